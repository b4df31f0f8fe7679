"""The roofline: decode without speculation cannot beat memory bandwidth / bytes read per token.

Operators reason with it, and the study uses it as a sanity check: a non-speculative
trial far above it is not a measurement (``above_roofline``). The bandwidth is the
fingerprint's copy probe (one copy thread per core, STREAM-counted read + write), so the
ceiling is an estimate, not a bound; and a model whose weights fit in the last-level
cache is not bound by memory at all, so the check is skipped for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tuner.machine.bandwidth import measure_memory_bandwidth
from tuner.machine.fingerprint import Fingerprint
from tuner.machine.topology import read_topology

ABOVE_ROOFLINE_FACTOR = 2.0  # a non-speculative trial this far above the (estimated) ceiling is impossible
CACHE_RESIDENT_FACTOR = 4  # weights below this many last-level caches may be served from cache
LLC_SIZE_FILE = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")


@dataclass(frozen=True)
class Bandwidth:
    """Memory bandwidth for the roofline, and where the figure came from."""

    bytes_per_s: float
    source: str  # "fingerprint" or "measured at report time"
    note: str


class StudyFacts(Protocol):
    """What a study's record says of its machine and target (``tuner.storage.records.StudyRecord`` has
    both; the machine floor does not import the storage above it). Read-only: the record is frozen."""

    @property
    def fingerprint(self) -> Fingerprint: ...

    @property
    def target(self) -> dict: ...


def study_bandwidth(record: StudyFacts, probe: Callable[[], float] | None = None) -> Bandwidth:
    """The fingerprint's bandwidth; without one, measured now (and the report says so)."""
    fp = record.fingerprint
    if bandwidth := fp.get("bandwidth_bytes_per_s"):
        return Bandwidth(
            float(bandwidth),
            "fingerprint",
            "measured when the study started (copy probe, one thread per core: an estimate)",
        )
    measured = (probe or measure_memory_bandwidth)()
    here = read_topology().cpu_model
    note = "the study's fingerprint has no bandwidth: measured at report time on this host (copy probe, one thread per core: an estimate)"
    if fp.get("cpu_model") and fp["cpu_model"] != here:
        note += f"; this host's CPU ({here}) is not the study's ({fp['cpu_model']}), so the ceiling is indicative only"
    return Bandwidth(measured, "measured at report time", note)


@dataclass(frozen=True)
class Roofline:
    """Decode ceiling without speculation: bandwidth / bytes of weights read per token."""

    bandwidth: Bandwidth
    weights_bytes: int
    expert_bytes: int | None  # routed experts (MoE only)
    expert_count: int | None
    default_experts: int | None
    note: str

    def bytes_per_token(self, experts: int | None) -> float:
        if not self.expert_bytes or not self.expert_count:
            return float(self.weights_bytes)
        active = experts or self.default_experts or self.expert_count
        return self.weights_bytes - self.expert_bytes + self.expert_bytes * active / self.expert_count

    def tokens_per_second(self, experts: int | None = None) -> float:
        return self.bandwidth.bytes_per_s / self.bytes_per_token(experts)


def study_roofline(record: StudyFacts, bandwidth: Bandwidth) -> Roofline | None:
    """None when the study does not record the target's weight bytes."""
    target = record.target
    if not target.get("weights_bytes"):
        return None
    expert_bytes = target.get("expert_weights_bytes") if target.get("is_moe") else None
    note = "weights read per token = all tensor bytes of the target"
    if target.get("is_moe"):
        note = "weights read per token = shared tensors + active/total of the routed experts"
    return Roofline(
        bandwidth,
        int(target["weights_bytes"]),
        expert_bytes or None,
        target.get("expert_count"),
        target.get("expert_used_count"),
        note,
    )


def last_level_cache_bytes() -> int:
    """The L3 size (``TUNER_LLC_BYTES`` overrides it, e.g. where sysfs does not say); 0 when unknown."""
    override = os.environ.get("TUNER_LLC_BYTES")
    if override is not None:
        return int(override)
    try:
        text = LLC_SIZE_FILE.read_text().strip()
    except OSError:
        return 0
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:].upper(), 1)
    return int(text.rstrip("KMGkmg")) * scale


def impossible(
    tokens_per_second: float, roofline: Roofline, experts: int | None, llc_bytes: int
) -> str | None:
    """Why a non-speculative rate cannot be real, or None (also when the model may be cache-resident)."""
    per_token = roofline.bytes_per_token(experts)
    if per_token <= CACHE_RESIDENT_FACTOR * llc_bytes:
        return None
    ceiling = roofline.tokens_per_second(experts)
    if tokens_per_second > ABOVE_ROOFLINE_FACTOR * ceiling:
        return (
            f"{tokens_per_second:.1f} tokens/s without speculation is above x{ABOVE_ROOFLINE_FACTOR:g} the "
            f"memory roofline ({ceiling:.1f} tokens/s = {roofline.bandwidth.bytes_per_s / 1e9:.1f} GB/s / "
            f"{per_token / 1e9:.3f} GB per token)"
        )
    return None
