"""`tuner bench`: the tuner's benchmarks in one session, results under reports/bench/.

1. Search efficiency: record the grid study's landscape fresh, replay it for every
   strategy over the seeds (`tuner bench-search`); 1b. the same at operator scale, on
   modelled 96-core landscapes built from the research tables, and on hosts whose threads are every
   integer from 1 to their cores, as a host presents them (`tuner bench-operator`);
   1c. the decision rules' error rates on a simulated host with launch effects.
   1d. how much a race launch measures: one pass against the chosen size, at an equal time budget.
2. Overhead and validity: alternating rounds against llama-bench on the study's target; 2b. the load
   generator's aggregate tokens/s at 1, 2 and 4 users against llama-batched-bench's.
3. Repeatability: two seeds of the study, each raced to its deployment; both deployments re-measured side by
   side, each checked against the other's stated loss bound (and the searches' best trials beside them).
4. GGUF metadata: today's full parse against the fast, cached read (the Gemma 3 270M file
   when its package is installed, and the study's target).
5. The research's regime: the scale target's K sweep per content type, recorded fresh, against the K the
   structured search predicts and its pick within 20 trials (`bench/scale_regime`).

Measurements run one after another (never two measurements at once), the replays,
CPU-bound, after the grid is recorded. Writes ``bench.json`` (everything), ``bench.md``
(the tables) and the recorded grid (CSV and JSONL).

``--quick`` runs every section on its smallest input (one prompt of the studies' first suite, 8
tokens, the grid's first two launches, one seed, one round, one operator landscape): its figures mean nothing, it
shows in a few minutes that each section of ``make bench`` starts and finishes (tests/test_studies.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import yaml

from tuner.bench import (
    concurrency,
    gguf_read,
    launch_sizing,
    operator,
    overhead,
    race_bench,
    repeat,
    replay,
    scale_regime,
)
from tuner.bench.grid import record_grid
from tuner.bench.operator_landscapes import LANDSCAPES
from tuner.bench.table import read_table
from tuner.errors import UserError
from tuner.machine import hostlock
from tuner.measurement.workload import load_workload
from tuner.output.files import write_atomic
from tuner.paths import reports_dir
from tuner.prepare import prepare
from tuner.progress import Progress
from tuner.studyfile.spec import StudySpec, load_spec


@dataclass(frozen=True)
class Sizes:
    """How much each section measures: the options as given, or ``--quick``'s smallest inputs."""

    seeds: int
    rounds: int
    decision_runs: int
    repeat_trials: int | None
    quick: bool = False
    grid_launches: int | None = None  # None: the whole grid
    operator: dict[str, Any] = field(default_factory=lambda: {"jobs": -1})
    overhead: dict[str, Any] = field(default_factory=dict)
    concurrency: dict[str, Any] = field(default_factory=dict)
    gguf: dict[str, Any] = field(default_factory=dict)


QUICK_N_PREDICT = 8


@dataclass(frozen=True)
class Asked:
    """The session's sizes as the command line gives them (``--quick``: the smallest inputs), checked by
    ``sizes_of`` once the measurement lock is held."""

    seeds: int
    rounds: int
    decision_runs: int
    repeat_trials: int | None
    quick: bool = False


def sizes_of(seeds: int, rounds: int, decision_runs: int, repeat_trials: int | None, quick: bool) -> Sizes:
    """The section sizes; a count below 1 is one line naming its option."""
    counts = {
        "seeds": seeds,
        "rounds": rounds,
        "repeat_trials": repeat_trials,
        "decision_runs": decision_runs,
    }
    for name, count in counts.items():
        if count is not None and count < 1:
            raise UserError(f"--{name.replace('_', '-')}: must be >= 1, got {count}")
    if not quick:
        return Sizes(seeds, rounds, decision_runs, repeat_trials)
    return Sizes(
        seeds=1,
        rounds=1,
        decision_runs=2,
        repeat_trials=2,
        quick=True,
        grid_launches=2,
        operator={"names": LANDSCAPES[:1], "seeds": 1, "budget": 5, "baseline_budget": 5, "jobs": 1},
        overhead={"n_predict": QUICK_N_PREDICT, "repetitions": 1},
        concurrency={"tg": QUICK_N_PREDICT, "per_client": 1},
        gguf={"repeats": 1, "reference_repeats": 1},
    )


def study_spec(path: Path, sizes: Sizes, out: Path) -> StudySpec:
    """The study as written; for ``--quick``, one prompt of its first suite, 8 tokens, two passes, no
    warm-up."""
    spec = load_spec(path)
    if not sizes.quick:
        return spec
    settings = replace(
        spec.measurement, warmup=0, repetitions=2, max_repetitions=None, n_predict=QUICK_N_PREDICT
    )
    return replace(spec, suites=(quick_suite(spec, out),), measurement=settings, budget_minutes=None)


def quick_suite(spec: StudySpec, out: Path) -> str:
    """The first prompt of the study's first suite as a suite file of its own under ``out``; a
    conversation or a prompt with expected answers keeps its whole suite (it needs the suite's context)."""
    first = load_workload(list(spec.suites[:1]), spec.base_dir).prompts[0]
    if first.chat or first.expected:
        return spec.suites[0]
    path = write_atomic(
        out / f"quick-{spec.suites[0].replace('/', '-').removesuffix('.yaml')}.yaml",
        yaml.safe_dump({"prompts": [{"id": first.id, "text": first.text}]}, sort_keys=False),
    )
    return str(path.absolute())


class Session:
    """One bench run's results: bench.json and bench.md rewritten after every section, so an
    interrupted bench keeps what it measured."""

    def __init__(self, out: Path, quick: bool):
        self.out, self.quick = out, quick
        out.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.result: dict = {"quick": quick, "timings": {}}
        self.sections: list[str] = []

    def section(
        self,
        key: str,
        banner: str,
        title: str,
        measure: Callable[[], Any],
        markdown: Callable[[Any], str],
        to_dict: Callable[[Any], dict] = lambda value: value,
    ) -> Any:
        """Print the banner, measure, then print the table and rewrite both files with it."""
        print(f"== {banner}", flush=True)
        mark = time.monotonic()
        value = measure()
        self.result[key] = to_dict(value)
        self.result["timings"][f"{key}_s"] = time.monotonic() - mark
        self.result["timings"]["total_s"] = time.monotonic() - self.started
        table = markdown(value)
        print(table, flush=True)
        self.sections.extend([f"## {title}", "", table])
        self.write(last=False)
        return value

    def write(self, last: bool) -> None:
        total = self.result["timings"].get("total_s", 0.0)
        write_atomic(self.out / "bench.json", json.dumps(self.result, indent=2, default=str) + "\n")
        write_atomic(
            self.out / "bench.md",
            "\n".join(
                [
                    "# tuner bench" + (" (--quick: every section on its smallest input)" * self.quick),
                    "",
                    *self.sections,
                    f"{'Whole bench' if last else 'Bench time so far'}: {total / 60:.1f} min.",
                    "",
                ]
            ),
        )


def run_bench(
    grid_study: Path, study: Path, gguf: list[Path] | None, out: Path | None, asked: Asked, scale_grid: Path
) -> int:
    """Every section in one session, under this host's measurement lock (the sizes are checked once it is held)."""
    with hostlock.measuring(f"bench ({grid_study.name}, {study.name})"):  # the whole session measures
        sizes = sizes_of(asked.seeds, asked.rounds, asked.decision_runs, asked.repeat_trials, asked.quick)
        return _run(grid_study, study, gguf, out, sizes, scale_grid)


def _run(
    grid_study: Path, study: Path, gguf: list[Path] | None, out: Path | None, sizes: Sizes, scale_grid: Path
) -> int:
    default_out = reports_dir() / "bench" / ("quick" if sizes.quick else "")  # --quick never overwrites
    session = Session(out or default_out, sizes.quick)
    _search(session, grid_study, sizes)
    _simulated(session, sizes)
    _overhead(session, study, sizes)
    _repeatability(session, study, sizes)
    _gguf(session, gguf, study, sizes)
    _scale(session, scale_grid, sizes)
    session.result["timings"]["total_s"] = time.monotonic() - session.started
    session.write(last=True)
    print(
        f"wrote {session.out / 'bench.json'} and {session.out / 'bench.md'} in "
        f"{session.result['timings']['total_s'] / 60:.1f} min"
    )
    return 0


def _search(session: Session, grid_study: Path, sizes: Sizes) -> None:
    """1. The grid study's landscape recorded fresh, then every strategy replayed on it."""
    spec = study_spec(grid_study, sizes, session.out)
    csv = session.out / f"grid-{spec.name}.csv"
    for stale in (csv.with_suffix(".jsonl"), csv.with_suffix(".reference.json")):
        stale.unlink(missing_ok=True)  # a fresh landscape: every figure from this session

    def measure() -> dict:
        record_grid(spec, csv, progress=Progress.untimed(), max_launches=sizes.grid_launches)
        search = replay.benchmark(replay.load_landscape(read_table(csv)), seeds=sizes.seeds)
        return {**search, "table": str(csv)}

    session.section(
        "search",
        f"1/3 search efficiency: recording the grid of {grid_study}",
        f"1. Search efficiency on the recorded grid of {spec.name}",
        measure,
        replay.markdown,
    )


def _operator(sizes: Sizes) -> operator.OperatorBenchmark:
    """The operator-scale replays at the session's sizes (``Sizes.operator``: the landscapes' ``names`` and
    ``operator.ReplayPlan``'s fields)."""
    options = {"seeds": sizes.seeds, **sizes.operator}
    names = options.pop("names", operator.LANDSCAPES)
    return operator.benchmark(names, operator.ReplayPlan(**options))


def _simulated(session: Session, sizes: Sizes) -> None:
    """1b and 1c: no measurement, simulated hosts (operator-scale landscapes, launch effects)."""
    session.section(
        "search_operator",
        "1b/3 search efficiency at operator scale (modelled 96-core landscapes; hosts' real thread ranges)",
        "1b. Search efficiency at operator scale",
        lambda: _operator(sizes),
        operator.markdown,
    )
    session.section(
        "decisions",
        "1c decisions: race, finalists and pruning on a simulated host with launch effects",
        "1c. Decisions: error rates of the race, the finalist cut and pruning",
        lambda: race_bench.measure_decisions(runs=sizes.decision_runs),
        race_bench.markdown,
    )
    session.section(
        "launch_size",
        "1d launch size: one pass per launch against the size the race chooses, at an equal time budget",
        "1d. Launch size: how much a race launch measures",
        lambda: launch_sizing.measure_sizing(runs=sizes.decision_runs),
        launch_sizing.markdown,
    )


def _overhead(session: Session, study: Path, sizes: Sizes) -> None:
    """2 and 2b: the tuner's measurement against llama-bench's and llama-batched-bench's."""
    session.section(
        "overhead",
        f"2/3 overhead and validity against llama-bench ({study})",
        "2. Overhead and validity against llama-bench",
        lambda: overhead.measure_overhead(
            prepare(study_spec(study, sizes, session.out)),
            rounds=sizes.rounds,
            progress=Progress.untimed(),
            **sizes.overhead,
        ),
        overhead.markdown,
        lambda found: found.to_dict(),
    )
    levels = ", ".join(map(str, concurrency.LEVELS))
    session.section(
        "concurrency",
        f"2b concurrency: the load generator against llama-batched-bench at {levels} users ({study})",
        "2b. Load generator against llama-batched-bench",
        lambda: concurrency.measure_concurrency(
            prepare(study_spec(study, sizes, session.out)), rounds=sizes.rounds, **sizes.concurrency
        ),
        concurrency.markdown,
        concurrency.to_dict,
    )


def _repeatability(session: Session, study: Path, sizes: Sizes) -> None:
    """3. Two seeds of the study, each run to its race's deployment; both deployments (and both searches' best
    recorded trials) re-measured side by side, each deployment checked against the other's stated bound."""
    spec = study_spec(study, sizes, session.out)
    trials = sizes.repeat_trials or spec.budget_trials
    session.section(
        "repeatability",
        f"3/3 repeatability: two seeds of {study}, {trials} trials each, each raced to its deployment",
        "3. Repeatability",
        lambda: repeat.measure_repeatability(
            spec, session.out / "repeat.db", trials=trials, rounds=sizes.rounds, progress=Progress.untimed()
        ),
        repeat.markdown,
        lambda found: found.to_dict(),
    )


def _gguf(session: Session, given: list[Path] | None, study: Path, sizes: Sizes) -> None:
    """4. GGUF metadata reads: the given files, else Gemma 3 270M when installed (not in --quick) and the
    study's target."""
    gemma = None if sizes.quick else gguf_read.gemma_270m()
    files = given or [p for p in (gemma, load_spec(study).target) if p is not None]
    session.section(
        "gguf_read",
        f"4 GGUF metadata: today's full parse against the fast, cached read ({', '.join(f.name for f in files)})",
        "4. GGUF metadata read",
        lambda: gguf_read.benchmark(files, **sizes.gguf),
        gguf_read.markdown,
    )


def _scale(session: Session, scale_grid: Path, sizes: Sizes) -> None:
    """5. The scale target's sweep on code and on prose against the structured search."""
    spec = study_spec(scale_grid, sizes, session.out)
    session.section(
        "scale_regime",
        f"5 the research's regime: the scale target's K sweep ({scale_grid.name}) on "
        f"{', '.join(scale_regime.SUITES)}, against the structured search",
        "5. The research's regime: the scale target's K sweep against the search",
        lambda: scale_regime.measure_regime(
            session.out, seeds=sizes.seeds, max_launches=sizes.grid_launches, study=spec
        ),
        scale_regime.markdown,
    )
