"""The GGUF-reading benchmark: fresh processes, the reference against the tuner's cold and cached reads."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from gguf_factory import DEFAULT_VOCAB_SIZE, write_gguf

from benchmarks import gguf_read
from tuner.errors import UserError


def test_benchmark_times_every_way_of_reading(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    then = time.time_ns() - 60 * 10**9  # older than the cache's "recently modified"
    os.utime(path, ns=(then, then))

    result = gguf_read.benchmark([path], repeats=2, reference_repeats=1)

    [row] = result["files"]
    assert (row["path"], row["vocab_size"]) == (str(path), DEFAULT_VOCAB_SIZE)
    assert len(row["reference_s"]["runs"]) == 1 and len(row["cold_s"]["runs"]) == 2
    assert len(row["same_process_s"]["runs"]) == 4
    for key in ("reference_s", "cold_s", "cached_s", "same_process_s"):
        assert row[key]["median"] > 0
    table = gguf_read.markdown(result)
    assert table.splitlines()[2].startswith(f"| m.gguf (0 MiB) | {DEFAULT_VOCAB_SIZE} | ")
    assert "Medians over 2 fresh processes (1 for gguf's full parse" in table


def test_a_file_modified_just_now_is_refused_for_the_cached_figure(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    soon = time.time_ns() + 60 * 10**9  # "just now" however slowly the bench's processes start
    os.utime(path, ns=(soon, soon))
    with pytest.raises(UserError, match="modified in the last seconds"):
        gguf_read.benchmark([path], repeats=1, reference_repeats=1)


def test_missing_model_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="nowhere.gguf: no such model file"):
        gguf_read.benchmark([tmp_path / "nowhere.gguf"])
