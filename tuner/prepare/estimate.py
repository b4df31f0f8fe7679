"""The study's expected time on this machine, before it runs (``tuner.eta``): the trials, the race and the
races ``tuner export`` runs."""

from __future__ import annotations

from tuner import eta
from tuner.decisions.per_type import type_rounds
from tuner.machine.roofline import Bandwidth, study_roofline
from tuner.measurement.workload import restrict, split
from tuner.prepare.context import StudyContext
from tuner.prepare.loaded_workload import request_prompts


def study_estimate(ctx: StudyContext) -> eta.Estimate:
    """The study's expected time on this machine (``tuner.eta.estimate``): the target's bytes read per
    token against the fingerprint's bandwidth, a launch reading the target and the largest draft; the races
    export runs (per content type on the held-out prompts, per load class) as ``tuner export`` would."""
    spec, settings = ctx.spec, ctx.settings
    bandwidth = float(ctx.fingerprint.get("bandwidth_bytes_per_s") or 0.0)
    roofline = study_roofline(ctx.study_record("check"), Bandwidth(bandwidth or 1.0, "fingerprint", ""))
    per_token = roofline.bytes_per_token(None) if roofline else ctx.target.weights_bytes
    files = ctx.target.file_size_bytes + max((d.file_size_bytes for d in ctx.drafts.values()), default=0)
    splits, _ = split(ctx.workload)
    held_out = restrict(ctx.workload, [i for s in splits.values() for i in s.held_out])
    speculative = any(v != "none" for v in getattr(ctx.space.domains.get("spec_type"), "values", ["none"]))
    prompts = request_prompts(ctx.workload)
    passes = eta.Passes(
        prompts,
        n_predict=settings.n_predict,
        warmup=settings.warmup,
        repetitions=settings.repetitions,
        levels=spec.load_levels,
    )
    search = eta.SearchPlan(
        trials=spec.budget_trials,
        sentinel_every=spec.sentinel.every_trials,
        sentinel_minutes=spec.sentinel.every_minutes,
        budget_minutes=spec.budget_minutes,
        speculative=speculative,
        prune=spec.prune,
    )
    race = eta.RacePlan(
        rounds=spec.race.max_rounds,
        finalists=spec.race.max_finalists,
        confirm_rounds=spec.race.confirm_rounds,
        minutes=spec.race.budget_minutes,
        min_rounds=spec.race.min_rounds,
    )
    est = eta.estimate(eta.machine(per_token, files, bandwidth), passes, search, race)
    return eta.with_export(
        est,
        passes,
        race,
        request_prompts(held_out) if len(splits) >= 2 else (),
        len(splits),
        type_rounds(spec.race),
    )
