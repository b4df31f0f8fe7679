"""Compare two studies (`tuner compare A B`): two llama.cpp builds, or two machines.

Modelled on llama.cpp's compare-llama-bench: results are joined on identical
configurations (the trial's stored ``config``), each side reduced to its median
tokens/s over repeats, and shown as t/s A, t/s B and B/A. The header says which
fingerprint comparability keys (``tuner.machine.fingerprint.COMPARABILITY_KEYS``) differ, which
is what the ratio measures. Everything else that makes numbers comparable (the models,
identified by content rather than path, the workload's texts, the measurement settings,
the scorer and floor) must be equal: otherwise the comparison is refused, naming it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna
import pandas as pd

from tuner.errors import UserError
from tuner.knobs.registry import INT_KNOBS
from tuner.knobs.registry import NAMES as KNOBS
from tuner.machine.fingerprint import COMPARABILITY_KEYS
from tuner.output.analysis import complete, trials_frame
from tuner.storage import store
from tuner.storage.records import StudyRecord, changes

# Differences a comparison reports instead of refusing: what it measures, or what joining on configurations absorbs.
MEASURED_DIFFERENCES = (*COMPARABILITY_KEYS, "search space", "objectives")


@dataclass(frozen=True)
class Comparison:
    """Study B against study A on the configurations both measured."""

    name_a: str
    name_b: str
    differing: list[tuple[str, Any, Any]]  # (fingerprint key, A's value, B's value)
    rows: pd.DataFrame  # knob columns, then tps_a, tps_b, ratio, acceptance_a, acceptance_b, n_a, n_b
    only_a: int  # configurations measured in A only
    only_b: int
    geomean_ratio: float | None


def _per_config(frame: pd.DataFrame) -> pd.DataFrame:
    """Complete trials reduced to one row per configuration (median over repeats)."""
    done = complete(frame)
    if done.empty:
        return pd.DataFrame(columns=["key", "tokens_per_second", "acceptance", "n"])
    done = done.assign(key=[_config_key(r) for _, r in done[list(KNOBS)].iterrows()])
    return done.groupby("key", as_index=False).agg(
        tokens_per_second=("tokens_per_second", "median"),
        acceptance=("acceptance", "median"),
        n=("trial", "count"),
    )


def _config_key(row: pd.Series) -> str:
    return json.dumps({k: (None if pd.isna(v) else v) for k, v in row.items()}, sort_keys=True, default=str)


def _differences(
    values_a: Mapping[str, Any], values_b: Mapping[str, Any], keys: tuple[str, ...]
) -> list[tuple[str, Any, Any]]:
    return [(k, values_a.get(k), values_b.get(k)) for k in keys if values_a.get(k) != values_b.get(k)]


def compare_studies(
    study_a: optuna.Study, record_a: StudyRecord, study_b: optuna.Study, record_b: StudyRecord
) -> Comparison:
    """Join A and B on identical configurations; B/A ratios and the fingerprint differences."""
    incomparable = changes(record_a, record_b, ignore=MEASURED_DIFFERENCES, sides=("A has", "B has"))
    if incomparable:
        raise UserError(
            f"study {study_b.study_name!r} cannot be compared with {study_a.study_name!r}: "
            f"{incomparable[0]}; "
            "compare studies of the same models, workload, measurement settings and scorer"
        )
    per_a, per_b = (
        _per_config(trials_frame(store.read_trials(study_a))),
        _per_config(trials_frame(store.read_trials(study_b))),
    )
    joined = per_a.merge(per_b, on="key", suffixes=("_a", "_b"))
    knobs = pd.DataFrame([json.loads(k) for k in joined["key"]], columns=list(KNOBS))
    for knob in INT_KNOBS:
        knobs[knob] = knobs[knob].astype("Int64")
    rows = pd.concat(
        [
            knobs,
            pd.DataFrame(
                {
                    "tps_a": joined["tokens_per_second_a"],
                    "tps_b": joined["tokens_per_second_b"],
                    "ratio": joined["tokens_per_second_b"] / joined["tokens_per_second_a"],
                    "acceptance_a": joined["acceptance_a"],
                    "acceptance_b": joined["acceptance_b"],
                    "n_a": joined["n_a"],
                    "n_b": joined["n_b"],
                }
            ),
        ],
        axis=1,
    ).sort_values("tps_a", ascending=False, ignore_index=True)
    ratios = [r for r in rows["ratio"] if r > 0 and math.isfinite(r)]
    fp_a, fp_b = record_a.fingerprint, record_b.fingerprint
    return Comparison(
        name_a=study_a.study_name,
        name_b=study_b.study_name,
        differing=_differences(fp_a, fp_b, COMPARABILITY_KEYS),
        rows=rows,
        only_a=len(per_a) - len(joined),
        only_b=len(per_b) - len(joined),
        geomean_ratio=math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
    )


def _cell(value: Any, digits: int | None = 2) -> str:
    """A measurement with ``digits`` decimals; knobs (``digits=None``) as compactly as they read."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:g}" if digits is None else f"{value:.{digits}f}"
    return str(value)


def format_markdown(comparison: Comparison) -> str:
    """Header (what differs), then a pipe table of the joined configurations."""
    lines = [f"Comparing {comparison.name_b} (B) against {comparison.name_a} (A)."]
    if comparison.differing:
        lines.append(
            "Fingerprint keys that differ: "
            + "; ".join(f"{k}: {va!r} (A) vs {vb!r} (B)" for k, va, vb in comparison.differing)
        )
    else:
        lines.append(
            "All comparability keys are equal (" + ", ".join(COMPARABILITY_KEYS) + "): differences are noise."
        )
    lines.append(
        f"{len(comparison.rows)} configurations in both; "
        f"{comparison.only_a} only in A, {comparison.only_b} only in B."
    )
    if comparison.rows.empty:
        return "\n".join(lines)
    varying = [k for k in KNOBS if comparison.rows[k].astype(str).nunique() > 1] or ["spec_type"]
    measured = ["t/s A", "t/s B", "B/A", "accept A", "accept B"]
    lines += [
        "",
        "| " + " | ".join(varying + measured) + " |",
        "|" + "|".join(["---"] * len(varying) + ["---:"] * len(measured)) + "|",
    ]
    for _, row in comparison.rows.iterrows():
        cells = [_cell(row[k], None) for k in varying] + [
            _cell(row["tps_a"]),
            _cell(row["tps_b"]),
            _cell(row["ratio"]),
            _cell(row["acceptance_a"]),
            _cell(row["acceptance_b"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if comparison.geomean_ratio is not None:
        lines += [
            "",
            f"Geometric mean B/A over {len(comparison.rows)} configurations: {comparison.geomean_ratio:.3f}",
        ]
    return "\n".join(lines)
