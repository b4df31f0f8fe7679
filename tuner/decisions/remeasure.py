"""Re-measure configurations launch by launch: one live server at a time, in a carry-over-balanced order.

Why: a server launch lands its threads, pages and allocations somewhere, and the next launch
of the same configuration runs a few percent faster or slower. Requests within one launch
are not independent samples of a configuration, so a re-measure round *launches* each
contender, warms it up (discarded), measures one pass of the workload (or the part or the passes the
race's launch size says: ``tuner.decisions.launch_size``) and stops it. Speculation that remembers
earlier requests (ngram-mod, ngram-cache) starts fresh in every round, and each of its passes is a launch of
its own (``tuner.measurement.measured_launch``). Rounds follow a Williams design (every contender equally
often first, and right after each other one), and the models' cached pages are evicted when
consecutive launches use different NUMA policies, as a study does between trials.

A contender with ``users`` is a load class's: its server has ``--parallel users`` slots, and the
pass after the warm-up is one concurrency level of that many clients (``tuner.measurement.load``),
the launch's rate its aggregate tokens/s.

The finalist race (``tuner.decisions.race``), the load-class races (``tuner.decisions.load_race``),
the per-type race and the repeatability benchmark all re-measure through here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from tuner.decisions.launch_size import LaunchSize
from tuner.errors import UserError
from tuner.knobs.config import TrialConfig
from tuner.knobs.registry import DRAFT_MODEL_TYPES, remembers_requests
from tuner.machine.host import busy_text
from tuner.machine.placement import evict
from tuner.measurement.failures import TrialFailure
from tuner.measurement.measure import MeasurementSettings, check_drafted, pooled_rate
from tuner.measurement.measured_launch import MeasuredLaunch, Requests, ServerLaunch, measured_launch
from tuner.measurement.workload import Workload
from tuner.progress import Progress
from tuner.storage.records import TrialRecord
from tuner.studyfile.spec import StudySpec


class StudyInputs(Protocol):
    """What the decisions read of a prepared study (``tuner.prepare.StudyContext`` has it all): its
    spec (the race settings), how it measures, its workload and where its logs go. Decisions sit
    below the context and take it as this argument, never importing it. Read-only, as the frozen context's
    fields are."""

    @property
    def spec(self) -> StudySpec: ...

    @property
    def settings(self) -> MeasurementSettings: ...

    @property
    def workload(self) -> Workload: ...

    @property
    def log_dir(self) -> Path: ...


MODEL_FLAGS = ("--model", "--spec-draft-model")


@dataclass(frozen=True)
class Contender:
    label: str  # also the log files' name: remeasure-LABEL-N.log
    argv: list[str]  # without --host/--port
    temperature: float
    numa: str = "none"
    models: tuple[str, ...] = ()  # files whose cached pages follow the NUMA policy
    users: int | None = (
        None  # a load class: this many clients at once on as many slots; None: one user's pass
    )
    # the speculative types asked for ("" for none): a launch that drafts nothing may fail (``must_draft``)
    speculation: str = ""


def contender(label: str, record: TrialRecord, users: int | None = None) -> Contender:
    """A stored trial as a contender: its command (with ``users``: serving that many at once), temperature,
    NUMA policy and model files."""
    models = tuple(v for f, v in (record.command.options if record.command else ()) if f in MODEL_FLAGS and v)
    argv = record.argv
    if users is not None:
        if record.command is None:
            raise UserError(f"{label}: no stored command to serve {users} users with")
        argv = record.command.with_slots(users).argv
    return config_contender(label, record.config, argv, models, users)


def config_contender(
    label: str, config: TrialConfig, argv: list[str], models: tuple[str, ...] = (), users: int | None = None
) -> Contender:
    """A configuration launched as ``argv``: its temperature, NUMA policy and speculation from ``config``."""
    speculation = ",".join(config.spec_types) if config.speculative else ""
    return Contender(label, argv, config.temperature, config.numa, models, users, speculation)


@dataclass(frozen=True)
class Launch:
    """One launch's measured pass."""

    rate: float  # pooled tokens/s of the pass
    drafted: int
    accepted: int
    per_suite: dict[str, float] = field(default_factory=dict)
    host_busy: bool = False  # other processes used more than ``machine.host.BUSY_CORES`` during it
    unpinned: str | None = (
        None  # its server's threads not held to the asked CPUs (``MeasuredLaunch.unpinned``)
    )


@dataclass(frozen=True)
class Rates:
    tokens_per_second: list[float]  # one launch per round
    drafted: int  # draft tokens over all rounds (0 with speculation on: it was off)
    per_suite: dict[str, list[float]] = field(default_factory=dict)  # suite -> one pooled rate per round
    accepted: list[int] = field(default_factory=list)  # accepted draft tokens, per round


def williams_order(n: int, round_index: int) -> list[int]:
    """Row ``round_index`` of a Williams design for ``n`` contenders: over n rounds (2n for odd n) each
    contender is equally often in each position and follows every other one equally often."""
    first = [0]
    for position in range(1, n):
        first.append((position + 1) // 2 if position % 2 else n - position // 2)
    rows = [[(x + i) % n for x in first] for i in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return rows[round_index % len(rows)] if n else []


def must_draft(speculation: str, spec_problem: str | None) -> str:
    """The speculation a launch that drafted nothing fails on, as a trial does: a draft model always drafts, but
    a lookup may find nothing to draft in one launch's few requests, so it fails only when the log says
    speculation was off."""
    drafts = any(t in DRAFT_MODEL_TYPES for t in speculation.split(","))
    return speculation if drafts or spec_problem else ""


class LaunchFailed(UserError):
    """A contender's launch failed twice: the configuration's fault, not a stalled host's."""


class Remeasure:
    """Launches contenders one at a time; remembers the NUMA policy its pages were placed under."""

    def __init__(
        self,
        workload: Workload,
        settings: MeasurementSettings,
        log_dir: Path,
        progress: Progress,
        size: LaunchSize | None = None,
    ):
        self.workload, self.log_dir, self.progress, self.size = workload, log_dir, progress, size
        self.settings = replace(settings, repetitions=size.passes if size else 1, max_repetitions=None)
        self.placed_under: str | None = None
        self.launches = 0
        self.round_index = 0  # which part of the workload a launch measures (``LaunchSize.workload``)
        # label -> why its launch failed twice (``round`` goes on without it)
        self.failed: dict[str, str] = {}

    @property
    def measured(self) -> Workload:
        """What this round's launches measure: the whole workload, or this round's part of it."""
        return self.size.workload(self.workload, self.round_index) if self.size else self.workload

    def launch(self, contender: Contender) -> Launch:
        """Start ``contender``'s server, warm up, measure one pass (a load class: one level of its users), stop it;
        marked when the host was busy meanwhile or its threads were not on the asked CPUs. A launch that fails (speculation that drafted nothing included)
        is launched once more (a stalled host or a crash must not end a long race); a second failure is the
        configuration's, one line."""
        try:
            return self._launch_once(contender)
        except TrialFailure as failure:
            self.progress(
                f"re-measuring {contender.label} failed ({failure}; see {self._log(contender)}); launching it once more"
            )
        try:
            return self._launch_once(contender)
        except TrialFailure as failure:
            raise LaunchFailed(
                f"re-measuring {contender.label} failed twice: {failure}; see {self._log(contender)}"
            ) from None

    def _log(self, contender: Contender) -> Path:
        level = f"-c{contender.users}" if contender.users is not None else ""
        return self.log_dir / f"remeasure-{contender.label}{level}-{self.launches}.log"

    def _launch_once(self, contender: Contender) -> Launch:
        """One launch, checked as a trial is: speculation asked for that drafted nothing fails it (``must_draft``)."""
        if self.placed_under is not None and contender.numa != self.placed_under and contender.models:
            evict([Path(m) for m in contender.models])
        self.placed_under = contender.numa
        self.launches += 1
        users = contender.users
        measured: MeasuredLaunch[None] = measured_launch(
            ServerLaunch(
                contender.argv,
                self._log(contender),
                timeout_s=self.settings.trial_timeout_s,
                models=[Path(m) for m in contender.models],
            ),
            requests=Requests(
                self.workload if users is not None else self.measured,
                self.settings,
                contender.temperature,
                passes=users is None,
                levels=(users,) if users is not None else (),
                remembers=remembers_requests(contender.speculation.split(",")),
            ),
        )
        launch = self._measured(measured)
        problem = measured.spec_problem
        check_drafted(must_draft(contender.speculation, problem), launch.drafted, problem, measured.log_tail)
        if launch.host_busy:
            self.progress(
                f"re-measuring {contender.label}: {busy_text(measured.busy)} during its launch; "
                "its rate may read low"
            )
        if launch.unpinned:
            self.progress(
                f"re-measuring {contender.label}: not pinned as asked ({launch.unpinned}); its rate measures "
                "another placement"
            )
        return launch

    def _measured(self, measured: MeasuredLaunch) -> Launch:
        """A launch's figures: its pass's (pooled tokens/s, per suite), or its one level's aggregate tokens/s."""
        if measured.levels:
            level = measured.levels[0]
            return Launch(
                level.aggregate_tokens_per_second,
                sum(r.draft_n for r in level.requests),
                sum(r.draft_n_accepted for r in level.requests),
                host_busy=measured.host_busy,
                unpinned=measured.unpinned,
            )
        samples = measured.samples
        return Launch(
            pooled_rate(samples),
            sum(s.draft_n for s in samples),
            sum(s.draft_n_accepted for s in samples),
            {suite: pooled_rate(s for s in samples if s.suite == suite) for suite in self.workload.suites},
            measured.host_busy,
            measured.unpinned,
        )

    def round(self, contenders: Sequence[Contender], round_index: int) -> dict[str, Launch]:
        """Each contender launched once, in the Williams order of this round; one whose launch fails twice is
        left out of the answer and its reason kept in ``failed`` (the others' launches are not lost with it)."""
        order = [contenders[i] for i in williams_order(len(contenders), round_index)]
        self.round_index = round_index
        launched = {}
        for contender in order:
            try:
                launched[contender.label] = self.launch(contender)
            except LaunchFailed as failure:
                self.failed[contender.label] = str(failure)
                self.progress(str(failure))
        return launched


def rounds_of_launches(
    contenders: list[Contender],
    workload: Workload,
    settings: MeasurementSettings,
    rounds: int,
    log_dir: Path,
    progress: Progress,
) -> dict[str, Rates]:
    """A fixed number of rounds, each launching every contender once (per-type race, repeatability bench)."""
    remeasure = Remeasure(workload, settings, log_dir, progress)
    launches: dict[str, list[Launch]] = {c.label: [] for c in contenders}
    for round_index in range(rounds):
        for label, launch in remeasure.round(contenders, round_index).items():
            launches[label].append(launch)
        if remeasure.failed:  # every contender every round: a fixed design has no place for one that failed
            raise UserError(next(iter(remeasure.failed.values())))
        progress(
            f"re-measure round {round_index + 1}/{rounds} (one launch each): "
            + ", ".join(f"{label} {values[-1].rate:.1f} t/s" for label, values in launches.items())
        )
    return {
        label: Rates(
            [x.rate for x in values],
            sum(x.drafted for x in values),
            {s: [x.per_suite.get(s, 0.0) for x in values] for s in workload.suites},
            [x.accepted for x in values],
        )
        for label, values in launches.items()
    }
