"""Shared fixtures: the real pinned llama.cpp build, the synthetic models, process hygiene."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from pathlib import Path

import pytest

# Every process this test session starts inherits this marker, so the leftover check
# sees our processes only, never another session's on the same machine.
SESSION_MARKER = f"TUNER_TEST_SESSION={uuid.uuid4().hex}"
os.environ["TUNER_TEST_SESSION"] = SESSION_MARKER.split("=", 1)[1]
# Studies the tests start record this bandwidth instead of running the copy probe (a few seconds)
# (test_hardware tests the probe); fake_llama_server.BANDWIDTH is the same figure.
os.environ["TUNER_MEMORY_BANDWIDTH"] = "20e9"
# Started with SIGINT ignored (nohup, `cmd &`, some CI runners), pytest would pass that on to
# every child: a tuner under test would then ignore the Ctrl-C a test sends it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# A real llama.cpp process is known by its *name* (its command line would also match a
# compiler building llama-server's sources); the stand-in server runs as
# ``python .../fake_llama_server.py``, known by that script in its command line.
LLAMA_PROCESS_PREFIX = "llama-"
STAND_IN_SCRIPT = b"fake_llama_server.py"


def running_llama_processes() -> list[str]:
    """llama.cpp processes and stand-in servers started by this test session (``PID COMMAND`` lines).

    A zombie (exited, not reaped yet) has no environment left, so it is not one.
    """
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or SESSION_MARKER.encode() not in (
                proc / "environ"
            ).read_bytes().split(b"\0"):
                continue
            name = (proc / "comm").read_text().strip()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:  # gone already, or not ours to read
            continue
        if name.startswith(LLAMA_PROCESS_PREFIX) or STAND_IN_SCRIPT in cmdline:
            found.append(f"{proc.name} {cmdline.decode(errors='replace').strip()[:200]}")
    return found


def pytest_collection_modifyitems(items):
    """Tests that run the pinned build get the ``llama`` mark: ``-m "not llama"`` is the unit suite."""
    for item in items:
        if {"llama_bin_dir", "synthetic_models"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.llama)


@pytest.fixture(autouse=True, scope="session")
def storage_outside_the_repo(tmp_path_factory):
    """Trial logs and default storages of tests go to a temporary folder, not storage/; the
    host's measurement lock is this session's own, so parallel sessions do not wait on each other."""
    os.environ["TUNER_STORAGE_DIR"] = str(tmp_path_factory.mktemp("storage"))
    os.environ["TUNER_MEASURE_LOCK"] = str(tmp_path_factory.mktemp("lock") / "measure.lock")


@pytest.fixture(scope="session")
def llama_bin_dir():
    """The pinned build (`make test` builds it first); its absence is an error, not a skip."""
    from tuner.machine.llama_build import resolve_bin_dir

    return resolve_bin_dir()


@pytest.fixture(scope="session")
def synthetic_models(llama_bin_dir):
    """The built-in synthetic family (generated once, cached in models/synthetic)."""
    from tuner.synthetic.family import ensure_family

    return ensure_family()


@pytest.fixture(scope="session")
def scale_models(synthetic_models):
    """The family's scale members (made once, about 20 s and 2.7 GB, cached in models/synthetic/scale):
    only the tests of the scale studies' files ask for them."""
    from tuner.synthetic.family import ensure_scale

    return ensure_scale()


@pytest.fixture(autouse=True)
def no_llama_process_left_behind():
    """After every test, none of its llama.cpp servers or stand-ins may still run (a killed
    tuner's orphan included): one left behind skews the rest."""
    before = set(running_llama_processes())
    yield
    leftover = [p for p in running_llama_processes() if p not in before]
    for line in leftover:  # kill them so one failure does not cascade, then fail loudly
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split()[0]), signal.SIGKILL)
    assert not leftover, f"llama.cpp processes left running: {leftover}"


@pytest.fixture
def env(tmp_path, monkeypatch) -> dict:
    """For tests with the stand-in llama-server: logs under tmp_path, every launch recorded."""
    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path / "storage"))
    monkeypatch.setenv("FAKE_LLAMA_LAUNCHES", str(tmp_path / "launches.jsonl"))
    for var in (
        "FAKE_LLAMA_FAULTS",
        "FAKE_LLAMA_DELAY_S",
        "FAKE_LLAMA_COMMIT",
        "FAKE_LLAMA_SPEED",
        "FAKE_LLAMA_JITTER",
        "FAKE_LLAMA_HELP",
    ):
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


@pytest.fixture(scope="module")
def cluster():
    """A private PostgreSQL cluster per test module (workers and fault drills); a skip where none can start."""
    pytest.importorskip(
        "psycopg2", reason="the PostgreSQL driver is the `postgres` extra: pip install -e '.[postgres]'"
    )
    from contextlib import ExitStack

    from postgres import ClusterUnavailable, private_cluster

    with ExitStack() as stack:
        try:
            yield stack.enter_context(private_cluster())
        except ClusterUnavailable as err:
            pytest.skip(f"PostgreSQL cannot start on this machine: {err}")


@pytest.fixture
def database(cluster, request) -> str:
    """A fresh database per test, named after it."""
    return cluster.create_database(request.node.name.lower()[:60])
