"""A race on real launches: finalists launched against the baseline round by round (each launch timed for the time
left, ``finalist_launches``), confirmation rounds when asked, and what the race leaves (``RaceResult``)."""

from __future__ import annotations

from dataclasses import replace

from tuner import figure_text
from tuner.decisions import evidence
from tuner.decisions.race.finalist_launches import Launcher, RaceSetup
from tuner.decisions.race.finalist_selection import label, recorded_rate, resource_key
from tuner.decisions.race.operator_lines import announce
from tuner.decisions.race.results import Confirmation, Entry, RaceResult
from tuner.decisions.race.rounds import RaceRounds
from tuner.decisions.race.sequential import LoopOptions, confirm, sequential_race
from tuner.decisions.race.stop_rules import RESOURCE_RULE, Outcome
from tuner.decisions.race.wording import race_title
from tuner.decisions.remeasure import Remeasure
from tuner.errors import UserError
from tuner.progress import Progress
from tuner.storage.records import StudyRecord, TrialRecord
from tuner.studyfile.spec import RaceSpec


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
    launcher = Launcher(records, Remeasure(workload, settings, log_dir, progress, size), progress, users)
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
        options=LoopOptions(title=title),
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
        loss_bound=figure_text.or_none(outcome.loss),
        leader=records[outcome.leader].number,
        forecast=outcome.forecast,
        users=users,
        no_bound=outcome.no_bound,
    )


def _confirm_winner(
    race_rounds: RaceRounds,
    winner: str,
    baseline: str,
    launcher: Launcher,
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
    launcher: Launcher,
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
                unpinned=launcher.unpinned[name],
                rounds=[i + 1 for i in race_rounds.rounds.get(name, [])],
            )
        )
    return sorted(entries, key=lambda e: (e.status == "winner", e.speedup), reverse=True)
