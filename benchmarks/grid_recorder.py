"""The grid's launches measured (``benchmarks/grid`` plans them): one server per launch, one row per configuration
appended to ``NAME.jsonl`` and flushed as soon as it is measured, so an interrupted recording resumes where it
stopped. Why a module of its own: what a grid is (every combination, grouped by launch, the table it ends as)
and how its rows are measured, resumed and marked change for different reasons.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tuner.errors import UserError
from tuner.knobs.config import TrialConfig
from tuner.knobs.registry import NAMES as KNOBS
from tuner.machine.host import busy_text
from tuner.measurement.failures import PERMANENT, FailureReason, TrialFailure
from tuner.measurement.measure import Sample, outputs_by_prompt, run_workload, score_trial
from tuner.measurement.measured_launch import MeasuredLaunch, Requests, ServerLaunch, measured_launch
from tuner.measurement.quality import output_quality
from tuner.measurement.server_process import LlamaServer
from tuner.prepare import StudyContext
from tuner.progress import Progress
from tuner.search.space import baseline_config

# A long sweep's baseline: its first launch, one midway and one at its end. A sweep of fewer than
# CHECKED_SWEEP launches keeps its one launch (a short one ends before the host drifts).
BASELINE_LAUNCHES = 3
CHECKED_SWEEP = 10


@dataclass(frozen=True)
class Launch:
    """Configurations that share one server: the same argv, other temperatures."""

    argv: tuple[str, ...]
    configs: tuple[TrialConfig, ...]
    refused: TrialFailure | None = None  # the argv builder refused them: nothing to launch


def config_key(config: TrialConfig | dict) -> str:
    data = config.as_dict() if isinstance(config, TrialConfig) else config
    return json.dumps(data, sort_keys=True)


def row_knobs(row: dict) -> dict[str, Any]:
    """The configuration a recorded row measured, as its knobs (those it sets)."""
    return {k: row[k] for k in KNOBS if row.get(k) is not None}


def recorded_rows(jsonl: Path) -> list[dict]:
    """Every row a recording appended, in order (a configuration measured again has several)."""
    return [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]


def latest_rows(rows: list[dict]) -> dict[str, dict]:
    """The last row of each configuration, by ``config_key``: what the recording's table holds."""
    return {config_key(row_knobs(row)): row for row in rows}


def _stale_lookup(row: dict) -> bool:
    """A row of a lookup that remembers requests, measured with its passes in one server (a recording from before
    ``launch_per_pass``): its later passes drafted from the first's answers."""
    return TrialConfig(**row_knobs(row)).remembers_requests and not row.get("launch_per_pass")


def readings_of(reference: dict | None) -> list[dict]:
    """The baseline's launches as the reference keeps them (one recorded before readings were kept: its one
    rate)."""
    if not reference:
        return []
    return reference.get("readings") or [{"tokens_per_second": reference["tokens_per_second"]}]


def quiet_readings(reference: dict | None) -> list[float]:
    """The baseline's rates from its launches that no other process kept busy."""
    return [float(r["tokens_per_second"]) for r in readings_of(reference) if not r.get("host_busy")]


def reference_rate(readings: list[dict]) -> float:
    """What every speedup divides by: the median of the baseline's quiet launches (of all, if none was quiet)."""
    quiet = [r["tokens_per_second"] for r in readings if not r.get("host_busy")]
    return float(statistics.median(quiet or [r["tokens_per_second"] for r in readings]))


def rebased(rows: list[dict], reference: dict | None) -> list[dict]:
    """The rows with every speedup over the reference's rate as it stands now: a row measured before a later
    baseline launch divided by the rate known then."""
    if not reference:
        return rows
    rate = float(reference["tokens_per_second"])
    return [{**r, "speedup": r["tokens_per_second"] / rate} if r.get("status") == "ok" else r for r in rows]


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
        timeout), rows measured beside other busy processes, and a remembering lookup's rows measured in one server
        (before ``launch_per_pass``): those are measured again. Refused if measured on another build, space or
        settings."""
        if not self.jsonl.is_file():
            return {}
        rows = recorded_rows(self.jsonl)
        for row in rows:
            other = {k: row.get(k) for k in self.provenance if row.get(k) != self.provenance[k]}
            if other:
                raise UserError(
                    f"{self.jsonl}: recorded with {other}, not { ({k: self.provenance[k] for k in other}) }; "
                    "rows would not be comparable: delete it or pass another --out"
                )
        latest = latest_rows(rows)
        return {
            key: row
            for key, row in latest.items()
            if (row["status"] == "ok" and not row.get("host_busy") and not _stale_lookup(row))
            or (row["status"] != "ok" and FailureReason(row["status"]) in PERMANENT)
        }

    def record(self, launches: list[Launch]) -> list[dict]:
        total = sum(len(launch.configs) for launch in launches)
        checks = {len(launches) // 2: 2, len(launches) - 1: BASELINE_LAUNCHES}
        for number, launch in enumerate(launches):
            self._record_launch(number, launch, total)
            if len(launches) >= CHECKED_SWEEP and number in checks:
                self._baseline_again(launches[0], number, total, checks[number])
        return list(self.done.values())

    def _record_launch(self, number: int, launch: Launch, total: int) -> None:
        pending = [c for c in launch.configs if config_key(c) not in self.done]
        if launch.refused:
            for config in pending:
                self._write(self._failed(config, launch.refused))
            return
        relaunched = False
        while pending:
            pending, busy = self._launch(number, launch, pending, total)
            if busy and not relaunched:
                # as a trial is: launched once more; a second busy launch is kept, marked
                relaunched, pending = True, busy + pending

    def _baseline_again(self, first: Launch, number: int, total: int, wanted: int) -> None:
        """The baseline launched again until it has ``wanted`` quiet launches (one more launch per one missing).
        Why: every speedup divides by its rate, and one launch of it can read a quarter low with nothing in the
        host's counters to show it (the scale target's first launch: 25 tokens/s where later ones read 32)."""
        base = baseline_config(self.ctx.space)
        for _ in range(wanted - len(quiet_readings(self.reference))):
            self.progress(
                f"launch {number}: the baseline launched again ({len(quiet_readings(self.reference))} quiet "
                "launch(es) so far): the speedups divide by the median of its launches"
            )
            self._launch(number, Launch(first.argv, (base,)), [base], total)

    def _launch(
        self, number: int, launch: Launch, pending: list[TrialConfig], total: int
    ) -> tuple[list[TrialConfig], list[TrialConfig]]:
        """One server for the pending configurations; returns those left after a failure, and those measured
        while other processes kept the host busy (their rows marked ``host_busy``: measured again on resume)."""
        if pending[0].remembers_requests:  # alone in its launch (``grid.plan``)
            return [], self._launch_per_pass(number, launch, pending[0], total)
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
        return launched.then, self._marked_busy(number, launched, measured)

    def _launch_per_pass(
        self, number: int, launch: Launch, config: TrialConfig, total: int
    ) -> list[TrialConfig]:
        """A configuration whose speculation remembers requests: each pass a launch (``measured_launch``)."""
        ctx = self.ctx
        try:
            launched: MeasuredLaunch[None] = measured_launch(
                ServerLaunch(
                    launch.argv,
                    ctx.log_dir / f"grid-{number}.log",
                    timeout_s=ctx.spec.measurement.trial_timeout_s,
                ),
                requests=Requests(ctx.workload, ctx.settings, config.temperature, remembers=True),
            )
            row = self._row(
                config, launched.samples, launched.measure_s, launched.spec_problem, launched.log_tail
            )
        except TrialFailure as failure:
            self._write(self._failed(config, failure))
            return []
        self._write({**row, "launch_s": launched.ready_s})
        self.progress(f"[{len(self.done)}/{total}] {_describe(row)}")
        return self._marked_busy(number, launched, [config])

    def _marked_busy(
        self, number: int, launched: MeasuredLaunch, measured: list[TrialConfig]
    ) -> list[TrialConfig]:
        """The configurations measured while other processes kept the host busy, their rows marked."""
        if not (launched.host_busy and measured):
            return []
        self.progress(f"launch {number}: {busy_text(launched.busy)} during it: its rows are marked host_busy")
        for config in measured:
            self._write({**self.done[config_key(config)], "host_busy": True})
        if baseline_config(self.ctx.space) in measured:
            self._baseline_busy()
        return measured

    def _measure(self, server: LlamaServer, config: TrialConfig) -> dict[str, Any]:
        started = time.monotonic()
        samples = run_workload(server, self.ctx.workload, self.ctx.settings, config.temperature)
        measure_s = time.monotonic() - started
        return self._row(config, samples, measure_s, server.speculation_log_problem(), server.log_tail())

    def _row(
        self,
        config: TrialConfig,
        samples: list[Sample],
        measure_s: float,
        spec_problem: str | None,
        log_tail: str,
    ) -> dict[str, Any]:
        """A configuration's row from its samples (the baseline's also a reading of the reference)."""
        ctx = self.ctx
        scores = score_trial(
            samples, ctx.settings, config.speculative, config.spec_type, spec_problem, log_tail
        )
        outputs = outputs_by_prompt(samples)
        baseline = config == baseline_config(ctx.space)
        if self.reference is None and not baseline:
            raise UserError(
                "record-grid: the baseline must be measured first; delete the table and record again"
            )
        if baseline:
            # every launch of it is a reading; the speedups divide by their median (``reference_rate``)
            readings = [
                *readings_of(self.reference),
                {"tokens_per_second": scores.tokens_per_second, "host_busy": False},
            ]
            self._write_reference(
                {
                    "tokens": {pid: list(s.tokens) for pid, s in outputs.items()},
                    "readings": readings,
                    "tokens_per_second": reference_rate(readings),
                }
            )
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
            "generated": sum(s.predicted_n for s in samples),
            "requests": len(samples),
            "measure_s": measure_s,
            "launch_per_pass": config.remembers_requests,
            **self.provenance,
        }

    def _baseline_busy(self) -> None:
        """The baseline's last launch kept busy by other processes: its reading is kept, marked, and left out."""
        assert self.reference is not None
        readings = [*self.reference["readings"][:-1], {**self.reference["readings"][-1], "host_busy": True}]
        self._write_reference(
            {**self.reference, "readings": readings, "tokens_per_second": reference_rate(readings)}
        )

    def _write_reference(self, reference: dict) -> None:
        self.reference = reference
        self.reference_path.write_text(json.dumps(reference) + "\n")

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
        self.done[config_key(row_knobs(row))] = row


def _describe(row: dict) -> str:
    knobs = " ".join(f"{k}={v}" for k, v in row_knobs(row).items())
    return (
        f"{row['tokens_per_second']:.1f} t/s (cv {'n/a: one pass' if row['cv'] is None else format(row['cv'], '.0%')}), "
        f"acceptance {row['acceptance']:.2f}, "
        f"quality {row['quality']:.3f} | {knobs}"
    )
