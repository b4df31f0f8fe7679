"""Shared fixtures: the real pinned llama.cpp build, the synthetic models, process hygiene."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

# Matched against the process *name* (not the command line, which would also match a
# compiler building llama-server's sources); the kernel keeps 15 characters of it.
LLAMA_PROCESS_NAME = r"^llama-"
# Every process this test session starts inherits this marker, so the leftover check
# sees our llama.cpp processes only, never another session's on the same machine.
SESSION_MARKER = f"TUNER_TEST_SESSION={uuid.uuid4().hex}"
os.environ["TUNER_TEST_SESSION"] = SESSION_MARKER.split("=", 1)[1]


def _ours(pid: str) -> bool:
    try:
        return SESSION_MARKER.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone already, or not ours to read
        return False


def running_llama_processes() -> list[str]:
    """llama.cpp processes started by this test session (``PID NAME`` lines)."""
    proc = subprocess.run(["pgrep", "-a", LLAMA_PROCESS_NAME], capture_output=True, text=True)
    return [line for line in proc.stdout.splitlines() if _ours(line.split()[0])]


@pytest.fixture(autouse=True, scope="session")
def storage_outside_the_repo(tmp_path_factory):
    """Trial logs and default storages of tests go to a temporary folder, not storage/; the
    host's measurement lock is this session's own, so parallel sessions do not wait on each other."""
    os.environ["TUNER_STORAGE_DIR"] = str(tmp_path_factory.mktemp("storage"))
    os.environ["TUNER_MEASURE_LOCK"] = str(tmp_path_factory.mktemp("lock") / "measure.lock")


@pytest.fixture(scope="session")
def llama_bin_dir():
    """The pinned build (`make test` builds it first); its absence is an error, not a skip."""
    from tuner.llama_build import resolve_bin_dir

    return resolve_bin_dir()


@pytest.fixture(scope="session")
def synthetic_models(llama_bin_dir):
    """The built-in synthetic family (generated once, cached in models/synthetic)."""
    from tuner.synthetic.family import ensure_family

    return ensure_family()


@pytest.fixture(autouse=True)
def no_llama_process_left_behind():
    """After every test, no llama.cpp process may still run: one left behind skews the rest."""
    before = set(running_llama_processes())
    yield
    leftover = [p for p in running_llama_processes() if p not in before]
    for line in leftover:  # kill them so one failure does not cascade, then fail loudly
        subprocess.run(["kill", "-9", line.split()[0]], check=False)
    assert not leftover, f"llama.cpp processes left running: {leftover}"


@pytest.fixture
def env(tmp_path, monkeypatch) -> dict:
    """For tests with the stand-in llama-server: logs under tmp_path, every launch recorded."""
    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path / "storage"))
    monkeypatch.setenv("FAKE_LLAMA_LAUNCHES", str(tmp_path / "launches.jsonl"))
    for var in ("FAKE_LLAMA_FAULTS", "FAKE_LLAMA_DELAY_S", "FAKE_LLAMA_COMMIT", "FAKE_LLAMA_SPEED", "FAKE_LLAMA_JITTER"):
        monkeypatch.delenv(var, raising=False)
    return dict(os.environ)


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> str:
    """One SQLite file for a test module's studies: creating an Optuna schema costs seconds on a busy box."""
    return f"sqlite:///{tmp_path_factory.mktemp('storage') / 'studies.db'}"


@pytest.fixture(scope="module")
def demo(storage, tmp_path_factory):
    """(study, record) of the stand-in's demo study (``fake_llama_server.write_demo_study``),
    measured by the real runner once per test module that reads it."""
    from fake_llama_server import DEMO_FAULTS, run_study_file, write_demo_study

    folder = tmp_path_factory.mktemp("demo")
    return run_study_file(write_demo_study(folder, storage), FAKE_LLAMA_FAULTS=DEMO_FAULTS)
