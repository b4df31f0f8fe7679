"""Re-measure several configurations side by side: all servers up, rounds in alternating order.

Why: a figure recorded minutes ago on a shared machine can be luck. Measuring the
contenders now, each round one pass of the workload on each, in forward then reverse
order (or a shuffled one), compares configurations rather than moments of a noisy machine.
The finalist race (``tuner.decisions.race``, at the end of a run and in export), the per-type race
and the repeatability benchmark all use this.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

from tuner.errors import UserError
from tuner.measurement.failures import TrialFailure
from tuner.measurement.measure import MeasurementSettings, pooled_rate, run_workload
from tuner.measurement.runner import LlamaServer, free_port
from tuner.measurement.workload import Workload


@dataclass(frozen=True)
class Contender:
    label: str  # also the log file's name: remeasure-LABEL.log
    argv: list[str]  # without --host/--port
    temperature: float


@dataclass(frozen=True)
class Rates:
    tokens_per_second: list[float]  # one pooled rate per round
    drafted: int  # draft tokens over all rounds (0 with speculation on: it was off)
    per_suite: dict[str, list[float]] = field(default_factory=dict)  # suite -> one pooled rate per round


def alternate(contenders: list[Contender], workload: Workload, settings: MeasurementSettings, rounds: int,
              log_dir: Path, progress: Callable[[str], None] = print, shuffle_seed: int | None = None) -> dict[str, Rates]:
    """Each round one pass of the workload per contender; the first round warms up as a trial does.

    The order alternates (forward, then reverse), or with ``shuffle_seed`` is shuffled afresh
    every round, so no contender always runs first or right after the same neighbour."""
    rng = random.Random(shuffle_seed)
    rates: dict[str, list[float]] = {c.label: [] for c in contenders}
    drafted = dict.fromkeys(rates, 0)
    per_suite: dict[str, dict[str, list[float]]] = {c.label: {s: [] for s in workload.suites} for c in contenders}
    timeout = settings.trial_timeout_s
    try:
        with ExitStack() as stack:
            servers = [(c, stack.enter_context(LlamaServer(c.argv, free_port(), log_dir / f"remeasure-{c.label}.log",
                                                           ready_timeout_s=timeout, request_timeout_s=timeout)))
                       for c in contenders]
            for r in range(rounds):
                once = replace(settings, warmup=settings.warmup if r == 0 else 0, repetitions=1)
                order = servers if r % 2 == 0 else servers[::-1]
                if shuffle_seed is not None:
                    order = rng.sample(servers, len(servers))
                for contender, server in order:
                    samples = run_workload(server, workload, once, contender.temperature)
                    rates[contender.label].append(pooled_rate(samples))
                    drafted[contender.label] += sum(s.draft_n for s in samples)
                    for suite, values in per_suite[contender.label].items():
                        values.append(pooled_rate(s for s in samples if s.suite == suite))
                progress(f"re-measure round {r + 1}/{rounds}: "
                         + ", ".join(f"{label} {values[-1]:.1f} t/s" for label, values in rates.items()))
    except TrialFailure as failure:
        raise UserError(f"re-measuring failed: {failure}; see the logs in {log_dir}") from None
    return {label: Rates(values, drafted[label], per_suite[label]) for label, values in rates.items()}
