"""`tuner bench`: the tuner's benchmarks in one session, results under reports/bench/.

1. Search efficiency: record the grid study's landscape fresh, replay it for every
   strategy over the seeds (`tuner bench-search`); 1b. the same at operator scale, on
   modelled 96-core landscapes built from the research tables (`tuner bench-operator`);
   1c. the decision rules' error rates on a simulated host with launch effects.
2. Overhead and validity: alternating rounds against llama-bench on the study's target; 2b. the load
   generator's aggregate tokens/s at 1, 2 and 4 users against llama-batched-bench's.
3. Repeatability: two seeds of the study, winners re-measured side by side.
4. GGUF metadata: today's full parse against the fast, cached read (the Gemma 3 270M file
   when its package is installed, and the study's target).

Measurements run one after another (never two measurements at once), the replays,
CPU-bound, after the grid is recorded. Writes ``bench.json`` (everything), ``bench.md``
(the tables) and the recorded grid (CSV and JSONL).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tuner.bench import concurrency, decisions, gguf_read, operator, overhead, repeat, replay
from tuner.bench.grid import record_grid
from tuner.bench.table import read_table
from tuner.context import prepare
from tuner.errors import UserError
from tuner.machine import hostlock
from tuner.paths import REPO_ROOT, reports_dir
from tuner.studyfile.spec import load_spec


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Benchmark the tuner in one session: (1) trials each sampler needs to come within 3% of the best "
        "configuration of a recorded grid, (2) the tuner's tokens/s and wall time per trial against "
        "llama-bench's, alternating, (3) two seeds of a study, winners re-measured side by side. "
        "Writes reports/bench/bench.json and bench.md."
    )
    parser.add_argument(
        "--grid-study",
        type=Path,
        default=REPO_ROOT / "studies" / "bench-grid.yaml",
        help="study whose (all-choices) space is recorded as the grid (default: studies/bench-grid.yaml)",
    )
    parser.add_argument(
        "--study",
        type=Path,
        default=REPO_ROOT / "studies" / "demo.yaml",
        help="study for the overhead and repeatability runs (default: studies/demo.yaml)",
    )
    parser.add_argument("--seeds", type=int, default=20, help="seeds per sampler in the replay (default: 20)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=7,
        help="alternating rounds for overhead and re-measuring; one round varies by about 10%% on a "
        "shared VM, the median of 7 by a few %% (default: 7)",
    )
    parser.add_argument(
        "--decision-runs",
        type=int,
        default=400,
        help="simulated races per cell of the decision section (default: 400)",
    )
    parser.add_argument(
        "--repeat-trials",
        type=int,
        help="trials per repeatability study (default: the study's own budget, 20 for the demo)",
    )
    parser.add_argument(
        "--gguf",
        type=Path,
        action="append",
        help="a GGUF for the metadata-read section, repeatable (default: Gemma 3 270M when its package "
        "is installed, and the --study's target)",
    )
    parser.add_argument("--out", type=Path, help="output folder (default: reports/bench)")
    hostlock.add_argument(parser)


def run(args: argparse.Namespace) -> int:
    with hostlock.measuring(
        f"bench ({args.grid_study.name}, {args.study.name})"
    ):  # the whole session measures
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    for name in ("seeds", "rounds", "repeat_trials", "decision_runs"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    out = args.out or reports_dir() / "bench"
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result: dict = {"timings": {}}
    sections: list[str] = []

    def done(key: str, value: dict, title: str, table: str, mark: float, last: bool = False) -> None:
        """Print a section and rewrite bench.json/bench.md with it: an interrupted bench keeps its results."""
        result[key] = value
        result["timings"][f"{key}_s"] = time.monotonic() - mark
        result["timings"]["total_s"] = time.monotonic() - started
        print(table, flush=True)
        sections.extend([f"## {title}", "", table])
        (out / "bench.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        (out / "bench.md").write_text(
            "\n".join(
                [
                    "# tuner bench",
                    "",
                    *sections,
                    f"{'Whole bench' if last else 'Bench time so far'}: "
                    f"{result['timings']['total_s'] / 60:.1f} min.",
                    "",
                ]
            )
        )

    grid_spec = load_spec(args.grid_study)
    csv = out / f"grid-{grid_spec.name}.csv"
    for stale in (csv.with_suffix(".jsonl"), csv.with_suffix(".reference.json")):
        stale.unlink(missing_ok=True)  # a fresh landscape: every figure from this session
    print(f"== 1/3 search efficiency: recording the grid of {args.grid_study}", flush=True)
    mark = time.monotonic()
    record_grid(args.grid_study, csv)
    search = replay.benchmark(replay.load_landscape(read_table(csv)), seeds=args.seeds)
    search["table"] = str(csv)
    done(
        "search",
        search,
        f"1. Search efficiency on the recorded grid of {grid_spec.name}",
        replay.markdown(search),
        mark,
    )
    print("== 1b/3 search efficiency at operator scale (modelled 96-core landscapes)", flush=True)
    mark = time.monotonic()
    at_scale = operator.benchmark(seeds=args.seeds, jobs=-1)
    done(
        "search_operator",
        at_scale,
        "1b. Search efficiency at operator scale",
        operator.markdown(at_scale),
        mark,
    )

    print("== 1c decisions: race, finalists and pruning on a simulated host with launch effects", flush=True)
    mark = time.monotonic()
    choosing = decisions.measure_decisions(runs=args.decision_runs)
    done(
        "decisions",
        choosing,
        "1c. Decisions: error rates of the race, the finalist cut and pruning",
        decisions.markdown(choosing),
        mark,
    )

    print(f"== 2/3 overhead and validity against llama-bench ({args.study})", flush=True)
    mark = time.monotonic()
    over = overhead.measure_overhead(prepare(load_spec(args.study)), rounds=args.rounds)
    done(
        "overhead",
        over.to_dict(),
        "2. Overhead and validity against llama-bench",
        overhead.markdown(over),
        mark,
    )

    levels = ", ".join(map(str, concurrency.LEVELS))
    print(
        f"== 2b concurrency: the load generator against llama-batched-bench at {levels} users ({args.study})",
        flush=True,
    )
    mark = time.monotonic()
    loads = concurrency.measure_concurrency(prepare(load_spec(args.study)), rounds=args.rounds)
    done(
        "concurrency",
        concurrency.to_dict(loads),
        "2b. Load generator against llama-batched-bench",
        concurrency.markdown(loads),
        mark,
    )

    repeat_trials = args.repeat_trials or load_spec(args.study).budget_trials
    print(f"== 3/3 repeatability: two seeds of {args.study}, {repeat_trials} trials each", flush=True)
    mark = time.monotonic()
    rep = repeat.measure_repeatability(
        args.study, out / "repeat.db", trials=repeat_trials, rounds=args.rounds
    )
    done("repeatability", rep.to_dict(), "3. Repeatability", repeat.markdown(rep), mark)

    files = args.gguf or [p for p in (gguf_read.gemma_270m(), load_spec(args.study).target) if p is not None]
    print(
        f"== 4 GGUF metadata: today's full parse against the fast, cached read ({', '.join(f.name for f in files)})",
        flush=True,
    )
    mark = time.monotonic()
    reading = gguf_read.benchmark(files)
    done("gguf_read", reading, "4. GGUF metadata read", gguf_read.markdown(reading), mark, last=True)
    print(f"wrote {out / 'bench.json'} and {out / 'bench.md'} in {result['timings']['total_s'] / 60:.1f} min")
    return 0
