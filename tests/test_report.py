"""Report data on studies the real runner measured with the stand-in llama-server, and the
HTML report rendered in headless Chromium.

Expected figures come from the stored records, never from numbers written here: the
report must show what the study measured.
"""

from __future__ import annotations

import json
from dataclasses import replace

import browser
import optuna
import pandas as pd
import pytest
from fake_llama_server import run_study_file, write_moe_study, write_study

from tuner.cli import main
from tuner.decisions import front
from tuner.errors import UserError
from tuner.output import analysis, report
from tuner.output.report_html import render
from tuner.storage import store


@pytest.fixture(scope="module")
def records(demo):
    return store.read_trials(demo[0])


@pytest.fixture(scope="module")
def data(demo) -> analysis.ReportData:
    return analysis.report_data(*demo)


def hot(records):
    """The trial above temperature 0: the fastest of all, and below the quality floor."""
    return next(r for r in records if r.config.temperature > 0)


def dominated(record, others, objectives) -> bool:
    values = [record.metrics.objective(o) for o in objectives]
    return any(
        all(a >= b for a, b in zip(theirs, values)) and theirs != values
        for theirs in ([other.metrics.objective(o) for o in objectives] for other in others)
    )


def test_trials_frame_has_knobs_objectives_attrs_and_roofline(demo, records, data):
    record = demo[1]
    frame = data.trials.set_index("trial")
    assert list(frame.index) == [r.number for r in records]
    assert frame["state"].value_counts().to_dict() == {"COMPLETE": len(records) - 1, "FAIL": 1}
    base = frame.loc[0]
    assert (base["role"], base["method"], base["speedup"]) == ("baseline", "none", 1.0)
    ceiling = record.fingerprint["bandwidth_bytes_per_s"] / record.target["weights_bytes"]
    for r in filter(lambda r: r.complete, records):
        row = frame.loc[r.number]
        assert row["tokens_per_second"] == r.metrics.tokens_per_second
        assert row["roofline_fraction"] == pytest.approx(r.metrics.tokens_per_second / ceiling)
        assert (row["tps_code"], row["tps_prose"]) == (
            r.per_suite_tokens_per_second["code"],
            r.per_suite_tokens_per_second["prose"],
        )
    assert not frame.loc[hot(records).number, "feasible"] and hot(records).metrics.quality < record.floor
    failed = frame[frame["state"] == "FAIL"].iloc[0]
    assert failed["failure_reason"] == "out_of_memory" and pd.isna(failed["tokens_per_second"])
    k8 = next(r for r in records if r.config.draft_max == 8)
    assert (
        "--spec-draft-n-max 8" in frame.loc[k8.number, "command"]
        and "--port" not in frame.loc[k8.number, "command"]
    )


def test_pareto_front_keeps_feasible_nondominated_trials(demo, records, data):
    study, record = demo
    feasible = [r for r in records if r.feasible]
    objectives = list(record.objectives)
    assert set(data.pareto["trial"]) == {r.number for r in feasible if not dominated(r, feasible, objectives)}
    assert list(data.pareto["tokens_per_second"]) == sorted(data.pareto["tokens_per_second"], reverse=True)
    best = store.best_feasible(study)
    assert data.pareto["trial"].iloc[0] == best.number
    assert (
        hot(records).metrics.tokens_per_second > best.metrics.tokens_per_second
    )  # faster, but below the floor
    assert hot(records).number not in set(data.pareto["trial"])
    assert {r.metrics.quality for r in feasible} == {1.0}  # greedy speculation is lossless
    assert list(data.front_quality["trial"]) == [best.number]
    # with quality equal everywhere, the three-objective front is the acceptance front
    assert set(data.front_acceptance["trial"]) == set(data.pareto["trial"])
    along = data.front_acceptance
    assert along["acceptance"].is_monotonic_increasing and along["tokens_per_second"].is_monotonic_decreasing


def test_k_effects_and_best_per_content_type(records, data):
    feasible = [r for r in records if r.feasible]
    drafts = [r for r in feasible if r.config.spec_type == "draft-simple"]
    curve = data.k_by_method[data.k_by_method["method"] == "draft"]
    assert dict(zip(curve["K"], curve["tokens_per_second"])) == {
        k: max(r.metrics.tokens_per_second for r in drafts if r.config.draft_max == k)
        for k in {r.config.draft_max for r in drafts}
    }
    none = data.k_by_method[data.k_by_method["method"] == "none"]
    assert none["K"].tolist() == [0] and none["trials"].tolist() == [
        sum(not r.config.speculative for r in feasible)
    ]
    best = data.best_per_suite.set_index("suite")
    for suite in ("code", "prose"):
        fastest = max(feasible, key=lambda r: r.per_suite_tokens_per_second[suite])
        assert best.loc[suite, "trial"] == fastest.number
        on_suite = data.k_by_suite[data.k_by_suite["suite"] == suite]
        assert (
            dict(zip(on_suite["K"], on_suite["tokens_per_second"]))[fastest.config.draft_max or 0]
            == fastest.per_suite_tokens_per_second[suite]
        )
    # the stand-in's draft keeps being accepted longer on code than on prose
    assert best.loc["code", "draft_max"] > best.loc["prose", "draft_max"]


def test_temperature_threads_numa_and_importances(records, data):
    above = data.temperature[data.temperature["temperature"] > 0]
    assert above[["method", "best_tokens_per_second", "quality"]].values.tolist() == [
        ["draft", hot(records).metrics.tokens_per_second, hot(records).metrics.quality]
    ]
    threads = data.threads_numa.set_index(["numa", "threads"])["best_tokens_per_second"]
    assert threads.to_dict() == {
        ("none", n): max(r.metrics.tokens_per_second for r in records if r.complete and r.config.threads == n)
        for n in {r.config.threads for r in records}
    }
    if len(threads) > 1:
        assert threads[("none", 2)] > threads[("none", 1)]  # the stand-in: two threads decode faster
    tps = data.importances[data.importances["objective"] == "tokens_per_second"]
    assert {"spec_type", "temperature"} <= set(tps["param"])
    assert tps["importance"].sum() == pytest.approx(1.0)
    failed = [r for r in records if r.state == "FAIL"]
    assert list(data.failures["trial"]) == [r.number for r in failed]
    assert list(data.failures["failure_reason"]) == ["out_of_memory"]


@pytest.fixture(scope="module")
def moe(storage, tmp_path_factory):
    return run_study_file(write_moe_study(tmp_path_factory.mktemp("moe"), storage))


def test_moe_roofline_counts_only_active_experts_and_knee_sits_at_the_bend(moe):
    study, record = moe
    data = analysis.report_data(study, record)
    roof = data.roofline
    # write_moe_study's target: 256 bytes of shared weights and 1024 of 8 experts, 4 of them used
    assert roof.bytes_per_token(2) == pytest.approx(256 + 1024 * 2 / 8)
    assert roof.tokens_per_second(None) == pytest.approx(
        record.fingerprint["bandwidth_bytes_per_s"] / (256 + 512)
    )
    frame = data.trials.set_index("trial")
    records = store.read_trials(study)
    for r in records:
        ceiling = record.fingerprint["bandwidth_bytes_per_s"] / (256 + 1024 * r.config.experts / 8)
        assert frame.loc[r.number, "roofline_fraction"] == pytest.approx(
            r.metrics.tokens_per_second / ceiling
        )
    assert list(data.experts["experts"]) == [1, 2, 3, 4]
    # the stand-in: each expert fewer is faster and agrees less, so every feasible trial is on the front
    feasible = sorted((r for r in records if r.feasible), key=lambda r: r.metrics.quality)
    assert 0 < len(feasible) < len(records)
    assert list(data.front_quality["trial"]) == [r.number for r in feasible]
    knee = front.knee(data.front_quality)
    assert knee in [r.number for r in feasible[1:-1]]  # neither end: the fastest nor the baseline


def test_missing_bandwidth_is_measured_at_report_time_and_said(demo, records):
    study, record = demo
    elsewhere = replace(
        record,
        fingerprint={**record.fingerprint, "bandwidth_bytes_per_s": None, "cpu_model": "Some Other CPU"},
    )
    bandwidth = analysis.study_bandwidth(elsewhere, probe=lambda: 40e9)
    assert bandwidth.source == "measured at report time" and bandwidth.bytes_per_s == 40e9
    assert "has no bandwidth" in bandwidth.note and "Some Other CPU" in bandwidth.note
    data = analysis.report_data(study, elsewhere, bandwidth)
    ceiling = 40e9 / record.target["weights_bytes"]
    assert data.trials.loc[0, "roofline_fraction"] == pytest.approx(
        records[0].metrics.tokens_per_second / ceiling
    )


def test_open_study_by_name_or_study_file_and_clear_errors(storage, demo, tmp_path):
    record = demo[1]
    assert store.open_stored_study(record.spec_path)[1] == record  # the file names the study and its storage
    assert store.open_stored_study("demo", storage)[0].study_name == "demo"
    with pytest.raises(UserError, match=r"study 'nope': not in .*known studies: .*demo"):
        store.open_stored_study("nope", storage)
    with pytest.raises(UserError, match="no such file"):
        store.open_stored_study("demo", f"sqlite:///{tmp_path / 'missing.db'}")


def test_report_command_writes_html_and_csv(storage, records, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", "demo", "--storage", storage, "--out", str(out)]) == 0
    assert f"report: {out / 'index.html'}" in capsys.readouterr().out
    csv = pd.read_csv(out / "trials.csv")
    assert list(csv["trial"]) == [r.number for r in records]
    assert {
        "spec_type",
        "draft",
        "draft_max",
        "temperature",
        "threads",
        "tokens_per_second",
        "acceptance",
        "quality",
        "speedup",
        "cv",
        "feasible",
        "roofline_fraction",
        "command",
        "failure_reason",
        "tps_code",
        "tps_prose",
    } <= set(csv.columns)
    html = (out / "index.html").read_text()
    assert "<script src=" not in html and len(html) > 3_000_000  # plotly.js inlined: works offline


@pytest.mark.slow
def test_report_renders_pareto_plots_in_headless_chromium(data, tmp_path):
    html_path, _ = report.write_report(data, tmp_path / "report")
    root = browser.render(html_path.as_uri(), screenshot="report-demo.png")

    quality = root.by_id("fig-pareto-quality")
    assert quality is not None and quality.find_all("svg", "main-svg"), "plotly drew no SVG"
    traces = quality.find_all("g", "trace")
    assert len(traces) == 4  # feasible, below the floor, Pareto front, baseline
    complete = analysis.complete(data.trials)
    assert (
        len(quality.find_all("path", "point")) == len(complete) + len(data.front_quality) + 1
    )  # + baseline star
    legend = {e.all_text() for e in quality.find_all("g", "traces")}
    assert {"feasible", "below quality floor", "Pareto front", "baseline"} <= {t.strip() for t in legend}

    acceptance = root.by_id("fig-pareto-acceptance")
    front = [t for t in acceptance.find_all("g", "trace") if t.find_all("path", "js-line")]
    assert len(front) == 1 and len(front[0].find_all("path", "point")) == len(data.front_acceptance)
    for fig_id in (
        "fig-k-method",
        "fig-k-suite",
        "fig-temperature",
        "fig-threads-numa",
        "fig-speedup",
        "fig-roofline",
        "fig-importance",
    ):
        assert root.by_id(fig_id).find_all("g", "trace"), f"{fig_id} has no trace"
    best_k = data.pareto["draft_max"].iloc[0]
    assert f"--spec-draft-n-max {best_k}" in root.by_id("pareto-table").all_text()
    assert (browser.ARTIFACTS / "report-demo.png").stat().st_size > 10_000


def test_a_study_whose_trials_all_failed_still_reports(storage, tmp_path):
    path = write_study(tmp_path, storage, "broken")
    with pytest.raises(UserError, match="the baseline trial 0 failed"):
        run_study_file(path, FAKE_LLAMA_FAULTS=json.dumps({"--model": "launch"}))
    data = analysis.report_data(*store.open_stored_study("broken", storage))
    assert list(data.failures["failure_reason"]) == ["launch_failed"]
    assert data.pareto.empty and data.k_by_method.empty and data.importances.empty
    assert "no complete trial" in render(data)


def test_report_of_a_study_without_trials_is_a_one_line_error(storage, demo, capsys):
    """A study is recorded when it is created, before its baseline: its creator may die in between."""
    directions = ["maximize"] * 3
    optuna.create_study(study_name="unrecorded", storage=storage, directions=directions)
    assert main(["report", "unrecorded", "--storage", storage]) == 2
    assert capsys.readouterr().err.startswith(
        "tuner report: error: study 'unrecorded' has no study record yet: "
    )
    empty = optuna.create_study(study_name="empty", storage=storage, directions=directions)
    store.write_study_record(empty, replace(demo[1], name="empty"))
    assert main(["report", "empty", "--storage", storage]) == 2
    assert capsys.readouterr().err == (
        "tuner report: error: study 'empty' has no finished trial; run it first (`tuner run`)\n"
    )


def test_a_concurrency_report_shows_ttft_and_tpot_per_level_and_family(storage, tmp_path):
    """Beside the aggregate plot: each family's best trial at each level, with its p50/p95 time to first
    token and time per output token, read back from the written page."""
    path = write_study(
        tmp_path,
        storage,
        "latency",
        workload={"suites": ["suite.yaml"], "n_predict": 8, "concurrency": [1, 2]},
        budget={"trials": 3},
    )
    study, record = run_study_file(path)
    html_path, _ = report.write_report(analysis.report_data(study, record), tmp_path / "report")
    page = html_path.read_text()
    root = browser.parse(page)
    ids = [s.attrs["id"] for s in root.find_all("section")]
    assert ids.index("latency") == ids.index("concurrency") + 1
    section = root.by_id("latency")
    assert section.by_id("fig-latency") is not None
    head = [th.all_text() for th in section.find_all("th")]
    rows = [dict(zip(head, (td.all_text() for td in tr.find_all("td")))) for tr in section.find_all("tr")[1:]]
    best: dict[tuple[str, int], tuple[int, dict]] = {}  # each family's best aggregate at each level
    for r in (r for r in store.read_trials(study) if r.feasible):
        for level in r.load:
            key = (r.config.family, level["users"])
            if (
                key not in best
                or level["aggregate_tokens_per_second"] > best[key][1]["aggregate_tokens_per_second"]
            ):
                best[key] = (r.number, level)
    assert {(row["family"], int(row["users"])) for row in rows} == set(best) and len(rows) == len(best)
    assert {users for _, users in best} == {1, 2} and len({family for family, _ in best}) == 2
    for row in rows:
        trial, level = best[(row["family"], int(row["users"]))]
        assert int(row["trial"]) == trial
        for metric in ("p50_ttft_ms", "p95_ttft_ms", "p50_tpot_ms", "p95_tpot_ms"):
            header = f"{metric[:3]} {metric[4:8].upper()} ms"
            assert float(row[header]) == pytest.approx(level[metric], abs=0.006), (row, metric)
        assert level["p95_ttft_ms"] >= level["p50_ttft_ms"] > 0 and level["p50_tpot_ms"] > 0
