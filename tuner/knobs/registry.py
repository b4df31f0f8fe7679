"""The knob registry: every launch knob a study can search, its type and what it does.

One place: the search space (``tuner.search.space``), the argv builder, the report's and
compare's columns, the grid recorder and the benchmark tables all read these names.
``TrialConfig`` (``tuner.knobs.config``) has exactly these fields, in this order.
"""

from __future__ import annotations

from dataclasses import dataclass

# Speculative types of the pinned llama.cpp (`--spec-type`). draft-eagle3/dflash/dspark need
# model-specific sidecars and are not offered; draft-mtp only where the target announces it.
LOOKUP_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
# Types a model announces in its GGUF (llama.cpp's common_speculative_types_from_gguf).
ANNOUNCED_TYPES = ("draft-mtp",)
# Draft sources that run a model (an external draft, or the target's own MTP head): lookup stacks on them.
DRAFT_MODEL_TYPES = ("draft-simple", *ANNOUNCED_TYPES)
SPEC_TYPES = ("none", "draft-simple", *LOOKUP_TYPES, *ANNOUNCED_TYPES)
# The types whose draft length K we set (ngram-cache drafts a fixed 8 in this version).
SPEC_TYPES_WITH_K = ("draft-simple", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "draft-mtp")
# The n-gram types with a key length and draft length (ngram-cache has neither), and those with minimum hits.
SIZED_LOOKUP_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod")
HITS_LOOKUP_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v")
# Lookups whose table outlives a request: ngram-mod's hash is shared by every request of a server (reset only when a
# quarter full), ngram-cache keeps its dynamic cache. A server that has served a prompt's answer drafts it from memory
# the next time, so a measurement never lets them see a request twice (``tuner.measurement.measured_launch``).
REMEMBERING_LOOKUP_TYPES = ("ngram-mod", "ngram-cache")
NUMA_POLICIES = ("none", "interleave", "bind", "distribute", "isolate")
# Serving knobs, which change how a batch of users' tokens is computed and cached: flash attention modes and
# the KV cache types of the pinned build (-ctk/-ctv).
FLASH_ATTN = ("auto", "on", "off")
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
# The target_quant value of the target file as the study gives it (its highest precision).
SOURCE_QUANT = "source"
# Knobs that only mean something with several users at once: a space file's `concurrent:` section.
CONCURRENT_KNOBS = ("parallel",)
# How llama-server holds the weights, which decides page faults and swapping under memory pressure: mapped
# from the file or read into memory, locked or not.
# The pinned build has one option for both, --load-mode (none, mmap, mlock, mmap+mlock): see
# tuner.measurement.launch.memory_options. Their values are on/off (a bare YAML on/off reads as a boolean).
MEMORY_KNOBS = ("mmap", "mlock")
ON_OFF = ("on", "off")
# The serving and memory knobs, in the order the structured sampler walks them
# (tuner.search.stages.serving); every plan carries the baseline's values until then.
SERVING_KNOBS = (
    "parallel",
    "ubatch",
    "batch",
    "flash_attn",
    "cache_type_k",
    "cache_type_v",
    "poll",
    "cache_reuse",
    *MEMORY_KNOBS,
)
# llama.cpp's own defaults of the serving and memory knobs: the baseline (the quality reference) runs
# them, never a quantized KV cache a search happened to draw; a space that fixes a memory knob or
# cache_reuse at its default leaves it out (tuner.search.space), so the argv is llama.cpp's default.
SERVING_DEFAULTS = {
    "batch": 2048,
    "ubatch": 512,
    "flash_attn": "auto",
    "cache_type_k": "f16",
    "cache_type_v": "f16",
    "poll": 50,
    "cache_reuse": 0,
    "mmap": "on",
    "mlock": "off",
}


@dataclass(frozen=True)
class Knob:
    name: str
    type: type
    help: str
    searched: bool = True  # False: derived from other knobs, never written in a study file


KNOBS = (
    Knob("spec_type", str, f"speculative decoding type, one of {', '.join(SPEC_TYPES)}"),
    Knob("draft", str, "draft model name (file stem) among the study's compatible drafts"),
    Knob("draft_max", int, "draft length K (--spec-draft-n-max, or the n-gram type's size-m)"),
    Knob("draft_min", int, "minimum draft length (--spec-draft-n-min / --spec-ngram-mod-n-min)"),
    Knob("draft_p_min", float, "minimum draft probability (--spec-draft-p-min), draft-simple only"),
    Knob(
        "lookup",
        str,
        f"prompt lookup stacked on a draft model: none or one of {', '.join(LOOKUP_TYPES)}; "
        "llama.cpp asks the lookup first and the draft model where lookup has nothing",
    ),
    Knob("lookup_max", int, "the stacked lookup's draft length (its size-m, or --spec-ngram-mod-n-max)"),
    Knob("lookup_min", int, "the stacked ngram-mod's minimum draft length (--spec-ngram-mod-n-min)"),
    Knob(
        "ngram_key",
        int,
        "n-gram key length of the lookup in play (--spec-ngram-*-size-n, ngram-mod's n-match)",
    ),
    Knob(
        "ngram_min_hits", int, "minimum hits before an n-gram drafts (--spec-ngram-*-min-hits; not ngram-mod)"
    ),
    Knob("temperature", float, "sampling temperature, sent per request"),
    Knob("experts", int, "MoE active experts (--override-kv ARCH.expert_used_count=int:N), MoE targets only"),
    Knob(
        "target_quant",
        str,
        "the target's quantization: 'source' (the file as given) or a llama-quantize type the study's "
        "target.quantize lists",
    ),
    Knob(
        "numa", str, f"NUMA policy, one of {', '.join(NUMA_POLICIES)}; collapses to what the machine supports"
    ),
    Knob("numa_node", int, "the node a 'bind' policy binds to", searched=False),
    Knob("threads", int, "generation threads (-t), pinned one per physical core"),
    Knob("threads_batch", int, "batch/prompt threads (-tb); default: same as threads"),
    Knob("parallel", int, "server slots (-np); default: the study's highest concurrency level"),
    Knob("batch", int, "logical batch size (-b): tokens per decode call over all slots"),
    Knob("ubatch", int, "physical batch size (-ub), at most batch"),
    Knob("flash_attn", str, f"flash attention (-fa), one of {', '.join(FLASH_ATTN)}"),
    Knob(
        "cache_type_k", str, f"KV cache type of K (-ctk), one of {', '.join(KV_CACHE_TYPES)}; changes outputs"
    ),
    Knob("cache_type_v", str, "KV cache type of V (-ctv); a quantized V needs flash attention"),
    Knob("poll", int, "polling level 0..100 while waiting for work (--poll)"),
    Knob(
        "cache_reuse",
        int,
        "smallest chunk of a cached prompt reused through KV shifting (--cache-reuse N; 0: off)",
    ),
    Knob("mmap", str, "weights mapped from the file (on) or read into memory (off): --load-mode"),
    Knob("mlock", str, "weights locked in RAM, never swapped (on/off): --load-mode mlock or mmap+mlock"),
)

NAMES = tuple(k.name for k in KNOBS)
INT_KNOBS = tuple(k.name for k in KNOBS if k.type is int)
# Knobs a study file's search_space may set, with their types.
KNOB_TYPES: dict[str, type] = {k.name: k.type for k in KNOBS if k.searched}


def remembers_requests(spec_types: tuple[str, ...] | list[str]) -> bool:
    """Whether speculation of these ``--spec-type`` entries remembers earlier requests' tokens."""
    return any(t in REMEMBERING_LOOKUP_TYPES for t in spec_types)
