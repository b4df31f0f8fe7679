"""Fault drills (issue 12): each fault reproduced against the real study runner, as a user meets it.

Every drill runs the real ``tuner`` command in a subprocess (storage, Optuna, runner,
measurement all real) with the fast stand-in llama-server (tests/fake_llama_server.py),
and asserts the one-line message, the exit code, and that every trial measured before
the fault is in storage afterwards, or in the journal and then in storage after a rerun.

- host lock: two studies (two storages) started together measure one after the other;
  --no-wait refuses run, worker, export, record-grid and bench in one line.
- storage outages: a SQLite filesystem that fills mid-trial, or is full at start (a real
  tmpfs: needs root, else skipped saying why), a read-only database at start (Linux
  refuses to remount a filesystem read-only while the database is open for writing), PostgreSQL stopped for 15 s mid-trial (the worker goes on),
  PostgreSQL stopped for good mid-trial (journal, then stored by the rerun).
- passwords with ``/``, ``@``, ``:`` and percent-encoding never printed.
- a warm start outside the resolved space is refused before anything runs.
- one-line errors for a binary or empty study file, an unusable SQLite path, an unreachable or
  missing PostgreSQL database, an unknown suite, a missing space file.
- a run killed -9 during its baseline: the rerun fails the orphan with a reason and says so.
- issue 32: a study name that is a path (in a study file or on the command line) is refused in one
  line; report and export on a full disk (a real 64 kB tmpfs) are one line naming the path and the
  free space, and keep the previous files; a mysql:// storage names the supported kinds; a replayed
  table with numa bind and no numa_node column is one line.

The host's measurement lock is pointed at a per-test file (TUNER_MEASURE_LOCK): test
sessions sharing a machine must not block each other.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import optuna
import pytest
from fake_llama_server import alive, launches, wait_for, write_study

from tuner.storage.urls import safe_url, with_driver

COMPLETE, FAIL, RUNNING = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.FAIL,
    optuna.trial.TrialState.RUNNING,
)


# ------------------------------------------------------------------ helpers


@pytest.fixture
def fenv(env, tmp_path, monkeypatch) -> dict:
    """conftest's stand-in environment plus a measurement lock of this test's own."""
    monkeypatch.setenv("TUNER_MEASURE_LOCK", str(tmp_path / "measure.lock"))
    return dict(os.environ)


def tuner(
    *args: str, env: dict, timeout: float = 120, module: str = "tuner.cli"
) -> subprocess.CompletedProcess:
    """A ``tuner`` command (``module="benchmarks"``: ``python -m benchmarks``) as its own process."""
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start(*args: str, env: dict, out: Path) -> subprocess.Popen:
    with open(out, "w") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", *map(str, args)],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            text=True,
        )


def error_line(proc: subprocess.CompletedProcess | str) -> str:
    """The one error line: no traceback anywhere, the error is stderr's last line."""
    text = proc if isinstance(proc, str) else proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    lines = (text if isinstance(proc, str) else proc.stderr).strip().splitlines()
    assert lines, text
    return lines[-1]


def stored(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=with_driver(url)).get_trials(deepcopy=False)


def measured_numbers(trials: list[optuna.trial.FrozenTrial]) -> set[int]:
    """Numbers of the trials whose measurement is in storage: finished with a record, in their
    own number or replayed from the journal (``replay_of``)."""
    out = set()
    for t in trials:
        if t.state.is_finished() and "record" in t.user_attrs:
            out.add(t.system_attrs.get("replay_of", t.number))
    return out


def kill_stand_ins(launch_file: Path) -> None:
    for launch in launches(launch_file):
        try:
            os.kill(launch["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


# ------------------------------------------------------------------ 1. one measurement per host


def test_two_studies_started_together_measure_one_after_the_other(fenv, tmp_path):
    env = {**fenv, "FAKE_LLAMA_DELAY_S": "0.2"}
    a = write_study(tmp_path / "a", f"sqlite:///{tmp_path / 'a.db'}", name="a", budget={"trials": 3})
    b = write_study(tmp_path / "b", f"sqlite:///{tmp_path / 'b.db'}", name="b", budget={"trials": 3})
    first = start(
        "run", a, env={**env, "FAKE_LLAMA_DELAY_S": "2"}, out=tmp_path / "a.log"
    )  # still running when b starts
    try:
        wait_for(
            lambda: (
                "study a" in (tmp_path / "measure.lock").read_text(errors="replace")
                if (tmp_path / "measure.lock").exists()
                else False
            ),
            60,
            "run a to hold the measurement lock",
        )
        refused = tuner("run", b, "--no-wait", env=env)
        assert refused.returncode == 75
        assert error_line(refused) == (
            f"tuner run: error: another measurement runs on this host (pid {first.pid}, tuner run, study a; lock "
            f"{tmp_path / 'measure.lock'}): two measurements on one host measure each other; run again when it "
            "is done, or drop --no-wait to wait for it"
        )
        second = tuner("run", b, env=env, timeout=180)
    finally:
        first.wait(timeout=180)
    assert first.returncode == 0, (tmp_path / "a.log").read_text()
    assert second.returncode == 0, second.stderr
    assert (
        f"waiting for the measurement running on this host to finish (pid {first.pid}, tuner run, study a"
        in second.stdout
    )
    order = [
        "a" if f"{tmp_path / 'a'}/" in " ".join(launch["argv"]) else "b"
        for launch in launches(tmp_path / "launches.jsonl")
    ]
    assert order == sorted(order) and set(order) == {"a", "b"}, order  # every launch of b after all of a's
    for name in "ab":
        assert measured_numbers(stored(f"sqlite:///{tmp_path / (name + '.db')}", name)) == {0, 1, 2}


def test_every_measuring_command_takes_the_host_lock(fenv, tmp_path):
    url = f"sqlite:///{tmp_path / 'a.db'}"
    study = write_study(tmp_path / "a", url, name="a", budget={"trials": 2})
    assert tuner("run", study, env=fenv).returncode == 0
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from tuner.machine import hostlock\n"
            "with hostlock.measuring('other'):\n    print('held', flush=True); time.sleep(120)",
        ],
        env=fenv,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        for command, args in [
            ("run", [study]),
            ("worker", [study, "--storage", "postgresql://tuner:pw@127.0.0.1:1/tuner"]),
            ("export", [study, "--out", tmp_path / "export"]),
            ("record-grid", [study, "--out", tmp_path / "grid.csv"]),
            ("bench", ["--grid-study", study, "--study", study, "--out", tmp_path / "bench"]),
        ]:
            bench = command in ("record-grid", "bench")  # the benchmarks' commands, outside the package
            proc = tuner(command, *args, "--no-wait", env=fenv, module="benchmarks" if bench else "tuner.cli")
            assert proc.returncode == 75, (command, proc.stderr)
            prog = "python -m benchmarks" if bench else "tuner"
            assert error_line(proc).startswith(
                f"{prog} {command}: error: another measurement runs on this host "
                f"(pid {holder.pid}, tuner, study other;"
            ), (command, proc.stderr)
    finally:
        holder.kill()
        holder.wait()
    assert not (tmp_path / "grid.jsonl").exists() and not (tmp_path / "bench").exists()


# ------------------------------------------------------------------ 2. storage outages


def mounted_tmpfs(mount: Path, size: str):
    """A tmpfs of ``size`` at ``mount`` for the test, unmounted after it (skips where mounting needs root)."""
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem to fill (needs root): {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def small_fs(tmp_path):
    """A 4 MB tmpfs for the SQLite file (a filesystem this test can fill or make read-only)."""
    yield from mounted_tmpfs(tmp_path / "fs", "4m")


def fill(folder: Path) -> Path:
    """Fill the filesystem of ``folder`` to the last byte."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 16, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def journal_lines(storage_dir: Path) -> list[dict]:
    return [
        json.loads(line)
        for p in sorted((storage_dir / "journal").glob("*.jsonl"))
        for line in p.read_text().splitlines()
    ]


def wait_for_trial_two_to_launch(proc: subprocess.Popen, log: Path, tmp_path: Path) -> None:
    """Until trial 2's server runs: after trial 1's progress line (printed once its server has stopped), the newest
    launch alive. Counting launches would not do: on a busy host the baseline is launched twice
    (``trial_measurement.BUSY_RELAUNCHES``), and on a quiet one trial 2's server starts within the poll after
    trial 1's line, so a count read then already holds it and the wait ran on to trial 3's."""
    wait_for(lambda: "] trial 1: " in log.read_text() or proc.poll() is not None, 120, "trial 1 to end")

    def newest_running() -> bool:
        found = launches(tmp_path / "launches.jsonl")
        return proc.poll() is not None or (bool(found) and alive(found[-1]["pid"]))

    wait_for(newest_running, 120, "trial 2's server to start")
    assert proc.poll() is None, log.read_text()


def run_until_trial_two_launches(study: Path, env: dict, tmp_path: Path) -> subprocess.Popen:
    proc = start("run", study, env=env, out=tmp_path / "run.log")
    wait_for_trial_two_to_launch(proc, tmp_path / "run.log", tmp_path)
    return proc


def test_filesystem_filling_mid_trial_keeps_the_trial_in_the_journal(fenv, tmp_path, small_fs):
    env = {**fenv, "FAKE_LLAMA_DELAY_S": "1.5"}  # two prompts: 3 s of measuring per trial
    url = f"sqlite:///{small_fs / 'tuner.db'}"
    study = write_study(
        tmp_path / "s", url, name="full", budget={"trials": 4}, workers={"storage_retry_s": 2}
    )
    proc = run_until_trial_two_launches(study, env, tmp_path)
    time.sleep(1.2)  # its server is up and measuring
    filler = fill(small_fs)
    assert proc.wait(timeout=120) == 69
    out = (tmp_path / "run.log").read_text()
    line = error_line(out)
    journal = journal_lines(tmp_path / "storage")
    assert len(journal) == 1 and journal[0]["number"] == 2 and journal[0]["state"] == "COMPLETE"
    journal_file = next((tmp_path / "storage" / "journal").glob("*.jsonl"))
    assert line == (
        f"tuner run: error: storage unavailable: {url}: database or disk is full; 1 measured trial(s) "
        f"kept in {journal_file}, run again to store them"
    )
    filler.unlink()  # space again: the rerun stores the journalled trial first
    rerun = tuner("run", study, env=env, timeout=180)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "trial 2: measured before the storage failed, stored from the journal as trial" in rerun.stdout
    trials = stored(url, "full")
    assert {0, 1, 2} <= measured_numbers(trials)
    orphan = trials[2]
    assert orphan.state == FAIL and orphan.user_attrs["record"]["failure"]["reason"] == "orphaned"
    assert not journal_file.exists()


@pytest.mark.parametrize("resume", [False, True], ids=["new-database", "resume"])
def test_full_filesystem_at_start_is_retried_for_storage_retry_s_then_one_line(
    fenv, tmp_path, small_fs, resume
):
    """Issue 21: a full disk at start stopped the run after about 6 s (a resume: Optuna's trial cache
    creates trials through a storage method that was not retried), or at once (a new database), not
    after workers.storage_retry_s."""
    url = f"sqlite:///{small_fs / 'db' / 'tuner.db'}"
    study = write_study(
        tmp_path / "s", url, name="full", budget={"trials": 2}, workers={"storage_retry_s": 8}
    )
    (small_fs / "db").mkdir()
    if resume:
        assert tuner("run", study, "--trials", "1", env=fenv).returncode == 0
    launched = len(launches(tmp_path / "launches.jsonl"))
    fill(small_fs)
    started = time.monotonic()
    proc = tuner("run", study, env=fenv)
    assert proc.returncode == 69
    assert f"storage {url}: database or disk is full; retrying for up to 8 s" in proc.stderr
    assert 8 <= time.monotonic() - started < 60
    assert error_line(proc) == (
        f"tuner run: error: storage unavailable: {url}: "
        "database or disk is full; no measured trial is waiting to be stored"
    )
    assert len(launches(tmp_path / "launches.jsonl")) == launched


def test_read_only_database_at_start_is_one_line(fenv, tmp_path):
    db = tmp_path / "tuner.db"
    study = write_study(tmp_path / "s", f"sqlite:///{db}", name="ro", budget={"trials": 2})
    assert tuner("run", study, env=fenv).returncode == 0
    read_only = f"sqlite:///file:{db}?mode=ro&uri=true"
    study = write_study(tmp_path / "s", read_only, name="ro", budget={"trials": 4})
    proc = tuner("run", study, env=fenv)
    assert proc.returncode == 69
    assert error_line(proc) == (
        f"tuner run: error: storage unavailable: {read_only}: attempt to write a readonly "
        "database; no measured trial is waiting to be stored"
    )
    assert measured_numbers(stored(f"sqlite:///{db}", "ro")) == {0, 1}


def pg_ctl(cluster, action: str) -> None:
    from postgres import _as_server_user, server_bin_dir

    options = (
        f"-p {cluster.port} -k {cluster.root} -c listen_addresses=127.0.0.1 -c fsync=off "
        "-c max_connections=200"
    )
    args = {
        "stop": ["-m", "fast", "stop"],
        "start": ["-o", options, "-l", str(cluster.root / "server.log"), "-w", "-t", "60", "start"],
    }[action]
    subprocess.run(
        [*_as_server_user(), str(server_bin_dir() / "pg_ctl"), "-D", str(cluster.root / "data"), *args],
        check=True,
        capture_output=True,
        timeout=90,
    )


@contextmanager
def stopped(cluster):
    pg_ctl(cluster, "stop")
    try:
        yield
    finally:
        pg_ctl(cluster, "start")


PG_WORKERS = {"heartbeat_s": 1, "grace_s": 30, "max_retry": 1, "baseline_wait_s": 60}


def test_postgres_stopped_15_s_mid_trial_the_worker_goes_on(fenv, tmp_path, cluster, database):
    env = {**fenv, "FAKE_LLAMA_DELAY_S": "0.5"}
    study = write_study(
        tmp_path / "s",
        database,
        name="pg",
        budget={"trials": 5},
        workers={**PG_WORKERS, "storage_retry_s": 60},
    )
    proc = start("worker", study, env=env, out=tmp_path / "worker.log")
    wait_for(
        lambda: len(launches(tmp_path / "launches.jsonl")) >= 3 or proc.poll() is not None,
        120,
        "the third trial to start",
    )
    with stopped(cluster):
        time.sleep(15)
    assert proc.wait(timeout=180) == 0, (tmp_path / "worker.log").read_text()
    out = (tmp_path / "worker.log").read_text()
    assert "Traceback" not in out and "retrying for up to 60 s" in out
    trials = stored(database, "pg")
    assert measured_numbers(trials) >= {0, 1, 2, 3, 4} and not [t for t in trials if t.state == RUNNING]


def test_postgres_down_for_good_keeps_the_trial_and_the_rerun_stores_it(fenv, tmp_path, cluster, database):
    env = {**fenv, "FAKE_LLAMA_DELAY_S": "1.5"}  # two prompts: 3 s of measuring per trial
    study = write_study(
        tmp_path / "s",
        database,
        name="pg",
        budget={"trials": 4},
        workers={**PG_WORKERS, "storage_retry_s": 3},
    )
    proc = start("worker", study, env=env, out=tmp_path / "worker.log")
    wait_for_trial_two_to_launch(proc, tmp_path / "worker.log", tmp_path)
    time.sleep(1.2)  # its server is up and measuring
    with stopped(cluster):
        code = proc.wait(timeout=120)
    assert code == 69, (tmp_path / "worker.log").read_text()
    line = error_line((tmp_path / "worker.log").read_text())
    journal = next((tmp_path / "storage" / "journal").glob("*.jsonl"))
    assert line.startswith(f"tuner worker: error: storage unavailable: {database}: ")
    assert line.endswith(f"; 1 measured trial(s) kept in {journal}, run again to store them")
    rerun = tuner("worker", study, env=env, timeout=180)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert measured_numbers(stored(database, "pg")) >= {0, 1, 2}
    assert not journal.exists()


def test_heartbeat_thread_survives_an_outage(tmp_path, monkeypatch):
    """A heartbeat that cannot be written is skipped: Optuna's thread would end at its first exception."""
    import sqlalchemy.exc
    from optuna.storages import RDBStorage
    from optuna.storages._heartbeat import HeartbeatThread

    from tuner.storage.coordination import open_storage
    from tuner.studyfile.spec import WorkersSpec

    storage = open_storage(f"sqlite:///{tmp_path / 'x.db'}", WorkersSpec(heartbeat_s=1, grace_s=3))
    trial = optuna.create_study(storage=storage).ask()
    calls = []

    def down(self, trial_id):
        calls.append(trial_id)
        raise sqlalchemy.exc.OperationalError(
            "UPDATE trial_heartbeats", {}, Exception("server closed the connection")
        )

    monkeypatch.setattr(RDBStorage, "record_heartbeat", down)
    thread = HeartbeatThread(trial._trial_id, storage)
    thread.start()
    try:
        wait_for(lambda: len(calls) >= 3, 10, "three heartbeats through the outage")
        assert thread._thread.is_alive()
    finally:
        thread.join()


# ------------------------------------------------------------------ 3. passwords


@pytest.mark.parametrize("password", ["Sl/ash-Pw-42", "p@ss@word", "a:b:c", "p%40ss%2Fx%3A", "pl@in/and:all"])
def test_passwords_are_never_printed(password):
    url = f"postgresql://tuner:{password}@db-host:5432/tuner"
    assert safe_url(url) == "postgresql://tuner:***@db-host:5432/tuner"
    from urllib.parse import unquote

    from sqlalchemy.engine import make_url

    assert make_url(with_driver(url)).password == unquote(password)


def test_password_with_special_characters_works_and_never_shows(fenv, tmp_path, cluster, database):
    password = "Sl/ash@Pw:42%"
    url = database.replace("postgresql://postgres@", f"postgresql://postgres:{password}@")
    study = write_study(tmp_path / "s", url, name="pw", budget={"trials": 2}, workers=PG_WORKERS)
    ran = tuner("worker", study, env=fenv, timeout=180)
    assert ran.returncode == 0, ran.stderr
    unreachable = url.replace(f":{cluster.port}/", ":1/")
    outputs = [
        ran,
        tuner("report", "pw", "--storage", url, env=fenv),
        tuner("report", "pw", "--storage", unreachable, env=fenv),
        tuner("worker", study, "--storage", unreachable, env=fenv),
    ]
    for proc in outputs:
        for secret in ("Sl/ash", "ash@Pw", "Pw:42", "Sl%2Fash"):
            assert secret not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert f"storage {safe_url(url)}" in ran.stdout
    assert error_line(outputs[2]).startswith(
        f"tuner report: error: storage {safe_url(unreachable)}: cannot open ("
    )


# ------------------------------------------------------------------ 4. warm starts


def test_warm_start_outside_the_space_is_refused_before_anything_runs(fenv, tmp_path):
    study = write_study(
        tmp_path / "s",
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        name="w",
        warm_start=[{"spec_type": "draft-simple", "draft": "draft-huge", "draft_max": 4}],
    )
    for args in (["--check"], []):
        proc = tuner("run", study, *args, env=fenv)
        assert proc.returncode == 2
        assert error_line(proc) == (
            f"tuner run: error: {study}: warm_start[0].draft: 'draft-huge' is not one of draft; "
            "use a value of the resolved space (`tuner run STUDY --check` prints it)"
        )
    study = write_study(
        tmp_path / "s",
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        name="w",
        warm_start=[{"spec_type": "draft-simple", "draft_max": 7}],
    )
    proc = tuner("run", study, env=fenv)
    assert error_line(proc) == (
        f"tuner run: error: {study}: warm_start[0].draft_max: 7 is not one of 2, 3, 4, 5, 6, "
        "8; use a value of the resolved space (`tuner run STUDY --check` prints it)"
    )
    assert launches(tmp_path / "launches.jsonl") == [] and not (tmp_path / "db.sqlite").exists()


# ------------------------------------------------------------------ 5. one-line errors


def test_unusable_inputs_are_one_line(fenv, tmp_path, cluster):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    proc_path = write_study(tmp_path / "p", "sqlite:////proc/x/x.db", name="p")
    suite = write_study(
        tmp_path / "u", f"sqlite:///{tmp_path / 'u.db'}", name="u", workload={"suites": ["x"]}
    )
    space = write_study(
        tmp_path / "f", f"sqlite:///{tmp_path / 'f.db'}", name="f", search_space={"file": "nope.yaml"}
    )
    cases = [
        (
            ["run", binary],
            2,
            f"tuner run: error: {binary}: not a text file (no UTF-8 at byte 0); pass a YAML file",
        ),
        (
            ["run", empty],
            2,
            f"tuner run: error: {empty}: the file is empty; expected a mapping of fields "
            "(see studies/demo.yaml)",
        ),
        (
            ["run", proc_path],
            2,
            "tuner run: error: storage sqlite:////proc/x/x.db: cannot create the folder /proc/x "
            "(No such file or directory); check the path of the SQLite file",
        ),
        (["run", suite], 2, f"tuner run: error: {suite}: workload.suites: unknown suite 'x'; use one of "),
        (
            ["run", space],
            2,
            f"tuner run: error: {space}: search_space.file: {tmp_path / 'f' / 'nope.yaml'}: no such "
            "file; fix the path (relative to the study file's folder)",
        ),
        (
            ["report", "x", "--storage", f"postgresql://postgres@127.0.0.1:{cluster.port}/missing"],
            2,
            f"tuner report: error: storage postgresql://postgres@127.0.0.1:{cluster.port}/missing: cannot open (",
        ),
        (
            ["report", "x", "--storage", "postgresql://postgres@127.0.0.1:1/tuner"],
            2,
            "tuner report: error: storage postgresql://postgres@127.0.0.1:1/tuner: cannot open (",
        ),
    ]
    for args, code, expected in cases:
        proc = tuner(*args, env=fenv)
        assert proc.returncode == code, (args, proc.stderr)
        assert error_line(proc).startswith(expected), (args, proc.stderr)
    assert launches(tmp_path / "launches.jsonl") == []


def test_draft_mtp_on_a_target_that_does_not_announce_it_is_one_line_at_check(fenv, tmp_path):
    from gguf_factory import write_gguf

    asked = {"overrides": {"spec_type": ["none", "draft-mtp"], "draft_max": [2, 3], "threads": 1}}
    study = write_study(tmp_path / "s", f"sqlite:///{tmp_path / 'db.sqlite'}", name="m", search_space=asked)
    for args in (["--check"], []):
        proc = tuner("run", study, *args, env=fenv)
        assert (proc.returncode, error_line(proc)) == (
            2,
            (
                f"tuner run: error: {study}: search_space.spec_type: target.gguf does not announce draft-mtp (`tuner "
                "inspect` lists the types a model announces); remove draft-mtp from spec_type"
            ),
        )
    assert launches(tmp_path / "launches.jsonl") == [] and not (tmp_path / "db.sqlite").exists()
    write_gguf(tmp_path / "s" / "models" / "target.gguf", block_count=2, nextn=True)  # now with an MTP head
    proc = tuner("run", study, "--check", "--json", env=fenv)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["space"]["spec_type"] == ["Choices", {"values": ["none", "draft-mtp"]}]


# ------------------------------------------------------------------ 6. misleading messages


def test_kill_9_during_the_baseline_rerun_names_the_orphan(fenv, tmp_path):
    env = {**fenv, "FAKE_LLAMA_DELAY_S": "3"}
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = write_study(tmp_path / "s", url, name="k", budget={"trials": 2})
    proc = start("run", study, env=env, out=tmp_path / "run.log")
    try:
        wait_for(lambda: launches(tmp_path / "launches.jsonl"), 60, "the baseline's server")
        time.sleep(1.5)  # inside its measurement
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        kill_stand_ins(tmp_path / "launches.jsonl")
    rerun = tuner("run", study, env={**env, "FAKE_LLAMA_DELAY_S": "0"}, timeout=180)
    assert rerun.returncode == 0, rerun.stderr
    assert (
        "trial 0 (baseline) was left running by a process that died: failed as orphaned, queued again"
        in rerun.stdout
    )
    assert "waiting for the baseline" not in rerun.stdout
    trials = stored(url, "k")
    assert trials[0].state == FAIL
    assert trials[0].user_attrs["record"]["failure"] == {
        "reason": "orphaned",
        "detail": "the process running it died",
    }
    assert trials[1].user_attrs["role"] == "baseline" and trials[1].state == COMPLETE


# ------------------------------------------------------------------ 7. a damaged SQLite file (issue 21)


def test_damaged_or_foreign_sqlite_file_is_one_line_and_left_as_it_is(fenv, tmp_path):
    import random

    db = tmp_path / "db.sqlite"
    study = write_study(tmp_path / "s", f"sqlite:///{db}", name="d", budget={"trials": 2})
    assert tuner("run", study, env=fenv).returncode == 0
    with open(db, "r+b") as f:  # 4 KiB of random bytes in the middle of the file
        f.seek(db.stat().st_size // 2)
        f.write(random.Random(21).randbytes(4096))
    foreign = tmp_path / "notes.sqlite"
    foreign.write_text("not a database\n" * 300)
    foreign_study = write_study(tmp_path / "f", f"sqlite:///{foreign}", name="d")
    advice = (
        "restore it from a backup, or salvage what SQLite can still read with `sqlite3 {0} .recover` (or `.dump`) "
        "into a new file and use that as the storage"
    )
    malformed = (
        f"storage {db}: database disk image is malformed (the SQLite file is damaged); {advice.format(db)}"
    )
    not_db = (
        f"storage {foreign}: file is not a database (not a SQLite file, or one whose header is damaged); "
        f"{advice.format(foreign)}"
    )
    cases = [
        (
            ["report", "d", "--storage", f"sqlite:///{db}", "--out", tmp_path / "rep"],
            f"tuner report: error: {malformed}",
        ),
        (["run", study], f"tuner run: error: {malformed}; no measured trial is waiting to be stored"),
        (["report", "d", "--storage", f"sqlite:///{foreign}"], f"tuner report: error: {not_db}"),
        (["run", foreign_study], f"tuner run: error: {not_db}; no measured trial is waiting to be stored"),
    ]
    before = {p: p.read_bytes() for p in (db, foreign)}
    launched = len(launches(tmp_path / "launches.jsonl"))
    for args, expected in cases:
        proc = tuner(*args, env=fenv)
        assert (proc.returncode, error_line(proc)) == (69, expected), args
    assert {p: p.read_bytes() for p in (db, foreign)} == before  # nothing written
    assert len(launches(tmp_path / "launches.jsonl")) == launched and not (tmp_path / "rep").exists()


def test_output_path_under_a_file_is_one_line_before_any_work(fenv, tmp_path):
    blocker = tmp_path / "X"
    blocker.write_text("a file where a folder is expected\n")
    db = tmp_path / "db.sqlite"
    study = write_study(tmp_path / "s", f"sqlite:///{db}", name="o", budget={"trials": 2})
    assert tuner("run", study, env=fenv).returncode == 0
    under = (
        f"{blocker} is a file, not a folder; pass a path whose parents are folders (missing ones are created)"
    )
    cases = [
        (
            ["report", study, "--out", blocker / "rep"],
            f"tuner report: error: --out {blocker / 'rep'}: {under}",
        ),
        (
            ["report", study, "--out", blocker],
            f"tuner report: error: --out {blocker}: is a file, not a folder; "
            "pass a folder path (it is created if missing)",
        ),
        (
            ["export", study, "--out", blocker / "a" / "b"],
            f"tuner export: error: --out {blocker / 'a' / 'b'}: {under}",
        ),
        (
            ["export", study, "--preset", blocker / "p.ini"],
            f"tuner export: error: --preset {blocker / 'p.ini'}: {under}",
        ),
    ]
    launched = len(launches(tmp_path / "launches.jsonl"))
    for args, expected in cases:
        proc = tuner(*args, env=fenv)
        assert (proc.returncode, error_line(proc)) == (2, expected), args
    assert len(launches(tmp_path / "launches.jsonl")) == launched  # the export did not race first
    report = tuner("report", study, "--out", tmp_path / "new" / "rep", env=fenv)
    assert report.returncode == 0 and (tmp_path / "new" / "rep" / "index.html").is_file()


# ------------------------------------------------------------------ 8. a prompt longer than the context (issue 21)


def test_check_names_the_prompt_that_does_not_fit_ctx_size_in_the_targets_tokens(
    fenv, tmp_path, llama_bin_dir
):
    import yaml

    from tuner.measurement.workload import llama_tokenize_count

    folder = tmp_path / "s"
    folder.mkdir()
    essay = " ".join(f"word{i % 50}" for i in range(3000))  # 3,000 words
    (folder / "long.yaml").write_text(
        yaml.safe_dump({"prompts": [{"id": "short", "text": "def f():\n"}, {"id": "essay", "text": essay}]})
    )
    study = write_study(
        folder,
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        name="l",
        workload={"suites": ["long.yaml"], "n_predict": 8},
        measurement={"warmup": 0, "repetitions": 1, "ctx_size": 1024, "trial_timeout_s": 20},
    )
    without = tuner("run", study, "--check", env=fenv)  # the stand-in's folder has no llama-tokenize: a note
    assert (
        without.returncode == 0
        and (
            f"note: prompt 'essay' (long.yaml: prompts[1]) may not fit measurement.ctx_size 1024, and llama-tokenize is "
            f"not in {folder / 'bin'} to count it; a prompt that does not fit fails its trials as context_exceeded"
        )
        in without.stderr
    )
    (folder / "bin" / "llama-tokenize").symlink_to(llama_bin_dir / "llama-tokenize")
    tokens = llama_tokenize_count(llama_bin_dir / "llama-tokenize", folder / "models" / "target.gguf", essay)
    assert tokens > 3000
    proc = tuner("run", study, "--check", env=fenv)
    assert (proc.returncode, error_line(proc)) == (
        2,
        (
            f"tuner run: error: {study}: measurement.ctx_size: prompt 'essay' (long.yaml: prompts[1]) is {tokens} tokens "
            f"in the target's vocabulary (counted by llama-tokenize), which with n_predict 8 does not fit ctx_size 1024; "
            f"raise measurement.ctx_size to at least {tokens + 9}, or shorten the prompt"
        ),
    )
    assert tuner("run", study, env=fenv).returncode == 2  # a run refuses it the same way, before any launch
    assert launches(tmp_path / "launches.jsonl") == [] and not (tmp_path / "db.sqlite").exists()
    (folder / "long.yaml").write_text(yaml.safe_dump({"prompts": [{"id": "essay", "text": essay[:600]}]}))
    assert tuner("run", study, "--check", env=fenv).returncode == 0  # 100 words fit


# ------------------------------------------------------------------ 9. a text scorer's cache mid-trial (issue 21)


def test_a_scorer_cache_write_during_an_outage_leaves_the_measurement_to_the_journal(tmp_path):
    """The perplexity/kld scorers store their figures per model flags mid-trial, before the journal
    keeps the trial: an outage there used to end the trial and lose its measurement. Now the cache
    is best effort (read empty, write skipped) and the trial's own writes meet the outage after the
    journal has kept it. A read-only database is a real storage that refuses writes."""
    from tuner.storage import outage, store
    from tuner.storage.coordination import open_storage
    from tuner.studyfile.spec import WorkersSpec

    db = tmp_path / "x.db"
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{db}")
    store.write_kld_cache(study, {"-m t.gguf": {"mean_kld": 0.0, "same_top": 1.0}})
    outage.reset()
    try:
        read_only = open_storage(f"sqlite:///file:{db}?mode=ro&uri=true", WorkersSpec(storage_retry_s=0))
        study = optuna.load_study(study_name="s", storage=read_only)
        assert store.kld_cache(study) == {"-m t.gguf": {"mean_kld": 0.0, "same_top": 1.0}}
        store.write_kld_cache(study, {"-m t.gguf --override-kv x": {"mean_kld": 0.1, "same_top": 0.9}})
        store.write_perplexity_cache(study, {"-m t.gguf": 3.2})  # neither raised
        assert outage.is_down()  # the storage is down for the rest of the run...
        assert (
            store.kld_cache(study) == {} and store.perplexity_cache(study) == {}
        )  # ...read empty, not raised
        with pytest.raises(
            outage.StorageDown
        ):  # ...and the trial's own record write (after the journal) stops it
            study.set_user_attr("record", {})
    finally:
        outage.reset()


# ------------------------------------------------------------------ 10. names, full disks, storages, tables (issue 32)

UNSAFE_NAMES = ["../../e1escape", "a/b", ".hidden", "/tmp/e1abs", "-dash", "x" * 101]


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_a_study_name_that_is_a_path_is_refused_by_the_spec_loader_in_one_line(tmp_path, name):
    """A study's name becomes folders (storage/logs/NAME, reports/NAME): a path there wrote outside them."""
    from tuner.errors import UserError
    from tuner.paths import NAME_RULE
    from tuner.studyfile.spec import load_spec

    study = tmp_path / "s.yaml"
    study.write_text(json.dumps({"name": name, "target": "missing.gguf"}))
    with pytest.raises(UserError) as err:
        load_spec(study)  # refused before the (missing) target is even looked at
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{study}: name: {name!r} ")
    assert message.endswith(NAME_RULE)
    assert not (tmp_path / "e1escape").exists() and not Path("/tmp/e1abs").exists()


def test_a_file_stem_that_is_no_study_name_is_refused_and_the_rule_is_named(tmp_path):
    from tuner.errors import UserError
    from tuner.studyfile.spec import load_spec

    for stem in (".hidden", "my study"):
        study = tmp_path / f"{stem}.yaml"
        study.write_text("target: missing.gguf\n")
        with pytest.raises(UserError, match=r"name \(not set, so the file name's stem; set name: or rename"):
            load_spec(study)


@pytest.mark.parametrize("command", ["report", "export"])
def test_a_study_name_that_is_a_path_is_refused_on_the_command_line(fenv, tmp_path, command, capsys):
    from tuner.cli import main

    for name in ("../../e1escape", "a/b", ".hidden", "/tmp/e1abs", "x" * 101):
        assert main([command, name]) == 2
        line = error_line(capsys.readouterr().err)
        assert line.startswith(f"tuner {command}: error: study (not a file, so a study name): {name!r} "), (
            line
        )
        assert line.endswith(
            "a study name is one folder name: letters, digits, '.', '_' and '-', "
            "not starting with '.' or '-', at most 100 characters"
        )
    assert not (tmp_path.parent / "e1escape").exists() and not Path("/tmp/e1abs").exists()


def test_a_joined_name_never_leaves_its_folder(tmp_path):
    from tuner.errors import UserError
    from tuner.paths import inside

    assert inside(tmp_path, "demo", "study") == tmp_path / "demo"
    for name in ("..", "../x", "a/../../x", str(tmp_path.parent / "x"), "/etc", "."):
        with pytest.raises(UserError, match=rf"study {re_quote(name)}: the path .* leaves {tmp_path}"):
            inside(tmp_path, name, "study")


def re_quote(name: str) -> str:
    import re

    return re.escape(repr(name))


@pytest.fixture
def tiny_fs(tmp_path):
    """A 64 kB tmpfs to fill: a real 'No space left on device' for the output writers."""
    yield from mounted_tmpfs(tmp_path / "tiny", "64k")


def test_report_and_export_on_a_full_disk_are_one_line_and_keep_the_old_files(fenv, tmp_path, tiny_fs):
    study = write_study(
        tmp_path / "s", f"sqlite:///{tmp_path / 'db.sqlite'}", name="full", budget={"trials": 2}
    )
    assert tuner("run", study, env=fenv).returncode == 0
    (tiny_fs / "rep").mkdir()
    old = tiny_fs / "rep" / "index.html"
    old.write_text("<p>the previous report</p>\n")
    fill(tiny_fs)
    before = sorted(p.name for p in tiny_fs.rglob("*"))
    proc = tuner("report", study, "--out", tiny_fs / "rep", env=fenv)
    assert proc.returncode == 2
    assert error_line(proc) == (
        f"tuner report: error: {tiny_fs / 'rep' / 'trials.csv'}: cannot write (No space left on device; "
        f"0 B free on {tiny_fs / 'rep'}); free some space or write elsewhere"
    )
    proc = tuner(
        "export", study, "--no-race", "--out", tiny_fs / "exp", "--preset", tiny_fs / "p.ini", env=fenv
    )
    assert proc.returncode == 2
    assert error_line(proc).startswith(
        f"tuner export: error: {tiny_fs / 'exp' / 'serve.sh'}: cannot write (No space left on device; 0 B free"
    )
    assert old.read_text() == "<p>the previous report</p>\n"
    after = sorted(p.name for p in tiny_fs.rglob("*"))
    assert after in (before, sorted([*before, "exp"]))  # no temporary left, nothing half-written


def test_a_failed_rename_leaves_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    import errno

    from tuner.errors import UserError
    from tuner.output import files
    from tuner.output.export import merge_sections

    preset = tmp_path / "models-preset.ini"
    merge_sections(preset, {"demo": ["[demo]", "threads = 2"]})
    old = preset.read_text()
    written = files.write_atomic(tmp_path / "serve.sh", "#!/bin/sh\n", mode=0o755)
    assert written.stat().st_mode & 0o777 == 0o755 and written.read_text() == "#!/bin/sh\n"

    history = (tmp_path / "models-preset.ini.history.jsonl").read_text()
    real = files.os.replace

    def full(src, dst):
        if Path(dst).name == "models-preset.ini.history.jsonl":
            return real(src, dst)  # the section's kept version is written; the preset is not
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "replace", full)
    with pytest.raises(UserError) as err:
        merge_sections(preset, {"other": ["[other]", "threads = 1"]})
    assert str(err.value).startswith(f"{preset}: cannot write (No space left on device; ")
    assert f"free on {tmp_path}); free some space or write elsewhere" in str(err.value)
    with pytest.raises(UserError, match="serve.sh: cannot write"):
        files.write_atomic(tmp_path / "serve.sh", "#!/bin/sh\nexit 1\n")
    assert preset.read_text() == old and written.read_text() == "#!/bin/sh\n"
    assert (tmp_path / "models-preset.ini.history.jsonl").read_text() == history  # put back: no change made
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "models-preset.ini",
        "models-preset.ini.history.jsonl",
        "serve.sh",
    ]


def test_a_storage_other_than_sqlite_or_postgresql_names_its_scheme_and_the_supported_ones(fenv, tmp_path):
    url = "mysql://tuner:Secret-pw@db-host/tuner"
    supported = (
        "the tuner stores studies in SQLite (sqlite:///PATH) or PostgreSQL "
        "(postgresql://USER:PASSWORD@HOST:PORT/DB)"
    )
    study = write_study(tmp_path / "s", url, name="my", budget={"trials": 2})
    for args in (["report", "x", "--storage", url], ["run", study]):
        proc = tuner(*args, env=fenv)
        assert proc.returncode == 2, proc.stderr
        assert error_line(proc) == (
            f"tuner {args[0]}: error: storage mysql://tuner:***@db-host/tuner: the scheme 'mysql://' is not "
            f"supported; {supported}"
        )
        assert "Secret-pw" not in proc.stdout + proc.stderr and "PostgreSQL driver" not in proc.stderr
    assert launches(tmp_path / "launches.jsonl") == []


def test_bench_search_on_a_bind_table_without_numa_node_is_one_line(tmp_path, capsys):
    from benchmarks.cli import main

    rows = [
        "spec_type,draft_max,numa,threads,tokens_per_second,acceptance,quality,cv,quality_floor,feasible,status",
        "none,,none,1,10.0,0.0,1.0,0.01,0.99,True,ok",
        "none,,bind,1,11.0,0.0,1.0,0.01,0.99,True,ok",
        "ngram-simple,2,none,1,12.0,0.5,1.0,0.01,0.99,True,ok",
        "ngram-simple,2,bind,1,13.0,0.5,1.0,0.01,0.99,True,ok",
    ]
    table = tmp_path / "bind.csv"
    table.write_text("\n".join(rows) + "\n")
    assert main(["bench-search", str(table), "--seeds", "1", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(
        "python -m benchmarks bench-search: error: column 'numa_node': not among the table's parameters, and the default "
        "sampler asks it for rows with numa bind"
    )
    # the same table with the node, and with one thread count throughout (a one-core host): replayed
    with_node = [rows[0].replace("numa,", "numa,numa_node,")] + [
        r.replace(",bind,", ",bind,0,").replace(",none,1,", ",none,,1,") for r in rows[1:]
    ]
    table.write_text("\n".join(with_node) + "\n")
    out = tmp_path / "r.json"
    assert main(["bench-search", str(table), "--seeds", "1", "--jobs", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["params"] == ["spec_type", "draft_max", "numa", "numa_node", "threads"]
    assert result["best_config"] == {
        "spec_type": "ngram-simple",
        "draft_max": 2,
        "numa": "bind",
        "numa_node": 0,
        "threads": 1,
    }
