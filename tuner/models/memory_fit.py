"""Whether a configuration fits in memory, from the GGUF headers already read, before anything is launched.

Why: a target, its draft and the KV cache that do not fit are not slow, they swap or get killed, and a launch
that thrashes the page cache disturbs every measurement after it. The resident size is the weights (target and
draft: llama.cpp maps or reads them whole), the KV cache of both models for ``ctx_size`` tokens (llama-server's
``--ctx-size``, which its slots share) at the cache types, and a margin for compute buffers and the server
itself (``MARGIN_SHARE`` of that, at least ``MARGIN_BYTES``). It is compared with the host's available memory
(MemAvailable: free plus what the kernel can reclaim), and with one node's memory under ``numa: bind``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.machine.topology import Topology
from tuner.models.gguf_info import ModelInfo

# Bytes per cached element for llama.cpp's KV cache types (-ctk/-ctv): a block's bytes over its 32 elements.
CACHE_TYPE_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}
MARGIN_SHARE = 0.10  # compute buffers, the server's own allocations, fragmentation
MARGIN_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Footprint:
    """What one configuration keeps resident, in bytes."""

    weights: int  # the target's
    draft: int  # the draft model's weights, 0 without one
    kv_cache: int  # both models' KV cache for ctx_size tokens
    ctx_size: int

    @property
    def margin(self) -> int:
        return max(MARGIN_BYTES, round(MARGIN_SHARE * (self.weights + self.draft + self.kv_cache)))

    @property
    def total(self) -> int:
        return self.weights + self.draft + self.kv_cache + self.margin

    def text(self) -> str:
        draft = f" + draft {_gb(self.draft)}" if self.draft else ""
        return (
            f"{_gb(self.total)} (weights {_gb(self.weights)}{draft} + KV cache {_gb(self.kv_cache)} for "
            f"{self.ctx_size} tokens + margin {_gb(self.margin)})"
        )


def footprint(
    target: ModelInfo, draft: ModelInfo | None, ctx_size: int, cache_type_k: str = "f16", cache_type_v: str = "f16"
) -> Footprint:
    """The resident size of the target with ``draft`` (or none) at ``ctx_size`` and the cache types."""
    per_element = (CACHE_TYPE_BYTES.get(cache_type_k, 2.0) + CACHE_TYPE_BYTES.get(cache_type_v, 2.0)) / 2
    elements = target.kv_elements_per_token + (draft.kv_elements_per_token if draft else 0)
    return Footprint(
        weights=target.weights_bytes,
        draft=draft.weights_bytes if draft else 0,
        kv_cache=round(elements * ctx_size * per_element),
        ctx_size=ctx_size,
    )


def available_bytes(topology: Topology, node: int | None = None) -> int | None:
    """The memory a launch may take: the host's MemAvailable, or under bind the node's free memory (None: the
    kernel does not say)."""
    if node is None:
        return topology.mem_available_bytes
    return next((n.mem_free_bytes or n.mem_total_bytes for n in topology.nodes if n.id == node), None)


def misfit(size: Footprint, topology: Topology, node: int | None = None) -> str | None:
    """Why ``size`` cannot be launched here, in one line, or None when it fits (or the memory is unknown)."""
    room = available_bytes(topology, node)
    if room is None or size.total <= room:
        return None
    where = "available on this host" if node is None else f"free on NUMA node {node} (numa: bind)"
    return f"needs {size.text()}, {_gb(room)} {where}"


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB"
