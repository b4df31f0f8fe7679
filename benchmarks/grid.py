"""`python -m benchmarks record-grid STUDY`: measure every configuration of a small space into a table.

Why: comparing search strategies needs the whole landscape, measured once on the real
build; `python -m benchmarks bench-search` then replays it as often as it likes. The space is the
study's resolved space, every combination of its choices, asked the way a study asks
(no draft without speculation); a range has no finite grid, so it is refused.

Runs are ordered like llama-bench's, to load models as few times as possible:
configurations that differ only in per-request fields (temperature) share one server,
and launches follow the knobs in order (speculative type, then draft model, then K,
...), so each draft model is loaded in one stretch. The baseline (the quality
reference) is measured first. Each row is appended to ``NAME.jsonl`` as soon as it is
measured (``benchmarks/grid_recorder``), so an interrupted recording resumes where it stopped;
the CSV table is written from it at the end.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import optuna
import pandas as pd

from benchmarks.grid_recorder import GridRecorder, Launch, config_key, rebased
from benchmarks.sweep_leaders import relaunch_leaders
from benchmarks.table import RESULT_COLUMNS
from tuner.errors import UserError
from tuner.knobs.config import Choices, TrialConfig
from tuner.knobs.registry import NAMES as KNOBS
from tuner.machine import hostlock
from tuner.measurement.failures import TrialFailure
from tuner.measurement.launch import build_server_argv
from tuner.output.files import write_atomic
from tuner.paths import reports_dir
from tuner.prepare import StudyContext, prepare
from tuner.progress import Progress
from tuner.search.space import ResolvedSpace, baseline_config, suggest
from tuner.studyfile.spec import StudySpec, load_spec


def grid_configs(space: ResolvedSpace, where: str = "search_space") -> list[TrialConfig]:
    """Every distinct configuration of the space, temperature varying fastest."""
    ranges = [name for name, d in space.domains.items() if not isinstance(d, Choices)]
    if ranges:
        name = ranges[0]
        raise UserError(
            f"{where}.{name}: is a range ({type(space.domains[name]).__name__}); a grid needs "
            f"explicit choices: list them in the study's search_space.overrides, e.g. {name}: [1, 2]"
        )
    names = sorted(
        space.domains, key=lambda n: (n == "temperature", KNOBS.index(n) if n in KNOBS else len(KNOBS))
    )
    choices = {name: domain.values for name, domain in space.domains.items() if isinstance(domain, Choices)}
    configs: dict[TrialConfig, None] = {}  # insertion-ordered and without repeats
    for values in itertools.product(*(choices[n] for n in names)):
        config = suggest(optuna.trial.FixedTrial(dict(zip(names, values))), space)
        configs.setdefault(config, None)
    return list(configs)


def plan(ctx: StudyContext, configs: list[TrialConfig]) -> list[Launch]:
    """Group by launch in first-seen order; the baseline's launch first, the baseline first in it
    (it is the quality reference, so it is a row even if the choices leave it out). A configuration whose
    speculation remembers requests shares its server with no other (``TrialConfig.remembers_requests``)."""
    base = baseline_config(ctx.space)
    ordered = [base] + [c for c in configs if c != base]
    groups: dict[tuple[tuple[str, ...], TrialConfig | None], list[TrialConfig]] = {}
    refused = []
    for config in ordered:
        try:
            argv = tuple(build_server_argv(config, ctx.launch))
        except TrialFailure as failure:
            refused.append(Launch((), (config,), failure))
            continue
        groups.setdefault((argv, config if config.remembers_requests else None), []).append(config)
    return [Launch(argv, tuple(cs)) for (argv, _), cs in groups.items()] + refused


def table_frame(rows: list[dict]) -> pd.DataFrame:
    """The table of recorded rows: knob columns that are set anywhere, then the result columns."""
    frame = pd.DataFrame(rows)
    knobs = [k for k in KNOBS if k in frame.columns and frame[k].notna().any()]
    return frame[knobs + [c for c in RESULT_COLUMNS if c in frame.columns]]


def write_table(rows: list[dict], csv: Path) -> pd.DataFrame:
    """The CSV (``table_frame``)."""
    frame = table_frame(rows)
    write_atomic(csv, frame.to_csv(index=False))
    return frame


def record_grid(
    study: str | Path | StudySpec,
    out: Path | None = None,
    *,
    progress: Progress,
    max_launches: int | None = None,
    leader_rounds: int = 0,
) -> Path:
    """Record (or resume) the study's grid (a study file, or a spec already read); returns the CSV table.
    ``max_launches``: only the first launches of the plan, the baseline's first (``python -m benchmarks bench --quick``);
    ``leader_rounds``: then the leaders and the baseline launched again that many rounds (``benchmarks/sweep_leaders``)."""
    spec = study if isinstance(study, StudySpec) else load_spec(study)
    ctx = prepare(spec)
    configs = grid_configs(ctx.space, f"{spec.path}: search_space")
    csv = out or reports_dir() / "bench" / f"grid-{spec.name}.csv"
    recorder = GridRecorder(ctx, csv.with_suffix(".jsonl"), progress)
    launches = plan(ctx, configs)[:max_launches]
    todo = sum(config_key(c) not in recorder.done for launch in launches for c in launch.configs)
    progress(
        f"grid {spec.name}: {sum(len(launch.configs) for launch in launches)} configurations in "
        f"{len(launches)} launch(es), {todo} to measure; rows in {recorder.jsonl}"
    )
    with hostlock.measuring(spec.name, progress=progress):  # one measurement per host
        rows = rebased(recorder.record(launches), recorder.reference)
        write_table(rows, csv)
        if leader_rounds:
            relaunch_leaders(ctx, rows, csv, leader_rounds, progress)
    return csv
