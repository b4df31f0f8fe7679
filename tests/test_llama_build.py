"""The pinned llama.cpp build: truthful version, cached, and a user's build first-class."""

import os
import subprocess
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.errors import MissingBinaryError
from tuner.machine.llama_build import (
    ENV_BIN_DIR,
    PINNED_LLAMA_COMMIT,
    TOOLS,
    binary,
    build_pinned,
    find_build_info,
    pinned_bin_dir,
    pinned_root,
    read_binary_version,
    resolve_bin_dir,
)


def test_pinned_server_reports_the_manifest_commit(llama_bin_dir, monkeypatch):
    monkeypatch.delenv(ENV_BIN_DIR, raising=False)
    manifest = build_pinned()
    proc = subprocess.run(
        [str(pinned_bin_dir() / "llama-server"), "--version"], capture_output=True, text=True
    )
    assert f"commit {manifest['commit']})" in proc.stderr
    assert manifest["commit"] == PINNED_LLAMA_COMMIT
    assert all((pinned_bin_dir() / tool).is_file() for tool in TOOLS)


def test_second_build_reuses_the_cache(llama_bin_dir, monkeypatch):
    monkeypatch.delenv(ENV_BIN_DIR, raising=False)
    server = pinned_bin_dir() / "llama-server"
    log = pinned_root() / "build.log"
    before = (server.stat().st_mtime_ns, log.stat().st_mtime_ns)
    assert build_pinned() == build_pinned()
    assert (server.stat().st_mtime_ns, log.stat().st_mtime_ns) == before  # nothing rebuilt, no cmake run


def test_user_build_is_read_from_its_binaries(llama_bin_dir, tmp_path, monkeypatch):
    user_bin = tmp_path / "my-build"
    user_bin.symlink_to(pinned_bin_dir())
    monkeypatch.setenv(ENV_BIN_DIR, str(user_bin))
    assert resolve_bin_dir() == user_bin
    info = find_build_info()
    assert info["source"] == "user build"
    assert info["commit"] == read_binary_version(binary("llama-server")).commit == PINNED_LLAMA_COMMIT


def test_missing_binary_and_bad_bin_dir_are_clear_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ENV_BIN_DIR, str(tmp_path))
    with pytest.raises(MissingBinaryError, match=r"llama-server not found; build it with `make llama`"):
        binary("llama-server")
    monkeypatch.setenv(ENV_BIN_DIR, str(tmp_path / "nope"))
    assert main(["llama"]) == 3
    err = capsys.readouterr().err
    assert f"{ENV_BIN_DIR}={tmp_path / 'nope'}: not a directory" in err and err.count("\n") == 1


def test_a_binary_that_is_not_executable_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "llama-server").write_text("not a program\n")
    os.chmod(tmp_path / "llama-server", 0o644)
    monkeypatch.setenv(ENV_BIN_DIR, str(tmp_path))
    with pytest.raises(MissingBinaryError, match=r"llama-server exists but is not executable; chmod \+x it"):
        binary("llama-server")
    assert main(["llama", "--bin-dir", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert (
        f"{tmp_path / 'llama-server'}: llama-server exists but is not executable; chmod +x it or point "
        in err
    )
    assert f"{ENV_BIN_DIR} at a build's bin/ folder" in err and err.count("\n") == 1


def test_not_a_llama_binary(tmp_path):
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho hello\n")
    os.chmod(fake, 0o755)
    with pytest.raises(MissingBinaryError, match="printed no llama.cpp build info"):
        read_binary_version(fake)
