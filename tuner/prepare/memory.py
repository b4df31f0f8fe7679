"""A study's configurations against this host's memory (``models.memory_fit``): the largest one for
``--check`` and ``tuner doctor --study``, and each trial's before it is launched (what does not fit fails as
``does_not_fit``)."""

from __future__ import annotations

from pathlib import Path

from tuner.knobs.config import TrialConfig
from tuner.models.gguf_info import ModelInfo, read_model_info
from tuner.models.memory_fit import CACHE_TYPE_BYTES, Footprint, footprint, misfit
from tuner.prepare.context import StudyContext
from tuner.search.stages.configs import KnobValues
from tuner.storage.records import StudyRecord


def config_footprint(ctx: StudyContext, config: TrialConfig) -> Footprint:
    """What ``config`` keeps resident: the target, its draft model if it drafts with one, the KV cache."""
    draft = ctx.drafts.get(config.draft) if config.draft else None
    return footprint(
        ctx.target_for(config),
        draft,
        ctx.launch.ctx_size,
        config.cache_type_k or "f16",
        config.cache_type_v or "f16",
    )


def config_misfit(ctx: StudyContext, config: TrialConfig) -> str | None:
    """Why ``config`` cannot be launched on this host (bind: on its node), or None."""
    node = config.numa_node if config.numa == "bind" else None
    return misfit(config_footprint(ctx, config), ctx.launch.topology, node)


def largest(ctx: StudyContext) -> Footprint:
    """The space's largest configuration: the target (of its variants, the largest) with the draft whose
    footprint is largest, at the widest KV cache type."""
    targets = [ctx.target, *(v.info for v in ctx.target_variants.values())]
    return largest_of(
        targets, list(ctx.drafts.values()), ctx.launch.ctx_size, _cache_types(ctx.space.domains)
    )


def largest_of(
    targets: list[ModelInfo], drafts: list[ModelInfo], ctx_size: int, cache_types: list[str]
) -> Footprint:
    """The largest footprint over every target file and draft (or none), at the widest of ``cache_types``."""
    widest = max(cache_types or ["f16"], key=lambda t: CACHE_TYPE_BYTES.get(t, 2.0))
    sizes = [
        footprint(target, draft, ctx_size, widest, widest) for target in targets for draft in [None, *drafts]
    ]
    return max(sizes, key=lambda size: size.total)


def stored_largest(record: StudyRecord) -> Footprint:
    """A stored study's largest configuration, from its models' headers as they are on disk now (``tuner
    doctor --study``)."""
    targets = [record.target["path"], *(v["path"] for v in record.target_variants.values())]
    drafts = [d["path"] for d in record.drafts.values()]
    space = KnobValues(record.space)
    cache_types = [str(v) for knob in ("cache_type_k", "cache_type_v") for v in space.values(knob)]
    return largest_of(
        [read_model_info(Path(p)) for p in targets],
        [read_model_info(Path(p)) for p in drafts],
        int(record.measurement.get("ctx_size", 0)),
        cache_types,
    )


def _cache_types(domains: dict) -> list[str]:
    return [
        str(v)
        for knob in ("cache_type_k", "cache_type_v")
        for v in getattr(domains.get(knob), "values", ("f16",))
    ]
