"""A race on real launches: a study's finalists launched against its baseline round by round (each launch timed
for the time left), confirmation rounds when asked, and the result stored with the study."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import optuna

from tuner import eta, figures
from tuner.decisions import evidence, launch_size
from tuner.decisions.drift import Sentinels
from tuner.decisions.race.finalist_selection import finalists, label, recorded_rate, resource_key
from tuner.decisions.race.operator_lines import announce
from tuner.decisions.race.results import Confirmation, Entry, RaceResult
from tuner.decisions.race.rounds import RaceRounds
from tuner.decisions.race.sequential import confirm, sequential_race
from tuner.decisions.race.stop_rules import RESOURCE_RULE, Outcome
from tuner.decisions.race.wording import race_title
from tuner.decisions.remeasure import Launch, Remeasure, StudyInputs, contender
from tuner.errors import UserError
from tuner.measurement.measure import MeasurementSettings
from tuner.measurement.workload import Workload
from tuner.progress import Progress
from tuner.storage import store
from tuner.storage.records import StudyRecord, TrialRecord
from tuner.studyfile.spec import RaceSpec


class _Launcher:
    """Launches for a race: one finalist alone or a round of several, each timed (the time left is
    planned on them) and its drafted and accepted tokens and whether its host was busy kept per finalist."""

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
        self.watch = eta.Stopwatch(progress.time)

    def _rate(self, name: str, launched: Launch) -> float:
        self.drafted[name] += launched.drafted
        self.accepted[name].append(launched.accepted)
        self.host_busy[name].append(launched.host_busy)
        return launched.rate

    def launch(self, name: str) -> float:
        return self._rate(name, self.watch.time(1, lambda: self.remeasure.launch(self.contenders[name])))

    def launch_round(self, names: list[str], round_index: int) -> dict[str, float]:
        launched = self.watch.time(
            len(names), lambda: self.remeasure.round([self.contenders[n] for n in names], round_index)
        )
        return {name: self._rate(name, one) for name, one in launched.items()}


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


def run_race(
    study: StudyRecord,
    candidates: list[TrialRecord],
    baseline: TrialRecord,
    setup: RaceSetup,
    progress: Progress,
) -> RaceResult:
    """Rounds of launches until decided or out of rounds; confirmation rounds when ``race.confirm_rounds`` asks
    (``setup``: what each launch measures and the race's rules)."""
    workload, settings, spec, log_dir = setup.workload, setup.settings, setup.spec, setup.log_dir
    launch_sigma, users, size = setup.launch_sigma, setup.users, setup.size
    records = {label(r): r for r in [*candidates, baseline]}
    launcher = _Launcher(records, Remeasure(workload, settings, log_dir, progress, size), progress, users)
    title = race_title(users)
    spec = replace(spec, max_rounds=size.rounds(spec.max_rounds)) if size else spec
    announce(records, spec, progress, launch_sigma, title, size)
    race_rounds, outcome = sequential_race(
        [n for n in records if n != label(baseline)],
        label(baseline),
        launcher.launch_round,
        {n: resource_key(r, study) for n, r in records.items()},
        spec,
        progress=progress,
        title=title,
    )
    confirmation = _confirm_winner(
        race_rounds, outcome.winner, label(baseline), launcher, spec, progress, title
    )
    progress.time.plan(progress.time.then_s)  # what follows the race (an export's per-type race)
    return RaceResult(
        rounds=max(max(v, default=-1) for v in race_rounds.rounds.values()) + 1,
        baseline_trial=baseline.number,
        entries=_entries(race_rounds, outcome, records, launcher, users),
        winner=records[outcome.winner].number,
        decided=outcome.decided,
        verdict=outcome.verdict,
        rule=RESOURCE_RULE,
        loss=spec.loss,
        drafted=launcher.drafted,
        outliers=race_rounds.outliers,
        launches=race_rounds.launches,
        confirmation=confirmation,
        loss_bound=figures.or_none(outcome.loss),
        leader=records[outcome.leader].number,
        forecast=outcome.forecast,
        users=users,
        no_bound=outcome.no_bound,
    )


def _confirm_winner(
    race_rounds: RaceRounds,
    winner: str,
    baseline: str,
    launcher: _Launcher,
    spec: RaceSpec,
    progress: Progress,
    title: str,
) -> Confirmation | None:
    """``race.confirm_rounds`` rounds of the winner and the baseline alone (none when the baseline won); their
    launches and outliers count in the race's."""
    progress.time.then_units = 0
    if winner == baseline or not spec.confirm_rounds:
        return None
    progress.time.expect(2 * spec.confirm_rounds)
    progress(f"{title}: confirming {winner} against the baseline in {spec.confirm_rounds} fresh rounds")
    try:
        confirmation, check = confirm(
            winner, baseline, launcher.launch_round, launcher.launch, spec.confirm_rounds
        )
    except UserError as failure:  # the race's figures stand; only the separate figure is missing
        progress(f"{title}: no confirmation figure: {failure}")
        return None
    race_rounds.outliers += [f"confirmation {line}" for line in check.outliers]
    race_rounds.launches += check.launches
    return confirmation


def _entries(
    race_rounds: RaceRounds,
    outcome: Outcome,
    records: dict[str, TrialRecord],
    launcher: _Launcher,
    users: int | None = None,
) -> list[Entry]:
    entries = []
    for name, rates in race_rounds.rates.items():
        record = records[name]
        ratio = outcome.speedups[name]
        entries.append(
            Entry(
                trial=record.number,
                label=name,
                config=record.config.as_dict(),
                recorded_tokens_per_second=recorded_rate(record, users),
                rates=rates,
                mean_tokens_per_second=evidence.geometric_mean(rates),
                speedup=ratio.estimate,
                speedup_low=ratio.low,
                speedup_high=ratio.high,
                status=outcome.standing[name],
                accepted=launcher.accepted[name],
                host_busy=launcher.host_busy[name],
                rounds=[i + 1 for i in race_rounds.rounds.get(name, [])],
            )
        )
    return sorted(entries, key=lambda e: (e.status == "winner", e.speedup), reverse=True)


def race_study(
    ctx: StudyInputs,
    study: optuna.Study,
    progress: Progress,
    candidates: list[TrialRecord] | None = None,
    launch_s: float | None = None,
    users: int | None = None,
) -> RaceResult | None:
    """Race a study's finalists (or the given candidates) against its baseline; stored with the study.
    None when there is nothing to race: no feasible trial other than the baseline itself. ``launch_s``:
    a launch as the study's estimate has it, for the remaining time before the first is measured. With
    ``users``, the load class of that many users at once (``tuner.decisions.load_race``), stored as its own."""
    base = store.baseline_record(study)
    if base is None:
        return None
    records = store.read_trials(study)
    pool = (
        candidates
        if candidates is not None
        else finalists(records, ctx.settings.noise_cv, ctx.spec.race.max_finalists, users)
    )
    pool = [r for r in pool if r.config != base.config]
    if not pool:
        return None
    if progress.time.unit_s is None:  # no trial measured in this command: a launch as the study estimates it
        progress.time.unit_s = launch_s
    sentinels = Sentinels(records, ctx.settings.noise_cv)
    size = (
        launch_size.from_trials(
            [*pool, base], sentinels.launch_estimate(), ctx.workload, ctx.spec.race.max_rounds
        )
        if users is None
        else None
    )
    setup = RaceSetup(
        workload=ctx.workload,
        settings=ctx.settings,
        spec=ctx.spec.race,
        log_dir=ctx.log_dir,
        launch_sigma=sentinels.launch_estimate(),  # the forecast before racing: a point estimate, not a bound
        users=users,
        size=size,
    )
    result = run_race(store.read_study_record(study), pool, base, setup, progress)
    if users is None:
        store.write_race(study, result.to_json())
    else:
        store.write_load_race(study, users, result.to_json())
    return result
