"""Host state: what may change between runs on the same machine (provenance, never a key).

THP mode, cpufreq governors, load, numactl, affinity, and a memory bandwidth probe for
the report's roofline. Read under a ``root`` like ``tuner.topology``.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tuner.topology import (
    CPU_GOVERNOR_FILE,
    LIVE_ROOT,
    PROC_LOADAVG,
    SYS_CPU,
    THP_ENABLED,
    Topology,
    format_cpu_list,
    read_text,
)


@dataclass(frozen=True)
class LoadAverage:
    one: float
    five: float
    fifteen: float


@dataclass(frozen=True)
class HostState:
    """What may change between runs on the same machine; provenance, never a key.

    ``governors`` maps CPU id to its cpufreq governor (empty when cpufreq is not
    exposed, as in most VMs). ``affinity`` and ``hostname`` are only filled for the live
    root; ``numactl`` is always this host's, since it is this host that would run it.
    """

    thp_mode: str | None
    governors: Mapping[int, str]
    load: LoadAverage | None
    numactl: str | None
    affinity: tuple[int, ...] | None
    hostname: str | None


def is_live_root(root: Path) -> bool:
    return Path(root).resolve() == LIVE_ROOT


def read_thp_mode(root: Path = LIVE_ROOT) -> str | None:
    """Transparent hugepage mode: the bracketed value of "always [madvise] never"."""
    text = read_text(Path(root), THP_ENABLED)
    match = re.search(r"\[(\w+)\]", text or "")
    return match.group(1) if match else None


def read_governors(root: Path, cpus: Iterable[int]) -> dict[int, str]:
    """cpufreq governor per CPU; CPUs without cpufreq (VMs) are left out."""
    governors = {}
    for cpu in cpus:
        text = read_text(Path(root), SYS_CPU / f"cpu{cpu}" / CPU_GOVERNOR_FILE)
        if text and text.strip():
            governors[cpu] = text.strip()
    return governors


def summarize_governors(governors: Mapping[int, str]) -> dict[str, str]:
    """Governor name -> CPU list, e.g. {"performance": "0-63"}."""
    by_name: dict[str, list[int]] = {}
    for cpu, name in governors.items():
        by_name.setdefault(name, []).append(cpu)
    return {name: format_cpu_list(cpus) for name, cpus in sorted(by_name.items())}


def read_load_average(root: Path = LIVE_ROOT) -> LoadAverage | None:
    fields = (read_text(Path(root), PROC_LOADAVG) or "").split()
    try:
        return LoadAverage(float(fields[0]), float(fields[1]), float(fields[2]))
    except (IndexError, ValueError):
        return None


def numactl_path() -> str | None:
    return shutil.which("numactl")


def current_affinity(root: Path = LIVE_ROOT) -> tuple[int, ...] | None:
    """CPUs this process may run on; only meaningful for the live machine."""
    if not is_live_root(root) or not hasattr(os, "sched_getaffinity"):
        return None
    return tuple(sorted(os.sched_getaffinity(0)))


def read_host_state(topo: Topology, root: Path = LIVE_ROOT) -> HostState:
    live = is_live_root(root)
    return HostState(
        thp_mode=read_thp_mode(root),
        governors=read_governors(root, (cpu.id for cpu in topo.cpus)),
        load=read_load_average(root),
        numactl=numactl_path(),
        affinity=current_affinity(root),
        hostname=platform.node() if live else None,
    )


def measure_memory_bandwidth(seconds: float = 0.5, size_bytes: int = 256 * 2**20) -> float:
    """Memory bandwidth in bytes/s from a single-threaded numpy copy (best of several).

    A lower bound: one thread cannot saturate a server's memory channels. Bytes are
    counted STREAM-style (read + write of the array). Used for a roofline estimate of
    decode speed (bandwidth / bytes of weights read per token).
    """
    import numpy as np  # lazy: keeps `tuner --help` fast

    src = np.ones(max(size_bytes // 8, 1), dtype=np.float64)
    dst = np.zeros_like(src)  # untouched pages: the first copy faults them in, best-of drops it
    best = float("inf")
    deadline = time.perf_counter() + seconds
    runs = 0
    while runs < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
        runs += 1
    return 2 * src.nbytes / best
