"""What a race on real launches measures (``RaceSetup``) and its launches (``Launcher``): one finalist alone or a
round of several, each timed for the time left, with what each drafted and accepted and whether its host was
busy, kept per finalist."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuner import eta
from tuner.decisions import launch_size
from tuner.decisions.remeasure import Launch, Remeasure, contender
from tuner.measurement.measure import MeasurementSettings
from tuner.measurement.workload import Workload
from tuner.progress import Progress
from tuner.storage.records import TrialRecord
from tuner.studyfile.spec import RaceSpec


@dataclass(frozen=True)
class RaceSetup:
    """How a race on real launches measures: the workload and settings each launch runs, the race's rules
    (``spec``) and where the launches' logs go. ``launch_sigma``: the launch spread the forecast before racing
    assumes. With ``users``, a load class's race: each launch serves that many users at once
    (``remeasure.Contender``). With ``size``, each launch measures what it says (``tuner.decisions.launch_size``),
    and ``race.max_rounds`` becomes as many rounds as fit in the time of that many one-pass rounds."""

    workload: Workload
    settings: MeasurementSettings
    spec: RaceSpec
    log_dir: Path
    launch_sigma: float | None = None
    users: int | None = None
    size: launch_size.LaunchSize | None = None


class Launcher:
    """Launches for a race: one finalist alone or a round of several, each timed (the time left is
    planned on them) and its drafted and accepted tokens whether its host was busy and whether its threads were pinned as asked kept per finalist."""

    def __init__(
        self,
        records: dict[str, TrialRecord],
        remeasure: Remeasure,
        progress: Progress,
        users: int | None = None,
    ):
        self.contenders = {name: contender(name, r, users) for name, r in records.items()}
        self.remeasure = remeasure
        self.drafted = dict.fromkeys(records, 0)
        self.accepted: dict[str, list[int]] = {name: [] for name in records}
        self.host_busy: dict[str, list[bool]] = {name: [] for name in records}
        self.unpinned: dict[str, list[bool]] = {name: [] for name in records}
        self.watch = eta.Stopwatch(progress.time)

    def _rate(self, name: str, launched: Launch) -> float:
        self.drafted[name] += launched.drafted
        self.accepted[name].append(launched.accepted)
        self.host_busy[name].append(launched.host_busy)
        self.unpinned[name].append(launched.unpinned is not None)
        return launched.rate

    def launch(self, name: str) -> float:
        return self._rate(name, self.watch.time(1, lambda: self.remeasure.launch(self.contenders[name])))

    def launch_round(self, names: list[str], round_index: int) -> dict[str, float]:
        launched = self.watch.time(
            len(names), lambda: self.remeasure.round([self.contenders[n] for n in names], round_index)
        )
        return {name: self._rate(name, one) for name, one in launched.items()}
