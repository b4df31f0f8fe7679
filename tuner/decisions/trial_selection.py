"""Which trial is deployed, with what verdict and policy (``tuner.decisions.export_choice`` decides with these rules,
``tuner.output.export`` writes it).

Selection policy (documented in ``--help``): among complete trials that meet the quality
floor (``constraint_quality <= 0``), optionally only those with acceptance at least
``--min-acceptance``,

* ``max-tps`` (default): the highest decode tokens/s;
* ``knee``: the knee of the tokens/s-against-quality front (``tuner.decisions.front.knee``),
  i.e. the best speed before quality starts to be paid for it;
* ``--trial N`` overrides both with one feasible trial.

Before anything is written the finalists are raced (``tuner.decisions.race``): the policy's choice
(with ``max-tps``: every feasible trial within reach of the leader) and the baseline are
launched afresh round by round until the race decides, and the deployment is the race's winner, with
its speedup over the baseline (a 95% interval simultaneous over the finalists) and what it may lose
(the best other finalist may be at most that much faster). The baseline is the default: a finalist
replaces llama.cpp's defaults only when shown faster than the baseline; otherwise the baseline is
deployed, with the best candidate's figures beside it. A study's single best figure can be luck;
fresh launches, compared in pairs, are what an operator can bet on.

Per content type, each type's winner on its tuning prompts is raced on held-out prompts against the
pooled winner (``tuner.decisions.per_type``); per load class, the level's finalists on aggregate tokens/s at N
users (``tuner.decisions.load_race``; with ``--no-race`` the best recorded figure, ``best_at_load``). The
study's context comes in as an argument (``remeasure.StudyInputs``).
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pandas as pd

from tuner import figure_text
from tuner.decisions.evidence import THREAD_TIE
from tuner.decisions.front import feasible, front_2d, knee
from tuner.decisions.per_type import PerTypeResult, race_per_type, type_rounds, winner_lines
from tuner.decisions.race import RaceResult, finalists, race_study
from tuner.decisions.remeasure import StudyInputs
from tuner.decisions.route import describe_accuracy
from tuner.errors import UserError
from tuner.knobs.registry import NAMES
from tuner.machine import hostlock
from tuner.progress import Progress
from tuner.storage import store
from tuner.storage.records import StudyRecord, TrialRecord

POLICIES = {
    "max-tps": "highest tokens/s among trials that meet the quality floor",
    "knee": "knee of the tokens/s-against-quality front of trials that meet the quality floor",
}


# ------------------------------------------------------------------ the policy's choice


def choose(
    record: StudyRecord,
    frame: pd.DataFrame,
    policy: str = "max-tps",
    min_acceptance: float | None = None,
    trial: int | None = None,
) -> tuple[int, str]:
    """The exported trial's number and why it was chosen; no candidate is a UserError."""
    if policy not in POLICIES:
        raise UserError(f"--policy: unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
    name = record.name
    pool = feasible(frame)
    n_complete = int((frame["state"] == "COMPLETE").sum())
    if pool.empty:
        raise UserError(
            f"study {name!r} has no feasible trial ({n_complete} complete, none meets the quality floor "
            f"{record.floor}); run more trials or lower quality.floor in the study file"
        )
    if trial is not None:
        if trial not in set(pool["trial"]):
            raise UserError(
                f"--trial {trial}: not a complete trial of {name!r} that meets the quality floor; "
                "pick one from the report's Pareto table"
            )
        return trial, f"trial {trial} chosen with --trial"
    if min_acceptance is not None:
        best = pool["acceptance"].max()
        pool = pool[pool["acceptance"] >= min_acceptance]
        if pool.empty:
            raise UserError(
                f"--min-acceptance {min_acceptance:g}: no feasible trial of {name!r} reaches it "
                f"(best feasible acceptance {best:.2f}); lower it"
            )
    why = POLICIES[policy] + (f", acceptance >= {min_acceptance:g}" if min_acceptance is not None else "")
    if policy == "knee":
        at_knee = knee(front_2d(pool, "quality"))
        assert at_knee is not None, "a pool with a feasible trial has a front"
        return at_knee, why
    return int(pool.sort_values("tokens_per_second", ascending=False)["trial"].iloc[0]), why


# ------------------------------------------------------------------ the race's verdict


def race_for_export(
    ctx: StudyInputs,
    study: optuna.Study,
    record: StudyRecord,
    candidates: list[TrialRecord] | None,
    launch_s: float | None,
    progress: Progress,
) -> RaceResult | None:
    """Race with the study's own workload and settings (``ctx``; ``launch_s``: one launch's expected seconds);
    ``candidates`` None: the finalists within reach of the leader."""
    if candidates is None:
        candidates = finalists(store.read_trials(study), ctx.settings.noise_cv, ctx.spec.race.max_finalists)
    for trial in candidates:
        assert trial.command is not None, "a finalist is a trial that was launched"
        if not Path(trial.command.binary).exists():
            raise UserError(
                f"{trial.command.binary}: not on this host; export on the study's host or pass --no-race"
            )
    with hostlock.measuring(record.name, progress=progress):  # one measurement per host
        return race_study(ctx, study, progress, candidates, launch_s)


def decision(race: RaceResult | None) -> dict | None:
    """What the race decided, for JSON/YAML readers: the deployed trial, whether it replaced llama.cpp's defaults,
    the verdict, what it may lose (``loss_bound``: the best other finalist may be at most this much faster, 95%,
    simultaneous over the finalists), the forecast after an undecided race, and beside a deployed baseline the
    best candidate's figures. None without a race (``--no-race``)."""
    if race is None:
        return None
    best = race.best_candidate if race.baseline_deployed else None
    return {
        "deployed_trial": race.winner,
        "baseline_deployed": race.baseline_deployed,
        "decided": race.decided,
        "verdict": race.verdict,
        "loss_bound": race.loss_bound,  # null where there is none yet: loss_bound_reason says why
        "loss_bound_reason": race.no_bound or None,
        "loss_bound_text": race.loss_line(),
        "race_loss": race.loss,
        "rounds": race.rounds,
        "launches": race.launches,
        "forecast": race.forecast or None,
        "best_candidate": None
        if best is None
        else {
            "trial": best.trial,
            "speedup": figure_text.or_none(best.speedup),
            "speedup_low": figure_text.or_none(best.speedup_low),
            "speedup_high": figure_text.or_none(best.speedup_high),
            "config": best.config,
        },
    }


def race_policy(race: RaceResult, why: str) -> str:
    """Why the export is what it is after a race, in one line (the preset's and serve.sh's comment): won, the
    highest estimate of an undecided race, or the baseline because nothing was shown faster than it."""
    if race.baseline_deployed:
        best = race.best_candidate
        beside = (
            f"; best candidate trial {best.trial}: {race.speedup_of(best).text()} over it, not shown faster"
            if best
            else ""
        )
        return f"nothing was shown faster than the baseline: llama.cpp's defaults are exported{beside}"
    if race.decided:
        return f"won the finalist race ({why} among the finalists); {race.loss_line()}"
    return f"highest estimate of an undecided finalist race ({why} among the finalists); {race.loss_line()}"


def thread_notes(record: StudyRecord, trial: TrialRecord, frame: pd.DataFrame) -> tuple[str, str]:
    """How the deployed ``threads`` and ``threads-batch`` were chosen, for the preset's and serve.sh's comments:
    searched or fixed; prompt threads compared on prompt throughput among the trial's siblings (the same
    configuration at other prompt threads, ``frame``: ``trials_frame``), or not tuned (llama.cpp's default)."""
    config = trial.config
    threads = record.space.get("threads")
    low, high = _range_of(threads)
    how = (
        f"searched over {low}..{high} (NUMA policies, a ladder, then a shrinking bracket; among finalists "
        f"within the race's loss, fewer threads)"
        if low != high
        else "fixed by the study's space"
    )
    batch = config.threads_batch or config.threads
    if "threads_batch" not in record.space:
        return f"threads {config.threads}: {how}", (
            f"threads-batch {batch}: not tuned (llama.cpp's default, equal to threads); prompt processing may "
            f"want every core: a workload with long prompts, or threads_batch in search_space, searches it"
        )
    siblings = _prompt_siblings(config, frame)
    others = [(t, rate) for t, rate in siblings.items() if t != batch]
    if batch not in siblings or not others:
        return f"threads {config.threads}: {how}", f"threads-batch {batch}: searched, not compared on prompts"
    versus = ", ".join(f"{rate:.0f} at {t}" for t, rate in others)
    return f"threads {config.threads}: {how}", (
        f"threads-batch {batch}: tuned apart on prompt throughput, {siblings[batch]:.0f} prompt tokens/s "
        f"against {versus} (ties within {THREAD_TIE:.0%} to fewer threads)"
    )


def _range_of(entry: list | None) -> tuple:
    """The lowest and highest value of a domain as the study record keeps it (``ResolvedSpace.as_dict``)."""
    if not entry:
        return None, None
    kind, domain = entry
    values = domain["values"] if kind == "Choices" else (domain["low"], domain["high"])
    return min(values), max(values)


def _prompt_siblings(config, frame: pd.DataFrame) -> dict[int, float]:
    """Prompt threads -> the best prompt tokens/s among feasible trials of ``config`` at any prompt threads."""
    if frame.empty or "prompt_tokens_per_second" not in frame:
        return {}
    same = frame[frame["feasible"] & frame["prompt_tokens_per_second"].notna()]
    for knob in NAMES:
        if knob != "threads_batch" and knob in same:
            value = getattr(config, knob, None)
            same = same[same[knob].isna()] if value is None else same[same[knob] == value]
    batch = same["threads_batch"].fillna(same["threads"]).astype(int)
    return same.groupby(batch)["prompt_tokens_per_second"].max().to_dict()


# ------------------------------------------------------------------ per content type


def wants_per_type(asked: bool | None, no_race: bool, record: StudyRecord, types: list[str]) -> bool:
    """Per-type deployment: asked for (``asked``: --per-type True, --no-per-type False, else None), or by
    default when the study measured several content types (``types``)."""
    if asked is False:
        return False
    if len(types) < 2:
        if asked:
            raise UserError(
                f"--per-type: study {record.name!r} measured one content type "
                f"({', '.join(types) or 'none'}), so there is no per-type winner to serve; export "
                "without --per-type (its pooled winner is that type's winner), or run a study whose "
                "workload has several suites"
            )
        return False
    if no_race:
        if asked:
            raise UserError(
                "--per-type re-measures each type's winner on held-out prompts; it cannot be "
                "combined with --no-race"
            )
        print("per-type: skipped with --no-race (per-type winners are only exported on held-out figures)")
        return False
    return True


def race_types(
    ctx: StudyInputs,
    study: optuna.Study,
    record: StudyRecord,
    pooled: int,
    asked: bool | None,
    progress: Progress,
) -> PerTypeResult | None:
    """Race the per-type winners on held-out prompts against the pooled winner (trial ``pooled``); the
    result says which types pay. ``progress.time.unit_s``: one launch's expected seconds."""
    # at most the pooled winner, the baseline and one winner per type, each launched once per round
    assert progress.time.unit_s is not None, "the caller sets one launch's expected seconds"
    progress.time.plan(type_rounds(ctx.spec.race) * (len(ctx.workload.suites) + 2) * progress.time.unit_s)
    with hostlock.measuring(record.name, progress=progress):  # one measurement per host
        result = race_per_type(ctx, study, store.read_trial(study.trials[pooled]), progress)
    if result is None:
        print("per-type: the study has no baseline; nothing to race")
        return None
    for line in winner_lines(result):
        print(line)
    if not result.types and asked:
        raise UserError(
            f"--per-type: no content type of {record.name!r} can be split into tuning and held-out "
            "prompts ("
            + "; ".join(f"{s}: {why}" for s, why in result.unsplit.items())
            + "); add prompts to its suites"
        )
    print(describe_accuracy())
    return result


# ------------------------------------------------------------------ per load class


def best_at_load(
    record: StudyRecord, frame: pd.DataFrame, users: int, measured: list[int]
) -> tuple[pd.Series, float]:
    """The feasible trial (its frame row) with the best recorded aggregate tokens/s at ``users`` users, and that
    figure (one launch each: the trial's own, not raced); ``measured``: the levels the study measured."""
    column = f"aggregate_tokens_per_second_c{users}"
    pool = feasible(frame).dropna(subset=[column]) if column in frame else frame.iloc[0:0]
    if pool.empty:
        raise UserError(
            f"--concurrency {users}: study {record.name!r} has no feasible trial measured at {users} "
            f"users (levels measured: {', '.join(map(str, measured)) or 'none'}); list those levels "
            "in workload.concurrency and run it again, or export one of them"
        )
    best = pool.loc[pool[column].idxmax()]
    return best, float(best[column])
