"""The knob registry: every launch knob a study can search, its type and what it does.

One place: the search space (``tuner.search.space``), the argv builder, the report's and
compare's columns, the grid recorder and the benchmark tables all read these names.
``TrialConfig`` (``tuner.search.space``) has exactly these fields, in this order.
"""

from __future__ import annotations

from dataclasses import dataclass

# Speculative types of the pinned llama.cpp (`--spec-type`) that need no extra files.
# draft-eagle3/mtp/dflash/dspark need model-specific sidecars and are not offered.
SPEC_TYPES = ("none", "draft-simple", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
# The types whose draft length K we set (ngram-cache drafts a fixed 8 in this version).
SPEC_TYPES_WITH_K = ("draft-simple", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod")
NUMA_POLICIES = ("none", "interleave", "bind", "distribute", "isolate")


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
    Knob("temperature", float, "sampling temperature, sent per request"),
    Knob("experts", int, "MoE active experts (--override-kv ARCH.expert_used_count=int:N), MoE targets only"),
    Knob("numa", str, f"NUMA policy, one of {', '.join(NUMA_POLICIES)}; collapses to what the machine supports"),
    Knob("numa_node", int, "the node a 'bind' policy binds to", searched=False),
    Knob("threads", int, "generation threads (-t), pinned one per physical core"),
    Knob("threads_batch", int, "batch/prompt threads (-tb); default: same as threads"),
)

NAMES = tuple(k.name for k in KNOBS)
INT_KNOBS = tuple(k.name for k in KNOBS if k.type is int)
# Knobs a study file's search_space may set, with their types.
KNOB_TYPES: dict[str, type] = {k.name: k.type for k in KNOBS if k.searched}
