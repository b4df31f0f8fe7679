"""Reliability on one host, trial by trial: each fault fails its trial with a reason and the
log tail and the study goes on; a permanent failure is not launched again; Ctrl-C, SIGTERM,
an exception or a killed tuner leave no server behind and no trial running, and the
study resumes; a SQLite study takes one process; bad storage input is one line.

Faults a real llama-server cannot show on demand come from the stand-in
(tests/fake_llama_server.py); the real pinned llama.cpp shows a truncated GGUF, a
SIGKILL and a SIGSTOP. tests/test_server_process.py covers the same faults for one server process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
import yaml
from fake_llama_server import alive, launches, port_is_free, wait_for, write_study
from gguf_factory import write_gguf

from tuner.cli import main
from tuner.errors import UserError
from tuner.measurement.failures import TrialFailure
from tuner.paths import models_dir
from tuner.prepare import prepare
from tuner.progress import Progress
from tuner.run.objective import StudyObjective
from tuner.run.study_loop import run_study
from tuner.run.study_start import open_study
from tuner.storage import store
from tuner.storage.coordination import make_storage, tally
from tuner.studyfile.spec import load_spec

COMPLETE, FAIL, RUNNING = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.FAIL,
    optuna.trial.TrialState.RUNNING,
)
SYNTH = models_dir() / "synthetic"

# draft length K -> the fault the stand-in shows for it -> the reason its trial must record
FAULTS = {
    2: ("launch", "launch_failed"),
    3: ("exit137", "out_of_memory"),
    4: ("crash", "crashed"),
    5: ("hang", "timeout"),
    6: ("crash_mid_run", "crashed"),
    7: ("http500", "server_unreachable"),
    8: ("nodraft", "speculation_unavailable"),
}


def tuner(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", *args],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def draft_k(k: int) -> dict:
    return {"spec_type": "draft-simple", "draft": "draft", "draft_max": k}


def sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'studies.db'}"


def stored(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name="t", storage=sqlite(tmp_path))


# ------------------------------------------------------------------ faults, trial by trial


def test_each_fault_fails_its_trial_with_reason_and_log_tail_and_the_study_goes_on(
    tmp_path, env, monkeypatch
):
    monkeypatch.setenv(
        "FAKE_LLAMA_FAULTS", json.dumps({f"--spec-draft-n-max {k} ": f for k, (f, _) in FAULTS.items()})
    )
    path = write_study(
        tmp_path,
        sqlite(tmp_path),
        search_space={
            "overrides": {
                "spec_type": ["none", "draft-simple"],
                "draft_max": [*FAULTS, 10],
                "temperature": 0.0,
                "threads": 1,
            }
        },
        measurement={"warmup": 0, "repetitions": 1, "ctx_size": 256, "trial_timeout_s": 3},
        warm_start=[draft_k(k) for k in FAULTS] + [draft_k(10)],
        budget={"trials": len(FAULTS) + 2},
    )
    lines: list[str] = []
    study = run_study(load_spec(path), progress=Progress(lines.append))

    trials = study.get_trials()
    assert [t.state for t in trials] == [COMPLETE] + [FAIL] * len(FAULTS) + [COMPLETE]
    for trial in trials[1:-1]:
        fault, reason = FAULTS[trial.params["draft_max"]]
        assert store.read_trial(trial).failure.reason == reason, (fault, store.read_trial(trial))
        assert store.read_trial(trial).failure.detail
        assert "loading model from" in store.read_trial(trial).log_tail, fault  # the server's own words
        assert any(f"trial {trial.number}: FAILED ({reason}:" in line for line in lines)
    nodraft = next(t for t in trials if t.params.get("draft_max") == 8)
    assert "vocabs are not compatible" in store.read_trial(nodraft).failure.detail
    assert store.read_trial(trials[-1]).drafted > 0  # measured normally after all of them
    assert tally(study).counted == len(FAULTS) + 2
    assert not [launch for launch in launches(tmp_path / "launches.jsonl") if alive(launch["pid"])]

    # Again: a permanent failure (out of memory) is recorded at once without a launch;
    # a crash may be a fluke, so that configuration is launched again.
    k6_launches = sum(
        "--spec-draft-n-max 6" in " ".join(x["argv"]) for x in launches(tmp_path / "launches.jsonl")
    )
    study.enqueue_trial(draft_k(3))
    study.enqueue_trial(draft_k(6))
    study = run_study(load_spec(path), trials=len(FAULTS) + 4, progress=Progress(lines.append))
    first_oom = next(t for t in trials if t.params.get("draft_max") == 3)
    oom_again, crash_again = study.get_trials()[-2:]
    assert store.read_trial(oom_again).failure.reason == "out_of_memory"
    assert (
        store.read_trial(oom_again).failure.detail
        == f"same configuration already failed permanently in trial {first_oom.number}"
    )
    assert store.read_trial(oom_again).log_tail == store.read_trial(first_oom).log_tail
    assert not (
        tmp_path / "storage" / "logs" / "t" / f"trial-{oom_again.number}.log"
    ).exists()  # never launched
    assert store.read_trial(crash_again).failure.reason == "crashed"
    assert (
        sum("--spec-draft-n-max 6" in " ".join(x["argv"]) for x in launches(tmp_path / "launches.jsonl"))
        == k6_launches + 1
    )


def test_an_exception_mid_trial_still_stops_the_server(tmp_path, env, monkeypatch):
    def buggy_measurement(server, *args, **kwargs):
        assert server.complete("def f():\n", 4, 0.0, 1).predicted_n == 4  # the server is up and answering
        raise RuntimeError("a bug while measuring")

    monkeypatch.setattr("tuner.measurement.measured_launch.run_workload", buggy_measurement)
    path = write_study(tmp_path, sqlite(tmp_path))
    with pytest.raises(RuntimeError, match="a bug while measuring"):
        run_study(load_spec(path), progress=Progress.quiet())
    (launch,) = launches(tmp_path / "launches.jsonl")
    assert not alive(launch["pid"]) and port_is_free(launch["port"])
    assert [t.state for t in stored(tmp_path).trials] == [FAIL]


# ------------------------------------------------------------------ interrupts and killed tuners


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupt_mid_trial_records_it_stops_the_server_and_resumes(tmp_path, env, sig):
    path = write_study(
        tmp_path,
        sqlite(tmp_path),
        budget={"trials": 2},
        measurement={"warmup": 0, "repetitions": 1, "ctx_size": 256, "trial_timeout_s": 60},
    )
    proc = tuner(["run", str(path)], {**env, "FAKE_LLAMA_DELAY_S": "120"})
    try:
        launch = wait_for(lambda: launches(tmp_path / "launches.jsonl"), 60, "the baseline's server")[0]
        log = tmp_path / "storage" / "logs" / "t" / "trial-0.log"
        wait_for(lambda: "processing task" in log.read_text(), 30, "a request in flight")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and f"tuner run {path}` again to resume" in err
    assert not alive(launch["pid"]) and port_is_free(launch["port"])
    (trial,) = stored(tmp_path).trials
    assert trial.state == FAIL and store.read_trial(trial).failure.reason == "interrupted"
    assert "processing task" in store.read_trial(trial).log_tail

    resumed = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "run", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    study = stored(tmp_path)
    # the interrupted trial measured nothing: it does not count, and the baseline runs again
    assert [t.state for t in study.trials] == [FAIL, COMPLETE, COMPLETE]
    assert store.role_of(study.trials[1]) == "baseline" and store.read_reference(study).trial == 1
    assert tally(study).counted == 2


def test_sqlite_takes_one_process_and_a_killed_run_resumes(tmp_path, env, capsys, monkeypatch):
    path = write_study(
        tmp_path,
        sqlite(tmp_path),
        budget={"trials": 3},
        measurement={"warmup": 0, "repetitions": 1, "ctx_size": 256, "trial_timeout_s": 60},
    )
    proc = tuner(["run", str(path)], {**env, "FAKE_LLAMA_DELAY_S": "120"})
    try:
        launch = wait_for(lambda: launches(tmp_path / "launches.jsonl"), 60, "the baseline's server")[0]
        assert (
            main(["run", str(path), "--no-wait"]) == 75
        )  # the host's measurement lock (tuner.machine.hostlock)
        assert (
            f"another measurement runs on this host (pid {proc.pid}, tuner run, study "
            in capsys.readouterr().err
        )
        host_lock = os.environ.get("TUNER_MEASURE_LOCK")
        monkeypatch.setenv(
            "TUNER_MEASURE_LOCK", str(tmp_path / "other-host.lock")
        )  # then the study's own lock
        assert main(["run", str(path)]) == 2
        assert f"is being run by pid {proc.pid} on " in capsys.readouterr().err
        if host_lock is None:
            monkeypatch.delenv("TUNER_MEASURE_LOCK")
        else:
            monkeypatch.setenv("TUNER_MEASURE_LOCK", host_lock)
        assert main(["worker", str(path)]) == 2
        assert "workers need a database server" in capsys.readouterr().err
    finally:
        proc.kill()  # SIGKILL: no cleanup of its own
        proc.communicate()
    wait_for(lambda: not alive(launch["pid"]), 5, "the kernel to kill the killed tuner's server")
    wait_for(lambda: port_is_free(launch["port"]), 5, "its port to be free")  # its threads end a moment later
    assert [t.state for t in stored(tmp_path).trials] == [RUNNING]

    run_study(load_spec(path), progress=Progress.quiet())  # the lock died with the process
    study = stored(tmp_path)
    assert [t.state for t in study.trials] == [FAIL, COMPLETE, COMPLETE, COMPLETE]
    retry = study.trials[1]
    assert retry.system_attrs["failed_trial"] == 0 and store.role_of(retry) == "baseline"
    assert tally(study).counted == 3  # the orphan was replaced by its retry, not counted as well


# ------------------------------------------------------------------ bad input


def test_unreachable_storage_is_one_line_without_the_password(tmp_path, env, capsys):
    url = "postgresql://tuner:s3cret@127.0.0.1:1/tuner"
    path = write_study(tmp_path, url)
    for args in (["run", str(path)], ["worker", str(path), "--storage", url]):
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "cannot open" in err, err
        assert "s3cret" not in err and "postgresql://tuner:***@127.0.0.1:1/tuner" in err
    assert not (tmp_path / "storage").exists()  # nothing written


def test_a_storage_that_cannot_be_opened_is_one_line_from_every_opener():
    """Running a study (make_storage) and reading one (open_stored_study) say the same line."""
    for url, problem in (
        ("postgresql://tuner:s3cret@127.0.0.1:1/tuner", "connection"),
        ("postgresql://tuner:s3cret@127.0.0.1:port/tuner", "invalid literal"),
    ):
        lines = []
        for opener in (lambda: make_storage(url), lambda: store.open_stored_study("x", url)):
            with pytest.raises(UserError) as raised:
                opener()
            lines.append(str(raised.value))
        assert lines[0] == lines[1], lines
        line = lines[0]
        assert "\n" not in line and "s3cret" not in line and problem in line, line
        assert line.startswith("storage postgresql://") and ": cannot open (" in line, line
        assert line.endswith("; check the URL and that the database is reachable"), line


def test_existing_study_with_another_search_space_is_refused_untouched(tmp_path, env, capsys):
    path = write_study(tmp_path, sqlite(tmp_path), budget={"trials": 1})
    run_study(load_spec(path), progress=Progress.quiet())
    digest = store.read_study_record(stored(tmp_path)).space_digest
    write_study(
        tmp_path,
        sqlite(tmp_path),
        budget={"trials": 2},
        search_space={
            "overrides": {
                "spec_type": ["none", "draft-simple"],
                "draft_max": [2, 4],
                "temperature": 0.0,
                "threads": 1,
            }
        },
    )
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "search space differs" in err
    after = stored(tmp_path)
    assert len(after.trials) == 1 and store.read_study_record(after).space_digest == digest


@pytest.mark.parametrize(
    "edit, changed",
    [
        (
            lambda folder: (folder / "suite.yaml").write_text(
                (folder / "suite.yaml").read_text().replace("def add(a, b)", "def add(x, y)")
            ),
            "workload (prompt texts) differs",
        ),
        (
            lambda folder: write_study(
                folder, sqlite(folder), workload={"suites": ["suite.yaml"], "n_predict": 16}
            ),
            "measurement.n_predict differs (the study has 8, this run has 16)",
        ),
        (
            lambda folder: write_study(folder, sqlite(folder), quality={"scorer": "agreement", "floor": 0.5}),
            "quality.floor differs (the study has 0.9, this run has 0.5)",
        ),
        # issue 21: the target replaced at the same path was two truncated JSON blobs; now the entry that differs
        (
            lambda folder: write_gguf(folder / "models" / "target.gguf", name="tiny-v2"),
            'target model name differs (the study has "tiny", this run has "tiny-v2")',
        ),
    ],
)
def test_resume_after_a_change_that_breaks_comparability_is_refused_in_one_line(
    tmp_path, env, capsys, edit, changed
):
    """An edited prompt used to crash a resumed study; a new n_predict made every trial infeasible."""
    path = write_study(tmp_path, sqlite(tmp_path), budget={"trials": 2})
    run_study(load_spec(path), progress=Progress.quiet())
    edit(tmp_path)
    for command in (["run", str(path), "--trials", "3"], ["export", str(path), "--out", str(tmp_path / "x")]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "{" not in err and changed in err, err  # no JSON blob
    assert (
        len(stored(tmp_path).trials) == 2 and not (tmp_path / "x").exists()
    )  # nothing added, nothing written


def test_a_study_measured_before_a_remembering_lookup_got_a_launch_per_pass_is_not_resumed(
    tmp_path, env, capsys
):
    """A study whose space holds ngram-mod stores how such a lookup is measured; one stored before the rule (its
    ngram-mod figures drafted from earlier passes) is not resumed, but is still exported: a race launches every
    finalist afresh. A space without such a lookup stores nothing new, so its old studies resume."""
    from tuner.storage.records import REMEMBERING_LOOKUP

    overrides = {"spec_type": ["none", "ngram-mod"], "draft_max": [2, 4], "temperature": 0.0, "threads": 1}
    path = write_study(
        tmp_path, sqlite(tmp_path), budget={"trials": 2}, search_space={"overrides": overrides}
    )
    run_study(load_spec(path), progress=Progress.quiet())
    study = stored(tmp_path)
    record = store.read_study_record(study)
    assert record.measurement[REMEMBERING_LOOKUP] == "a launch per pass"
    before = replace(
        record, measurement={k: v for k, v in record.measurement.items() if k != REMEMBERING_LOOKUP}
    )
    store.write_study_record(study, before)  # as a tuner before the rule stored it
    assert main(["run", str(path), "--trials", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        "\n" not in err
        and 'measurement of a lookup that remembers differs (the study has null, this run has "a launch per pass")'
        in err
    ), err
    assert len(stored(tmp_path).trials) == 2
    assert main(["export", str(path), "--no-per-type", "--out", str(tmp_path / "x")]) == 0

    plain = write_study(tmp_path / "plain", sqlite(tmp_path / "plain"), budget={"trials": 1})
    run_study(load_spec(plain), progress=Progress.quiet())
    assert (
        REMEMBERING_LOOKUP
        not in store.read_study_record(
            optuna.load_study(study_name="t", storage=sqlite(tmp_path / "plain"))
        ).measurement
    )


def test_a_study_stored_by_the_old_schema_is_one_line_naming_its_version(tmp_path, env, capsys):
    url = sqlite(tmp_path)
    old = optuna.create_study(study_name="t", storage=url)
    old.set_user_attr("fingerprint", {"cpu_model": "x"})  # how schema 1 stored a study
    for command in (["report", "t", "--storage", url], ["export", "t", "--storage", url]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "storage schema 1" in err and "new name" in err, err


@pytest.mark.parametrize(
    "workers, expected",
    [
        ({"heartbeat_s": 30, "grace_s": 30}, "workers.grace_s: must exceed heartbeat_s (30)"),
        ({"max_retry": -1}, "workers.max_retry: must be >= 0"),
        ({"heartbeat_s": 0.5}, "workers.heartbeat_s: expected an integer"),
        ({"retries": 1}, "workers.retries: unknown field"),
    ],
)
def test_bad_workers_section(tmp_path, workers, expected):
    path = write_study(tmp_path, sqlite(tmp_path), workers=workers)
    with pytest.raises(UserError) as err:
        load_spec(path)
    assert expected in str(err.value)


# ------------------------------------------------------------------ the real pinned llama.cpp


def real_study(tmp_path: Path, **fields) -> Path:
    """A short study of the synthetic family on the pinned build (see tests/test_study.py)."""
    study = {
        "name": "t",
        "target": str(SYNTH / "target.gguf"),
        "drafts": [str(SYNTH / "draft-small.gguf")],
        # one thread: two would spin-wait on each other whenever a busy machine preempts one
        "search_space": {
            "overrides": {
                "spec_type": ["none", "draft-simple"],
                "draft_max": [2, 4],
                "temperature": 0.0,
                "threads": 1,
            }
        },
        "workload": {"suites": ["code"], "n_predict": 32},  # ten requests: long enough to sabotage mid-way
        "measurement": {"warmup": 0, "repetitions": 2, "ctx_size": 512, "trial_timeout_s": 10},
        "budget": {"trials": 4},
        "sampler": {"prune": False},  # every trial measured whole
        # the sabotage names trials by number: no re-measure of a busy baseline between them (sentinel.after_busy)
        "sentinel": {"every_trials": 1000, "after_busy": 0},
        "storage": sqlite(tmp_path),
        **fields,
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def server_child() -> int | None:
    """The llama-server this process launched, if one runs now."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if ppid == os.getpid() and b"llama-server" in cmdline:
            return int(stat.parent.name)
    return None


def test_truncated_gguf_is_refused_up_front_or_fails_its_trial(tmp_path, env, synthetic_models, capsys):
    """As a target it is bad input, refused before anything runs; a draft truncated in the
    middle of a study (replaced on disk) fails its trial, and the study goes on."""
    path = real_study(
        tmp_path,
        target=str(SYNTH / "corrupt.gguf"),
        drafts=[],
        search_space={"overrides": {"spec_type": "none", "temperature": 0.0, "threads": 1}},
    )
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "corrupt.gguf: truncated or corrupt GGUF" in err
    assert not (tmp_path / "studies.db").exists() and not (tmp_path / "storage").exists()  # nothing written

    ctx = prepare(load_spec(real_study(tmp_path)))
    study = open_study(ctx)
    ctx.launch.drafts["draft-small"] = (SYNTH / "corrupt.gguf").resolve()  # the file changed under the study
    study.enqueue_trial({"spec_type": "draft-simple", "draft": "draft-small", "draft_max": 2})
    study.enqueue_trial({"spec_type": "none"}, user_attrs={store.ROLE: "baseline"})
    study.optimize(StudyObjective(ctx, study, progress=Progress.quiet()), n_trials=2, catch=(TrialFailure,))
    broken, after = study.trials
    assert broken.state == FAIL and store.read_trial(broken).failure.reason == "model_load_failed"
    assert "corrupt.gguf" in store.read_trial(broken).log_tail
    assert after.state == COMPLETE


def test_real_server_killed_or_stopped_mid_trial_fails_that_trial_and_the_study_goes_on(
    tmp_path, env, synthetic_models
):
    path = real_study(
        tmp_path,
        warm_start=[{"spec_type": "draft-simple", "draft": "draft-small", "draft_max": k} for k in (2, 4)],
    )
    logs = tmp_path / "storage" / "logs" / "t"
    sabotaged: list[int] = []

    def sabotage() -> None:
        """Trial 1's server gets SIGKILL, trial 2's SIGSTOP, each once it is serving."""
        for trial, sig in ((1, signal.SIGKILL), (2, signal.SIGSTOP)):
            log = logs / f"trial-{trial}.log"
            wait_for(
                lambda: log.exists() and "listening on http" in log.read_text(),
                120,
                f"trial {trial}'s server",
            )
            pid = wait_for(server_child, 10, f"trial {trial}'s server process")
            os.kill(pid, sig)
            sabotaged.append(pid)

    saboteur = threading.Thread(target=sabotage, daemon=True)
    saboteur.start()
    study = run_study(load_spec(path), progress=Progress.quiet())
    saboteur.join(timeout=5)
    assert len(sabotaged) == 2
    states = [(t.state, store.failure_reason(t)) for t in study.get_trials()]
    assert states == [(COMPLETE, None), (FAIL, "crashed"), (FAIL, "timeout"), (COMPLETE, None)]
    killed = study.trials[1]
    assert "SIGKILL" in store.read_trial(killed).failure.detail and store.read_trial(killed).log_tail
    assert not any(alive(pid) for pid in sabotaged)
