"""The fingerprint that makes two results comparable, and the rest of a run's provenance.

The counterpart of llama-bench's key properties: ``COMPARABILITY_KEYS`` must be equal
for two results to be compared; every other field is provenance.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from tuner.machine.bandwidth import FINGERPRINT_KEY, BandwidthCurve
from tuner.machine.host import HostState, summarize_governors
from tuner.machine.topology import Topology, format_cpu_list

# SIMD features that change llama.cpp's kernels; recorded as provenance.
SIMD_FLAGS = frozenset(
    {
        "sse4_2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx_vnni",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx512_bf16",
        "amx_tile",
        "amx_int8",
        "amx_bf16",
        "asimd",
        "asimddp",
        "sve",
        "sve2",
        "i8mm",
        "bf16",
    }
)

COMPARABILITY_KEYS = (
    "cpu_model",
    "logical_cpus",
    "physical_cores",
    "numa_nodes",
    "memory_gib",
    "llama_commit",
    "llama_build_flags",
)


class Fingerprint(TypedDict, total=False):
    """The machine and build a study measured on, as its record stores it (JSON). ``fingerprint`` sets every
    key but the host's, which it sets with a host state; an empty one stands for none (a replayed study's, a
    record not yet stored), and one stored by an older tuner may lack the newer keys."""

    # the comparability keys
    cpu_model: str
    logical_cpus: int
    physical_cores: int
    numa_nodes: list[str]  # each node's CPU list, e.g. "0-15"
    memory_gib: int | None
    llama_commit: str | None
    llama_build_flags: list[str] | None
    # provenance
    threads_per_core: int
    simd_flags: list[str]
    mem_available_bytes: int | None
    numa_mem_free_bytes: list[int | None]
    llama_source: str | None
    llama_build_number: int | None
    llama_compiler: str | None
    llama_bin_dir: str | None
    bandwidth_bytes_per_s: float | None
    # the copy probe's curve by threads (``tuner.machine.bandwidth.FINGERPRINT_KEY``)
    bandwidth_by_threads: dict[str, float] | None
    # the host's state, with one
    hostname: str | None
    thp_mode: str | None
    governors: dict[str, str]  # governor -> CPU list
    load_avg: list[float] | None
    affinity: str | None
    numactl: str | None


def fingerprint(
    topo: Topology,
    build_manifest: Mapping | None,
    host: HostState | None = None,
    bandwidth_bytes_per_s: float | None = None,
    bandwidth_curve: BandwidthCurve | None = None,
) -> Fingerprint:
    """A JSON-serialisable description of the machine and llama.cpp build.

    Fields named in ``COMPARABILITY_KEYS`` decide whether two results may be compared;
    the rest (load, free memory, governor, THP, bandwidth and its curve by threads, ...)
    is provenance: a resumed study is never refused for a bandwidth that moved.
    """
    manifest = dict(build_manifest or {})
    fp: Fingerprint = {
        "cpu_model": topo.cpu_model,
        "logical_cpus": topo.logical_cpus,
        "physical_cores": topo.physical_cores,
        "numa_nodes": [format_cpu_list(node.cpus) for node in topo.nodes],
        "memory_gib": round(topo.mem_total_bytes / 2**30) if topo.mem_total_bytes else None,
        "llama_commit": manifest.get("commit"),
        "llama_build_flags": manifest.get("cmake_flags"),
        # provenance
        "threads_per_core": topo.threads_per_core,
        "simd_flags": sorted(SIMD_FLAGS.intersection(topo.cpu_flags)),
        "mem_available_bytes": topo.mem_available_bytes,
        "numa_mem_free_bytes": [node.mem_free_bytes for node in topo.nodes],
        "llama_source": manifest.get("source"),
        "llama_build_number": manifest.get("build_number"),
        "llama_compiler": manifest.get("compiler"),
        "llama_bin_dir": manifest.get("bin_dir"),
        "bandwidth_bytes_per_s": bandwidth_bytes_per_s,
        FINGERPRINT_KEY: bandwidth_curve.to_json() if bandwidth_curve else None,
    }
    if host is not None:
        fp.update(
            {
                "hostname": host.hostname,
                "thp_mode": host.thp_mode,
                "governors": summarize_governors(host.governors),
                "load_avg": [host.load.one, host.load.five, host.load.fifteen] if host.load else None,
                "affinity": format_cpu_list(host.affinity) if host.affinity is not None else None,
                "numactl": host.numactl,
            }
        )
    return fp


def compare_fingerprints(study_fp: Mapping, host_fp: Mapping) -> list[str]:
    """Why results from these two fingerprints are not comparable (empty: they are)."""
    return [
        f"{key} differs: study has {study_fp.get(key)!r}, this host has {host_fp.get(key)!r}"
        for key in COMPARABILITY_KEYS
        if study_fp.get(key) != host_fp.get(key)
    ]
