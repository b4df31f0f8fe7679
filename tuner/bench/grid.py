"""`tuner record-grid STUDY`: measure every configuration of a small space into a table.

Why: comparing search strategies needs the whole landscape, measured once on the real
build; `tuner bench-search` then replays it as often as it likes. The space is the
study's resolved space, every combination of its choices, asked the way a study asks
(no draft without speculation); a range has no finite grid, so it is refused.

Runs are ordered like llama-bench's, to load models as few times as possible:
configurations that differ only in per-request fields (temperature) share one server,
and launches follow the knobs in order (speculative type, then draft model, then K,
...), so each draft model is loaded in one stretch. The baseline (the quality
reference) is measured first. Each row is appended to ``NAME.jsonl`` and flushed as
soon as it is measured, so an interrupted recording resumes where it stopped; the CSV
table is written from it at the end.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna
import pandas as pd

from tuner.bench.table import RESULT_COLUMNS
from tuner.errors import UserError
from tuner.knobs.config import Choices, TrialConfig
from tuner.knobs.registry import NAMES as KNOBS
from tuner.machine import hostlock
from tuner.machine.host import busy_text
from tuner.measurement.failures import PERMANENT, FailureReason, TrialFailure
from tuner.measurement.launch import build_server_argv
from tuner.measurement.measure import outputs_by_prompt, run_workload, score_trial
from tuner.measurement.measured_launch import ServerLaunch, measured_launch
from tuner.measurement.quality import output_quality
from tuner.measurement.server_process import LlamaServer
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


@dataclass(frozen=True)
class Launch:
    """Configurations that share one server: the same argv, other temperatures."""

    argv: tuple[str, ...]
    configs: tuple[TrialConfig, ...]
    refused: TrialFailure | None = None  # the argv builder refused them: nothing to launch


def plan(ctx: StudyContext, configs: list[TrialConfig]) -> list[Launch]:
    """Group by launch in first-seen order; the baseline's launch first, the baseline first in it
    (it is the quality reference, so it is a row even if the choices leave it out)."""
    base = baseline_config(ctx.space)
    ordered = [base] + [c for c in configs if c != base]
    groups: dict[tuple[str, ...], list[TrialConfig]] = {}
    refused = []
    for config in ordered:
        try:
            groups.setdefault(tuple(build_server_argv(config, ctx.launch)), []).append(config)
        except TrialFailure as failure:
            refused.append(Launch((), (config,), failure))
    return [Launch(argv, tuple(cs)) for argv, cs in groups.items()] + refused


def config_key(config: TrialConfig | dict) -> str:
    data = config.as_dict() if isinstance(config, TrialConfig) else config
    return json.dumps(data, sort_keys=True)


class GridRecorder:
    """Measures the planned launches, appending one row per configuration to a JSONL file."""

    def __init__(self, ctx: StudyContext, jsonl: Path, progress: Progress):
        if ctx.spec.quality.scorer == "perplexity":
            raise UserError(
                f"{ctx.spec.path}: quality.scorer: record-grid scores agreement or answers; "
                "perplexity needs a llama-perplexity run per expert count, use `tuner run` for it"
            )
        self.ctx = ctx
        self.jsonl = jsonl
        jsonl.parent.mkdir(parents=True, exist_ok=True)
        self.reference_path = jsonl.with_suffix(".reference.json")
        self.progress = progress
        self.provenance = {
            "build_commit": ctx.build.get("commit"),
            "cpu_model": ctx.fingerprint.get("cpu_model"),
            "space_digest": ctx.space.digest(),
            "n_predict": ctx.settings.n_predict,
            "repetitions": ctx.settings.repetitions,
        }
        self.done = self._resume()
        self.reference = (
            json.loads(self.reference_path.read_text()) if self.reference_path.is_file() else None
        )

    def _resume(self) -> dict[str, dict]:
        """Rows already recorded (the last per configuration), except failures that may not recur (a crash, a
        timeout) and rows measured beside other busy processes: those are measured again. Refused if measured on
        another build, space or settings."""
        if not self.jsonl.is_file():
            return {}
        rows = [json.loads(line) for line in self.jsonl.read_text().splitlines() if line.strip()]
        for row in rows:
            other = {k: row.get(k) for k in self.provenance if row.get(k) != self.provenance[k]}
            if other:
                raise UserError(
                    f"{self.jsonl}: recorded with {other}, not { ({k: self.provenance[k] for k in other}) }; "
                    "rows would not be comparable: delete it or pass another --out"
                )
        latest = {config_key({k: row[k] for k in KNOBS if row.get(k) is not None}): row for row in rows}
        return {
            key: row
            for key, row in latest.items()
            if (row["status"] == "ok" and not row.get("host_busy"))
            or (row["status"] != "ok" and FailureReason(row["status"]) in PERMANENT)
        }

    def record(self, launches: list[Launch]) -> list[dict]:
        total = sum(len(launch.configs) for launch in launches)
        for number, launch in enumerate(launches):
            pending = [c for c in launch.configs if config_key(c) not in self.done]
            if launch.refused:
                for config in pending:
                    self._write(self._failed(config, launch.refused))
                continue
            relaunched = False
            while pending:
                pending, busy = self._launch(number, launch, pending, total)
                if (
                    busy and not relaunched
                ):  # as a trial is: launched once more; a second busy launch is kept, marked
                    relaunched, pending = True, busy + pending
        return list(self.done.values())

    def _launch(
        self, number: int, launch: Launch, pending: list[TrialConfig], total: int
    ) -> tuple[list[TrialConfig], list[TrialConfig]]:
        """One server for the pending configurations; returns those left after a failure, and those measured
        while other processes kept the host busy (their rows marked ``host_busy``: measured again on resume)."""
        started = time.monotonic()
        measured: list[TrialConfig] = []

        def measure_pending(server: LlamaServer) -> list[TrialConfig]:
            launch_s = time.monotonic() - started
            while pending:
                config = pending[0]
                try:
                    row = self._measure(server, config)
                except TrialFailure as failure:
                    if failure.reason in PERMANENT:  # a property of the launch: the rest share it
                        for other in pending:
                            self._write(self._failed(other, failure))
                        return []
                    self._write(self._failed(config, failure))
                    return pending[1:]  # the server may be gone: a new one for the rest
                self._write({**row, "launch_s": launch_s})
                measured.append(pending.pop(0))
                self.progress(f"[{len(self.done)}/{total}] {_describe(row)}")
            return []

        try:
            launched = measured_launch(
                ServerLaunch(
                    launch.argv,
                    self.ctx.log_dir / f"grid-{number}.log",
                    timeout_s=self.ctx.spec.measurement.trial_timeout_s,
                ),
                then=measure_pending,
            )
        except TrialFailure as failure:  # the launch itself failed: so do all its configurations
            for config in pending:
                self._write(self._failed(config, failure))
            return [], []
        assert launched.then is not None  # measure_pending always answers
        if not (launched.host_busy and measured):
            return launched.then, []
        self.progress(f"launch {number}: {busy_text(launched.busy)} during it: its rows are marked host_busy")
        for config in measured:
            self._write({**self.done[config_key(config)], "host_busy": True})
        return launched.then, measured

    def _measure(self, server: LlamaServer, config: TrialConfig) -> dict[str, Any]:
        ctx = self.ctx
        started = time.monotonic()
        samples = run_workload(server, ctx.workload, ctx.settings, config.temperature)
        measure_s = time.monotonic() - started
        scores = score_trial(
            samples,
            ctx.settings,
            config.speculative,
            config.spec_type,
            server.speculation_log_problem(),
            server.log_tail(),
        )
        outputs = outputs_by_prompt(samples)
        baseline = config == baseline_config(ctx.space)
        if self.reference is None and not baseline:
            raise UserError(
                "record-grid: the baseline must be measured first; delete the table and record again"
            )
        if baseline:  # the first time, or again after a busy launch: every speedup divides by its latest rate
            self.reference = {
                "tokens": {pid: list(s.tokens) for pid, s in outputs.items()},
                "tokens_per_second": scores.tokens_per_second,
            }
            self.reference_path.write_text(json.dumps(self.reference) + "\n")
        assert self.reference is not None  # the baseline was measured first, checked above
        quality = output_quality(ctx.spec.quality.scorer, outputs, ctx.workload, self.reference["tokens"])
        floor = ctx.spec.quality.floor
        return {
            **asdict(config),
            "tokens_per_second": scores.tokens_per_second,
            "acceptance": scores.acceptance,
            "quality": quality,
            "speedup": scores.tokens_per_second / self.reference["tokens_per_second"],
            "cv": scores.cv,
            "quality_floor": floor,
            "feasible": quality >= floor,
            "status": "ok",
            "drafted": scores.drafted,
            "accepted": scores.accepted,
            "measure_s": measure_s,
            **self.provenance,
        }

    def _failed(self, config: TrialConfig, failure: TrialFailure) -> dict[str, Any]:
        if self.reference is None:
            raise UserError(
                f"record-grid: the baseline failed ({failure}); fix it before recording "
                f"(logs in {self.ctx.log_dir})"
            )
        self.progress(f"[{len(self.done) + 1}] FAILED {failure.reason.value}: {config_key(config)}")
        return {
            **asdict(config),
            "status": failure.reason.value,
            "failure_detail": failure.detail,
            "feasible": False,
            **self.provenance,
        }

    def _write(self, row: dict[str, Any]) -> None:
        with open(self.jsonl, "a") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()
        self.done[config_key({k: row[k] for k in KNOBS if row.get(k) is not None})] = row


def _describe(row: dict) -> str:
    knobs = " ".join(f"{k}={row[k]}" for k in KNOBS if row.get(k) is not None)
    return (
        f"{row['tokens_per_second']:.1f} t/s (cv {row['cv']:.0%}), acceptance {row['acceptance']:.2f}, "
        f"quality {row['quality']:.3f} | {knobs}"
    )


def write_table(rows: list[dict], csv: Path) -> pd.DataFrame:
    """The CSV: knob columns that are set anywhere, then the result columns."""
    frame = pd.DataFrame(rows)
    knobs = [k for k in KNOBS if k in frame.columns and frame[k].notna().any()]
    frame = frame[knobs + [c for c in RESULT_COLUMNS if c in frame.columns]]
    write_atomic(csv, frame.to_csv(index=False))
    return frame


def record_grid(
    study: str | Path | StudySpec,
    out: Path | None = None,
    *,
    progress: Progress,
    max_launches: int | None = None,
) -> Path:
    """Record (or resume) the study's grid (a study file, or a spec already read); returns the CSV table.
    ``max_launches``: only the first launches of the plan, the baseline's first (``tuner bench --quick``)."""
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
        rows = recorder.record(launches)
    write_table(rows, csv)
    return csv
