"""The search space: knob domains from YAML, resolved against the model and the machine.

A search-space file maps knob names to domains. A domain is a scalar (fixed value), a
list (categorical choices), or a mapping ``{low, high, step, log}`` (a range). The
file's domains are then *resolved* for one study: knobs that cannot apply disappear
(no expert knob for a dense model, no draft knob without compatible drafts), draft-mtp
is offered only for a target whose GGUF announces it, NUMA policies collapse to what the
topology makes meaningful, and thread ranges are checked against the physical cores.
``suggest`` turns an Optuna trial into an immutable ``TrialConfig``, asking only for
the knobs that apply to the choices already made (K only when speculating, the draft
model only for draft-simple).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from tuner.knobs.config import Choices, Domain, FloatRange, IntRange, RawSpace, TrialConfig
from tuner.knobs.registry import (
    ANNOUNCED_TYPES,
    CONCURRENT_KNOBS,
    DRAFT_MODEL_TYPES,
    HITS_LOOKUP_TYPES,
    LOOKUP_TYPES,
    MEMORY_KNOBS,
    SERVING_DEFAULTS,
    SIZED_LOOKUP_TYPES,
    SOURCE_QUANT,
    SPEC_TYPES_WITH_K,
)
from tuner.studyfile.validate import Fields


@dataclass(frozen=True)
class ResolvedSpace:
    """The domains of one study, on one machine, for one target model."""

    domains: dict[str, Domain]
    default_experts: int | None
    physical_cores: int
    allow_smt: bool
    notes: tuple[str, ...] = field(default=())
    # knobs the space fixed at llama.cpp's default, left out of the domains (and the digest): knob -> value
    defaults: dict[str, Any] = field(default_factory=dict)

    def digest(self) -> str:
        """A stable hash: resuming a study with a different space is refused."""
        payload = {name: [type(d).__name__, asdict(d)] for name, d in sorted(self.domains.items())}
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=list).encode()).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        """Each knob's domain as ``[kind, fields]``: the study record's ``space``, read back by the samplers."""
        return {name: [type(d).__name__, asdict(d)] for name, d in self.domains.items()}


@dataclass(frozen=True)
class SpaceTarget:
    """What a space is fitted to on the model's side: the target's name (for messages), its compatible drafts,
    its experts (``expert_used_count`` None for a dense model) and the speculative types its GGUF announces
    (``ModelInfo.speculative_types``)."""

    name: str = "the target"
    drafts: tuple[str, ...] = ()
    expert_used_count: int | None = None
    expert_count: int | None = None
    announced: tuple[str, ...] = ()
    quants: tuple[str, ...] = ()  # the target's llama-quantize variants (target.quantize), by type


@dataclass(frozen=True)
class SpaceHost:
    """What a space is fitted to on the machine's side: its cores and logical CPUs, the NUMA policies that mean
    something on it and its nodes."""

    physical_cores: int
    logical_cpus: int
    numa_policies: tuple[str, ...]
    numa_nodes: tuple[int, ...]


def resolve_space(
    raw: RawSpace,
    *,
    fields: Fields,
    target: SpaceTarget,
    host: SpaceHost,
    concurrency: tuple[int, ...] = (1,),
    long_prompts: str | None = None,
) -> ResolvedSpace:
    """Fit the written space to this target and machine (and to the study's concurrency levels:
    the ``concurrent:`` domains only with several users); refuse what cannot work.

    ``long_prompts``: why the workload's prompts are long (chat, a TTFT bound), if they are: ``threads_batch``
    is then searched apart from ``threads`` unless the space names it.
    """
    draft_names, target_name, announced = target.drafts, target.name, target.announced
    expert_used_count, expert_count = target.expert_used_count, target.expert_count
    physical_cores, logical_cpus = host.physical_cores, host.logical_cpus
    numa_policies, numa_nodes = host.numa_policies, host.numa_nodes
    notes: list[str] = []
    domains = _concurrent_domains(raw, concurrency, notes)
    spec_values = _resolve_spec_types(
        domains, "spec_type" in raw.from_file, fields, draft_names, target_name, announced, notes
    )
    _resolve_drafts(domains, spec_values, fields, draft_names)
    _resolve_lookup(domains, spec_values, notes)
    _resolve_experts(domains, fields, expert_used_count, expert_count, notes)
    _resolve_target_quant(domains, fields, target.quants, notes)
    _resolve_numa(domains, numa_policies, numa_nodes, notes)
    _resolve_threads(
        domains, fields, physical_cores, logical_cpus if raw.allow_smt else physical_cores, raw.allow_smt
    )
    if long_prompts and "threads_batch" not in domains and physical_cores > 1:
        domains["threads_batch"] = IntRange(1, physical_cores)
        notes.append(
            f"threads_batch: 1..{physical_cores}, tuned apart from threads on prompt throughput ({long_prompts}): "
            "prompt processing is compute-bound and may want every core where decode saturates earlier"
        )
    defaults = _drop_defaults(domains)
    return ResolvedSpace(domains, expert_used_count, physical_cores, raw.allow_smt, tuple(notes), defaults)


def _concurrent_domains(raw: RawSpace, concurrency: tuple[int, ...], notes: list[str]) -> dict[str, Domain]:
    """The written domains; the ``concurrent:`` ones (the serving knobs) only where the study measures
    several users at once, which is what they are written for; dropped with a note otherwise."""
    domains = {**raw.concurrent, **raw.domains} if max(concurrency) > 1 else dict(raw.domains)
    for knob in CONCURRENT_KNOBS:
        if knob in domains and max(concurrency) == 1:
            domains.pop(knob)
            notes.append(f"{knob}: dropped (the workload has one user at a time: workload.concurrency)")
    return domains


def _resolve_spec_types(
    domains: dict[str, Domain],
    from_file: bool,
    fields: Fields,
    draft_names: tuple[str, ...],
    target_name: str,
    announced: tuple[str, ...],
    notes: list[str],
) -> list[str]:
    """The speculative types this target can run: draft-simple only with drafts, announced types only where
    announced, and always ``none``, which the baseline trial runs."""
    spec = domains.get("spec_type", Choices(("none",)))
    assert isinstance(spec, Choices)
    spec_values = list(spec.values)
    _resolve_announced(spec_values, from_file, fields, target_name, announced, notes)
    if "draft-simple" in spec_values and not draft_names:
        if spec_values == ["draft-simple"]:
            fields.fail(
                "search_space.spec_type",
                "draft-simple needs draft models; list compatible ones under `drafts`",
            )
        spec_values.remove("draft-simple")
        notes.append("spec_type: draft-simple dropped (the study lists no drafts)")
    if "none" not in spec_values:
        spec_values.insert(0, "none")  # the baseline trial runs without speculation
    domains["spec_type"] = Choices(tuple(spec_values))
    return spec_values


def _resolve_drafts(
    domains: dict[str, Domain], spec_values: list[str], fields: Fields, draft_names: tuple[str, ...]
) -> None:
    """The draft model among the study's drafts, and K only where a type in play drafts K tokens."""
    if "draft-simple" in spec_values:
        wanted = domains.get("draft", Choices(draft_names))
        assert isinstance(wanted, Choices)
        unknown = [d for d in wanted.values if d not in draft_names]
        if unknown:
            fields.fail(
                "search_space.draft",
                f"{unknown[0]!r} is not one of the study's drafts ({', '.join(draft_names)})",
            )
        domains["draft"] = wanted
    else:
        domains.pop("draft", None)
    if not any(t in SPEC_TYPES_WITH_K for t in spec_values):
        for knob in ("draft_max", "draft_min", "draft_p_min"):
            domains.pop(knob, None)
    elif "draft_max" not in domains:
        domains["draft_max"] = Choices((3,))  # llama.cpp's own default K


def _resolve_target_quant(
    domains: dict[str, Domain], fields: Fields, quants: tuple[str, ...], notes: list[str]
) -> None:
    """The target's quantization: the source (the baseline's, always offered) and the study's variants, or
    the ones the space names among them; none without ``target.quantize``."""
    offered = (SOURCE_QUANT, *quants)
    if not quants:
        if domains.pop("target_quant", None) is not None:
            notes.append("target_quant: dropped (the study's target has no quantize list)")
        return
    written = domains.get("target_quant", Choices(offered))
    if not isinstance(written, Choices):
        fields.fail("search_space.target_quant", "expected a list of the target's variants")
    unknown = [v for v in written.values if v not in offered]
    if unknown:
        fields.fail(
            "search_space.target_quant",
            f"{unknown[0]!r} is not one of the target's variants ({', '.join(offered)}); add it to target.quantize",
        )
    domains["target_quant"] = Choices((SOURCE_QUANT, *(v for v in written.values if v != SOURCE_QUANT)))


def _resolve_experts(
    domains: dict[str, Domain],
    fields: Fields,
    expert_used_count: int | None,
    expert_count: int | None,
    notes: list[str],
) -> None:
    """The active expert count for a mixture-of-experts target, within the model's experts; none for a dense one."""
    if expert_used_count:
        experts = domains.get("experts", IntRange(1, expert_used_count))
        top = max(experts.values) if isinstance(experts, Choices) else experts.high
        low = min(experts.values) if isinstance(experts, Choices) else experts.low
        if low < 1 or top > (expert_count or expert_used_count):
            fields.fail(
                "search_space.experts",
                f"must lie within 1..{expert_count or expert_used_count} (the model's expert count)",
            )
        domains["experts"] = experts
    elif "experts" in domains:
        domains.pop("experts")
        notes.append("experts: dropped (the target is not a mixture-of-experts model)")


def _resolve_numa(
    domains: dict[str, Domain], numa_policies: tuple[str, ...], numa_nodes: tuple[int, ...], notes: list[str]
) -> None:
    """The NUMA policies this topology makes meaningful, always with ``none`` (the baseline's), and the node
    to bind to where ``bind`` is searched."""
    numa = domains.get("numa", Choices(("none",)))
    assert isinstance(numa, Choices)
    kept = tuple(p for p in numa.values if p in numa_policies)
    if set(kept) != set(numa.values):
        notes.append(
            f"numa: {', '.join(p for p in numa.values if p not in kept)} not meaningful on this machine "
            f"({len(numa_nodes)} NUMA node(s)); kept {', '.join(kept) or 'none'}"
        )
    if "none" not in kept:
        kept = ("none",) + kept  # the baseline runs without a NUMA policy
    domains["numa"] = Choices(kept)
    if "bind" in kept:
        domains["numa_node"] = Choices(numa_nodes)


# Knobs a space may fix at llama.cpp's default: then left out, so the command stays llama.cpp's default
# (no --load-mode, no --cache-reuse) and a study stored before they existed resumes with the same space.
DEFAULT_WHEN_FIXED = ("cache_reuse", *MEMORY_KNOBS)


def _drop_defaults(domains: dict[str, Domain]) -> dict[str, Any]:
    dropped = {}
    for knob in DEFAULT_WHEN_FIXED:
        domain = domains.get(knob)
        if isinstance(domain, Choices) and domain.values == (SERVING_DEFAULTS[knob],):
            dropped[knob] = domain.values[0]
            del domains[knob]
    return dropped


def _resolve_threads(
    domains: dict[str, Domain], fields: Fields, physical_cores: int, limit: int, smt: bool
) -> None:
    """Thread ranges default to the physical cores and never exceed what the machine has."""
    for knob in ("threads", "threads_batch"):
        dom = domains.get(knob)
        if dom is None:
            if knob == "threads":
                domains[knob] = IntRange(1, physical_cores)
            continue
        top = max(dom.values) if isinstance(dom, Choices) else dom.high
        low = min(dom.values) if isinstance(dom, Choices) else dom.low
        if low < 1:
            fields.fail(f"search_space.{knob}", "needs at least 1 thread")
        if top > limit:
            what = "logical CPUs" if smt else "physical cores (set allow_smt: true to use SMT siblings)"
            fields.fail(
                f"search_space.{knob}", f"{top} threads exceed the {limit} {what} of this machine; lower it"
            )


def _resolve_announced(
    spec_values: list[str],
    from_file: bool,
    fields: Fields,
    target_name: str,
    announced: tuple[str, ...],
    notes: list[str],
) -> None:
    """The target's own speculative types (draft-mtp): offered only where it announces them.

    A space file's list is for any model: an announced type joins it, one the target lacks is dropped.
    A study's own list is for its target: it is searched as written, so a type the target lacks is an error.
    """
    for kind in ANNOUNCED_TYPES:
        if kind in spec_values and kind not in announced:
            if not from_file:
                fields.fail(
                    "search_space.spec_type",
                    f"{target_name} does not announce {kind} (`tuner inspect` "
                    f"lists the types a model announces); remove {kind} from spec_type",
                )
            spec_values.remove(kind)
            notes.append(f"spec_type: {kind} dropped ({target_name} does not announce it)")
        elif kind in announced and kind not in spec_values and from_file:
            spec_values.append(kind)
            notes.append(f"spec_type: {kind} added ({target_name} announces it)")


def _resolve_lookup(domains: dict[str, Domain], spec_values: list[str], notes: list[str]) -> None:
    """Keep the lookup and n-gram size knobs only where a type in play reads them (absent: llama.cpp's default)."""
    stackable = [t for t in spec_values if t in DRAFT_MODEL_TYPES]
    if "lookup" in domains and not stackable:
        domains.pop("lookup")
        notes.append("lookup: dropped (no draft model to stack prompt lookup on)")
    lookups = [v for v in domains["lookup"].values if v != "none"] if "lookup" in domains else []  # type: ignore[union-attr]
    in_play = {t for t in spec_values if t in LOOKUP_TYPES} | set(lookups)
    wanted = {
        "lookup_max": any(t in SIZED_LOOKUP_TYPES for t in lookups),
        "lookup_min": "ngram-mod" in lookups,
        "ngram_key": bool(in_play & set(SIZED_LOOKUP_TYPES)),
        "ngram_min_hits": bool(in_play & set(HITS_LOOKUP_TYPES)),
    }
    for knob, applies in wanted.items():
        if knob in domains and not applies:
            domains.pop(knob)
            notes.append(f"{knob}: dropped (no lookup type in play reads it)")


def _suggest(trial, name: str, domain: Domain) -> Any:
    if isinstance(domain, Choices):
        return trial.suggest_categorical(name, list(domain.values))
    if isinstance(domain, IntRange):
        return trial.suggest_int(name, domain.low, domain.high, step=domain.step, log=domain.log)
    return trial.suggest_float(name, domain.low, domain.high, step=domain.step, log=domain.log)


def suggest(trial, space: ResolvedSpace) -> TrialConfig:
    """Ask Optuna for one configuration; conditional knobs only where they apply."""
    domains = space.domains
    values: dict[str, Any] = {"spec_type": _suggest(trial, "spec_type", domains["spec_type"])}
    spec_type = values["spec_type"]
    if spec_type == "draft-simple":
        values["draft"] = _suggest(trial, "draft", domains["draft"])
        if "draft_p_min" in domains:
            values["draft_p_min"] = _suggest(trial, "draft_p_min", domains["draft_p_min"])
    if spec_type in SPEC_TYPES_WITH_K:
        values["draft_max"] = _suggest(trial, "draft_max", domains["draft_max"])
        if "draft_min" in domains and spec_type in ("draft-simple", "ngram-mod"):
            values["draft_min"] = min(_suggest(trial, "draft_min", domains["draft_min"]), values["draft_max"])
    if spec_type in DRAFT_MODEL_TYPES and "lookup" in domains:
        values["lookup"] = _suggest(trial, "lookup", domains["lookup"])
    values.update(_suggest_ngram(trial, domains, spec_type, values.get("lookup")))
    for knob in ("temperature", "experts", "target_quant", "numa"):
        if knob in domains:
            values[knob] = _suggest(trial, knob, domains[knob])
    if values.get("numa") == "bind":
        values["numa_node"] = _suggest(trial, "numa_node", domains["numa_node"])
    values["threads"] = _suggest(trial, "threads", domains["threads"])
    if "threads_batch" in domains:
        values["threads_batch"] = _suggest(trial, "threads_batch", domains["threads_batch"])
    values.update(_suggest_serving(trial, domains))
    return TrialConfig(**values)


def _suggest_serving(trial, domains: dict[str, Domain]) -> dict[str, Any]:
    """Slots, batch sizes, flash attention, KV cache types, polling, cache reuse, mmap and mlock: where the
    space has them. The micro
    batch never exceeds the batch, and a V cache type only with flash attention on or auto (llama.cpp
    refuses a quantized V cache without it)."""
    values = {
        knob: _suggest(trial, knob, domains[knob])
        for knob in (
            "parallel",
            "batch",
            "ubatch",
            "flash_attn",
            "cache_type_k",
            "poll",
            "cache_reuse",
            *MEMORY_KNOBS,
        )
        if knob in domains
    }
    if "ubatch" in values and "batch" in values:
        values["ubatch"] = min(values["ubatch"], values["batch"])
    if "cache_type_v" in domains and values.get("flash_attn") != "off":
        values["cache_type_v"] = _suggest(trial, "cache_type_v", domains["cache_type_v"])
    return values


def _suggest_ngram(trial, domains: dict[str, Domain], spec_type: str, lookup: str | None) -> dict[str, Any]:
    """The n-gram sizes of the lookup in play (alone or stacked); none for ngram-cache, which has none."""
    stacked = lookup not in (None, "none")
    ngram = lookup if stacked else (spec_type if spec_type in LOOKUP_TYPES else None)
    values: dict[str, Any] = {}
    if ngram in SIZED_LOOKUP_TYPES and "ngram_key" in domains:
        values["ngram_key"] = _suggest(trial, "ngram_key", domains["ngram_key"])
    if ngram in HITS_LOOKUP_TYPES and "ngram_min_hits" in domains:
        values["ngram_min_hits"] = _suggest(trial, "ngram_min_hits", domains["ngram_min_hits"])
    if stacked and ngram in SIZED_LOOKUP_TYPES and "lookup_max" in domains:
        values["lookup_max"] = _suggest(trial, "lookup_max", domains["lookup_max"])
        if ngram == "ngram-mod" and "lookup_min" in domains:
            values["lookup_min"] = min(
                _suggest(trial, "lookup_min", domains["lookup_min"]), values["lookup_max"]
            )
    return values


def baseline_config(space: ResolvedSpace) -> TrialConfig:
    """The reference: target alone, all default experts, greedy, one thread per physical core, llama.cpp's
    default serving settings (f16 KV cache) and the most slots the space offers."""
    return TrialConfig(
        spec_type="none",
        temperature=0.0,
        experts=space.default_experts,
        target_quant=SOURCE_QUANT if "target_quant" in space.domains else None,
        numa="none",
        threads=_baseline_threads(space),
        # searched apart: the baseline keeps llama.cpp's default, prompt threads equal to threads
        threads_batch=_baseline_threads(space) if "threads_batch" in space.domains else None,
        **_baseline_serving(space),
    )


def _baseline_serving(space: ResolvedSpace) -> dict[str, Any]:
    domains = space.domains
    values: dict[str, Any] = {
        knob: default if outside(domains[knob], default) is None else _lowest(domains[knob])
        for knob, default in SERVING_DEFAULTS.items()
        if knob in domains
    }
    if "parallel" in domains:
        values["parallel"] = (
            max(domains["parallel"].values)
            if isinstance(domains["parallel"], Choices)
            else domains["parallel"].high
        )
    if "ubatch" in values and "batch" in values:
        values["ubatch"] = min(
            values["ubatch"], values["batch"]
        )  # as suggest: the micro batch fits the batch
    if values.get("flash_attn") == "off":
        values.pop("cache_type_v", None)  # as suggest: no V cache type without flash attention
    return values


def _lowest(domain: Domain) -> Any:
    return domain.values[0] if isinstance(domain, Choices) else domain.low


def _baseline_threads(space: ResolvedSpace) -> int:
    domain = space.domains["threads"]
    assert not isinstance(domain, FloatRange), "thread counts are whole numbers"
    top = max(domain.values) if isinstance(domain, Choices) else domain.high
    return min(top, space.physical_cores)


def outside(domain: Domain, value: object) -> str | None:
    """Why ``value`` is not in ``domain`` (a phrase for a one-line error), None when it is."""
    if isinstance(domain, Choices):
        if any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in domain.values):
            return None
        return f"is not one of {', '.join(map(str, domain.values))}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "is not a number"
    if isinstance(domain, IntRange) and (
        not float(value).is_integer() or (int(value) - domain.low) % domain.step
    ):
        return f"is not an integer of {domain.low}..{domain.high} step {domain.step}"
    if not domain.low <= value <= domain.high:
        return f"is outside {domain.low}..{domain.high}"
    return None


# a knob a plan or a warm start leaves unset takes another knob's value: prompt threads follow threads, as
# llama.cpp's default (the prompt_threads stage sets them apart)
FOLLOWS = {"threads_batch": "threads"}


def with_followers(params: dict[str, Any], space: ResolvedSpace) -> dict[str, Any]:
    """``params`` (a warm start as written) with each searched follower set to its leader's value where unset,
    so that Optuna's fallback sampler does not draw it (a warm start at 2 threads ran on 1 prompt thread)."""
    out = dict(params)
    for knob, leader in FOLLOWS.items():
        if knob in space.domains and knob not in out and leader in out:
            out[knob] = out[leader]
    return out


def enqueue_params(config: TrialConfig, space: ResolvedSpace) -> dict[str, Any]:
    """The Optuna params that make ``suggest`` return ``config`` (for enqueue_trial)."""
    return {k: v for k, v in config.as_dict().items() if k in space.domains or k == "numa_node"}
