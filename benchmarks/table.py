"""Recorded-grid tables: the columns `record-grid` writes and how any table is read back; bench.md's tables.

One row per configuration: parameter columns (empty where a knob does not apply, e.g.
no draft without speculation), then result columns. Parameter columns are whatever is
not a known result column; a user's own table may name them instead (``--params``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from tuner.errors import UserError

# Columns that describe a measurement, never a configuration.
METRIC_COLUMNS = ("tokens_per_second", "acceptance", "quality", "speedup")
RESULT_COLUMNS = (
    *METRIC_COLUMNS,
    "cv",  # coefficient of variation of tokens/s over repetitions: the replay's noise
    "quality_floor",
    "feasible",  # quality at or above the floor
    "status",  # "ok" or a FailureReason value
    "failure_detail",
    "drafted",
    "accepted",
    "generated",  # tokens the requests generated (llama.cpp's predicted_n, summed)
    "requests",  # requests measured (every repetition's)
    "launch_s",  # server start until ready, shared by the configurations of one launch
    "measure_s",
    "build_commit",
    "cpu_model",
    "space_digest",
    "n_predict",
    "repetitions",
)


def read_table(path: Path) -> pd.DataFrame:
    """A CSV or JSONL table; a missing or empty file is a UserError."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such table; record one with `python -m benchmarks record-grid STUDY`")
    try:
        if path.suffix in (".jsonl", ".json"):
            frame = pd.read_json(path, lines=True)
        else:
            frame = pd.read_csv(path)
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise UserError(
            f"{path}: cannot read it as {'JSONL' if path.suffix in ('.jsonl', '.json') else 'CSV'} ({err})"
        ) from err
    if frame.empty:
        raise UserError(f"{path}: the table has no rows")
    return frame


def parameter_columns(frame: pd.DataFrame, given: list[str] | None = None) -> list[str]:
    """The given columns (checked), else every non-result column that takes more than one value.

    A column with one value is not a choice anybody made (e.g. numa on a one-node
    machine), so it is left out of the replayed space.
    """
    if given:
        missing = [c for c in given if c not in frame.columns]
        if missing:
            raise UserError(
                f"--params: {missing[0]!r} is not a column of the table (columns: {', '.join(frame.columns)})"
            )
        return list(given)
    params = [c for c in frame.columns if c not in RESULT_COLUMNS and frame[c].nunique(dropna=False) > 1]
    if not params:
        raise UserError("the table has no parameter column that varies; name them with --params")
    return params


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table's lines: the header, its rule, one line per row."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
