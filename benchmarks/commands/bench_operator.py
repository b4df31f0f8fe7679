"""``python -m benchmarks bench-operator``: operator-scale landscapes replayed (``benchmarks/operator_replay``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import held_out
from benchmarks.landscape_draws import draw, draw_seeds, draw_table
from benchmarks.operator_replay import LANDSCAPES, STRATEGIES, ReplayPlan, benchmark, markdown
from tuner.errors import UserError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Replay the operator-scale landscapes (a modelled 96-core box: 32B target with three drafts on code, "
        "prose and a variant with moved optima; a MoE target with experts and n-gram speculation; the 32B target "
        "with prompt lookup alone and stacked on its drafts, on summaries, code edits and chat; the 32B target served to "
        "8 users at once, aggregate tokens/s, with the serving knobs) for each "
        "strategy over seeds: trials and measured seconds to come within 3% of the best, with and without pruning."
    )
    parser.add_argument(
        "--landscapes",
        default=",".join(LANDSCAPES),
        help=f"comma-separated (default: all: {','.join(LANDSCAPES)})",
    )
    parser.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help=f"comma-separated (default: {','.join(STRATEGIES)})",
    )
    parser.add_argument("--seeds", type=int, default=20, help="seeds per strategy (default: 20)")
    parser.add_argument(
        "--trials", type=int, default=40, help="trials per replay of the default (default: 40)"
    )
    parser.add_argument(
        "--baseline-trials", type=int, default=100, help="trials per replay of the others (default: 100)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="parallel replays (default: 1)")
    parser.add_argument("--json", help="also write the full result here")
    parser.add_argument(
        "--draws",
        help="instead of the named landscapes, the default over drawn ones (benchmarks/landscape_draws): "
        "held-out (seeds 10000-10099: judge rules here), development (0-99: inspect these), or A-B; "
        "--seeds replays per draw",
    )
    parser.add_argument(
        "--against",
        metavar="JSON",
        help="with --draws: compare each replay with the same draw and seed in JSON (the --json of an earlier "
        "--draws run with the same draws, --seeds and --trials): how many came within 3%% sooner or later, "
        "and a sign test",
    )
    parser.add_argument(
        "--print-draw", type=int, metavar="SEED", help="print the drawn landscape of SEED and exit"
    )


def run(args: argparse.Namespace) -> int:
    if args.print_draw is not None:
        print(draw_table(draw(args.print_draw)), end="")
        return 0
    if args.draws:
        return run_draws(args)
    names = tuple(s.strip() for s in args.landscapes.split(",") if s.strip())
    strategies = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
    for name in names:
        if name not in LANDSCAPES:
            raise UserError(f"--landscapes: unknown {name!r}; use some of {', '.join(LANDSCAPES)}")
    for s in strategies:
        if s not in STRATEGIES:
            raise UserError(f"--strategies: unknown {s!r}; use some of {', '.join(STRATEGIES)}")
    if args.seeds < 1 or args.trials < 1 or args.baseline_trials < 1:
        raise UserError("--seeds, --trials and --baseline-trials must be >= 1")
    plan = ReplayPlan(
        strategies, seeds=args.seeds, budget=args.trials, baseline_budget=args.baseline_trials, jobs=args.jobs
    )
    result = benchmark(names, plan)
    print(markdown(result), end="")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0 if all(t["met"] for t in result["targets"].values()) or "default" not in strategies else 1


def run_draws(args: argparse.Namespace) -> int:
    """The default over drawn landscapes: the figures against the bars (``benchmarks/held_out``)."""
    try:
        draws = draw_seeds(args.draws)
    except ValueError:
        raise UserError(f"--draws: {args.draws!r} is not held-out, development, A or A-B (seeds)") from None
    if not draws or args.seeds < 1 or args.trials < 1:
        raise UserError(
            "--draws must name at least one seed (A-B with A <= B); --seeds and --trials must be >= 1"
        )
    plan = held_out.DrawPlan(draws, seeds=args.seeds, budget=args.trials, jobs=args.jobs)
    before = _earlier_run(args.against, plan) if args.against else None
    result = held_out.benchmark(plan)
    print(held_out.markdown(result), end="")
    if before is not None:
        print(held_out.paired_markdown(held_out.paired(before, result), args.against), end="")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0 if result["figures"]["met"] else 1


def _earlier_run(path: str, plan: held_out.DrawPlan) -> held_out.DrawBenchmark:
    """An earlier ``--draws --json`` result of the same draws, seeds and trials, read before the replays start (a
    bad file fails at once, not after them)."""
    try:
        before = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise UserError(
            f"--against {path}: cannot read it as JSON ({error}); give the --json of a --draws run"
        ) from None
    if not isinstance(before, dict) or not isinstance(before.get("replays"), list):
        raise UserError(f"--against {path}: no 'replays' list; give the --json of a --draws run")
    try:
        held_out.check_comparable(
            before,  # type: ignore[arg-type]
            held_out.planned(plan.draws, plan.seeds, plan.budget, plan.tolerance),
        )
    except KeyError as error:
        raise UserError(f"--against {path}: no {error} field; give the --json of a --draws run") from None
    except (TypeError, ValueError, IndexError) as error:
        raise UserError(
            f"--against {path}: {error}; run with the same --draws, --seeds and --trials as it"
        ) from None
    return before  # type: ignore[return-value]
