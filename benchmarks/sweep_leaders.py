"""A sweep's leaders launched again, in interleaved rounds with its baseline: what ranks the configurations that one
launch each cannot separate.

Why: a sweep measures each configuration in one launch, and on the 2-core host the baseline's own launches differ by
up to a third (docs/decisions.md, "The sweep's baseline"). Two rows a few percent apart are then not ranked, yet
section 5 reads the sweep's best K and checks the race against it. The leaders (the rows within ``LEADER_BAND`` of
the best, at most ``MOST_LEADERS``) and the baseline are launched once per round in a Williams order
(``decisions.remeasure``, as a race launches its finalists). A leader's speedup is the median of its launches' rates
over the median of the baseline's, so the leaders, launched in the same rounds, rank by their own rates. Not the
median of per-round ratios: on the scale target the baseline's launches spread by a quarter (26.2 to 31.1 tokens/s)
while the leaders' spread by 2 to 5%, and not together (code's leader read its fastest in the baseline's slowest
round), so dividing round by round would rank the leaders by the baseline's noise.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.grid_recorder import row_knobs
from tuner.decisions.remeasure import config_contender, rounds_of_launches
from tuner.knobs.config import TrialConfig
from tuner.measurement.launch import build_server_argv
from tuner.prepare import StudyContext
from tuner.progress import Progress
from tuner.search.space import baseline_config

LEADER_BAND = 0.10  # rows within this of the sweep's best are launched again: about one launch's spread here
MOST_LEADERS = 4  # and at most this many, the fastest first
LEADER_ROUNDS = 3  # rounds of one launch each (section 5)


def leaders(rows: list[dict], band: float = LEADER_BAND, most: int = MOST_LEADERS) -> list[dict]:
    """The speculative rows within ``band`` of the best quiet, feasible row, fastest first, at most ``most``."""
    ok = [
        r
        for r in rows
        if r.get("status") == "ok"
        and r.get("feasible")
        and not r.get("host_busy")
        and r["spec_type"] != "none"
    ]
    if not ok:
        return []
    top = max(r["speedup"] for r in ok)
    return sorted((r for r in ok if r["speedup"] >= top * (1 - band)), key=lambda r: -r["speedup"])[:most]


def leaders_path(csv: Path) -> Path:
    """Where a sweep's leaders are kept: ``NAME.leaders.json`` beside its table."""
    return csv.with_suffix(".leaders.json")


def relaunch_leaders(ctx: StudyContext, rows: list[dict], csv: Path, rounds: int, progress: Progress) -> dict:
    """Launch the sweep's leaders and its baseline ``rounds`` times, interleaved; written to ``leaders_path``."""
    configs = [TrialConfig(**row_knobs(r)) for r in leaders(rows)]
    base = baseline_config(ctx.space)
    labels = {f"leader-{i}": c for i, c in enumerate(configs)} | {"baseline": base}
    contenders = [
        config_contender(
            label,
            config,
            build_server_argv(config, ctx.launch),
            tuple(str(m) for m in ctx.launch.model_files(config)),
        )
        for label, config in labels.items()
    ]
    progress(
        f"the sweep's {len(configs)} leader(s) and its baseline launched again: {rounds} interleaved rounds"
    )
    rates = rounds_of_launches(contenders, ctx.workload, ctx.settings, rounds, ctx.log_dir, progress)
    baseline = rates["baseline"].tokens_per_second
    found: dict[str, Any] = {
        "rounds": rounds,
        "band": LEADER_BAND,
        "baseline": baseline,
        "leaders": [
            {**config.as_dict(), **_speedup(rates[label].tokens_per_second, baseline)}
            for label, config in labels.items()
            if label != "baseline"
        ],
    }
    leaders_path(csv).write_text(json.dumps(found) + "\n")
    return found


def _speedup(rates: list[float], baseline: list[float]) -> dict[str, Any]:
    """A leader's launches, its speedup (its median rate over the baseline's) and the range of its per-round
    ratios to the baseline."""
    ratios = [r / b for r, b in zip(rates, baseline) if b > 0]
    return {
        "rates": rates,
        "ratios": ratios,
        "speedup": statistics.median(rates) / statistics.median(baseline),
        "low": min(ratios),
        "high": max(ratios),
    }


def read_leaders(csv: Path) -> dict | None:
    """A sweep's relaunched leaders, if recorded."""
    path = leaders_path(csv)
    return json.loads(path.read_text()) if path.is_file() else None
