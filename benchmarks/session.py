"""`python -m benchmarks bench`: the tuner's benchmarks in one session, results under reports/bench/: every section
(``benchmarks/sections``) at the sizes asked for (``benchmarks/sizes``; ``--quick``: each on its smallest input).

Measurements run one after another (never two measurements at once), the replays,
CPU-bound, after the grid is recorded. Writes ``bench.json`` (everything), ``bench.md``
(the tables) and the recorded grid (CSV and JSONL).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.sections import Section, sections
from benchmarks.sizes import Sizes, sizes_of
from tuner.machine import hostlock
from tuner.output.files import write_atomic
from tuner.paths import reports_dir


@dataclass(frozen=True)
class Asked:
    """The session's sizes as the command line gives them (``--quick``: the smallest inputs), checked by
    ``sizes_of`` once the measurement lock is held."""

    seeds: int
    rounds: int
    decision_runs: int
    repeat_trials: int | None
    quick: bool = False


class Session:
    """One bench run's results: bench.json and bench.md rewritten after every section, so an
    interrupted bench keeps what it measured."""

    def __init__(self, out: Path, quick: bool):
        self.out, self.quick = out, quick
        out.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.result: dict = {"quick": quick, "timings": {}}
        self.sections: list[str] = []

    def section(self, section: Section) -> None:
        """Print the banner, measure, then print the table and rewrite both files with it."""
        print(f"== {section.banner}", flush=True)
        mark = time.monotonic()
        value = section.measure()
        self.result[section.key] = section.to_dict(value)
        self.result["timings"][f"{section.key}_s"] = time.monotonic() - mark
        self.result["timings"]["total_s"] = time.monotonic() - self.started
        table = section.markdown(value)
        print(table, flush=True)
        self.sections.extend([f"## {section.title}", "", table])
        self.write(last=False)

    def write(self, last: bool) -> None:
        total = self.result["timings"].get("total_s", 0.0)
        write_atomic(self.out / "bench.json", json.dumps(self.result, indent=2, default=str) + "\n")
        write_atomic(
            self.out / "bench.md",
            "\n".join(
                [
                    "# python -m benchmarks bench"
                    + (" (--quick: every section on its smallest input)" * self.quick),
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
    for section in sections(grid_study, study, gguf, scale_grid, sizes, session.out):
        session.section(section)
    session.result["timings"]["total_s"] = time.monotonic() - session.started
    session.write(last=True)
    print(
        f"wrote {session.out / 'bench.json'} and {session.out / 'bench.md'} in "
        f"{session.result['timings']['total_s'] / 60:.1f} min"
    )
    return 0
