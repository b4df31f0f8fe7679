"""Several `tuner worker` processes sharing one study in a real PostgreSQL server.

The workers, the storage, Optuna, the runner and the measurement are all real; only
llama-server is the fast stand-in (tests/fake_llama_server.py), so a budget of 60 trials
takes seconds. The cluster is private to this module (tests/postgres.py); where no
server can start, these tests skip and say why.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna
import pytest
from fake_llama_server import alive, launches, wait_for, write_study

from tuner.cli import main
from tuner.storage import store
from tuner.storage.coordination import tally, with_driver

pytest.importorskip(
    "psycopg2", reason="the PostgreSQL driver is the `postgres` extra: pip install -e '.[postgres]'"
)

COMPLETE, FAIL, RUNNING, WAITING = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.FAIL,
    optuna.trial.TrialState.RUNNING,
    optuna.trial.TrialState.WAITING,
)
# Two workers that pass the budget check in the same instant each start a trial (see tuner.run.study_loop).
OVERSHOOT = 3 - 1
FAST_HEARTBEAT = {"heartbeat_s": 1, "grace_s": 3, "max_retry": 1, "baseline_wait_s": 60}


def start_workers(n: int, study: Path, storage: str, env: dict, tmp_path: Path) -> list[subprocess.Popen]:
    """``n`` workers, each standing for one host: each its own measurement lock (tuner.machine.hostlock),
    which on one real host they share, measuring one after the other."""
    procs = []
    for i in range(n):
        out = open(tmp_path / f"worker-{i}.log", "w")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tuner.cli", "worker", str(study), "--storage", storage],
                env={**env, "TUNER_MEASURE_LOCK": str(tmp_path / f"host-{i}.lock")},
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
        out.close()
    return procs


def finish(procs: list[subprocess.Popen], timeout_s: float = 180) -> list[int]:
    """Wait for every worker; kill any still running at the timeout (and fail)."""
    try:
        for proc in procs:
            proc.wait(timeout=timeout_s)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [proc.returncode for proc in procs]


def output(tmp_path: Path, i: int) -> str:
    return (tmp_path / f"worker-{i}.log").read_text()


def study_of(storage: str) -> optuna.Study:
    return optuna.load_study(study_name="t", storage=with_driver(storage))


def test_three_workers_complete_a_budget_of_60_without_loss_or_duplicate(tmp_path, env, database):
    study_file = write_study(tmp_path, "sqlite:///unused-by-workers.db", budget={"trials": 60})
    procs = start_workers(3, study_file, database, env, tmp_path)
    codes = finish(procs)
    assert codes == [0, 0, 0], [output(tmp_path, i)[-2000:] for i in range(3)]

    study = study_of(database)
    trials = study.get_trials()
    assert [t.number for t in trials] == list(range(len(trials)))
    assert {t.state for t in trials} == {COMPLETE}  # no trial lost, none left running or queued
    assert len(trials) == tally(study).counted
    assert 60 <= len(trials) <= 60 + OVERSHOOT
    baselines = [t for t in trials if store.role_of(t) == "baseline"]
    assert [t.number for t in baselines] == [0] and store.read_reference(study).trial == 0
    pids = {str(p.pid) for p in procs}
    assert {store.read_trial(t).worker.rsplit(":", 1)[1] for t in trials} == pids  # all three measured
    assert store.created_by(study) == store.read_trial(baselines[0]).worker  # its creator ran the baseline
    # each trial was measured by exactly one server launch, none repeated, none lost; but the baseline's launches
    # on a busy host (three workers starting on a small host), launched again at once and set aside
    ports = Counter(store.running_on(t)["port"] for t in trials)
    launched = Counter(launch["port"] for launch in launches(tmp_path / "launches.jsonl"))
    set_aside = len((store.read_trial(baselines[0]).host or {}).get("busy_readings") or [])
    assert ports - launched == Counter() and sum(launched.values()) == len(trials) + set_aside


def running_trial(database: str, role: str) -> optuna.trial.FrozenTrial | None:
    """A running trial of ``role`` whose server is up (None before the study exists)."""
    try:
        trials = study_of(database).get_trials(deepcopy=False, states=(RUNNING,))
    except KeyError:  # not created yet
        return None
    return next((t for t in trials if store.role_of(t) == role and store.running_on(t)), None)


def killed_worker_trial(study_file: Path, database: str, env: dict, tmp_path: Path, role: str):
    """Start three workers, SIGKILL the one measuring a trial of ``role``; wait for the rest.

    Each request takes 0.6 s (FAKE_LLAMA_DELAY_S), so a trial seen running with its
    server up is still running when its worker is killed a moment later."""
    procs = start_workers(3, study_file, database, {**env, "FAKE_LLAMA_DELAY_S": "0.6"}, tmp_path)
    try:
        trial = wait_for(
            lambda: running_trial(database, role),
            90,
            f"a running {role} trial with its server up",
            poll_s=0.2,
        )
        pid = int(store.running_on(trial)["worker"].rsplit(":", 1)[1])
        (killed,) = [p for p in procs if p.pid == pid]
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    finally:
        codes = finish(procs)
    port = store.running_on(trial)["port"]
    (server,) = [x for x in launches(tmp_path / "launches.jsonl") if x["port"] == port]
    assert not alive(server["pid"])  # the kernel killed the dead worker's server with it
    survivors = [code for p, code in zip(procs, codes) if p is not killed]
    assert codes[procs.index(killed)] == -signal.SIGKILL and survivors == [0, 0]
    return study_of(database), trial.number


def test_a_killed_worker_trial_is_failed_by_heartbeat_retried_once_and_the_study_completes(
    tmp_path, env, database
):
    study_file = write_study(tmp_path, "sqlite:///unused.db", budget={"trials": 4}, workers=FAST_HEARTBEAT)
    study, lost = killed_worker_trial(study_file, database, env, tmp_path, "search")

    trials = study.get_trials()
    assert trials[lost].state == FAIL and store.failure_reason(trials[lost]) is None
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == lost]
    assert retry.state == COMPLETE and retry.params == trials[lost].params
    assert retry.user_attrs[store.REQUEUED_BY] != store.running_on(trials[lost])["worker"]
    assert not [t for t in trials if t.state in (RUNNING, WAITING)]
    assert 4 <= tally(study).counted <= 4 + OVERSHOOT
    assert len(trials) == tally(study).counted + 1  # the lost trial is the one not counted


def test_a_killed_baseline_worker_is_replaced_and_the_baseline_runs_once(tmp_path, env, database):
    study_file = write_study(tmp_path, "sqlite:///unused.db", budget={"trials": 3}, workers=FAST_HEARTBEAT)
    study, lost = killed_worker_trial(study_file, database, env, tmp_path, "baseline")

    trials = study.get_trials()
    assert lost == 0 and trials[0].state == FAIL
    completed_baselines = [t for t in trials if store.role_of(t) == "baseline" and t.state == COMPLETE]
    assert [t.system_attrs.get("failed_trial") for t in completed_baselines] == [0]
    assert store.read_reference(study).trial == completed_baselines[0].number
    assert (
        store.read_trial(completed_baselines[0]).worker
        == completed_baselines[0].user_attrs[store.REQUEUED_BY]
    )
    assert 3 <= tally(study).counted <= 3 + OVERSHOOT and not [
        t for t in trials if t.state in (RUNNING, WAITING)
    ]


def test_a_worker_with_another_llama_build_is_refused(tmp_path, env, database, monkeypatch, capsys):
    study_file = write_study(tmp_path, "sqlite:///unused.db", budget={"trials": 2})
    assert main(["worker", str(study_file), "--storage", database]) == 0
    monkeypatch.setenv("FAKE_LLAMA_COMMIT", "deadbee")  # what this host's llama-server --version says
    capsys.readouterr()
    assert main(["worker", str(study_file), "--storage", database]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and 'llama_commit differs (the study has "0c1e570", this run has "deadbee")' in err
    assert len(study_of(database).trials) == 2  # nothing added


def test_a_paused_worker_whose_trial_was_failed_elsewhere_drops_it_in_one_line_and_goes_on(
    tmp_path, env, database
):
    """Issue 21: a worker SIGSTOPped past grace_s while measuring, its trial failed and queued again by
    another worker, then SIGCONTed, died with ``ValueError: Cannot tell a FAIL trial.``"""
    study_file = write_study(tmp_path, "sqlite:///unused.db", budget={"trials": 10}, workers=FAST_HEARTBEAT)
    procs = start_workers(2, study_file, database, {**env, "FAKE_LLAMA_DELAY_S": "0.6"}, tmp_path)
    try:
        trial = wait_for(
            lambda: running_trial(database, "search"),
            90,
            "a running search trial with its server up",
            poll_s=0.2,
        )
        pid = int(store.running_on(trial)["worker"].rsplit(":", 1)[1])
        (paused,) = [p for p in procs if p.pid == pid]
        paused.send_signal(signal.SIGSTOP)
        try:
            retry = wait_for(
                lambda: next(
                    (
                        t
                        for t in study_of(database).get_trials(deepcopy=False)
                        if t.system_attrs.get("failed_trial") == trial.number
                    ),
                    None,
                ),
                60,
                "the paused worker's trial failed and queued again by the other worker",
                poll_s=0.3,
            )
        finally:
            paused.send_signal(signal.SIGCONT)
    finally:
        codes = finish(procs)
    log = output(tmp_path, procs.index(paused))
    assert codes == [0, 0], [output(tmp_path, i)[-2000:] for i in range(2)]
    assert "Traceback" not in log and "Cannot tell" not in log
    assert (
        f"trial {trial.number} was failed as dead by another worker while this one did not send heartbeats for "
        f"workers.grace_s (3 s; paused?) and was queued again as trial {retry.number}; its measurement here is "
        "dropped, not stored or journalled, so the configuration counts once; going on with the next trial"
    ) in log
    study = study_of(database)
    trials = study.get_trials()
    assert trials[trial.number].state == FAIL and not store.has_record(
        trials[trial.number]
    )  # nothing written to it
    assert trials[retry.number].state == COMPLETE and trials[retry.number].params == trial.params
    later = [
        t
        for t in trials
        if t.number > retry.number
        and t.state == COMPLETE
        and store.read_trial(t).worker == store.running_on(trial)["worker"]
    ]
    assert later, log  # the resumed worker measured further trials
    assert not list((tmp_path / "storage" / "journal").glob("*.jsonl")) or all(
        not p.read_text() for p in (tmp_path / "storage" / "journal").glob("*.jsonl")
    )  # nothing journalled
