"""The sections of ``python -m benchmarks bench``, in the order a session runs them (``benchmarks/session`` runs and writes them).

1. Search efficiency: record the grid study's landscape fresh, replay it for every
   strategy over the seeds (`python -m benchmarks bench-search`); 1b. the same at operator scale, on
   modelled 96-core landscapes built from the research tables, and on hosts whose threads are every
   integer from 1 to their cores, as a host presents them (`python -m benchmarks bench-operator`), and on
   landscapes drawn from the research's ranges, held out from every rule's development (`--draws held-out`);
   1c. the decision rules' error rates on a simulated host with launch effects.
   1d. how much a race launch measures: one pass against the chosen size, at an equal time budget.
2. Overhead and validity: alternating rounds against llama-bench on the study's target; 2b. the load
   generator's aggregate tokens/s at 1, 2 and 4 users against llama-batched-bench's.
3. Repeatability: two seeds of the study, each raced to its deployment; both deployments re-measured side by
   side, each checked against the other's stated loss bound (and the searches' best trials beside them).
4. GGUF metadata: today's full parse against the fast, cached read (the Gemma 3 270M file
   when its package is installed, and the study's target).
5. The research's regime: the scale target's K sweep per content type, recorded fresh, its leaders launched
   again in interleaved rounds (`benchmarks/sweep_leaders`), against the K the structured search predicts, its pick
   within 20 trials and the scale study's race (`benchmarks/scale_regime`).
6. The target's quantization: llama-bench decode of the scale target's Q4_0 variant against its F16 variant,
   interleaved (`benchmarks/quant_speed`).
7. `tuner serve`: the proxy's added latency against calling its upstream directly at 1 and 64 streaming clients,
   and the classifier's accuracy on every built-in suite's held-out prompts (`benchmarks/serve_overhead`).

Why apart from the session: each section needs its own benchmark's module; the session only runs what they
describe and keeps the files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import (
    concurrency,
    gguf_read,
    held_out,
    launch_sizing,
    operator_replay,
    overhead,
    quant_speed,
    race_bench,
    repeat,
    replay,
    scale_regime,
    serve_overhead,
)
from benchmarks.grid import record_grid
from benchmarks.sizes import Sizes, shrunk, study_spec
from benchmarks.table import read_table
from tuner.prepare import prepare
from tuner.progress import Progress


@dataclass(frozen=True)
class Section:
    """One section: its key in bench.json, the banner printed before it measures, its title in bench.md, what
    it measures, its table, and its figures for bench.json (the measured value itself unless given)."""

    key: str
    banner: str
    title: str
    measure: Callable[[], Any]
    markdown: Callable[[Any], str]
    to_dict: Callable[[Any], Any] = lambda value: value


def sections(
    grid_study: Path, study: Path, gguf: list[Path] | None, scale_grid: Path, sizes: Sizes, out: Path
) -> Iterator[Section]:
    """Every section in order, each made once the one before it has run (what it reads, read then)."""
    yield _search(grid_study, sizes, out)
    yield from _simulated(sizes)
    yield from _overhead(study, sizes, out)
    yield _repeatability(study, sizes, out)
    yield _gguf(gguf, study_spec(study, sizes, out).target, sizes)
    yield _scale(scale_grid, sizes, out)
    yield _quantization(scale_grid, sizes, out)
    yield _serve(sizes)


def _search(grid_study: Path, sizes: Sizes, out: Path) -> Section:
    """1. The grid study's landscape recorded fresh, then every strategy replayed on it."""
    spec = study_spec(grid_study, sizes, out)
    csv = out / f"grid-{spec.name}.csv"
    for stale in (csv.with_suffix(".jsonl"), csv.with_suffix(".reference.json")):
        stale.unlink(missing_ok=True)  # a fresh landscape: every figure from this session

    def measure() -> dict:
        record_grid(spec, csv, progress=Progress.untimed(), max_launches=sizes.grid_launches)
        search = replay.benchmark(replay.load_landscape(read_table(csv)), seeds=sizes.seeds)
        return {**search, "table": str(csv)}

    return Section(
        "search",
        f"1/3 search efficiency: recording the grid of {grid_study}",
        f"1. Search efficiency on the recorded grid of {spec.name}",
        measure,
        replay.markdown,
    )


def _operator(sizes: Sizes) -> operator_replay.OperatorBenchmark:
    """The operator-scale replays at the session's sizes (``Sizes.operator``: the landscapes' ``names`` and
    ``operator_replay.ReplayPlan``'s fields)."""
    options = {"seeds": sizes.seeds, **sizes.operator}
    names = options.pop("names", operator_replay.LANDSCAPES)
    return operator_replay.benchmark(names, operator_replay.ReplayPlan(**options))


def _held_out(sizes: Sizes) -> held_out.DrawBenchmark:
    """The default over the held-out draws at the session's sizes (``Sizes.held_out``: ``held_out.DrawPlan``'s
    fields)."""
    return held_out.benchmark(held_out.DrawPlan(**sizes.held_out))


def _simulated(sizes: Sizes) -> list[Section]:
    """1b and 1c: no measurement, simulated hosts (operator-scale landscapes, drawn ones, launch effects)."""
    return [
        Section(
            "search_operator",
            "1b/3 search efficiency at operator scale (modelled 96-core landscapes; hosts' real thread ranges)",
            "1b. Search efficiency at operator scale",
            lambda: _operator(sizes),
            operator_replay.markdown,
        ),
        Section(
            "search_held_out",
            "1b search efficiency on held-out drawn landscapes (the research's ranges, no rule developed on them)",
            "1b. Search efficiency on held-out drawn landscapes",
            lambda: _held_out(sizes),
            held_out.markdown,
        ),
        Section(
            "decisions",
            "1c decisions: race, finalists and pruning on a simulated host with launch effects",
            "1c. Decisions: error rates of the race, the finalist cut and pruning",
            lambda: race_bench.measure_decisions(runs=sizes.decision_runs),
            race_bench.markdown,
        ),
        Section(
            "launch_size",
            "1d launch size: one pass per launch against the size the race chooses, at an equal time budget",
            "1d. Launch size: how much a race launch measures",
            lambda: launch_sizing.measure_sizing(runs=sizes.decision_runs),
            launch_sizing.markdown,
        ),
    ]


def _overhead(study: Path, sizes: Sizes, out: Path) -> list[Section]:
    """2 and 2b: the tuner's measurement against llama-bench's and llama-batched-bench's."""
    levels = ", ".join(map(str, concurrency.LEVELS))
    return [
        Section(
            "overhead",
            f"2/3 overhead and validity against llama-bench ({study})",
            "2. Overhead and validity against llama-bench",
            lambda: overhead.measure_overhead(
                prepare(study_spec(study, sizes, out)),
                rounds=sizes.rounds,
                progress=Progress.untimed(),
                **sizes.overhead,
            ),
            overhead.markdown,
            lambda found: found.to_dict(),
        ),
        Section(
            "concurrency",
            f"2b concurrency: the load generator against llama-batched-bench at {levels} users ({study})",
            "2b. Load generator against llama-batched-bench",
            lambda: concurrency.measure_concurrency(
                prepare(study_spec(study, sizes, out)), rounds=sizes.rounds, **sizes.concurrency
            ),
            concurrency.markdown,
            concurrency.to_dict,
        ),
    ]


def _repeatability(study: Path, sizes: Sizes, out: Path) -> Section:
    """3. Two seeds of the study, each run to its race's deployment; both deployments (and both searches' best
    recorded trials) re-measured side by side, each deployment checked against the other's stated bound."""
    spec = study_spec(study, sizes, out)
    trials = sizes.repeat_trials or spec.budget_trials
    return Section(
        "repeatability",
        f"3/3 repeatability: two seeds of {study}, {trials} trials each, each raced to its deployment",
        "3. Repeatability",
        lambda: repeat.measure_repeatability(
            spec, out / "repeat.db", trials=trials, rounds=sizes.rounds, progress=Progress.untimed()
        ),
        repeat.markdown,
        lambda found: found.to_dict(),
    )


def _gguf(given: list[Path] | None, target: Path, sizes: Sizes) -> Section:
    """4. GGUF metadata reads: the given files, else Gemma 3 270M when installed (not in --quick) and the
    study's target."""
    gemma = None if sizes.quick else gguf_read.gemma_270m()
    files = given or [p for p in (gemma, target) if p is not None]
    return Section(
        "gguf_read",
        f"4 GGUF metadata: today's full parse against the fast, cached read ({', '.join(f.name for f in files)})",
        "4. GGUF metadata read",
        lambda: gguf_read.benchmark(files, **sizes.gguf),
        gguf_read.markdown,
    )


def _scale(scale_grid: Path, sizes: Sizes, out: Path) -> Section:
    """5. The scale target's sweep on code and on prose against the structured search."""
    spec = study_spec(scale_grid, sizes, out)
    return Section(
        "scale_regime",
        f"5 the research's regime: the scale target's K sweep ({scale_grid.name}) on "
        f"{', '.join(scale_regime.SUITES)}, against the structured search",
        "5. The research's regime: the scale target's K sweep against the search",
        lambda: scale_regime.measure_regime(
            out,
            seeds=sizes.seeds,
            max_launches=sizes.grid_launches,
            study=spec,
            shrink=lambda suite_study: shrunk(suite_study, sizes, out),
        ),
        scale_regime.markdown,
    )


def _quantization(scale_grid: Path, sizes: Sizes, out: Path) -> Section:
    """6. The scale target's Q4_0 variant against its F16 variant, llama-bench decode interleaved."""
    target = study_spec(scale_grid, sizes, out).target
    rounds, tokens = (2, 8) if sizes.quick else (5, 32)
    return Section(
        "quantization",
        f"6 the target's quantization: llama-bench decode of {target.name}'s Q4_0 against its F16, {rounds} rounds",
        "6. The target's quantization: Q4_0 against F16 on the scale target",
        lambda: quant_speed.measure(target, rounds, tokens),
        quant_speed.markdown,
    )


def _serve(sizes: Sizes) -> Section:
    """7. The proxy's own overhead (a fake fast upstream) and the classifier on held-out prompts."""
    rounds, requests = (
        (1, 1) if sizes.quick else (sizes.rounds, 2)
    )  # --rounds: alternating rounds, as section 2
    clients = " and ".join(map(str, serve_overhead.CONCURRENCY))
    return Section(
        "serve",
        f"7 tuner serve: added latency at {clients} streaming clients, {rounds} rounds; the classifier held out",
        "7. tuner serve: the proxy's added latency and the classifier's accuracy",
        lambda: serve_overhead.benchmark(rounds, requests),
        serve_overhead.markdown,
        lambda found: found.to_dict(),
    )
