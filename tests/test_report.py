"""Report data on studies built in the test, and the HTML report rendered in headless Chromium."""

from __future__ import annotations

import optuna
import pandas as pd
import pytest

import browser
from study_factory import FINGERPRINT, MOE_TARGET, Row, make_study
from study_factory import no_llama_process_left_behind  # noqa: F401  (overrides conftest's machine-wide check)
from tuner import analysis, report
from tuner.cli import main
from tuner.errors import UserError
from tuner.report_html import render


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    """One SQLite file for the module: creating an Optuna schema costs seconds on a busy box."""
    return f"sqlite:///{tmp_path_factory.mktemp('storage') / 'studies.db'}"


@pytest.fixture
def demo():
    """In memory: the data tests need no database (SQLite commits cost a second per study)."""
    return make_study(optuna.storages.InMemoryStorage(), "demo")


@pytest.fixture(scope="module")
def stored_demo(storage):
    return make_study(storage, "demo")


def data_of(study) -> analysis.ReportData:
    return analysis.report_data(study)


def test_trials_frame_has_knobs_objectives_attrs_and_roofline(demo):
    frame = data_of(demo).trials
    assert list(frame["trial"]) == list(range(11))
    assert frame["state"].value_counts().to_dict() == {"COMPLETE": 10, "FAIL": 1}
    base = frame.iloc[0]
    assert (base["role"], base["method"], base["tokens_per_second"], base["speedup"]) == ("baseline", "none", 50.0, 1.0)
    # 20 GB/s over 0.2 GB of weights per token: a 100 t/s ceiling without speculation
    assert base["roofline_tokens_per_second"] == pytest.approx(100.0)
    assert frame.loc[2, "roofline_fraction"] == pytest.approx(0.95)
    assert frame.loc[2, ["method", "draft_max", "tps_code", "tps_prose"]].tolist() == ["draft-small", 8, 130.0, 52.0]
    assert not frame.loc[6, "feasible"]  # 0.90 < floor 0.99
    failed = frame.iloc[10]
    assert failed["failure_reason"] == "out_of_memory" and pd.isna(failed["tokens_per_second"])
    assert "--spec-draft-n-max 8" in frame.loc[2, "command"] and "--port" not in frame.loc[2, "command"]


def test_pareto_front_keeps_feasible_nondominated_trials(demo):
    data = data_of(demo)
    assert list(data.pareto["trial"]) == [2, 5, 4, 7]  # fastest first; 6 is faster but below the floor
    assert list(data.front_quality["trial"]) == [2]  # every feasible trial has quality 1.0
    assert list(data.front_acceptance["trial"]) == [2, 5, 4, 7]


def test_k_effects_and_best_per_content_type(demo):
    data = data_of(demo)
    small = data.k_by_method[data.k_by_method["method"] == "draft-small"]
    assert dict(zip(small["K"], small["tokens_per_second"])) == {2: 60.0, 4: 80.0, 8: 95.0, 16: 70.0}
    none = data.k_by_method[data.k_by_method["method"] == "none"]
    assert none["K"].tolist() == [0] and none["trials"].tolist() == [2]
    code = data.k_by_suite[data.k_by_suite["suite"] == "code"]
    assert dict(zip(code["K"], code["tokens_per_second"]))[8] == 130.0
    best = data.best_per_suite.set_index("suite")
    assert best.loc["code", ["trial", "draft_max"]].tolist() == [2, 8]
    assert best.loc["prose", ["trial", "method"]].tolist() == [8, "ngram-simple"]


def test_temperature_threads_numa_and_importances(demo):
    data = data_of(demo)
    hot = data.temperature[data.temperature["temperature"] == 0.7]
    assert hot[["method", "best_tokens_per_second", "quality"]].values.tolist() == [["draft-small", 120.0, 0.9]]
    numa = data.threads_numa.set_index(["numa", "threads"])
    assert numa.loc[("distribute", 1), "best_tokens_per_second"] == 30.0
    tps = data.importances[data.importances["objective"] == "tokens_per_second"]
    assert {"spec_type", "temperature", "threads"} <= set(tps["param"])
    assert tps["importance"].sum() == pytest.approx(1.0)
    assert list(data.failures["trial"]) == [10]


def moe_study(storage):
    """Expert reduction: fewer active experts decode faster and agree less with the baseline."""
    def experts(n, tps, quality, role=None):
        return Row({"spec_type": "none", "temperature": 0.0, "experts": n, "numa": "none", "threads": 2},
                   tps, 0.0, quality, role=role)

    rows = [experts(4, 50.0, 1.0, "baseline"), experts(3, 60.0, 0.99), experts(2, 75.0, 0.97), experts(1, 80.0, 0.90)]
    return make_study(storage, "moe", rows, target=MOE_TARGET, floor=0.85)


def test_moe_roofline_counts_only_active_experts_and_knee_sits_at_the_bend():
    data = data_of(moe_study(optuna.storages.InMemoryStorage()))
    roof = data.roofline
    # 40 MB shared + 160 MB of experts x 2/8 = 80 MB per token at 20 GB/s
    assert roof.bytes_per_token(2) == pytest.approx(80e6)
    assert roof.tokens_per_second(None) == pytest.approx(20e9 / 120e6)  # default: 4 of 8 experts
    frame = data.trials.set_index("trial")
    assert frame.loc[2, "roofline_fraction"] == pytest.approx(75.0 / 250.0)
    assert list(data.experts["experts"]) == [1, 2, 3, 4]
    assert list(data.front_quality["trial"]) == [3, 2, 1, 0]
    assert analysis.knee(data.front_quality) == 2  # 75 t/s at quality 0.97, before quality drops to 0.90


def test_missing_bandwidth_is_measured_at_report_time_and_said():
    fingerprint = {**FINGERPRINT, "bandwidth_bytes_per_s": None, "cpu_model": "Some Other CPU"}
    study = make_study(optuna.storages.InMemoryStorage(), "nobw", fingerprint=fingerprint)
    bandwidth = analysis.study_bandwidth(study, probe=lambda: 40e9)
    assert bandwidth.source == "measured at report time" and bandwidth.bytes_per_s == 40e9
    assert "has no bandwidth" in bandwidth.note and "Some Other CPU" in bandwidth.note
    data = analysis.report_data(study, bandwidth)
    assert data.trials.loc[0, "roofline_fraction"] == pytest.approx(50.0 / 200.0)


def test_open_study_by_name_or_study_file_and_clear_errors(storage, stored_demo, tmp_path):
    study_file = tmp_path / "demo.yaml"
    study_file.write_text(f"name: demo\nstorage: {storage}\ntarget: missing.gguf\n")
    assert analysis.open_study(str(study_file)).study_name == "demo"
    assert analysis.open_study("demo", storage).study_name == "demo"
    with pytest.raises(UserError, match=r"study 'nope': not in .*known studies: demo"):
        analysis.open_study("nope", storage)
    with pytest.raises(UserError, match="no such file"):
        analysis.open_study("demo", f"sqlite:///{tmp_path / 'missing.db'}")


def test_report_command_writes_html_and_csv(storage, stored_demo, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", "demo", "--storage", storage, "--out", str(out)]) == 0
    assert f"report: {out / 'index.html'}" in capsys.readouterr().out
    csv = pd.read_csv(out / "trials.csv")
    assert len(csv) == 11
    assert {"spec_type", "draft", "draft_max", "temperature", "threads", "tokens_per_second", "acceptance",
            "quality", "speedup", "cv", "feasible", "roofline_fraction", "command", "failure_reason"} <= set(csv.columns)
    html = (out / "index.html").read_text()
    assert "<script src=" not in html and len(html) > 3_000_000  # plotly.js inlined: works offline


@pytest.mark.slow
def test_report_renders_pareto_plots_in_headless_chromium(demo, tmp_path):
    out = tmp_path / "report"
    data = data_of(demo)
    html_path, _ = report.write_report(data, out)
    url = html_path.as_uri()
    root = browser.render(url, screenshot="report-demo.png")

    quality = root.by_id("fig-pareto-quality")
    assert quality is not None and quality.find_all("svg", "main-svg"), "plotly drew no SVG"
    traces = quality.find_all("g", "trace")
    assert len(traces) == 4  # feasible, below the floor, Pareto front, baseline
    # 9 feasible + 1 infeasible + 1 front point + the baseline star
    assert len(quality.find_all("path", "point")) == 12
    legend = {e.all_text() for e in quality.find_all("g", "traces")}
    assert {"feasible", "below quality floor", "Pareto front", "baseline"} <= {t.strip() for t in legend}

    acceptance = root.by_id("fig-pareto-acceptance")
    front = [t for t in acceptance.find_all("g", "trace") if t.find_all("path", "js-line")]
    assert len(front) == 1 and len(front[0].find_all("path", "point")) == 4
    for fig_id in ("fig-k-method", "fig-k-suite", "fig-temperature", "fig-threads-numa", "fig-speedup",
                   "fig-roofline", "fig-importance"):
        assert root.by_id(fig_id).find_all("g", "trace"), f"{fig_id} has no trace"
    table = root.by_id("pareto-table")
    assert "--spec-draft-n-max 8" in table.all_text()
    assert (browser.ARTIFACTS / "report-demo.png").stat().st_size > 10_000


def test_a_study_whose_trials_all_failed_still_reports():
    rows = [Row({"spec_type": "none", "temperature": 0.0, "numa": "none", "threads": 2}, failure="launch_failed")]
    data = data_of(make_study(optuna.storages.InMemoryStorage(), "broken", rows))
    assert list(data.failures["failure_reason"]) == ["launch_failed"]
    assert data.pareto.empty and data.k_by_method.empty and data.importances.empty
    assert "no complete trial" in render(data)


def test_report_of_an_empty_study_is_a_one_line_error(storage, capsys):
    optuna.create_study(study_name="empty", storage=storage, directions=["maximize"] * 3)
    assert main(["report", "empty", "--storage", storage]) == 2
    assert capsys.readouterr().err == ("tuner report: error: study 'empty' has no finished trial; "
                                       "run it first (`tuner run`)\n")
