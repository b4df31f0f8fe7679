"""`tuner export`: the policy's choice, the files it writes, and that llama-server runs them.

The chosen trials and the written files are checked against the records the real runner
stored, on the stand-in llama-server; the files are then run on the real one.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd
import pytest
import yaml
from fake_llama_server import (
    PINNED_COMMIT,
    get_json,
    run_study_file,
    stop_group,
    wait_for_json,
    write_moe_study,
    write_study,
)

from benchmarks.replay import replay_record
from tuner.cli import main
from tuner.decisions.race import Entry, RaceResult
from tuner.decisions.trial_selection import choose, race_policy
from tuner.errors import UserError
from tuner.machine.llama_build import binary
from tuner.machine.topology import read_topology
from tuner.measurement.launch import ServerCommand, cpu_mask
from tuner.measurement.server_process import free_port, source_blocks
from tuner.output.analysis import families_by_suite, front_2d, trials_frame
from tuner.output.export import (
    Export,
    build_export,
    client_note,
    merge_preset,
    preset_lines,
    production_argv,
    shell_script,
)
from tuner.paths import models_dir
from tuner.storage import store

# ------------------------------------------------------------------ choosing


def test_policies_choose_among_trials_that_meet_the_floor(demo):
    study, record = demo
    records = store.read_trials(study)
    frame = trials_frame(records)
    best = store.best_feasible(study)
    fastest = max((r for r in records if r.complete), key=lambda r: r.metrics.tokens_per_second)
    assert not fastest.feasible  # the stand-in's trial above temperature 0: fast, but below the floor
    assert choose(record, frame)[0] == best.number
    feasible = [r for r in records if r.feasible]
    floor = min(r.metrics.acceptance for r in feasible if r.metrics.acceptance > best.metrics.acceptance)
    accepting = max(
        (r for r in feasible if r.metrics.acceptance >= floor), key=lambda r: r.metrics.tokens_per_second
    )
    assert choose(record, frame, min_acceptance=floor)[0] == accepting.number != best.number
    other = next(r.number for r in feasible if r.number != best.number)
    assert choose(record, frame, trial=other) == (other, f"trial {other} chosen with --trial")
    with pytest.raises(
        UserError,
        match=rf"--trial {fastest.number}: not a complete trial of 'demo' that meets the "
        "quality floor",
    ):
        choose(record, frame, trial=fastest.number)
    top = max(r.metrics.acceptance for r in feasible)
    with pytest.raises(
        UserError,
        match=rf"--min-acceptance 0.95: no feasible trial .* \(best feasible acceptance "
        rf"{top:.2f}\)",
    ):
        choose(record, frame, min_acceptance=0.95)


def test_knee_policy_pays_little_quality_for_much_speed(storage, tmp_path):
    study, record = run_study_file(write_moe_study(tmp_path, storage))
    frame = trials_frame(store.read_trials(study))
    fastest = store.best_feasible(study)
    assert choose(record, frame, "max-tps")[0] == fastest.number
    knee = choose(record, frame, "knee")[0]
    assert knee in set(front_2d(frame, "quality")["trial"])
    chosen = store.read_trial(study.trials[knee])
    assert chosen.metrics.quality > fastest.metrics.quality and chosen.metrics.speedup > 1


def test_no_feasible_trial_is_a_one_line_error(storage, tmp_path, capsys):
    """Scored on expected answers the stand-in never gives, even the baseline falls below the floor."""
    (tmp_path / "answers.yaml").write_text(
        yaml.safe_dump(
            {
                "prompts": [
                    {
                        "id": "add",
                        "text": "def add(a, b):\n",
                        "expected": [{"kind": "contains", "value": "return a + b"}],
                    }
                ]
            }
        )
    )
    study, _ = run_study_file(
        write_study(
            tmp_path,
            storage,
            "hopeless",
            budget={"trials": 1},
            workload={"suites": ["answers.yaml"], "n_predict": 8},
            quality={"scorer": "answers", "floor": 0.99},
        )
    )
    assert [r.metrics.quality for r in store.read_trials(study)] == [0.0]
    assert main(["export", "hopeless", "--storage", storage, "--no-race"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "tuner export: error: study 'hopeless' has no feasible trial (1 complete, none meets the quality "
        "floor 0.99); run more trials or lower quality.floor in the study file\n"
    )


# ------------------------------------------------------------------ what is written


def preset_options(command: ServerCommand, temperature: float) -> list[str]:
    """What a preset section holds for a command: numactl's CPUs as a mask, then every option."""
    pinning = [f"cpu-mask = {cpu_mask(list(command.cpus))}", "cpu-strict = 1"] if command.prefix else []
    options = [
        f"{flag.lstrip('-')} = {'true' if value is None else value}" for flag, value in command.options
    ]
    return pinning + options + [f"temp = {temperature:g}"]


def test_files_script_json_yaml_and_preset(storage, demo, tmp_path, capsys):
    study, record = demo
    best = store.best_feasible(study)
    out, preset = tmp_path / "export", tmp_path / "models-preset.ini"
    assert (
        main(
            ["export", "demo", "--storage", storage, "--no-race", "--out", str(out), "--preset", str(preset)]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert (
        f"chosen: trial {best.number} (highest tokens/s among trials that meet the quality floor)" in printed
    )
    feasible = [r for r in store.read_trials(study) if r.feasible]
    per_suite = {
        suite: max(feasible, key=lambda r: r.per_suite_tokens_per_second[suite])
        for suite in ("code", "prose")
    }
    for suite, r in per_suite.items():
        assert (
            f"best on {suite} (recorded, all its prompts): trial {r.number}, draft, K={r.config.draft_max}, T=0.0: "
            f"{r.per_suite_tokens_per_second[suite]:.1f} tokens/s"
        ) in printed

    script = (out / "serve.sh").read_text()
    assert os.access(out / "serve.sh", os.X_OK)
    argv = [*best.argv, "--temp", "0"]  # the tuned temperature becomes the server's default
    assert script.splitlines()[-1] == (
        "exec " + shlex.join(argv) + ' --host "${LLAMA_ARG_HOST:-127.0.0.1}" '
        '--port "${LLAMA_ARG_PORT:-8080}" "$@"'
    )

    exported = json.loads((out / "config.json").read_text())
    assert exported == yaml.safe_load((out / "config.yaml").read_text())
    assert (exported["trial"], exported["config"], exported["argv"]) == (
        best.number,
        best.config.as_dict(),
        argv,
    )
    assert exported["metrics"] == asdict(best.metrics) and exported["race"] is None
    assert [(r["suite"], r["trial"], r["draft_max"]) for r in exported["per_content_type"]] == [
        (suite, r.number, r.config.draft_max) for suite, r in per_suite.items()
    ]
    assert exported["llama_cpp"]["commit"] == record.fingerprint["llama_commit"] == PINNED_COMMIT
    assert exported["preset_section"] == "demo"

    text = preset.read_text()
    assert text.startswith("version = 1\n")
    section = text.split("[demo]\n", 1)[1].splitlines()
    assert [line for line in section if not line.startswith(";")] == preset_options(best.command, 0.0)
    assert any(line.startswith("threads-batch = ") for line in section)  # carried, with how it was chosen:
    how = [line for line in section if line.startswith(("; threads ", "; threads-batch "))]
    assert [line.split(":")[0] for line in how] == [
        f"; threads {best.config.threads}",
        f"; threads-batch {best.config.threads_batch or best.config.threads}",
    ]


def quoted_export(command: ServerCommand, temperature: float = 0.0) -> Export:
    return Export(
        study="big model",
        trial=3,
        policy="max-tps",
        config={"temperature": temperature},
        metrics={"tokens_per_second": 10.0, "speedup": 1.5, "acceptance": 0.5, "quality": 1.0},
        argv=production_argv(command.argv, temperature),
        command=command,
        per_content_type=[],
        llama_cpp={"commit": "0c1e570"},
        machine={"cpu_model": "x"},
    )


def crafted_race(winner: int, decided: bool, loss_bound: float, forecast: str = "") -> RaceResult:
    """A race of the baseline (trial 0) and trial 2 (x1.16 [0.93, 1.44] over it on 4 paired rounds)."""
    entries = [
        Entry(
            trial=2,
            label="trial-2",
            config={"spec_type": "ngram-simple"},
            recorded_tokens_per_second=30.0,
            rates=[29.0, 31.0, 30.0, 28.0],
            mean_tokens_per_second=29.5,
            speedup=1.16,
            speedup_low=0.93,
            speedup_high=1.44,
            status="leader",
            accepted=[],
            rounds=[1, 2, 3, 4],
        ),
        Entry(
            trial=0,
            label="trial-0",
            config={"spec_type": "none"},
            recorded_tokens_per_second=25.0,
            rates=[25.0, 26.0, 24.0, 25.0],
            mean_tokens_per_second=25.0,
            speedup=1.0,
            speedup_low=1.0,
            speedup_high=1.0,
            status="winner",
            accepted=[],
            rounds=[1, 2, 3, 4],
        ),
    ]
    verdict = (
        "nothing was shown faster than the baseline after 4 rounds"
        if winner == 0
        else "undecided after 4 rounds"
    )
    return RaceResult(
        rounds=4,
        baseline_trial=0,
        entries=entries,
        winner=winner,
        decided=decided,
        verdict=verdict,
        rule="",
        loss=0.02,
        drafted={},
        outliers=[],
        launches=8,
        confirmation=None,
        loss_bound=loss_bound,
        leader=2,
        forecast=forecast,
    )


def test_a_race_that_showed_nothing_faster_exports_the_baseline_with_the_best_candidate_beside_it():
    """Issue 31, item 6: the baseline is the default; the preset no longer says 'won the finalist race'."""
    race = crafted_race(
        0, False, 0.44, "to tell 2% apart at this host's 7.8% per-round spread: about 40 more rounds"
    )
    export = replace(quoted_export(ServerCommand((), "/opt/llama-server", ())), trial=0, race=race)
    export = replace(export, policy=race_policy(race, "highest tokens/s"))
    comment = preset_lines(export)[1]
    assert "nothing was shown faster than the baseline" in comment and "won the finalist race" not in comment
    assert "best candidate trial 2: x1.16 [0.93, 1.44]" in comment
    decision = yaml.safe_load(yaml.safe_dump(export.to_dict()))["decision"]
    assert (
        decision["baseline_deployed"] and decision["deployed_trial"] == 0 and decision["loss_bound"] == 0.44
    )
    assert decision["best_candidate"]["trial"] == 2 and decision["best_candidate"]["speedup_low"] == 0.93
    assert (
        decision["loss_bound_text"]
        == "deployed the baseline, trial 0; no other finalist is more than 44.0% faster (95%, 4 rounds)"
    )
    script = shell_script(export)
    assert (
        "# What it may lose: deployed the baseline" in script and "# To settle it: to tell 2% apart" in script
    )
    assert "nothing was shown faster than the baseline" in client_note(export, [])


def test_an_undecided_race_exports_its_highest_estimate_and_says_what_it_may_lose():
    race = crafted_race(2, False, 0.061)
    policy = race_policy(race, "highest tokens/s")
    assert policy.startswith("highest estimate of an undecided finalist race") and "won" not in policy
    assert policy.endswith("deployed trial 2; no other finalist is more than 6.1% faster (95%, 4 rounds)")
    decided = race_policy(crafted_race(2, True, 0.0), "highest tokens/s")
    assert (
        decided.startswith("won the finalist race")
        and "no other finalist is faster (95%, 4 rounds)" in decided
    )
    assert Export.to_dict(replace(quoted_export(ServerCommand((), "/x", ())), race=None))["decision"] is None


def test_script_quotes_every_argument():
    export = quoted_export(ServerCommand((), "/opt/my llama/llama-server", (("--model", "/m/it's.gguf"),)))
    exec_line = shell_script(export).splitlines()[-1]
    assert exec_line.startswith(
        """exec '/opt/my llama/llama-server' --model '/m/it'"'"'s.gguf' --temp 0 --host"""
    )


def test_preset_turns_numactl_pinning_into_cpu_mask_and_keeps_policy_as_a_comment():
    command = ServerCommand(
        prefix=("/usr/bin/numactl", "--physcpubind=0-3", "--interleave=all"),
        binary="/opt/llama/llama-server",
        options=(
            ("--model", "/m/t.gguf"),
            ("--threads", "4"),
            ("--no-webui", None),
            ("--numa", "numactl"),
            ("--override-kv", "qwen3moe.expert_used_count=int:3"),
        ),
        cpus=(0, 1, 2, 3),
    )
    lines = preset_lines(quoted_export(command, temperature=0.7))
    assert lines[0] == "[big-model]"  # the study name made INI-safe
    assert (
        "; tuned under numactl --interleave=all: start the router with it to keep that memory policy" in lines
    )
    options = [line for line in lines if not line.startswith((";", "["))]
    assert options == [
        "cpu-mask = 0xf",
        "cpu-strict = 1",
        "model = /m/t.gguf",
        "threads = 4",
        "no-webui = true",
        "override-kv = qwen3moe.expert_used_count=int:3",
        "temp = 0.7",
    ]
    with pytest.raises(UserError, match="contains ; # or a newline"):
        preset_lines(quoted_export(ServerCommand((), "/opt/llama-server", (("--model", "/m/a#b.gguf"),))))
    with pytest.raises(UserError, match="repeats --override-kv"):
        preset_lines(
            quoted_export(
                ServerCommand(
                    (),
                    "/opt/llama-server",
                    (("--override-kv", "a=int:1"),),
                    extra=("--override-kv", "b=int:2"),
                )
            )
        )


def test_preset_file_keeps_other_sections_and_replaces_its_own(tmp_path):
    path = tmp_path / "models-preset.ini"
    path.write_text("version = 1\n\n[*]\nc = 8192\n\n[hand-written]\nmodel = /m/x.gguf ; mine\n")
    merge_preset(path, "a", ["[a]", "model = /m/a.gguf"])
    merge_preset(path, "b", ["[b]", "model = /m/b.gguf"])
    merge_preset(path, "a", ["[a]", "model = /m/a2.gguf"])
    assert path.read_text() == (
        "version = 1\n\n[*]\nc = 8192\n\n[hand-written]\nmodel = /m/x.gguf ; mine\n\n"
        "[a]\nmodel = /m/a2.gguf\n\n[b]\nmodel = /m/b.gguf\n"
    )


# ------------------------------------------------------------------ real llama-server


def synthetic(name: str) -> Path:
    path = models_dir() / "synthetic" / f"{name}.gguf"
    assert path.is_file(), f"{path} missing: the synthetic_models fixture should have generated it"
    return path


@pytest.fixture(scope="module")
def served(synthetic_models, storage, tmp_path_factory):
    """(study, record, the draft's trial) of a tiny study on the pinned llama-server and the
    synthetic family: the baseline, then one draft model with n-gram lookup stacked on it. Tests export the draft with --trial: which
    of the two the real build measures faster depends on how busy the machine is."""
    folder = tmp_path_factory.mktemp("served")
    (folder / "prompts.yaml").write_text(
        yaml.safe_dump(
            {
                "prompts": [
                    {"id": "code-1", "text": "def add(a, b):\n    return"},
                    {"id": "code-2", "text": "for i in range(10):\n    print("},
                ]
            }
        )
    )
    threads = min(2, read_topology().physical_cores)
    (folder / "served.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "served",
                "target": str(synthetic("target")),
                "drafts": [str(synthetic("draft-small"))],
                "search_space": {
                    "overrides": {
                        "spec_type": ["none", "draft-simple"],
                        "draft_max": [4],
                        "temperature": 0.0,
                        "threads": threads,
                        "lookup": ["none", "ngram-simple"],
                        "ngram_key": [2],
                        "lookup_max": [8],
                    }
                },
                # a stack: prompt lookup in front of the draft model, one server
                "warm_start": [
                    {
                        "spec_type": "draft-simple",
                        "draft": "draft-small",
                        "draft_max": 4,
                        "temperature": 0.0,
                        "threads": threads,
                        "lookup": "ngram-simple",
                        "ngram_key": 2,
                        "lookup_max": 8,
                    }
                ],
                "budget": {"trials": 2},
                "workload": {"suites": ["prompts.yaml"], "n_predict": 16},
                "measurement": {"warmup": 0, "repetitions": 1, "ctx_size": 1024, "trial_timeout_s": 120},
                "race": {"min_rounds": 3, "max_rounds": 3, "confirm_rounds": 3},
                "storage": storage,
            }
        )
    )
    study, record = run_study_file(folder / "served.yaml")
    return study, record, store.read_trials(study)[1]


def post_json(url: str, body: dict, timeout: float = 60.0) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.load(resp)


def start(argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    with open(log, "wb") as fh:
        return subprocess.Popen(
            argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )


@pytest.mark.llama
@pytest.mark.slow
def test_exported_script_serves_the_synthetic_family(served, storage, tmp_path):
    draft = served[2]
    out, preset = tmp_path / "export", tmp_path / "models-preset.ini"
    assert (
        main(
            [
                "export",
                "served",
                "--storage",
                storage,
                "--trial",
                str(draft.number),
                "--no-race",
                "--out",
                str(out),
                "--preset",
                str(preset),
            ]
        )
        == 0
    )
    port = free_port()
    proc = start(
        [str(out / "serve.sh")], tmp_path / "serve.log", env={**os.environ, "LLAMA_ARG_PORT": str(port)}
    )
    try:
        wait_for_json(proc, f"http://127.0.0.1:{port}/health", 90, "llama-server")
        answer = post_json(
            f"http://127.0.0.1:{port}/completion",
            {"prompt": "def add(a, b):\n    return", "n_predict": 16, "temperature": 0},
        )
        assert answer["timings"]["predicted_n"] > 0
        assert answer["timings"].get("draft_n", 0) > 0, "the exported command did not speculate"
    finally:
        stop_group(proc)  # SIGTERM: a router stops its children itself
    log = (tmp_path / "serve.log").read_text()
    assert "draft-small.gguf" in log


@pytest.mark.llama
@pytest.mark.slow
def test_preset_file_is_accepted_by_the_llama_server_router(served, tmp_path):
    """The stacked section is served by the real router, and both sources draft (its children's
    per-source statistics, at the trace verbosity the preset's [*] section asks for)."""
    study, record, draft = served
    assert draft.config.stacked
    preset = tmp_path / "models-preset.ini"
    preset.write_text("version = 1\n\n[*]\nc = 1024\nlog-verbosity = 4\n")
    merge_preset(
        preset,
        "served",
        preset_lines(build_export(record, draft, trials_frame(store.read_trials(study)), "max-tps")),
    )
    port = free_port()
    proc = start(
        [
            str(binary("llama-server")),
            "--models-preset",
            str(preset),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        tmp_path / "router.log",
    )
    try:
        wait_for_json(proc, f"http://127.0.0.1:{port}/health", 90, "llama-server")
        models = get_json(f"http://127.0.0.1:{port}/models")
        assert "served" in [m["id"] for m in models["data"]]
        answer = post_json(
            f"http://127.0.0.1:{port}/v1/completions",
            {"model": "served", "prompt": "def add(a, b):\n    return", "max_tokens": 64, "temperature": 0},
        )
        assert answer["choices"][0]["text"] != "" or answer["usage"]["completion_tokens"] > 0
        totals = wait_for_sources(tmp_path / "router.log")
    finally:
        stop_group(proc)  # SIGTERM: a router stops its children itself
    assert set(totals) == {"ngram-simple", "draft-simple"}, totals
    assert all(drafted > 0 for drafted, _ in totals.values()), f"a source drafted nothing: {totals}"


def wait_for_sources(log: Path, timeout_s: float = 10.0) -> dict[str, tuple[int, int]]:
    """The last per-source statistics block a server logged (the log lags the answer a little)."""
    deadline = time.monotonic() + timeout_s
    while not (blocks := source_blocks(log.read_text(errors="replace"))) and time.monotonic() < deadline:
        time.sleep(0.1)
    return blocks[-1] if blocks else {}


@pytest.mark.llama
@pytest.mark.slow
def test_export_races_the_choice_against_the_baseline_side_by_side(
    served, storage, tmp_path, capsys, monkeypatch
):
    study, record, draft = served
    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path))  # the race's server logs
    out, preset = tmp_path / "export", tmp_path / "models-preset.ini"
    assert (
        main(
            [
                "export",
                "served",
                "--storage",
                storage,
                "--trial",
                str(draft.number),
                "--out",
                str(out),
                "--preset",
                str(preset),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "race round 3:" in printed and "winner: trial" in printed and "verdict: " in printed
    race = json.loads((out / "config.json").read_text())["race"]
    assert race["rounds"] == 3 and {e["trial"] for e in race["entries"]} == {
        draft.number,
        race["baseline_trial"],
    }
    for e in race["entries"]:  # a launch left out as an outlier (a busy host) is not among the rates
        left_out = sum(1 for line in race["outliers"] if f"trial-{e['trial']} measured" in line)
        assert len(e["rates"]) + left_out == 3
        if e["speedup_high"] is not None:  # null: too few rounds for an interval (JSON has no infinity)
            assert e["speedup_low"] <= e["speedup"] <= e["speedup_high"]
    decided = json.loads((out / "config.json").read_text())["decision"]
    assert (decided["loss_bound"] is None) == (decided["loss_bound_reason"] is not None)
    assert race["drafted"][f"trial-{draft.number}"] > 0  # the draft configuration drafted while racing
    assert store.read_race(study) is not None  # recorded with the study
    # one launch per contender and round (selection and confirmation), each with its own log
    logs = list((tmp_path / "logs" / "served").glob(f"remeasure-trial-{draft.number}-*.log"))
    relaunched = (
        sum(  # a confirmation round's outlier is launched again (up to rounds.RELAUNCHES times), each
            len(line.split("launched again: ")[1].split(", "))  # its own log; a selection round's is left out
            for line in race["outliers"]
            if f"trial-{draft.number} measured" in line and "launched again: " in line
        )
    )
    assert len(logs) == 3 + (race["confirmation"]["rounds"] if race["confirmation"] else 0) + relaunched


@pytest.mark.llama
@pytest.mark.slow
def test_a_stacked_trial_records_what_each_source_drafted(served):
    """Per request, what each source drafted and had accepted, from llama-server's own statistics: the parts
    add up to the request's own draft counters, and the report's family table reads them."""
    study, record, stacked = served
    samples = stacked.samples
    assert samples and all(
        {name for name, _, _ in s["sources"]} == {"ngram-simple", "draft-simple"} for s in samples
    )
    for s in samples:
        assert sum(d for _, d, _ in s["sources"]) == s["draft_n"]
        assert sum(a for _, _, a in s["sources"]) == s["draft_n_accepted"]
    families = families_by_suite(trials_frame(store.read_trials(study)), store.read_trials(study))
    row = families[families["family"] == "stack"].iloc[0]
    assert (
        row["trial"] == stacked.number
        and "ngram-simple" in row["sources"]
        and "draft-simple" in row["sources"]
    )


def test_break_even_is_the_fewest_users_where_speculation_is_not_shown_to_pay():
    """One launch each: a ratio counts only beyond 1.96 * sqrt(2) * the launch spread (x0.87-x1.15 at 5%)."""
    from tuner.output.analysis import break_even

    def curves(rows):
        return pd.DataFrame(rows, columns=["family", "users", "aggregate_tokens_per_second", "trial"])

    pays = curves(
        [("none", 1, 100.0, 0), ("draft", 1, 150.0, 1), ("none", 2, 180.0, 0), ("lookup", 2, 216.0, 2)]
    )
    assert break_even(pays).startswith(
        "speculation pays at every measured level (1 user: x1.50 (draft); 2 users: x1.20"
    )
    assert "beyond x0.87-x1.15" in break_even(pays) and "launch spread of 5%" in break_even(pays)
    stops = curves(
        [
            ("none", 1, 100.0, 0),
            ("stack", 1, 150.0, 1),
            ("none", 2, 200.0, 0),
            ("stack", 2, 160.0, 1),
            ("none", 4, 350.0, 0),
            ("stack", 4, 300.0, 1),
        ]
    )
    assert break_even(stops).startswith("speculation stops paying at 2 users at once on this host")
    close = curves(
        [("none", 1, 100.0, 0), ("stack", 1, 150.0, 1), ("none", 2, 200.0, 0), ("stack", 2, 182.0, 1)]
    )
    assert break_even(close).startswith(
        "speculation is shown to pay up to 1 user; at 2 users at once it is within the launch spread"
    ), break_even(close)
    assert break_even(close, spread=0.02).startswith("speculation stops paying at 2 users"), (
        "a quieter host tells"
    )
    assert break_even(curves([("none", 1, 100.0, 0)])).startswith("no break-even figure")


@pytest.mark.llama
@pytest.mark.slow
def test_a_load_class_section_serves_its_users_at_once_with_the_real_router(
    synthetic_models, storage, tmp_path
):
    """A study of 1 and 2 users exports a STUDY-c2 section with 2 slots; the real router serves 2 requests
    to it at once, and ROUTER.md says which section is for which load."""
    (tmp_path / "prompts.yaml").write_text(
        yaml.safe_dump(
            {
                "prompts": [
                    {"id": "code-1", "text": "def add(a, b):\n    return"},
                    {"id": "code-2", "text": "for i in range(10):\n"},
                ]
            }
        )
    )
    threads = min(2, read_topology().physical_cores)
    (tmp_path / "load.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "loadclass",
                "target": str(synthetic("target")),
                "drafts": [],
                "search_space": {
                    "overrides": {
                        "spec_type": ["none", "ngram-mod"],
                        "draft_max": [4],
                        "ngram_key": [3],
                        "temperature": 0.0,
                        "threads": threads,
                    }
                },
                "warm_start": [
                    {
                        "spec_type": "ngram-mod",
                        "draft_max": 4,
                        "ngram_key": 3,
                        "temperature": 0.0,
                        "threads": threads,
                    }
                ],
                "budget": {"trials": 2},
                "storage": storage,
                "workload": {"suites": ["prompts.yaml"], "n_predict": 16, "concurrency": [1, 2]},
                "measurement": {"warmup": 0, "repetitions": 1, "ctx_size": 1024, "trial_timeout_s": 120},
            }
        )
    )
    run_study_file(tmp_path / "load.yaml")
    out, preset = tmp_path / "export", tmp_path / "models-preset.ini"
    assert (
        main(
            [
                "export",
                "loadclass",
                "--storage",
                storage,
                "--no-race",
                "--out",
                str(out),
                "--preset",
                str(preset),
            ]
        )
        == 0
    )
    text = preset.read_text()
    section = text[text.index("[loadclass-c2]") :]
    assert "parallel = 2" in section.split("\n[")[0] and "[loadclass-c1]" in text
    assert "`loadclass-c2`: up to 2 simultaneous user(s)" in (out / "ROUTER.md").read_text()
    port = free_port()
    proc = start(
        [
            str(binary("llama-server")),
            "--models-preset",
            str(preset),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        tmp_path / "router.log",
    )
    try:
        wait_for_json(proc, f"http://127.0.0.1:{port}/health", 90, "llama-server")
        body = {
            "model": "loadclass-c2",
            "prompt": "def add(a, b):\n    return",
            "max_tokens": 16,
            "temperature": 0,
        }
        post_json(f"http://127.0.0.1:{port}/v1/completions", body)  # loads the child server
        with ThreadPoolExecutor(2) as pool:
            answers = list(
                pool.map(lambda _: post_json(f"http://127.0.0.1:{port}/v1/completions", body), range(2))
            )
    finally:
        stop_group(proc)
    assert all(a["usage"]["completion_tokens"] > 0 for a in answers)


def test_the_preset_says_how_threads_and_prompt_threads_were_chosen():
    import pandas as pd

    from tuner.decisions.trial_selection import thread_notes
    from tuner.knobs.config import TrialConfig
    from tuner.storage.records import TrialRecord

    space = {"threads": ["IntRange", {"low": 1, "high": 96, "step": 1, "log": False}]}
    trial = TrialRecord(5, "COMPLETE", "search", TrialConfig(threads=48))
    threads, batch = thread_notes(replay_record("s", space, ("tokens_per_second",)), trial, pd.DataFrame())
    assert threads.startswith("threads 48: searched over 1..96") and batch.startswith(
        "threads-batch 48: not tuned"
    )
    searched = {**space, "threads_batch": space["threads"]}
    frame = pd.DataFrame(
        {
            "trial": [5, 6],
            "feasible": [True, True],
            "threads": [48, 48],
            "threads_batch": [96, 48],
            "prompt_tokens_per_second": [410.0, 300.0],
        }
    )
    tuned = TrialRecord(5, "COMPLETE", "search", TrialConfig(threads=48, threads_batch=96))
    _, batch = thread_notes(replay_record("s", searched, ("tokens_per_second",)), tuned, frame)
    assert batch.startswith(
        "threads-batch 96: tuned apart on prompt throughput, 410 prompt tokens/s against 300 at 48"
    )


def test_the_exported_speedup_is_the_sentinels_not_a_disturbed_baseline_one():
    """A trial recorded at x13.94 against a disturbed first baseline reading is exported at the sentinels' figure;
    without a corrected figure the recorded one stands."""
    from tuner.decisions.export_choice import sentinel_speedup
    from tuner.knobs.config import TrialConfig
    from tuner.storage.records import Metrics, TrialRecord

    trial = TrialRecord(
        number=1,
        state="COMPLETE",
        role="search",
        config=TrialConfig(spec_type="draft-simple", draft="d", draft_max=8, threads=2),
        worker="h:1",
        metrics=Metrics(524.2, 0.5, 1.0, 13.94),
    )
    frame = pd.DataFrame({"trial": [0, 1], "speedup": [1.0, 524.2 / 362.7]})
    assert sentinel_speedup(trial, frame) == pytest.approx(1.445, abs=1e-3)
    assert sentinel_speedup(trial, frame.assign(speedup=[1.0, None])) == 13.94
    assert sentinel_speedup(trial, frame[frame["trial"] == 0]) == 13.94
