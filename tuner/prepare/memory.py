"""A study's configurations against this host's memory (``models.memory_fit``): the largest one for
``--check``, and each trial's before it is launched (what does not fit fails as ``does_not_fit``)."""

from __future__ import annotations

from tuner.knobs.config import Choices, TrialConfig
from tuner.models.memory_fit import CACHE_TYPE_BYTES, Footprint, footprint, misfit
from tuner.prepare.context import StudyContext


def config_footprint(ctx: StudyContext, config: TrialConfig) -> Footprint:
    """What ``config`` keeps resident: the target, its draft model if it drafts with one, the KV cache."""
    draft = ctx.drafts.get(config.draft) if config.draft else None
    return footprint(
        ctx.target_for(config), draft, ctx.launch.ctx_size, config.cache_type_k or "f16", config.cache_type_v or "f16"
    )


def config_misfit(ctx: StudyContext, config: TrialConfig) -> str | None:
    """Why ``config`` cannot be launched on this host (bind: on its node), or None."""
    node = config.numa_node if config.numa == "bind" else None
    return misfit(config_footprint(ctx, config), ctx.launch.topology, node)


def largest(ctx: StudyContext) -> Footprint:
    """The space's largest configuration: the target (of its variants, the largest) with the draft whose
    footprint is largest, at the widest KV cache type."""
    widest = max(
        _cache_types(ctx, "cache_type_k") + _cache_types(ctx, "cache_type_v"),
        key=lambda t: CACHE_TYPE_BYTES.get(t, 2.0),
    )
    sizes = [
        footprint(target, draft, ctx.launch.ctx_size, widest, widest)
        for target in [ctx.target, *(v.info for v in ctx.target_variants.values())]
        for draft in [None, *ctx.drafts.values()]
    ]
    return max(sizes, key=lambda size: size.total)


def _cache_types(ctx: StudyContext, knob: str) -> list[str]:
    domain = ctx.space.domains.get(knob)
    return [str(v) for v in domain.values] if isinstance(domain, Choices) else ["f16"]
