"""What a race leaves: each finalist's entry, the confirmation rounds' figure, and the race's result as stored
with the study (JSON), with what the deployment may lose and the winner's figure in words."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tuner import figure_text
from tuner.decisions import evidence
from tuner.decisions.race.wording import race_title


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One finalist (or the baseline) in a race: its launches and its speedup over the baseline."""

    trial: int
    label: str
    config: dict
    recorded_tokens_per_second: float
    rates: list[float]  # one launch per round it was launched in
    mean_tokens_per_second: float  # geometric mean over those launches
    speedup: float  # geometric mean of paired per-round ratios over the baseline
    speedup_low: float  # simultaneous 95% interval (over the finalists and the race's looks)
    speedup_high: float
    status: str  # winner, within race.loss, leader, dropped: why, undecided
    accepted: list[int] = field(default_factory=list)  # accepted draft tokens per launch
    rounds: list[int] = field(default_factory=list)  # the round (from 1) of each launch
    # per launch (as ``accepted``): other processes used more than ``machine.host.BUSY_CORES`` meanwhile
    host_busy: list[bool] = field(default_factory=list)
    # per launch: its server's threads were not held to the CPUs asked for (``MeasuredLaunch.unpinned``)
    unpinned: list[bool] = field(default_factory=list)

    @property
    def busy_launches(self) -> str:
        """``2 of 7``: its launches on a busy host; "" when none was."""
        return f"{sum(self.host_busy)} of {len(self.host_busy)}" if any(self.host_busy) else ""

    @property
    def unpinned_launches(self) -> str:
        """``1 of 7``: its launches whose threads were not on the asked CPUs; "" when none was."""
        return f"{sum(self.unpinned)} of {len(self.unpinned)}" if any(self.unpinned) else ""


@dataclass(frozen=True, kw_only=True)
class Confirmation:
    """The winner and the baseline launched alone in further rounds (``race.confirm_rounds``)."""

    rounds: int
    winner_rates: list[float]
    baseline_rates: list[float]
    speedup: float
    low: float
    high: float

    def text(self) -> str:
        return evidence.Ratio(estimate=self.speedup, low=self.low, high=self.high, rounds=self.rounds).text()


@dataclass(frozen=True, kw_only=True)
class RaceResult:
    """A finished race, as stored with the study: its entries (best estimate first), who is deployed and why."""

    rounds: int  # selection rounds
    baseline_trial: int
    entries: list[Entry]  # best estimate first
    winner: int  # trial number: the deployed configuration (the baseline when nothing was shown faster)
    decided: bool
    verdict: str
    rule: str
    loss: float  # race.loss: a finalist within this of every other is deployed by the resource rule
    drafted: dict[
        str, int
    ]  # per label, tokens drafted during the race (0 for a speculative one: it did not draft)
    outliers: list[str]
    launches: int
    confirmation: Confirmation | None  # with race.confirm_rounds, when a finalist replaced the baseline
    # the best other finalist may be at most this much faster (95%); 0: none is; None: no bound (``no_bound`` says
    # why, or a race stored by an older version)
    loss_bound: float | None = None
    leader: int | None = None  # the highest estimate (the best candidate when the baseline is deployed)
    forecast: str = ""  # after an undecided race: what telling race.loss apart would take
    users: int | None = None  # a load class's race: aggregate tokens/s at this many users at once
    no_bound: str = (
        ""  # why there is no loss bound yet: a finalist with too few kept rounds beside the deployed
    )

    @property
    def title(self) -> str:
        return race_title(self.users)

    @property
    def winning(self) -> Entry:
        return next(e for e in self.entries if e.trial == self.winner)

    @property
    def baseline_deployed(self) -> bool:
        return self.winner == self.baseline_trial

    @property
    def best_candidate(self) -> Entry | None:
        """The highest estimate other than the baseline: its figures go beside a deployed baseline."""
        others = [e for e in self.entries if e.trial != self.baseline_trial]
        leader = next((e for e in others if e.trial == self.leader), None)
        return leader or max(others, key=lambda e: e.speedup, default=None)

    def speedup_of(self, entry: Entry) -> evidence.Ratio:
        """An entry over the baseline on their paired rounds, with its simultaneous 95% interval."""
        return evidence.Ratio(
            estimate=entry.speedup,
            low=entry.speedup_low,
            high=entry.speedup_high,
            rounds=_paired_with_baseline(self, entry),
        )

    def figure(self) -> str:
        """The winner's speedup and where it comes from."""
        if self.baseline_deployed:
            return "x1.00: the baseline configuration is deployed (nothing was shown faster than it)"
        if self.confirmation is not None:
            confirmation = self.confirmation
            return (
                f"{confirmation.text()} over the baseline, from {confirmation.rounds} confirmation rounds (winner "
                f"and baseline launched alone, not used to pick it)"
            )
        return (
            f"{self.speedup_of(self.winning).text()} over the baseline on the race's paired rounds (a 95% interval simultaneous over "
            f"the finalists, so picking the winner does not void it)"
        )

    def loss_line(self) -> str:
        """What the deployment may lose: ``deployed trial 2; no other finalist is more than 6.1% faster (95%, 8 rounds)``."""
        deployed = "deployed the baseline, trial" if self.baseline_deployed else "deployed trial"
        rounds = len(self.winning.rates)
        if self.no_bound:
            return f"{deployed} {self.winner}; no bound yet: {self.no_bound}"
        if self.loss_bound is None:
            return f"{deployed} {self.winner}; no loss bound (a race stored by an older version)"
        if self.loss_bound <= 0:
            return f"{deployed} {self.winner}; no other finalist is faster (95%, {rounds} rounds)"
        return (
            f"{deployed} {self.winner}; no other finalist is more than {figure_text.percent_up(self.loss_bound)} "
            f"faster (95%, {rounds} rounds)"
        )

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RaceResult | None:
        """None for a race stored by an older version (one launch per contender, no verdict)."""
        if "verdict" not in data:
            return None
        data = dict(data)
        if "equivalence" in data:  # a race stored before race.loss existed: its TOST margin is the loss
            data["loss"] = data.pop("equivalence")
        confirmation = Confirmation(**data["confirmation"]) if data.get("confirmation") else None
        return cls(**{**data, "entries": [Entry(**e) for e in data["entries"]], "confirmation": confirmation})


def _paired_with_baseline(result: RaceResult, entry: Entry) -> int:
    base = next(e for e in result.entries if e.trial == result.baseline_trial)
    if not entry.rounds or not base.rounds:
        return min(len(entry.rates), len(base.rates))
    return len(set(entry.rounds) & set(base.rounds))
