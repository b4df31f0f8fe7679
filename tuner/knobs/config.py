"""What every stage speaks: a knob's domain (``Choices``, ``IntRange``, ``FloatRange``), a space as
written (``RawSpace``) and one launch configuration (``TrialConfig``, immutable; its fields are the
registry's knobs, in order)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Union

from tuner.knobs.registry import LOOKUP_TYPES, remembers_requests


@dataclass(frozen=True)
class Choices:
    values: tuple


@dataclass(frozen=True)
class IntRange:
    low: int
    high: int
    step: int = 1
    log: bool = False


@dataclass(frozen=True)
class FloatRange:
    low: float
    high: float
    step: float | None = None
    log: bool = False


Domain = Union[Choices, IntRange, FloatRange]


@dataclass(frozen=True)
class RawSpace:
    """Domains as written, before the model and machine are known."""

    domains: dict[str, Domain]
    allow_smt: bool = False
    # Knobs whose domain a space file gave, for any model (a study's overrides are for its target).
    from_file: frozenset[str] = frozenset()
    # the `concurrent:` section: domains that apply only when the study drives several users at once
    concurrent: dict[str, Domain] = field(default_factory=dict)


@dataclass(frozen=True)
class TrialConfig:
    """One launch configuration: everything the argv builder and the workload need."""

    spec_type: str = "none"
    draft: str | None = None
    draft_max: int | None = None
    draft_min: int | None = None
    draft_p_min: float | None = None
    lookup: str | None = None
    lookup_max: int | None = None
    lookup_min: int | None = None
    ngram_key: int | None = None
    ngram_min_hits: int | None = None
    temperature: float = 0.0
    experts: int | None = None
    target_quant: str | None = None  # None: a study without target variants (the target file as given)
    numa: str = "none"
    numa_node: int | None = None
    threads: int = 1
    threads_batch: int | None = None
    parallel: int | None = None  # None: as many slots as the study's highest concurrency level
    batch: int | None = None
    ubatch: int | None = None
    flash_attn: str | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    poll: int | None = None
    cache_reuse: int | None = None
    mmap: str | None = None  # None: llama.cpp's default (mapped)
    mlock: str | None = None  # None: llama.cpp's default (not locked)

    @property
    def speculative(self) -> bool:
        return self.spec_type != "none"

    @property
    def stacked(self) -> bool:
        """A draft model with prompt lookup in front of it, in one server."""
        return self.lookup not in (None, "none")

    @property
    def spec_types(self) -> tuple[str, ...]:
        """The ``--spec-type`` list: the lookup first (llama.cpp asks it first either way), then the draft."""
        return (
            (self.lookup, self.spec_type) if self.lookup is not None and self.stacked else (self.spec_type,)
        )

    @property
    def ngram_type(self) -> str | None:
        """The n-gram lookup in play, alone or stacked, whose sizes the ngram_* knobs set."""
        return self.lookup if self.stacked else (self.spec_type if self.spec_type in LOOKUP_TYPES else None)

    @property
    def family(self) -> str:
        """none, draft, lookup or stack: how the report groups configurations."""
        if self.stacked:
            return "stack"
        return "none" if not self.speculative else ("lookup" if self.spec_type in LOOKUP_TYPES else "draft")

    @property
    def remembers_requests(self) -> bool:
        """Its speculation remembers earlier requests (``REMEMBERING_LOOKUP_TYPES``): each pass its own launch."""
        return self.speculative and remembers_requests(self.spec_types)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def method_of(config: dict) -> str:
    """How a trial drafts, for tables: the draft model's name, the n-gram type, "none", or a stack
    ("ngram-mod + draft-small")."""
    spec = config.get("spec_type", "none")
    method = (config.get("draft") or spec) if spec == "draft-simple" else spec
    lookup = config.get("lookup")
    return f"{lookup} + {method}" if lookup not in (None, "none") else method
