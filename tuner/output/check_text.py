"""What ``tuner run --check`` prints: the study's models and machine, the space fitted to them and what was left
out, the workload, and the time estimate."""

from __future__ import annotations

from tuner import eta
from tuner.decisions.race import DECISION_ROUNDS
from tuner.knobs.config import Choices, Domain, IntRange
from tuner.knobs.registry import NAMES
from tuner.machine.bandwidth import PLANNER_SHARE, bandwidth_saturation, curve_of
from tuner.measurement.quality import builtin_text
from tuner.models import memory_fit
from tuner.prepare import StudyContext, memory, study_estimate
from tuner.search.space import baseline_config
from tuner.search.stages.configs import KnobValues
from tuner.search.stages.hardware import walk_text
from tuner.studyfile.spec import QualitySpec


def describe_domain(domain: Domain) -> str:
    if isinstance(domain, Choices):
        return ", ".join(map(str, domain.values))
    text = f"{domain.low}..{domain.high}"
    step: float | None = domain.step if isinstance(domain, IntRange) and domain.step != 1 else None
    if not isinstance(domain, IntRange):
        step = domain.step
    return text + (f" step {step}" if step else "") + (" (log)" if domain.log else "")


def check_lines(ctx: StudyContext, race: bool = True) -> list[str]:
    """What `tuner run --check` prints: the space, what was left out and why, the workload, and the time."""
    spec, space = ctx.spec, ctx.space
    knobs = [k for k in NAMES if k in space.domains] + [k for k in space.domains if k not in NAMES]
    lines = [f"study {spec.name} ({spec.path}): checked, nothing run", *_models_lines(ctx), ""]
    lines += [f"{'knob':<16}values"] + [f"{k:<16}{describe_domain(space.domains[k])}" for k in knobs]
    dropped = [f"  {note}" for note in space.notes]
    if space.defaults:
        fixed = ", ".join(f"{k} {v}" for k, v in space.defaults.items())
        dropped.append(
            f"  {fixed}: llama.cpp's defaults, not searched (a list in search_space searches them)"
        )
    lines += ["", "left out for this machine or model:", *(dropped or ["  nothing"]), ""]
    return lines + _workload_lines(ctx) + [""] + estimate_lines(study_estimate(ctx), ctx, race)


def _models_lines(ctx: StudyContext) -> list[str]:
    """The target, the drafts, and the machine: cores, nodes, bandwidth and where it saturates."""
    target, fp = ctx.target, ctx.fingerprint
    bandwidth, curve = fp.get("bandwidth_bytes_per_s"), curve_of(fp)
    drafts = ", ".join(f"{n} ({d.file_size_bytes / 1e9:.2f} GB)" for n, d in ctx.drafts.items()) or "none"
    return [
        f"  target   {ctx.spec.target.name}: {target.architecture}, {target.file_type or target.dominant_tensor_type}, "
        f"{target.weights_bytes / 1e9:.2f} GB of weights"
        + (f", {target.expert_used_count} of {target.expert_count} experts" if target.is_moe else ""),
        *_variant_lines(ctx),
        f"  drafts   {drafts}",
        f"  machine  {fp.get('physical_cores')} cores, {len(ctx.launch.topology.nodes)} NUMA node(s), "
        + (f"{bandwidth / 1e9:.1f} GB/s memory bandwidth (copy probe)" if bandwidth else "bandwidth unknown"),
        *([f"  {curve.text()}"] if curve else []),
        f"  search   {_thread_walk(ctx)}",
        _memory_line(ctx),
    ]


def _variant_lines(ctx: StudyContext) -> list[str]:
    """The target's llama-quantize variants, their sizes, the KLD ceiling and the order the search walks them."""
    if not ctx.target_variants:
        return []
    sizes = ", ".join(
        f"{name} ({v.info.file_type or v.info.dominant_tensor_type}, {v.info.weights_bytes / 1e9:.2f} GB)"
        for name, v in ctx.target_variants.items()
    )
    return [
        f"  variants {sizes}",
        f"           walked in this order after speculation (stage 1d), each with the source's best configuration; "
        f"one over quality.max_kld {ctx.spec.quality.max_kld:g} is ruled out; K walked again on the one that leads",
    ]


def _memory_line(ctx: StudyContext) -> str:
    """The largest configuration's resident size against the memory here: what does not fit is never launched."""
    size = memory.largest(ctx)
    available = memory_fit.available_bytes(ctx.launch.topology)
    misfit = memory_fit.misfit(size, ctx.launch.topology)
    if misfit:
        return (
            f"  memory   DOES NOT FIT: the largest configuration {misfit}; configurations that do not fit are "
            "never launched (their trials fail as does_not_fit): lower measurement.ctx_size, a smaller draft or "
            "a quantized KV cache"
        )
    room = f", {available / 1e9:.2f} GB available" if available else ""
    return f"  memory   the largest configuration needs {size.text()}{room}"


def _thread_walk(ctx: StudyContext) -> str:
    """The hardware stage's thread walk on this machine (``tuner.search.stages.hardware``)."""
    values = KnobValues(ctx.space.as_dict()).values("threads")
    cores = baseline_config(ctx.space).threads
    saturation = bandwidth_saturation(ctx.fingerprint, PLANNER_SHARE)
    return walk_text(values, cores, saturation, max(1, len(ctx.launch.topology.nodes)))


def _workload_lines(ctx: StudyContext) -> list[str]:
    spec, settings, workload = ctx.spec, ctx.settings, ctx.workload
    suites = ", ".join(f"{s} {sum(p.suite == s for p in workload.prompts)}" for s in workload.suites)
    levels = spec.load_levels
    bounds = ", ".join(f"{c.name} {c.limit:g}" for c in spec.constraints)
    return [
        f"prompts      {len(workload.prompts)} ({suites}); n_predict {settings.n_predict}, warm-up {settings.warmup}, "
        f"{settings.repetitions} repetition(s)",
        "users        "
        + (
            f"{', '.join(map(str, levels))} at once, each level in every trial" if levels else "one at a time"
        ),
        f"objectives   {', '.join(o.metric for o in spec.objectives)}; quality {_quality_text(spec.quality)}"
        + (f"; bounds {bounds}" if bounds else ""),
        f"budget       {spec.budget_trials} trials"
        + (f" or {spec.budget_minutes:g} min" if spec.budget_minutes else ""),
    ]


def _quality_text(quality: QualitySpec) -> str:
    """``kld >= 0.95 (mean KLD <= 0.1) on the built-in text (PATH)``: the scorer, its floor and ceiling, its text."""
    text = quality.text_file
    where = (
        "" if text is None else f" on the built-in text ({text})" if text == builtin_text() else f" on {text}"
    )
    ceiling = f" (mean KLD <= {quality.max_kld:g})" if quality.max_kld is not None else ""
    return f"{quality.scorer} >= {quality.floor:g}{ceiling}{where}"


def estimate_lines(est: eta.Estimate, ctx: StudyContext, race: bool = True) -> list[str]:
    """The time estimate: trials, the race and export's races at their most, the total, and its basis."""
    duration, machine, race_spec = eta.duration, est.machine, ctx.spec.race
    capped = " (budget.minutes)" if est.budget_s and est.trials_s >= est.budget_s else ""
    lines = [
        "time estimate (tuner run" + (", then tuner export)" if race else ")"),
        f"  trials   {est.trials} + {est.sentinels} sentinel(s): ~{duration(est.trial_s)} each, ~{duration(est.reference_s)} the "
        f"baseline and each sentinel = ~{duration(est.trials_s)}{capped}",
    ]
    if race:
        confirm = f" + {race_spec.confirm_rounds} confirmation rounds x 2" if race_spec.confirm_rounds else ""
        lines.append(
            f"  race     at most {race_spec.max_rounds} rounds of {est.finalists + 1} launches, at most {eta.RACE_OPEN} "
            f"after round {race_spec.min_rounds}{confirm}: {est.race_launches} launches, ~{duration(est.launch_s)} each = "
            f"~{duration(est.race_s)}"
            + (
                f" (under {DECISION_ROUNDS} rounds no race decides: each ends with what it may lose)"
                if race_spec.max_rounds < DECISION_ROUNDS
                else ""
            )
        )
        lines += [
            f"  export   {p.what}: {p.how}: {p.launches} launches, ~{duration(p.launch_s)} each = ~{duration(p.seconds)}"
            for p in est.export
        ]
    most = est.trials_s + est.race_s + est.export_s
    lines.append(
        f"  total    ~{duration(est.expected_s(race))}"
        + (
            f" with each race to its last round, {eta.RACE_TYPICAL} launches a round after round "
            f"{race_spec.min_rounds} (at most ~{duration(most)})"
            if race
            else ""
        )
    )
    searched = (
        f"searched trials x{est.speedup:g} faster (speculation, on average)" if est.speedup != 1 else ""
    )
    pruned = f"pruning saves {est.pruned:.0%} of their passes" if est.pruned else ""
    lines.append(
        f"  basis: {machine.bytes_per_token / 1e9:.3f} GB read per token at {eta.DECODE_EFFICIENCY:.0%} of "
        f"{machine.bandwidth / 1e9:.1f} GB/s = {1000 * machine.token_s:.1f} ms/token (at least {1000 * eta.TOKEN_FLOOR_S:g} ms), "
        f"launch ~{machine.launch_s:.1f} s; "
        + "; ".join(x for x in (searched, pruned, "quality runs not counted") if x)
    )
    return lines
