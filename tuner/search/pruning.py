"""Stop a trial early once it clearly cannot beat the incumbent.

Why: a trial of a 32B target runs 27 requests of 128 tokens; a NUMA policy that halves
the rate is obvious after three of them, yet would cost the whole 20 minutes. "Clearly"
means: even an *optimistic* bound of the trial's final rate, given the spread seen so
far, lies below the incumbent's.

The comparison is paired, prompt by prompt: each measured request is divided by the
incumbent's rate on the same prompt (its median over repetitions), so a slow prompt does
not look like a slow configuration. From the log-ratios seen so far:

* the prompts already measured contribute ``mean + z * sqrt(sd^2 / n + 2 launch^2)``: the
  spread's standard error (``sd`` never below ``sigma_floor``: three samples do not measure a
  spread), and the launch-to-launch spread on both sides (the trial and the incumbent each ran
  in one launch, which moves all its requests together; ``launch`` from the study's sentinels,
  ``tuner.decisions.drift.Sentinels.launch_spread``, a conservative 5% until three exist);
* prompts not measured yet may differ (a slower answer), so each contributes the *best*
  ratio seen plus ``z * sqrt(sd^2 + 2 launch^2)``; a prompt of a suite (content type) none of whose prompts was
  measured yet gives no bound at all: the best K for prose is not the best for code, and
  a configuration that loses on the code prompts may still win the pooled rate or the
  per-type export on prose (``tuner.decisions.per_type``), so nothing is pruned before every suite
  was seen;
* the rule looks after every request, so its error is spent over the looks as O'Brien-Fleming
  does: at a fraction f of the trial's requests the bound uses ``z / sqrt(f)`` (early looks
  prune only the hopeless);

and the trial is pruned when the prompt-weighted bound is below 1 (the incumbent). With
per-repetition figures instead of per-prompt ones (one reference rate, ``unseen`` 0) the
same rule applies. Pruning never applies to the baseline or to a finalist: callers ask
``may_prune`` first; nor to a study whose first objective is not per-request tokens/s (``prunes_on``). A pruned trial keeps what it measured (state PRUNED, its partial
figures in its user attrs).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

from tuner.decisions.drift import PRIOR_LAUNCH_SIGMA
from tuner.measurement.workload import request_key

Z = 2.0  # the final look's one-sided boundary; earlier looks use Z / sqrt(fraction) (O'Brien-Fleming)
SIGMA_FLOOR = 0.04  # log-ratio spread assumed at least (a few % per request on a shared box)
MIN_SAMPLES = 3
NEVER_PRUNED = frozenset({"baseline", "finalist", "sentinel"})
NEVER_PRUNED_STAGES = frozenset({"hardware"})  # the planner's stages whose trials run whole (may_prune)


@dataclass(frozen=True)
class PruneRule:
    """The rule's constants: the final look's one-sided boundary ``z``, the log-ratio spread assumed at least
    and the fewest samples it judges on."""

    z: float = Z
    sigma_floor: float = SIGMA_FLOOR
    min_samples: int = MIN_SAMPLES


@dataclass(frozen=True)
class PruneDecision:
    prune: bool
    bound: float  # optimistic final rate / incumbent's
    estimate: float  # mean ratio so far
    reason: str


def prunes_on(objectives: Sequence[str]) -> bool:
    """The rule pairs per-request decode rates, so it judges only a study that maximises them first: a trial
    whose objective is aggregate tokens/s at a level (or a latency) is never pruned by its one-user rate (more
    slots, a smaller K or no draft lose alone and win with several users), and the level is measured last."""
    return bool(objectives) and objectives[0] == "tokens_per_second"


def may_prune(role: str | None, stage: str | None = None) -> bool:
    """The baseline is the reference and finalists decide the winner: both always run to the end. So do the
    hardware stage's trials: its thread walk compares them with each other within ``THREAD_TIE`` (ties go to
    fewer threads), and a trial stopped on one noisy pass leaves a partial rate no tie can be judged on, so the
    walk would keep the most threads (evidence: docs/decisions.md#thread-ties)."""
    return (role or "search") not in NEVER_PRUNED and stage not in NEVER_PRUNED_STAGES


def prune_decision(
    ratios: Sequence[float],
    unseen: int = 0,
    *,
    rule: PruneRule = PruneRule(),
    seen: int | None = None,
    launch_sigma: float = PRIOR_LAUNCH_SIGMA,
    fraction: float = 1.0,
) -> PruneDecision:
    """Decide from paired ratios (trial / incumbent, per request) and the number of prompts not yet measured.

    ``rule.z``: the final look's one-sided boundary (``Z``, a normal quantile);
    ``seen``: prompts measured at least once (default: one per ratio, capped by the ratios);
    ``fraction``: the share of the trial's requests measured so far (the look's information).
    """
    z, sigma_floor, min_samples = rule.z, rule.sigma_floor, rule.min_samples
    count = len(ratios)
    if count < min_samples or any(r <= 0 for r in ratios):
        return PruneDecision(False, math.inf, math.nan, f"{count} sample(s): too few to judge")
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    sd = max(statistics.stdev(logs) if count > 1 else 0.0, sigma_floor)
    seen = count if seen is None else seen
    z_look = z / math.sqrt(min(max(fraction, 1e-6), 1.0))
    both_launches = 2 * launch_sigma**2
    seen_bound = math.exp(mean + z_look * math.sqrt(sd**2 / count + both_launches))
    unseen_bound = math.exp(max(logs) + z_look * math.sqrt(sd**2 + both_launches))
    bound = (seen * seen_bound + unseen * unseen_bound) / (seen + unseen)
    estimate = math.exp(mean)
    if bound < 1.0:
        return PruneDecision(
            True,
            bound,
            estimate,
            f"after {count} samples at {estimate:.0%} of the incumbent, optimistic bound {bound:.1%} < 100%",
        )
    return PruneDecision(
        False, bound, estimate, f"optimistic bound {bound:.0%} of the incumbent: keep measuring"
    )


@dataclass(frozen=True)
class Pairing:
    """A running trial's requests paired with the incumbent's, prompt by prompt."""

    ratios: list[float]  # trial / incumbent, per request
    seen: int  # prompts measured at least once
    unseen: int  # the incumbent's prompts not measured yet
    unseen_suites: list[str]  # suites none of whose prompts was measured yet


def paired_ratios(samples: Iterable[dict], incumbent_samples: Iterable[dict]) -> Pairing:
    """A running trial's samples against the incumbent's.

    Samples are dicts with ``prompt_id`` (and a conversation's ``turn``), ``tokens_per_second`` and ``suite``
    (as ``tuner.run.trial_references.sample_record`` stores them; without a suite, one suite is assumed);
    the incumbent's per-prompt reference is its median over repetitions.
    """
    by_prompt: dict[str, list[float]] = {}
    suite_of: dict[str, str | None] = {}
    for sample in incumbent_samples:
        key = request_key(sample["prompt_id"], sample.get("turn", 0))
        by_prompt.setdefault(key, []).append(sample["tokens_per_second"])
        suite_of[key] = sample.get("suite")
    reference = {p: statistics.median(v) for p, v in by_prompt.items() if v}
    ratios, seen = [], set()
    for sample in samples:
        key = request_key(sample["prompt_id"], sample.get("turn", 0))
        ref = reference.get(key)
        if ref and sample["tokens_per_second"] > 0:
            ratios.append(sample["tokens_per_second"] / ref)
            seen.add(key)
    seen_suites = {suite_of.get(p) for p in seen}
    unseen_suites = sorted({str(suite_of[p]) for p in reference if suite_of.get(p) not in seen_suites})
    return Pairing(ratios, len(seen), len(set(reference) - seen), unseen_suites)


def should_prune(
    samples: Sequence[dict],
    incumbent_samples: Sequence[dict],
    role: str | None = None,
    planned: int | None = None,
    stage: str | None = None,
    **kwargs,
) -> PruneDecision:
    """The study loop's one call per finished request; ``planned``: the trial's requests in all (the looks' scale);
    ``stage``: the planner's stage that proposed the trial (``may_prune``)."""
    if not may_prune(role, stage):
        return PruneDecision(False, math.inf, math.nan, f"a {stage or role} trial is never pruned")
    pairing = paired_ratios(samples, incumbent_samples)
    if pairing.unseen_suites:
        return PruneDecision(
            False,
            math.inf,
            math.nan,
            f"suite(s) {', '.join(pairing.unseen_suites)} not measured yet: no bound",
        )
    fraction = len(samples) / planned if planned else 1.0
    return prune_decision(pairing.ratios, pairing.unseen, seen=pairing.seen, fraction=fraction, **kwargs)
