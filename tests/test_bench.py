"""The benchmark code: replay on a table built here, the default sampler's no-repeat rule,
the grid plan, and record-grid on a two-configuration grid with the real build.

Only shapes and relations are checked, never an absolute time or speed.
"""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import optuna
import pandas as pd
import pytest

from benchmarks import replay
from benchmarks.cli import main
from benchmarks.grid import grid_configs
from benchmarks.scale_regime import markdown as scale_markdown
from benchmarks.scale_regime import recorded_regime
from benchmarks.table import read_table
from tuner.decisions.race.results import RaceResult
from tuner.errors import UserError
from tuner.knobs.config import Choices, IntRange
from tuner.progress import Progress
from tuner.search.sampling import culprits, sampler_for
from tuner.search.space import ResolvedSpace
from tuner.search.speedup_model import expected_tokens, measured_acceptance, speedup


def landscape_table(path: Path) -> Path:
    """A conditional landscape like the demo's: K only when speculating, a draft only for draft-simple,
    temperature 0.7 fast but below the quality floor."""
    rows = []
    for spec, draft, k, temperature, threads in itertools.product(
        ["none", "draft-simple", "ngram-simple"], ["large", "small"], [1, 2, 4, 8], [0.0, 0.7], [1, 2]
    ):
        if spec != "draft-simple" and draft != "large":
            continue
        if spec == "none" and k != 1:
            continue
        base = 50.0 if threads == 2 else 30.0
        gain = {"none": 1.0, "ngram-simple": 1.1, "draft-simple": 1.4 if draft == "small" else 1.2}[spec]
        peak = 1.0 if spec == "none" else 1.0 - abs(k - 4) / 10
        quality = 1.0 if temperature == 0.0 else 0.6
        rows.append(
            {
                "spec_type": spec,
                "draft": draft if spec == "draft-simple" else None,
                "draft_max": None if spec == "none" else k,
                "temperature": temperature,
                "numa": "none",
                "threads": threads,
                "tokens_per_second": base * gain * peak * (1.2 if temperature else 1.0),
                "acceptance": 0.0 if spec == "none" else 0.5,
                "quality": quality,
                "quality_floor": 0.99,
                "feasible": quality >= 0.99,
                "cv": 0.02,
                "status": "ok",
            }
        )
    rows.append(
        {**rows[-1], "threads": 3, "tokens_per_second": None, "status": "out_of_memory", "feasible": False}
    )
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_table_becomes_a_conditional_landscape(tmp_path):
    land = replay.load_landscape(read_table(landscape_table(tmp_path / "grid.csv")))
    assert land.params == ("spec_type", "draft", "draft_max", "temperature", "threads")  # numa is constant
    assert land.objectives == ("tokens_per_second", "acceptance", "quality")
    assert land.domains["draft_max"] == (1, 2, 4, 8)  # ints again, though the CSV has gaps
    assert land.config(land.best_key()) == {
        "spec_type": "draft-simple",
        "draft": "small",
        "draft_max": 4,
        "temperature": 0.0,
        "threads": 2,
    }
    assert land.best == pytest.approx(70.0)
    assert not land.entries[land.order[-1]].ok  # the failed row is a failed configuration, not a fast one
    trial = optuna.trial.FixedTrial({"spec_type": "none", "temperature": 0.0, "threads": 2})
    assert replay.ReplayObjective(land, None).ask(trial) == ("none", None, None, 0.0, 2)


def test_a_column_set_in_only_part_of_a_branch_is_refused(tmp_path):
    path = tmp_path / "bad.csv"
    pd.DataFrame(
        {
            "spec_type": ["none", "none", "ngram-simple"],
            "draft_max": [None, 4, 4],
            "tokens_per_second": [1.0, 2.0, 3.0],
        }
    ).to_csv(path, index=False)
    with pytest.raises(UserError, match="draft_max"):
        replay.load_landscape(read_table(path))


def test_regret_counts_only_feasible_measured_configurations(tmp_path):
    land = replay.load_landscape(read_table(landscape_table(tmp_path / "grid.csv")))
    infeasible_fast = next(
        k
        for k in land.order
        if land.entries[k].ok
        and not land.entries[k].feasible
        and land.entries[k].tokens_per_second > land.best
    )
    curve = replay.regret_curve(land, [infeasible_fast, land.best_key()])
    assert curve == [1.0, 0.0]
    assert replay.trials_to(curve, 0.03) == 2


def test_bench_search_compares_every_strategy(tmp_path, capsys):
    table = landscape_table(tmp_path / "grid.csv")
    out = tmp_path / "search.json"
    assert main(["bench-search", str(table), "--seeds", "3", "--jobs", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["strategies"]) == set(replay.STRATEGIES)
    size = result["configurations"]
    assert result["budget"] == size
    for name, r in result["strategies"].items():
        assert len(r["trials_to_target"]) == (1 if name == "grid" else 3)
        assert all(t is None or 1 <= t <= size for t in r["trials_to_target"])
    assert result["strategies"]["grid"]["trials_to_target"][0] is not None  # the whole grid finds the best
    # the grid's first five rows: the target alone at 1 and 2 threads (30, 50 t/s), twice above temperature 0
    # (below the floor: no credit), then a draft at K=1 on one thread: the best feasible so far is 50 of 70
    assert result["strategies"]["grid"]["median_regret_at"]["5"] == pytest.approx(1 - 50 / 70)
    assert set(result["targets"]) == {
        "default_over_random",
        "random_censored",
        "default_over_grid_size",
        "no_worse_than_today",
        "met",
    }
    printed = capsys.readouterr().out
    assert "| default |" in printed and "target <= 0.5" in printed


def scale_sweep(folder: Path, suite: str, counted: bool) -> None:
    """A recorded scale sweep (as ``python -m benchmarks record-grid`` leaves it) from the speculation model itself: a cheap
    draft whose rounds cost half a step besides their tokens, and an n-gram lookup drafting on one step in
    ten; 5 prompts of 48 tokens, 2 repetitions. ``counted``: rows carry their generated tokens and requests
    (else the reference's outputs tell them); the draft's K=8 is recorded twice, busy first."""
    steps_total, ks = 2 * 5 * 47, [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    rows = [{"spec_type": "none", "tokens_per_second": 30.0, "acceptance": 0.0, "speedup": 1.0}]
    for spec, a, c, overhead, share in (
        ("draft-simple", 0.65, 0.08, 0.5, 1.0),
        ("ngram-simple", 0.8, 0.11, 0.0, 0.1),
    ):
        for k in ks:
            rate = speedup(a, c, k, overhead=overhead, share=share)
            per_step = share * (expected_tokens(a, k) - 1)  # accepted per decode step
            steps = steps_total / (1 + per_step)
            row = {
                "spec_type": spec,
                "draft": "small" if spec == "draft-simple" else None,
                "draft_max": k,
                "tokens_per_second": 30.0 * rate,
                "acceptance": measured_acceptance(a, k),
                "speedup": rate,
                "drafted": round(share * k * steps),
                "accepted": round(per_step * steps),
            }
            if spec == "draft-simple" and k == 8:
                rows.append({**row, "tokens_per_second": 3.0, "speedup": 0.1, "host_busy": True})
            rows.append(row)
    for row in rows:
        row.update(
            cv=0.01, quality=1.0, quality_floor=0.99, feasible=True, status="ok", repetitions=2, threads=2
        )
        if counted:
            row.update(generated=2 * 5 * 48, requests=2 * 5)
    name = folder / f"grid-scale-grid-{suite}"
    name.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    reference = {"tokens": {f"p{i}": list(range(48)) for i in range(5)}, "tokens_per_second": 30.0}
    name.with_suffix(".reference.json").write_text(json.dumps(reference))


def test_bench_scale_reads_recorded_sweeps_and_predicts_each_familys_best_k(tmp_path, capsys):
    scale_sweep(tmp_path, "code", counted=True)
    scale_sweep(tmp_path, "prose", counted=False)
    out = tmp_path / "scale.json"
    assert main(["bench-scale", str(tmp_path), "--seeds", "1", "--json", str(out)]) == 0
    found = json.loads(out.read_text())
    for suite in ("code", "prose"):
        by_family = {f["family"]: f for f in found["suites"][suite]["families"]}
        assert set(by_family) == {"small", "ngram-simple"}
        assert by_family["small"]["best_k"] == 4 and by_family["ngram-simple"]["best_k"] == 8
        assert all(f["rungs_off"] <= 1 for f in by_family.values()), by_family
    assert found["targets"]["predicted_within_one_rung"] is True
    assert "| small | 4 |" in capsys.readouterr().out
    assert main(["bench-scale", str(tmp_path / "none")]) == 2


def scale_race(config: dict, loss_bound: float | None) -> RaceResult:
    """The scale study's race as stored, deploying ``config`` (trial 3) over the baseline (trial 0)."""

    def entry(trial: int, entry_config: dict, speedup: float) -> dict:
        return {
            "trial": trial,
            "label": f"trial-{trial}",
            "config": entry_config,
            "recorded_tokens_per_second": 30.0 * speedup,
            "rates": [30.0 * speedup] * 3,
            "mean_tokens_per_second": 30.0 * speedup,
            "speedup": speedup,
            "speedup_low": speedup * 0.9,
            "speedup_high": speedup * 1.1,
            "status": "winner" if trial else "dropped: shown slower",
        }

    stored = {
        "rounds": 3,
        "baseline_trial": 0,
        "entries": [entry(3, config, 2.0), entry(0, {"spec_type": "none"}, 1.0)],
        "winner": 3,
        "decided": True,
        "verdict": "trial-3 shown faster than every other finalist after 3 rounds",
        "rule": "",
        "loss": 0.02,
        "drafted": {"trial-3": 100},
        "outliers": [],
        "launches": 6,
        "confirmation": None,
        "loss_bound": loss_bound,
    }
    race = RaceResult.from_json(stored)
    assert race is not None
    return race


def test_bench_scale_reads_summaries_stacks_and_the_races_deployment_against_each_sweep(tmp_path, capsys):
    for suite in ("code", "prose", "summarize"):
        scale_sweep(tmp_path, suite, counted=True)
    jsonl = tmp_path / "grid-scale-grid-summarize.jsonl"  # on summaries, ngram-mod stacked on the draft leads
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    rows = [{**r, "lookup": "none"} if r["spec_type"] == "draft-simple" else r for r in rows]
    stacks = [
        {
            **r,
            "lookup": "ngram-mod",
            "tokens_per_second": 2 * r["tokens_per_second"],
            "speedup": 2 * r["speedup"],
        }
        for r in rows
        if r["spec_type"] == "draft-simple" and not r.get("host_busy")
    ]
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows + stacks))
    prose = (
        tmp_path / "grid-scale-grid-prose.jsonl"
    )  # on prose the draft's K=4 pays half what it pays on code
    prose.write_text(
        "".join(
            json.dumps({**r, "tokens_per_second": r["tokens_per_second"] / 2, "speedup": r["speedup"] / 2})
            + "\n"
            if r["spec_type"] == "draft-simple" and r["draft_max"] == 4
            else json.dumps(r) + "\n"
            for r in map(json.loads, prose.read_text().splitlines())
        )
    )
    draft_k4 = {"spec_type": "draft-simple", "draft": "small", "draft_max": 4, "lookup": "none"}
    found = recorded_regime(tmp_path, seeds=1, race=scale_race(draft_k4, loss_bound=0.05))
    summaries = found["suites"]["summarize"]
    assert summaries["best"]["family"] == "ngram-mod + small" and summaries["best"]["best_k"] == 4
    assert found["targets"]["summaries_best_lookup_or_stack"] is True
    code = found["suites"]["code"]["race"]  # the sweep's best on code: the draft at K=4 itself
    assert code["deployed"] == "small K=4" and code["shortfall"] == pytest.approx(0.0) and code["within"]
    assert found["suites"]["summarize"]["race"]["shortfall"] == pytest.approx(
        0.5
    )  # the stack is twice as fast
    # the race ranked one configuration for the three types at once: read against the sweeps pooled, the
    # harmonic mean of each configuration's speedups in the three sweeps (the stacks, measured on summaries
    # alone, are not among them)
    pooled = found["pooled"]
    each = [found["suites"][s]["race"]["in_sweep"] for s in ("code", "prose", "summarize")]
    assert pooled["race"]["in_sweep"] == pytest.approx(3 / sum(1 / x for x in each))
    assert (
        each[1] == pytest.approx(each[0] / 2) and pooled["best"] != "small K=4" and "+" not in pooled["best"]
    )
    assert pooled["race"]["shortfall"] == pytest.approx(
        1 - pooled["race"]["in_sweep"] / pooled["best_speedup"]
    )
    assert pooled["race"]["within"] is False and found["targets"]["race_within_stated_loss"] is False
    best_k = int(pooled["best"].split("K=")[1])
    at_best = recorded_regime(tmp_path, seeds=1, race=scale_race({**draft_k4, "draft_max": best_k}, 0.0))
    assert at_best["pooled"]["race"]["shortfall"] == 0.0 and at_best["targets"]["race_within_stated_loss"]
    at_k8 = recorded_regime(tmp_path, seeds=1, race=scale_race({**draft_k4, "draft_max": 8}, loss_bound=0.0))
    assert (
        at_k8["suites"]["code"]["race"]["within"] is False
    )  # K=8 measured below K=4: more than "none faster"
    printed = scale_markdown(at_k8)
    assert "the scale study's race deployed small K=8 (trial 3; stated: no other finalist faster)" in printed
    assert "MORE than the stated loss" in printed
    assert "**the sweeps pooled as the race's traffic** (code and prose and summarize" in printed
    assert "not run in this storage" in scale_markdown(recorded_regime(tmp_path, seeds=1))
    assert (
        main(["bench-scale", str(tmp_path), "--seeds", "1", "--storage", f"sqlite:///{tmp_path}/none.db"])
        == 0
    )
    assert "not run in this storage" in capsys.readouterr().out


def test_the_sweeps_relaunched_leaders_rank_its_best_and_read_the_races_deployment(tmp_path):
    """One launch each put the draft's K=4 first; its leaders launched again rank K=3 first: that is the sweep's
    best, and the race's deployment (K=4) is read at its relaunched speedup."""
    from benchmarks.sweep_leaders import leaders, leaders_path

    scale_sweep(tmp_path, "code", counted=True)
    rows = [json.loads(line) for line in (tmp_path / "grid-scale-grid-code.jsonl").read_text().splitlines()]
    chosen = leaders(rows, band=0.05, most=3)
    top = max(r["speedup"] for r in rows if not r.get("host_busy") and r["spec_type"] != "none")
    assert [r["speedup"] for r in chosen] == sorted((r["speedup"] for r in chosen), reverse=True)
    assert len(chosen) == 3 and all(r["speedup"] >= 0.95 * top and not r.get("host_busy") for r in chosen)
    assert leaders([{**r, "feasible": False} for r in rows]) == []

    def relaunched(k: int, speedup: float) -> dict:
        return {
            "spec_type": "draft-simple",
            "draft": "small",
            "draft_max": k,
            "speedup": speedup,
            "low": speedup - 0.1,
            "high": speedup + 0.1,
        }

    leaders_path(tmp_path / "grid-scale-grid-code.csv").write_text(
        json.dumps({"rounds": 3, "leaders": [relaunched(4, 1.50), relaunched(3, 1.60)]})
    )
    draft_k4 = {"spec_type": "draft-simple", "draft": "small", "draft_max": 4, "lookup": "none"}
    found = recorded_regime(tmp_path, seeds=1, race=scale_race(draft_k4, loss_bound=0.05))
    best = found["suites"]["code"]["best"]
    assert (best["family"], best["best_k"], best["best_speedup"]) == ("small", 3, 1.60)
    race = found["suites"]["code"]["race"]
    assert race["in_sweep"] == 1.50 and race["shortfall"] == pytest.approx(1 - 1.50 / 1.60)
    assert race["within"] is False  # 6.25% below, more than the 5% it stated
    assert "small K=3 x1.60 [1.50, 1.70], small K=4 x1.50" in scale_markdown(found)


def test_bench_search_names_a_missing_parameter_column(tmp_path, capsys):
    table = landscape_table(tmp_path / "grid.csv")
    assert main(["bench-search", str(table), "--params", "spec_type,K"]) == 2
    assert "'K' is not a column" in capsys.readouterr().err


def test_default_sampler_measures_each_configuration_once_until_all_are_measured():
    def objective(trial):
        spec = trial.suggest_categorical("spec_type", ["none", "ngram-simple"])
        k = trial.suggest_categorical("draft_max", [1, 2, 4]) if spec != "none" else 0
        threads = trial.suggest_categorical("threads", [1, 2])
        trial.set_constraint("quality_floor", -1.0)
        return k * threads + (spec == "none"), 1.0, 1.0

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(directions=["maximize"] * 3, sampler=sampler_for("tpe", 0, 8))
    study.optimize(objective, n_trials=8)  # 2 + 6 configurations
    configs = [tuple(sorted(t.params.items())) for t in study.trials]
    assert len(set(configs)) == 8
    study.optimize(objective, n_trials=1)  # all measured: a repeat is let through, not an endless search
    assert len(study.trials) == 9


def test_default_sampler_never_proposes_a_pruned_configuration_again():
    # `make bench`'s demo studies: TPE re-proposed configurations pruned a few trials before
    def objective(trial):
        spec = trial.suggest_categorical("spec_type", ["none", "ngram-simple"])
        k = trial.suggest_categorical("draft_max", [1, 2, 4]) if spec != "none" else 0
        threads = trial.suggest_categorical("threads", [1, 2])
        if threads == 1 and trial.number > 0:
            raise optuna.TrialPruned()  # one thread: clearly slower than the incumbent
        trial.set_constraint("quality_floor", -1.0)
        return k * threads + (spec == "none"), 1.0, 1.0

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    for seed in range(3):
        study = optuna.create_study(directions=["maximize"] * 3, sampler=sampler_for("tpe", seed, 8))
        study.optimize(objective, n_trials=8)  # 8 configurations: each once, pruned or not
        configs = [tuple(sorted(t.params.items())) for t in study.trials]
        assert len(set(configs)) == 8 and any(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)


def test_default_sampler_stops_proposing_a_knob_value_that_only_fails():
    class NothingDrafted(Exception):
        pass

    def objective(trial):
        spec = trial.suggest_categorical("spec_type", ["none", "ngram-simple", "draft-simple"])
        k = trial.suggest_categorical("draft_max", [1, 2, 3, 4]) if spec != "none" else 0
        threads = trial.suggest_categorical("threads", [1, 2])
        if spec == "ngram-simple":
            raise NothingDrafted  # a failure without a transient reason: it will recur
        trial.set_constraint("quality_floor", -1.0)
        return 10 * threads + k, 1.0, 1.0

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    for seed in range(3):
        study = optuna.create_study(directions=["maximize"] * 3, sampler=sampler_for("tpe", seed, 12))
        study.optimize(objective, n_trials=12, catch=(NothingDrafted,))  # 10 configurations work
        assert sum(t.params["spec_type"] == "ngram-simple" for t in study.trials) <= 4


def test_culprits_blame_only_the_value_that_explains_the_bad_trials():
    good = [{"spec_type": "none", "temperature": 0.0, "threads": 2}]
    bad = [
        {"spec_type": "ngram-simple", "draft_max": 4, "temperature": 0.0, "threads": 1},  # drafted nothing
        {"spec_type": "none", "temperature": 0.7, "threads": 1},  # below the quality floor
        {"spec_type": "draft-simple", "draft_max": 2, "temperature": 0.7, "threads": 2},
        {"spec_type": "ngram-simple", "draft_max": 1, "temperature": 0.7, "threads": 2},
    ]
    # temperature 0.7 explains three; threads=1 is shared by two bad trials but each has another cause
    assert culprits(bad, good) == {("temperature", 0.7)}
    # two failures sharing two never-good values: either could be the cause, so neither is blamed
    assert (
        culprits(
            [
                {"spec_type": "draft-simple", "draft_max": 32, "threads": 1},
                {"spec_type": "draft-simple", "draft_max": 32, "threads": 2},
            ],
            good,
        )
        == set()
    )
    # two causes seen together and apart, equally often: both are blamed (a replayed grid
    # once kept proposing ngram-simple for seven failures while it tied with temperature 0.7)
    assert culprits(
        [
            {"spec_type": "ngram-simple", "draft_max": 8, "temperature": 0.7, "threads": 1},
            {"spec_type": "none", "temperature": 0.7, "threads": 2},
            {"spec_type": "ngram-simple", "draft_max": 1, "temperature": 0.0, "threads": 2},
        ],
        good,
    ) == {("spec_type", "ngram-simple"), ("temperature", 0.7)}
    assert (
        culprits([{"spec_type": "none", "temperature": 0.0, "threads": 2}], good) == set()
    )  # nothing to blame


def test_grid_enumerates_the_space_as_a_study_asks_it():
    space = ResolvedSpace(
        {
            "spec_type": Choices(("none", "draft-simple", "ngram-simple")),
            "draft": Choices(("a", "b")),
            "draft_max": Choices((2, 4)),
            "temperature": Choices((0.0, 0.5)),
            "numa": Choices(("none",)),
            "threads": Choices((1, 2)),
        },
        default_experts=None,
        physical_cores=2,
        allow_smt=False,
    )
    configs = grid_configs(space)
    assert len(configs) == len(set(configs)) == 4 + 16 + 8
    assert all(c.draft is None for c in configs if c.spec_type != "draft-simple")
    assert all(c.draft_max is None for c in configs if c.spec_type == "none")
    assert [c.temperature for c in configs[:2]] == [0.0, 0.5]  # temperature varies fastest
    assert configs[0].threads == configs[1].threads
    ranged = ResolvedSpace({**space.domains, "threads": IntRange(1, 2)}, None, 2, False)
    with pytest.raises(UserError, match="threads: is a range"):
        grid_configs(ranged)


# ------------------------------------------------------------------ record-grid on the real build


def grid_study(
    tmp_path: Path,
    threads: str = "[1]",
    spec_types: str = "[none]",
    n_predict: int = 8,
    suite: str = "one.yaml",
) -> Path:
    from tuner.paths import models_dir

    (tmp_path / "one.yaml").write_text('prompts:\n  - id: add\n    text: "def add(a, b):\\n    return"\n')
    study = tmp_path / "grid.yaml"
    study.write_text(f"""
name: grid-test
target: {models_dir() / "synthetic" / "target.gguf"}
search_space:
  overrides: {{spec_type: {spec_types}, temperature: [0.0, 0.7], threads: {threads}}}
workload: {{suites: [{suite}], n_predict: {n_predict}}}
measurement: {{repetitions: 2, ctx_size: 256, trial_timeout_s: 60}}
""")
    return study


def test_record_grid_shares_one_server_across_temperatures_and_resumes(
    synthetic_models, tmp_path, monkeypatch, capsys
):
    import tuner.measurement.measured_launch as launches

    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path / "storage"))
    # a quiet host, whatever else runs on this one: a busy launch is measured again on resume, which the test
    # below covers; here the resume must find nothing left to measure
    monkeypatch.setattr(launches, "busy_processes", lambda *args, **kwargs: {})
    study, csv = grid_study(tmp_path), tmp_path / "grid.csv"
    assert main(["record-grid", str(study), "--out", str(csv)]) == 0
    frame = pd.read_csv(csv)
    assert list(frame["temperature"]) == [
        0.0,
        0.7,
    ]  # the baseline (greedy) first: it is the quality reference
    assert {
        "spec_type",
        "threads",
        "tokens_per_second",
        "acceptance",
        "quality",
        "cv",
        "feasible",
        "status",
        "build_commit",
    } <= set(frame.columns)
    assert (frame["status"] == "ok").all() and (frame["tokens_per_second"] > 0).all()
    assert frame["quality"].iloc[0] == 1.0 and bool(frame["feasible"].iloc[0])
    assert frame["launch_s"].nunique() == 1  # one launch served both temperatures
    assert sorted(p.name for p in (tmp_path / "storage" / "logs" / "grid-test").iterdir()) == ["grid-0.log"]
    rows = csv.with_suffix(".jsonl").read_text()
    capsys.readouterr()
    assert main(["record-grid", str(study), "--out", str(csv)]) == 0
    assert "0 to measure" in capsys.readouterr().out
    assert csv.with_suffix(".jsonl").read_text() == rows  # resumed: nothing measured twice


def test_record_grid_gives_a_lookup_that_remembers_a_server_of_its_own_and_a_launch_per_pass(
    synthetic_models, tmp_path, monkeypatch, capsys
):
    """ngram-mod remembers what a server served: it shares no server across temperatures, and each of its two
    passes is a launch of its own (``grid-N.log``, ``grid-N-pass2.log``); the baseline's temperatures share one."""
    import tuner.measurement.measured_launch as launches

    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path / "storage"))
    monkeypatch.setattr(launches, "busy_processes", lambda *args, **kwargs: {})
    study = grid_study(tmp_path, spec_types="[none, ngram-mod], ngram_key: 3", n_predict=48, suite="prose")
    csv = tmp_path / "grid.csv"
    assert main(["record-grid", str(study), "--out", str(csv)]) == 0
    frame = pd.read_csv(csv)
    assert list(zip(frame["spec_type"], frame["temperature"])) == [
        ("none", 0.0),
        ("none", 0.7),
        ("ngram-mod", 0.0),
        ("ngram-mod", 0.7),
    ]
    assert (frame["status"] == "ok").all() and frame["launch_s"].nunique() == 3
    logs = sorted(p.name for p in (tmp_path / "storage" / "logs" / "grid-test").iterdir())
    assert logs == ["grid-0.log", "grid-1-pass2.log", "grid-1.log", "grid-2-pass2.log", "grid-2.log"]
    # a recording from before the rule (its lookup rows without launch_per_pass): those rows are measured again
    jsonl = csv.with_suffix(".jsonl")
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    jsonl.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "launch_per_pass"}) + "\n" for r in rows)
    )
    capsys.readouterr()
    assert main(["record-grid", str(study), "--out", str(csv)]) == 0
    assert "2 to measure" in capsys.readouterr().out


def test_record_grid_launches_its_leaders_again_interleaved_with_the_baseline(
    synthetic_models, tmp_path, monkeypatch
):
    """--leader-rounds 2: the feasible speculative rows within 10% of the best and the baseline launched once a
    round; each leader's speedup is its median rate over the baseline's, its range the per-round ratios."""
    import tuner.measurement.measured_launch as launches
    from benchmarks.sweep_leaders import read_leaders

    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path / "storage"))
    monkeypatch.setattr(launches, "busy_processes", lambda *args, **kwargs: {})
    study = grid_study(tmp_path, spec_types="[none, ngram-mod], ngram_key: 3", n_predict=48, suite="prose")
    csv = tmp_path / "grid.csv"
    assert main(["record-grid", str(study), "--out", str(csv), "--leader-rounds", "2"]) == 0
    found = read_leaders(csv)
    assert found is not None and found["rounds"] == 2 and len(found["baseline"]) == 2
    frame = pd.read_csv(csv)
    fast = frame[(frame["spec_type"] != "none") & frame["feasible"]]
    best = fast.loc[fast["speedup"].idxmax()]  # the greedy ngram-mod row at least: it matches the reference
    within = fast[fast["speedup"] >= 0.9 * best["speedup"]]  # the leaders: within 10% of the best
    leaders_at = sorted(r["temperature"] for r in found["leaders"])
    assert leaders_at == sorted(within["temperature"]) and best["temperature"] in leaders_at
    assert all(r["spec_type"] == "ngram-mod" for r in found["leaders"])
    for leader in found["leaders"]:
        assert len(leader["rates"]) == 2
        ratios = [r / b for r, b in zip(leader["rates"], found["baseline"])]
        assert leader["ratios"] == pytest.approx(ratios) and leader["low"] == pytest.approx(min(ratios))
        speedup = statistics.median(leader["rates"]) / statistics.median(found["baseline"])
        assert leader["speedup"] == pytest.approx(speedup)
    logs = {p.name for p in (tmp_path / "storage" / "logs" / "grid-test").iterdir()}
    assert len([n for n in logs if n.startswith("remeasure-")]) == 2 * (
        1 + len(found["leaders"])
    )  # a launch each
    assert main(["record-grid", str(study), "--leader-rounds", "-1"]) == 2


def test_record_grid_launches_a_long_sweeps_baseline_midway_and_at_its_end_and_divides_by_their_median(
    synthetic_models, tmp_path, monkeypatch, capsys
):
    """A sweep of at least ``CHECKED_SWEEP`` launches launches its baseline again midway and at its end; the
    reference keeps each launch's rate, and the table's speedups divide by their median."""
    import benchmarks.grid_recorder as recorder
    import tuner.measurement.measured_launch as launches

    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path / "storage"))
    monkeypatch.setattr(launches, "busy_processes", lambda *args, **kwargs: {})
    monkeypatch.setattr(recorder, "CHECKED_SWEEP", 2)  # the test's grid is two launches: 1 and 2 threads
    study, csv = grid_study(tmp_path, threads="[1, 2]"), tmp_path / "grid.csv"
    assert main(["record-grid", str(study), "--out", str(csv)]) == 0
    assert (
        capsys.readouterr().out.count("the baseline launched again") == 2
    )  # midway (launch 1) and at the end
    reference = json.loads(csv.with_suffix(".reference.json").read_text())
    rates = [r["tokens_per_second"] for r in reference["readings"]]
    assert len(rates) == 3 and reference["tokens_per_second"] == pytest.approx(sorted(rates)[1])
    frame = pd.read_csv(csv)
    assert frame["speedup"].to_numpy() == pytest.approx(
        frame["tokens_per_second"].to_numpy() / sorted(rates)[1]
    )
    rows = [json.loads(line) for line in csv.with_suffix(".jsonl").read_text().splitlines()]
    knobs = ("spec_type", "temperature", "threads")
    assert sum(all(r[k] == rows[0][k] for k in knobs) for r in rows) == 3  # the baseline's three launches


def test_record_grid_refuses_a_range(synthetic_models, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path / "storage"))
    assert main(["record-grid", str(grid_study(tmp_path, threads="{low: 1, high: 2}"))]) == 2
    assert "threads: is a range" in capsys.readouterr().err


def test_overhead_compares_a_trial_with_llama_bench_in_alternating_rounds(
    synthetic_models, tmp_path, monkeypatch
):
    from benchmarks.overhead import markdown, measure_overhead
    from tuner.prepare import prepare
    from tuner.studyfile.spec import load_spec

    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path / "storage"))
    result = measure_overhead(
        prepare(load_spec(grid_study(tmp_path))),
        n_predict=8,
        repetitions=2,
        rounds=2,
        progress=Progress.quiet(),
    )
    assert len(result.bench) == len(result.trials) == 2
    assert all(
        b.tokens_per_second > 0 and len(b.samples_ts) == 3 for b in result.bench
    )  # R + 1 runs, from its JSONL
    assert result.depth == result.trials[0].prompt_tokens > 0
    assert all(0 < t.tokens <= 2 * 8 for t in result.trials)  # R x N at most: a prompt may stop early
    assert 0.5 < result.tps_ratio < 2  # the tuner's decode figure agrees with llama-bench's, generously
    data = result.to_dict()
    assert data["met"] == result.met
    assert "| decode tokens/s (median) |" in markdown(result)


def test_repeatability_races_two_seeds_and_checks_each_deployment_against_the_others_bound(
    synthetic_models, tmp_path, monkeypatch
):
    from benchmarks.repeat import markdown, measure_repeatability
    from tuner.paths import models_dir
    from tuner.studyfile.spec import RaceSpec

    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path / "storage"))
    (tmp_path / "one.yaml").write_text('prompts:\n  - id: add\n    text: "def add(a, b):\\n    return"\n')
    study = tmp_path / "twins.yaml"  # two configurations that decode alike: finalists unless load parts them
    study.write_text(f"""
name: twins
target: {models_dir() / "synthetic" / "target.gguf"}
search_space:
  overrides: {{spec_type: [none], temperature: 0.0, threads: [1], cache_reuse: [0, 256]}}
workload: {{suites: [one.yaml], n_predict: 8}}
measurement: {{repetitions: 2, ctx_size: 256, trial_timeout_s: 60}}
""")
    result = measure_repeatability(
        study,
        tmp_path / "repeat.db",
        trials=2,
        rounds=2,
        race=RaceSpec(min_rounds=3, max_rounds=3),
        progress=Progress.quiet(),
    )
    assert [r.seed for r in result.runs] == [1, 2]
    for run in result.runs:
        assert (
            len(run.deployed.remeasured_tokens_per_second)
            == len(run.searched.remeasured_tokens_per_second)
            == 2
        )
        assert min(run.deployed.remeasured_tokens_per_second) > 0
        if run.loss_text.startswith("deployed"):
            # decided only when no other finalist may be more than race.loss faster; else it states what it may
            # lose, or why it has no bound yet
            assert run.decided == (run.loss_bound is not None and run.loss_bound <= RaceSpec().loss)
            assert run.loss_bound is not None or "no bound yet" in run.loss_text
        else:  # one launch each: on a busy host the twin can measure out of the finalists' reach
            assert run.loss_text == "nothing to race besides the baseline" and run.loss_bound is None
            assert run.deployed.trial == run.searched.trial == 0  # the baseline, deployed as searched
    data = result.to_dict()
    assert data["met"] == result.met and len(data["holds"]) == 2 and 0 < result.search_ratio <= 1
    text = markdown(result)
    assert "deployment over seed 1's" in text and "Search only" in text and "searched best" in text


def test_bench_command_writes_all_three_sections(synthetic_models, tmp_path, monkeypatch, capsys):
    import benchmarks.operator_replay
    import benchmarks.sizes

    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path / "storage"))
    monkeypatch.setattr(benchmarks.sizes, "HELD_OUT_SEEDS", range(10000, 10002))  # 1b's draws: two, not 100
    # 1b's named landscapes: two of the twelve (all twelve took 3.5 of this test's 6 minutes; --quick runs one)
    monkeypatch.setattr(benchmarks.operator_replay, "LANDSCAPES", benchmarks.operator_replay.LANDSCAPES[:2])
    study, out = grid_study(tmp_path), tmp_path / "bench"
    assert (
        main(
            [
                "bench",
                "--grid-study",
                str(study),
                "--study",
                str(study),
                "--seeds",
                "2",
                "--rounds",
                "1",
                "--repeat-trials",
                "2",
                "--decision-runs",
                "4",
                "--gguf",
                str(synthetic_models.path("draft-small")),
                "--scale-grid-study",  # section 5 on the small grid: its code and prose sweeps, two launches each
                str(study),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads((out / "bench.json").read_text())
    assert {
        "search",
        "decisions",
        "launch_size",
        "overhead",
        "concurrency",
        "repeatability",
        "scale_regime",
        "quantization",
        "timings",
    } <= set(result)
    assert set(result["search"]["strategies"]) >= {"default", "random", "grid"}
    assert [d["draw"] for d in result["search_held_out"]["replays"]] == [10000, 10001]
    assert result["overhead"]["rounds"] == 1 and len(result["repeatability"]["runs"]) == 2
    md = (out / "bench.md").read_text()
    assert (
        md.count("\n## ") == 12 and "Whole bench:" in md
    )  # 1, 1b (operator scale; held-out draws), 1c (decisions), 1d (launch size), 2, 2b, 3, 4, 5, 6 (quants), 7 (serve)
    quant = result["quantization"]  # the grid study's target stands in for the scale target: its F16 and Q4_0
    assert len(quant["ratios"]) >= 2 and quant["bytes"]["Q4_0"] < quant["bytes"]["F16"]
    assert "Q4_0 over F16: x" in md
    assert result["decisions"]["runs"] == 4 and len(result["decisions"]["races"]) == 27
    assert [Path(row["path"]).name for row in result["gguf_read"]["files"]] == ["draft-small.gguf"]
    assert (out / "grid-grid-test.csv").exists()
    assert [Path(s["table"]).name for s in result["scale_regime"]["suites"].values()] == [
        "grid-grid-test-code.csv",
        "grid-grid-test-prose.csv",
        "grid-grid-test-summarize.csv",
    ]


def test_bench_refuses_zero_rounds(capsys):
    assert main(["bench", "--rounds", "0"]) == 2
    assert "--rounds: must be >= 1, got 0" in capsys.readouterr().err


def test_record_grid_launches_a_busy_launch_once_more_and_marks_its_rows(
    synthetic_models, tmp_path, monkeypatch, capsys
):
    """A launch other processes kept the host busy during is launched once more, as a trial is; its first rows
    stay in the JSONL marked host_busy, and the table holds the second launch's."""
    import tuner.measurement.measured_launch as launches

    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path / "storage"))
    calls = []

    def first_busy(before, after, wall_s, ours):
        calls.append(wall_s)
        return {"hog[1]": 1.5, "all others": 1.5} if len(calls) == 1 else {"all others": 0.0}

    monkeypatch.setattr(launches, "busy_processes", first_busy)
    study, csv = grid_study(tmp_path), tmp_path / "grid.csv"
    assert main(["record-grid", str(study), "--out", str(csv)]) == 0
    assert "launch 0: host busy: hog[1] during it: its rows are marked host_busy" in capsys.readouterr().out
    rows = [json.loads(line) for line in csv.with_suffix(".jsonl").read_text().splitlines()]
    assert [bool(r.get("host_busy")) for r in rows] == [False, False, True, True, False, False] and len(
        calls
    ) == 2
    assert len(pd.read_csv(csv)) == 2 and "host_busy" not in pd.read_csv(csv).columns


def test_the_recorded_scale_regime_reads_as_docs_scale_says(capsys):
    """The scale sweeps kept in docs/evidence/scale (section 5's, 2026-11-27) read again: docs/scale.md's targets,
    its pooled best and the leaders' figures come from these rows, not from a copy of them."""
    from tuner.paths import REPO_ROOT

    evidence = REPO_ROOT / "docs" / "evidence" / "scale"
    found = recorded_regime(evidence, seeds=10)
    targets = found["targets"]
    assert (
        targets["code_best_k_at_least_12"]
        and targets["code_pays_x2_5"]
        and targets["prose_best_k_below_code"]
    )
    assert targets["predicted_within_one_rung"] and targets["search_within_3pct_in_20"]
    assert (
        targets["summaries_best_lookup_or_stack"] is False
    )  # docs/scale.md says so: the synthetic models do not copy
    readme = (REPO_ROOT / "docs" / "scale.md").read_text()
    pooled = found["pooled"]
    assert f"the pooled best is {pooled['best']} (x{pooled['best_speedup']:.2f}" in readme
    for suite in ("code", "prose", "summarize"):
        best = found["suites"][suite]["best"]
        assert f"{best['family']} K={best['best_k']} x{best['best_speedup']:.2f}" in readme, suite
    assert main(["bench-scale", str(evidence), "--seeds", "1", "--storage", "sqlite:///:memory:"]) == 0
    assert "**the sweeps pooled as the race's traffic**" in capsys.readouterr().out
