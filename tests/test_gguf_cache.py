"""The GGUF header cache: hit when the file is unchanged, never stale, never an error itself."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from gguf_factory import spm_tokens, write_gguf

from tuner.models import gguf_cache
from tuner.models.gguf_info import check_draft_compatibility, read_model_info


@pytest.fixture
def parses(tmp_path: Path, monkeypatch) -> list[Path]:
    """The files parsed (not served from the cache) during the test; the cache in tmp_path."""
    monkeypatch.setattr(gguf_cache, "cache_root", lambda: tmp_path / "cache")
    parsed: list[Path] = []
    parse = gguf_cache.parse_header
    monkeypatch.setattr(gguf_cache, "parse_header", lambda p: parsed.append(p) or parse(p))
    gguf_cache.clear_memo()
    yield parsed
    gguf_cache.clear_memo()


def _aged(path: Path, seconds_ago: float = 60) -> Path:
    """As if written a while ago: the cache never keeps a file modified in the last seconds."""
    then = time.time_ns() - int(seconds_ago * 1e9)
    os.utime(path, ns=(then, then))
    return path


def _entries(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache").glob("*.npz"))


def test_second_read_is_served_from_memory_then_from_disk(tmp_path: Path, parses: list[Path]) -> None:
    path = _aged(
        write_gguf(
            tmp_path / "m.gguf",
            architecture="qwen3moe",
            expert_count=8,
            expert_used_count=2,
            block_count=2,
            nextn=True,
        )
    )
    first = read_model_info(path)
    assert len(parses) == 1 and len(_entries(tmp_path)) == 1

    again = read_model_info(path)  # same process
    gguf_cache.clear_memo()
    from_disk = read_model_info(path)  # as a new process would
    assert len(parses) == 1
    for info in (again, from_disk):
        assert info.to_dict() == first.to_dict()
        assert info.speculative_types == ("draft-mtp",)  # its MTP tensor's name kept in the entry
        assert [info.vocab.text(i) for i in range(info.vocab_size)] == spm_tokens()
        assert check_draft_compatibility(first, info).ok


def test_path_is_reported_as_given(tmp_path: Path, parses: list[Path], monkeypatch) -> None:
    path = _aged(write_gguf(tmp_path / "m.gguf"))
    read_model_info(path)
    monkeypatch.chdir(tmp_path)
    assert read_model_info(Path("m.gguf")).path == Path("m.gguf")
    assert len(parses) == 1  # the key is the resolved path


def test_a_rewritten_file_is_read_again(tmp_path: Path, parses: list[Path]) -> None:
    path = _aged(write_gguf(tmp_path / "m.gguf"))
    assert read_model_info(path).vocab.text(10) == spm_tokens()[10]
    changed = spm_tokens()
    changed[10] = changed[10][::-1]  # same size: only the mtime tells the files apart
    size = path.stat().st_size
    _aged(write_gguf(path, tokens=changed), seconds_ago=30)
    assert path.stat().st_size == size
    assert read_model_info(path).vocab.text(10) == changed[10]
    assert len(parses) == 2


def test_touching_a_file_misses(tmp_path: Path, parses: list[Path]) -> None:
    path = _aged(write_gguf(tmp_path / "m.gguf"))
    read_model_info(path)
    _aged(path, seconds_ago=30)
    read_model_info(path)
    assert len(parses) == 2


def test_a_recently_modified_file_is_never_cached(tmp_path: Path, parses: list[Path], monkeypatch) -> None:
    monkeypatch.setattr(gguf_cache, "RECENT_NS", 3600 * 10**9)  # however slowly this test runs
    path = _aged(write_gguf(tmp_path / "m.gguf"), seconds_ago=60)
    read_model_info(path)
    read_model_info(path)
    assert len(parses) == 2 and _entries(tmp_path) == []


@pytest.mark.parametrize("garbage", [b"", b"not an npz", b"PK\x03\x04" + b"\0" * 64])
def test_a_corrupt_entry_is_ignored_and_replaced(tmp_path: Path, parses: list[Path], garbage: bytes) -> None:
    path = _aged(write_gguf(tmp_path / "m.gguf"))
    expected = read_model_info(path).to_dict()
    [entry] = _entries(tmp_path)
    entry.write_bytes(garbage)
    gguf_cache.clear_memo()
    assert read_model_info(path).to_dict() == expected
    gguf_cache.clear_memo()
    assert read_model_info(path).to_dict() == expected
    assert len(parses) == 2  # the corrupt entry was rewritten by the second parse


def test_an_entry_for_another_file_is_ignored(tmp_path: Path, parses: list[Path]) -> None:
    a = _aged(write_gguf(tmp_path / "a.gguf", name="a"))
    b = _aged(write_gguf(tmp_path / "b.gguf", name="b"))
    read_model_info(a)
    read_model_info(b)
    first, second = _entries(tmp_path)
    first.write_bytes(second.read_bytes())  # one file's entry under the other's name
    gguf_cache.clear_memo()
    assert {read_model_info(a).name, read_model_info(b).name} == {"a", "b"}


def test_an_unwritable_cache_folder_only_costs_time(tmp_path: Path, parses: list[Path], monkeypatch) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(gguf_cache, "cache_root", lambda: tmp_path / "file" / "cache")
    path = _aged(write_gguf(tmp_path / "m.gguf"))
    assert read_model_info(path).architecture == "llama"
    gguf_cache.clear_memo()
    assert read_model_info(path).architecture == "llama"
    assert len(parses) == 2


def test_the_least_recently_used_entries_are_pruned(tmp_path: Path, parses: list[Path], monkeypatch) -> None:
    monkeypatch.setattr(gguf_cache, "MAX_ENTRIES", 2)
    paths = [_aged(write_gguf(tmp_path / f"m{i}.gguf")) for i in range(3)]
    for path in paths:
        read_model_info(path)
        time.sleep(0.01)  # distinct entry mtimes
    assert len(_entries(tmp_path)) == 2
    gguf_cache.clear_memo()
    read_model_info(paths[0])  # pruned: parsed again
    read_model_info(paths[2])  # kept
    assert parses == [*paths, paths[0]]
