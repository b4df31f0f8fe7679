"""The finalist race: a sequential, launch-level race whose winner an operator can deploy.

Why: a study's best trial is the highest of many noisy single measurements (a configuration
that got lucky once), and every launch of a server runs a few percent faster or slower than
the last. An operator copies the winner to a fleet of fresh launches, so the race compares
launches, not requests, and says how sure it is.

1. **Finalists** (``finalist_selection.finalists``): the leader on drift-corrected rates (tokens/s over the
   sentinel rate at the trial's time, ``tuner.decisions.drift``) and every configuration within reach of
   it: the gap is below z x sqrt(cv_a^2 + cv_b^2 + 2 launch^2), the launch spread from the
   study's sentinels (``drift.Sentinels.launch_spread``: a conservative prior until three exist); a configuration
   measured in several trials judged on its readings together (its mean, each variance over its count). One per
   configuration, the closest first, at most ``race.max_finalists``.
2. **Rounds** (``sequential.sequential_race``, kept in ``rounds.RaceRounds``): the first ``race.min_rounds``
   rounds launch every finalist and the baseline once each (``tuner.decisions.remeasure``, Williams order); later
   rounds launch the leader (the highest fitted log rate: ``evidence.pooled_spread`` takes out what a round did to
   everyone), the baseline while the leader is not shown faster than it, and the finalists whose bound against
   the leader sets its loss bound; the others rest (``allocation.next_round``). Once the race foresees that it will
   stop at its cap (race.max_rounds or race.budget_minutes, ``allocation.foresee``), it keeps launching the leader
   and the runner-up every round (the pick), and a rested finalist's turn goes to the finalist forecast to set the
   bound the race will state at its cap (its own spread, not the pooled one); a line says the bound expected there
   (``forecasts.bound_at_cap``).
3. **The loss bound** (``paired_statistics.PairedStatistics.loss``): how much faster than a finalist the best
   other one may be, the largest one-sided upper bound of the paired per-round log ratios (``evidence.gap``:
   Student's t at the race's pooled degrees of freedom), each at ``race_alpha``: 5% over the comparisons with the
   unknown best and over the looks (Bonferroni; half of it at the look at the cap, where a race that does not
   decide states its bound), so the bound of whichever finalist is deployed holds with 95% whenever the race
   stops (multiple comparisons with the best).
4. **Decided** (``stop_rules.decide``): from round ``DECISION_ROUNDS`` (5), once some finalist is within
   ``race.loss`` of every other (its loss bound below it, on bounds narrow enough to decide on:
   ``PairedStatistics.decisive``) and may replace the baseline; the resource rule (fewer threads, then the smaller
   draft model; K is not a resource) chooses among those within it, and the baseline, llama.cpp's defaults, wins a
   tie. **Undecided** at ``race.max_rounds`` / ``race.budget_minutes`` (``stop_rules.out_of_budget``), or from
   round 5 once no decision is forecast by race.max_rounds and deploying the leader is expected to lose less than
   ``race.expected_loss`` (``stop_rules.settled_enough``: more rounds would rarely change the pick): the highest
   estimate among the finalists shown faster than the baseline, else the baseline; the verdict says so, with the
   loss bound and a forecast of what settling would take (``forecasts.Forecast``). A race stopped so is still
   decided when no other finalist is open (each shown slower than the deployed one, within race.loss of it, or
   out after failed launches): the verdict, the loss line and the table's statuses read the same bounds
   (``stop_rules.Outcome``).
5. **The baseline is the default**: a finalist replaces it only when shown faster (the whole simultaneous 95%
   interval of its speedup above 1); the printed speedup is that interval, valid whichever finalist was picked.
   ``race.confirm_rounds`` (optional) adds rounds of the winner and the baseline alone for a figure from rounds
   not used to pick it (``sequential.confirm``).
6. **Outlier launches**: a launch far from the contender's other launches (``evidence.is_outlier``) is left out
   of the figures and reported, every launch judged again each round; the rounds go on by doubt
   (``rounds.add_round``).

On real launches the race runs through ``study_race.race_study`` / ``launching.run_race`` (its launches:
``finalist_launches``), its result is a ``results.RaceResult`` (stored as JSON with the study), and ``operator_lines`` words what an operator reads.
"""

from tuner.decisions.evidence import DECISION_ROUNDS
from tuner.decisions.race.finalist_launches import RaceSetup
from tuner.decisions.race.finalist_selection import (
    finalists,
    label,
    prompt_pick,
    reach_z,
    recorded_rate,
    resource_key,
    within_reach,
)
from tuner.decisions.race.forecasts import Forecast, forecast_before, rounds_to_tell
from tuner.decisions.race.operator_lines import verdict_lines
from tuner.decisions.race.paired_statistics import PairedStatistics, first_look, race_alpha
from tuner.decisions.race.real_race import run_race
from tuner.decisions.race.results import Confirmation, Entry, RaceResult
from tuner.decisions.race.rounds import RaceRounds
from tuner.decisions.race.sequential import LoopOptions, confirm, sequential_race
from tuner.decisions.race.stop_rules import RESOURCE_RULE, Outcome
from tuner.decisions.race.study_race import race_study
from tuner.decisions.race.wording import loss_text, race_title, users_text

__all__ = [
    "DECISION_ROUNDS",
    "RESOURCE_RULE",
    "Confirmation",
    "Entry",
    "Forecast",
    "LoopOptions",
    "Outcome",
    "PairedStatistics",
    "RaceResult",
    "RaceSetup",
    "RaceRounds",
    "confirm",
    "finalists",
    "first_look",
    "forecast_before",
    "label",
    "loss_text",
    "prompt_pick",
    "race_alpha",
    "race_study",
    "race_title",
    "reach_z",
    "recorded_rate",
    "resource_key",
    "rounds_to_tell",
    "run_race",
    "sequential_race",
    "users_text",
    "verdict_lines",
    "within_reach",
]
