"""The offline bundle: bad input in one line, install.sh's own checks, an archive written whole, and the
bundle built here, then installed and run inside a network namespace that has no network."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from test_bench import grid_study  # a two-temperature grid: --trials 1 measures its greedy baseline

from tuner.bundle import BUILD_BACKEND, Target, build_bundle, install_script, make_target, write_archive
from tuner.cli import main
from tuner.errors import UserError
from tuner.machine.llama_build import PINNED_SDIST_SHA256, SDIST_NAME, keep_sdist, sha256_of
from tuner.paths import REPO_ROOT, models_dir

# The interpreter this venv was made from: install.sh makes its own venv with it.
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--python-version", "3.9"], "--python-version 3.9: the tuner needs CPython 3.10 or newer"),
        (["--python-version", "twelve"], "pass e.g. 3.12"),
        (["--platform", "many linux"], "--platform many linux: not a wheel platform tag; pass e.g."),
    ],
)
def test_a_bad_target_is_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bundle", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_patch_version_names_its_minor_version() -> None:
    """make reads PYTHON_VERSION from the environment, where a Python image sets 3.12.7."""
    target = make_target("3.12.7", "manylinux2014_x86_64", ["postgres"])
    assert target.label == "py3.12-manylinux2014_x86_64"
    assert target.pip_options() == [
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--platform",
        "manylinux2014_x86_64",
    ]


def test_the_build_backend_is_pyprojects() -> None:
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert pyproject["build-system"]["requires"] == [BUILD_BACKEND]


def fake_tools(folder: Path, names: list[str]) -> Path:
    """Commands that exist and succeed, for install.sh's checks."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text("#!/bin/sh\nexit 0\n")
        (folder / name).chmod(0o755)
    return folder


def run_install(folder: Path, path: str, python_version: str = "3.11") -> subprocess.CompletedProcess[str]:
    (folder / "install.sh").write_text(install_script(Target(python_version)))
    env = {"PATH": path, "HOME": str(folder)}
    return subprocess.run(["/bin/sh", str(folder / "install.sh")], capture_output=True, text=True, env=env)


def test_install_names_what_is_missing_and_how_to_install_it_in_one_line(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(BASE_PYTHON)
    for tool in ("dirname", "id", "sort", "tr"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    proc = run_install(tmp_path, str(bin_dir))
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("install.sh: missing: cmake make cc c++; install with: ")
    assert "apt-get install -y build-essential cmake (Debian, Ubuntu)" in proc.stderr
    assert "dnf install -y cmake gcc gcc-c++ make (Fedora, RHEL), then run ./install.sh again" in proc.stderr


def test_install_refuses_another_python_in_one_line(tmp_path: Path) -> None:
    tools = fake_tools(tmp_path / "bin", ["cmake", "make", "cc", "c++"])
    (tools / "python3").symlink_to(BASE_PYTHON)
    proc = run_install(tmp_path, f"{tools}:{os.environ['PATH']}", python_version="3.99")
    have = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr == (
        f"install.sh: the wheels are for Python 3.99 but python3 is {have}; run `make bundle "
        f"PYTHON_VERSION={have}` on the connected machine, or PYTHON=python3.99 ./install.sh\n"
    )


def test_a_failed_archive_write_leaves_the_old_archive_and_no_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "bundle.tar.gz"
    path.write_bytes(b"the previous bundle")
    (tmp_path / "a.txt").write_text("a\n")
    added: list[str] = []
    real_add = tarfile.TarFile.add

    def add_until_the_disk_is_full(self: tarfile.TarFile, name: str, arcname: str, **kwargs: object) -> None:
        if added:
            raise OSError(errno.ENOSPC, "No space left on device")
        added.append(arcname)
        real_add(self, name, arcname, **kwargs)

    monkeypatch.setattr(tarfile.TarFile, "add", add_until_the_disk_is_full)
    with pytest.raises(
        UserError, match=r"bundle.tar.gz: cannot write \(No space left on device; .* free on .*\); free"
    ):
        write_archive(path, [(tmp_path / "a.txt", "b/a.txt"), (tmp_path / "a.txt", "b/again.txt")])
    assert path.read_bytes() == b"the previous bundle"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "bundle.tar.gz"]


def test_a_source_archive_that_is_not_the_pinned_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fake = tmp_path / SDIST_NAME
    fake.write_bytes(b"not llama.cpp")
    with pytest.raises(UserError, match="is not the pinned"):
        keep_sdist(fake)
    assert main(["llama", "--sdist", str(fake), "--fetch-only"]) == 2
    err = capsys.readouterr().err
    assert f"--sdist {fake}: sha256 " in err and err.count("\n") == 1
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------------ the bundle, installed without network

# Brings the namespace's loopback up (a fresh network namespace has it down): llama-server listens on
# 127.0.0.1. SIOCGIFFLAGS / SIOCSIFFLAGS with IFF_UP, so no iproute2 is needed.
LOOPBACK_UP = """
import fcntl, socket, struct
s = socket.socket()
flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0)))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))
"""
# The namespace's interfaces (/proc/net/dev is per network namespace; /sys/class/net is not remounted),
# then a connection to the package index, which must fail.
NETWORK_PROBE = """
import socket
names = [line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:]]
print("interfaces:", ",".join(names))
try:
    socket.create_connection(("pypi.org", 443), timeout=5).close()
    print("pypi.org: reached")
except OSError as err:
    print("pypi.org: unreachable", type(err).__name__)
"""
OFFLINE_SCRIPT = """set -eu
"$PYTHON" -c "$LOOPBACK_UP"
"$PYTHON" -c "$NETWORK_PROBE"
./install.sh
make setup
.venv/bin/python -c "from tuner.machine.llama_build import source_dir; print('source:', source_dir())"
.venv/bin/tuner run studies/demo.yaml --check
.venv/bin/tuner run "$GRID_STUDY" --trials 1 --no-race
"""


def network_namespace() -> list[str]:
    """``unshare -n`` as root, else in a user namespace; a skip naming why where neither is allowed."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed: no network namespace to install the bundle in")
    for argv in (["unshare", "-n"], ["unshare", "-r", "-n"]):
        if subprocess.run([*argv, "true"], capture_output=True).returncode == 0:
            return argv
    why = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True).stderr.strip()
    pytest.skip(f"no network namespace allowed here (root or unprivileged user namespaces needed): {why}")


def offline_env(tmp_path: Path, llama_bin_dir: Path) -> dict[str, str]:
    """No pip configuration (its find-links and indexes), no PYTHONPATH (the bundle's own code runs), a
    fresh cache, this machine's llama.cpp build."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    return env | {
        "PIP_CONFIG_FILE": os.devnull,
        "PYTHON": BASE_PYTHON,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "LLAMA_CPP_BIN": str(llama_bin_dir),
        "TUNER_STORAGE_DIR": str(tmp_path / "storage"),
        "GRID_STUDY": str(grid_study(tmp_path)),
        "LOOPBACK_UP": LOOPBACK_UP,
        "NETWORK_PROBE": NETWORK_PROBE,
    }


@pytest.mark.slow
def test_the_bundle_installs_and_runs_a_trial_without_network(
    synthetic_models, llama_bin_dir: Path, tmp_path: Path
) -> None:
    """About 50 s here with pip's cache warm (the first bundle downloads ~130 MB: wheels and llama.cpp's
    source); install.sh then needs no network: pip --no-index, the source kept, a study checked, a trial."""
    unshare = network_namespace()
    if subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: a bundle holds the files git tracks")
    archive = build_bundle(REPO_ROOT, tmp_path / "dist", make_target(None, None, None))
    server = tmp_path / "server"
    server.mkdir()
    subprocess.run(["tar", "xzf", str(archive)], cwd=server, check=True)
    bundle = server / archive.name.removesuffix(".tar.gz")
    (bundle / "models").symlink_to(models_dir())  # what `make models` would generate there
    proc = subprocess.run(
        [*unshare, "bash", "-c", OFFLINE_SCRIPT],
        cwd=bundle,
        env=offline_env(tmp_path, llama_bin_dir),
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "interfaces: lo\n" in out and "pypi.org: unreachable" in out
    assert "install.sh: installed. Next, on this host:" in out and "make demo" in out
    kept = tmp_path / "cache" / "llama-tuner" / "llama.cpp" / "sdist" / SDIST_NAME
    assert sha256_of(kept) == PINNED_SDIST_SHA256
    assert f"source: {tmp_path / 'cache'}" in out  # `make llama` would build from it
    assert "time estimate" in out  # the demo study checked
    assert "[1/1] trial 0:" in out and "best feasible" in out
    shutil.rmtree(server)
    shutil.rmtree(tmp_path / "cache")
