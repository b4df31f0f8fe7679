"""What an operator reads of a race: its plan and forecast before the first round, a line per round, and the
verdict lines after it (the table, what the deployment may lose, outliers, the winner's figure)."""

from __future__ import annotations

import math
import statistics

from tuner import figure_text
from tuner.decisions import launch_size
from tuner.decisions.race.allocation import rounds_left, runner_up
from tuner.decisions.race.forecasts import bound_at_cap, forecast_before
from tuner.decisions.race.paired_statistics import PairedStatistics
from tuner.decisions.race.results import RaceResult
from tuner.decisions.race.rounds import RaceRounds
from tuner.decisions.race.stop_rules import Outcome
from tuner.decisions.race.wording import bound_text, loss_text, users_text
from tuner.progress import Progress
from tuner.storage.records import TrialRecord
from tuner.studyfile.spec import RaceSpec


def announce(
    records: dict[str, TrialRecord],
    spec: RaceSpec,
    progress: Progress,
    launch_sigma: float | None,
    title: str = "race",
    size: launch_size.LaunchSize | None = None,
) -> None:
    """The race's plan (with ``size``: what a launch measures), its expected launches for the time left, and the
    forecast from the launch spread."""
    if size is not None:
        more = f"; at most {spec.max_rounds} rounds in that time" if size.share != 1 else ""
        progress(f"{title}: {size.text()}{more}")
    progress.time.then_units = 2 * spec.confirm_rounds
    progress.time.expect(spec.max_rounds * len(records))
    progress(
        f"{title}: {len(records)} finalists ({', '.join(records)}), one launch each per round for "
        f"{spec.min_rounds} rounds, then the leader and the finalists whose comparison with it is open, until one "
        f"is within race.loss ({loss_text(spec.loss)}) of every other, at most {spec.max_rounds} rounds"
    )
    if launch_sigma is not None:
        seconds = progress.time.unit_s or _trial_seconds(list(records.values()))
        progress(f"{title}: {forecast_before(launch_sigma, len(records), spec, seconds).text()}")


def _trial_seconds(records: list[TrialRecord]) -> float | None:
    """A launch's time, at most: the median finalist trial's (a trial is one launch and all its passes)."""
    spans = [
        r.ended_at - r.started_at for r in records if r.started_at is not None and r.ended_at is not None
    ]
    return statistics.median(spans) if spans else None


def cap_line(look: PairedStatistics, spec: RaceSpec, done: int, title: str = "race") -> str:
    """The round the race first foresees its cap (``allocation.foresee``): what the cap leaves (the loss bound
    expected there, ``forecasts.bound_at_cap``) and where the rounds left go."""
    left = rounds_left(look.race_rounds, spec, done)
    cap = (
        f"race.max_rounds ({spec.max_rounds})"
        if left >= spec.max_rounds - done
        else f"the time budget ({spec.budget_minutes} min)"
    )
    leader = look.leader
    runner = runner_up(look, leader)
    expected = bound_at_cap(look, leader, runner, left) if runner is not None else -math.inf
    return (
        f"{title} forecast: no decision and no expected-loss stop within {cap}; the {left} round"
        f"{'s' if left != 1 else ''} left launch {leader} and {runner} (the pick) and, in turn, the finalist that "
        f"sets the loss bound: expected at the cap from the pick's rounds alone, no other finalist more than "
        f"{bound_text(max(expected, 0.0))} faster than {leader} (95%; {bound_text(max(look.loss(leader), 0.0))} "
        f"after {done} rounds)"
    )


def round_line(
    race_rounds: RaceRounds,
    look: PairedStatistics,
    measured: list[str],
    round_index: int,
    outcome: Outcome | None,
    title: str = "race",
) -> str:
    """A round's line: each launch's rate (or that it was left out), who rested, and where the race stands."""
    resting = [n for n in race_rounds.candidates if n not in measured]

    def rate(name: str) -> str:
        if race_rounds.rounds[name][-1:] == [round_index]:
            return f"{race_rounds.rates[name][-1]:.1f}"
        return "left out (outlier)"

    leader = look.leader
    status = (
        outcome.verdict
        if outcome
        else f"racing on ({leader} leads; no other finalist more than {bound_text(max(look.loss(leader), 0.0))} "
        f"faster, 95%)"
        if math.isfinite(look.loss(leader))
        else "racing on"
    )
    return (
        f"{title} round {round_index + 1}: "
        + ", ".join(f"{n} {rate(n)}" for n in measured)
        + " t/s"
        + (f" (resting: {', '.join(resting)})" if resting else "")
        + f"; {status}"
    )


def verdict_lines(result: RaceResult) -> list[str]:
    """What an operator reads: the table, the verdict, what the deployment may lose, the forecast, outliers, and the
    deployed configuration's figure. A load class's lines begin with its level (``c4 verdict: ...``)."""
    tag = "" if result.users is None else f"c{result.users} "
    rate = (
        "geometric mean tokens/s"
        if result.users is None
        else f"geometric mean aggregate tokens/s at {users_text(result.users)}"
    )
    lines = [
        f"{result.title}: {result.rounds} rounds, {result.launches} launches (per finalist: {rate} over its "
        f"launches; speedup over the baseline on paired rounds, 95% interval simultaneous over the finalists):"
    ]
    for entry in result.entries:
        mark = "*" if entry.trial == result.winner else " "
        figure = "baseline" if entry.trial == result.baseline_trial else result.speedup_of(entry).text()
        lines.append(
            f" {mark} trial {entry.trial:>3}: {figure_text.figure(entry.mean_tokens_per_second, '8.1f')} t/s over "
            f"{len(entry.rates)} launches (recorded {figure_text.figure(entry.recorded_tokens_per_second, '.1f')}), "
            f"{figure} | {entry.status} | " + " ".join(f"{k}={v}" for k, v in entry.config.items())
        )
    lines.append(f"{tag}verdict: {result.verdict}")
    lines.append(f"{tag}loss: {result.loss_line()}")
    if result.forecast:
        lines.append(f"{tag}forecast: {result.forecast}")
    lines += [f"{tag}outlier: {line}" for line in result.outliers]
    winning = result.winning
    lines.append(f"{tag}winner: trial {winning.trial}, {result.figure()}")
    if result.baseline_deployed and (best := result.best_candidate) is not None:
        lines.append(
            f"{tag}best candidate: trial {best.trial}, {result.speedup_of(best).text()} over the baseline "
            "(not shown faster)"
        )
    return lines
