"""Machine topology, host state and the fingerprint that makes two results comparable.

Everything is read from sysfs and procfs under a ``root`` directory so that tests (and
users reporting a bug) can pass a recorded tree instead of the live machine; see
``record_sysfs``. The pinning helpers here are what the argv builder uses to choose
CPUs, so the rules "physical cores first, never more threads than cores" live in one
place.
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

from tuner.errors import UserError

LIVE_ROOT = Path("/")

# Paths relative to the root, shared by the readers and by ``record_sysfs``.
SYS_CPU = Path("sys/devices/system/cpu")
SYS_NODE = Path("sys/devices/system/node")
PROC_CPUINFO = Path("proc/cpuinfo")
PROC_MEMINFO = Path("proc/meminfo")
PROC_LOADAVG = Path("proc/loadavg")
THP_ENABLED = Path("sys/kernel/mm/transparent_hugepage/enabled")
CPU_TOPOLOGY_FILES = ("physical_package_id", "core_id", "thread_siblings_list")
CPU_GOVERNOR_FILE = Path("cpufreq/scaling_governor")
NODE_FILES = ("cpulist", "meminfo")

NUMA_POLICIES = ("none", "interleave", "bind", "distribute", "isolate")

# SIMD features that change llama.cpp's kernels; recorded as provenance.
SIMD_FLAGS = frozenset({
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl",
    "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16",
    "asimd", "asimddp", "sve", "sve2", "i8mm", "bf16",
})

# Fingerprint fields that must be equal for two results to be comparable (the
# counterpart of llama-bench's key properties). Every other field is provenance.
COMPARABILITY_KEYS = (
    "cpu_model",
    "logical_cpus",
    "physical_cores",
    "numa_nodes",
    "memory_gib",
    "llama_commit",
    "llama_build_flags",
)


@dataclass(frozen=True)
class Cpu:
    """One online logical CPU and where it sits."""

    id: int
    package: int
    core: int
    node: int


@dataclass(frozen=True)
class NumaNode:
    """A NUMA node: its online CPUs and memory (None when the kernel does not say)."""

    id: int
    cpus: tuple[int, ...]
    mem_total_bytes: int | None
    mem_free_bytes: int | None


@dataclass(frozen=True)
class Topology:
    """The CPU and memory layout of one machine.

    ``smt_siblings`` holds one group per physical core: the online logical CPUs that
    share it, lowest first. A machine without SMT has groups of one.
    ``mem_available_bytes`` is the kernel's MemAvailable (free plus reclaimable cache),
    which is what decides whether a model fits.
    """

    cpu_model: str
    cpu_flags: tuple[str, ...]
    cpus: tuple[Cpu, ...]
    smt_siblings: tuple[tuple[int, ...], ...]
    nodes: tuple[NumaNode, ...]
    mem_total_bytes: int | None
    mem_available_bytes: int | None

    @property
    def logical_cpus(self) -> int:
        return len(self.cpus)

    @property
    def physical_cores(self) -> int:
        return len(self.smt_siblings)

    @property
    def threads_per_core(self) -> int:
        return max((len(group) for group in self.smt_siblings), default=1)

    @property
    def has_smt(self) -> bool:
        return self.threads_per_core > 1

    def node(self, node_id: int) -> NumaNode:
        for node in self.nodes:
            if node.id == node_id:
                return node
        known = ", ".join(str(n.id) for n in self.nodes)
        raise UserError(f"NUMA node {node_id} does not exist on this machine (nodes: {known})")


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


# ---------------------------------------------------------------- cpu lists


def parse_cpu_list(text: str) -> list[int]:
    """Parse the kernel's CPU list syntax ("0-2,5") into sorted, unique CPU ids."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise UserError(f"bad CPU list {text.strip()!r}: expected e.g. '0-7,32-39'")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise UserError(f"bad CPU list {text.strip()!r}: range {part} runs backwards")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """Format CPU ids in the kernel's compact syntax, the form numactl and taskset take."""
    ids = sorted(set(cpus))
    ranges: list[str] = []
    start = 0
    while start < len(ids):
        end = start
        while end + 1 < len(ids) and ids[end + 1] == ids[end] + 1:
            end += 1
        ranges.append(str(ids[start]) if start == end else f"{ids[start]}-{ids[end]}")
        start = end + 1
    return ",".join(ranges)


# ---------------------------------------------------------------- reading files


def _read(root: Path, relative: Path) -> str | None:
    """A file's text, or None when it is missing or unreadable (tolerant by design)."""
    try:
        return (root / relative).read_text()
    except OSError:
        return None


def _read_int(root: Path, relative: Path) -> int | None:
    text = _read(root, relative)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _parse_meminfo(text: str) -> dict[str, int]:
    """Parse /proc/meminfo or a node's meminfo ("Node 0 MemTotal: 123 kB") into bytes."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        label, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or not label.split() or not fields or not fields[0].isdigit():
            continue
        scale = 1024 if len(fields) > 1 and fields[1] == "kB" else 1
        values[label.split()[-1]] = int(fields[0]) * scale
    return values


def _parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """Model name and feature flags from the first processor block of /proc/cpuinfo."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    model = next(
        (fields[k] for k in ("model name", "Model", "Hardware", "cpu model") if fields.get(k)),
        "unknown",
    )
    flags = fields.get("flags") or fields.get("Features") or ""
    return model, tuple(sorted(set(flags.split())))


def _online_cpus(root: Path) -> list[int]:
    online = _read(root, SYS_CPU / "online")
    if online is not None:
        return parse_cpu_list(online)
    directory = root / SYS_CPU
    if not directory.is_dir():
        return []
    return sorted(int(p.name[3:]) for p in directory.iterdir() if re.fullmatch(r"cpu\d+", p.name))


def _node_ids(root: Path) -> list[int]:
    directory = root / SYS_NODE
    if not directory.is_dir():
        return []
    return sorted(int(p.name[4:]) for p in directory.iterdir() if re.fullmatch(r"node\d+", p.name))


def read_topology(root: Path = LIVE_ROOT) -> Topology:
    """Read the CPU/NUMA/memory layout from sysfs and procfs under ``root``.

    Only online CPUs count. Physical cores are the distinct thread_siblings_list groups
    (core_id alone repeats across packages and dies). A machine without
    /sys/devices/system/node is one implicit node holding every CPU and all memory.
    """
    root = Path(root)
    online = _online_cpus(root)
    if not online:
        raise UserError(f"no CPUs found under {root / SYS_CPU}; is {root} a sysfs/procfs root?")
    online_set = set(online)

    model, flags = _parse_cpuinfo(_read(root, PROC_CPUINFO) or "")
    meminfo = _parse_meminfo(_read(root, PROC_MEMINFO) or "")

    nodes: list[NumaNode] = []
    for node_id in _node_ids(root):
        node_dir = SYS_NODE / f"node{node_id}"
        cpus = [c for c in parse_cpu_list(_read(root, node_dir / "cpulist") or "") if c in online_set]
        node_mem = _parse_meminfo(_read(root, node_dir / "meminfo") or "")
        nodes.append(NumaNode(node_id, tuple(cpus), node_mem.get("MemTotal"), node_mem.get("MemFree")))
    if not nodes:
        nodes.append(NumaNode(0, tuple(online), meminfo.get("MemTotal"), meminfo.get("MemFree")))
    node_of = {cpu: node.id for node in nodes for cpu in node.cpus}

    cpus: list[Cpu] = []
    groups: set[tuple[int, ...]] = set()
    for cpu_id in online:
        topo_dir = SYS_CPU / f"cpu{cpu_id}" / "topology"
        package = _read_int(root, topo_dir / "physical_package_id")
        core = _read_int(root, topo_dir / "core_id")
        siblings_text = _read(root, topo_dir / "thread_siblings_list")
        siblings = parse_cpu_list(siblings_text) if siblings_text is not None else [cpu_id]
        groups.add(tuple(c for c in siblings if c in online_set) or (cpu_id,))
        cpus.append(Cpu(
            id=cpu_id,
            package=package if package is not None else 0,
            core=core if core is not None else cpu_id,
            node=node_of.get(cpu_id, nodes[0].id),
        ))

    mem_total = meminfo.get("MemTotal")
    node_totals = [n.mem_total_bytes for n in nodes if n.mem_total_bytes is not None]
    if mem_total is None and len(node_totals) == len(nodes):
        mem_total = sum(node_totals)
    return Topology(
        cpu_model=model,
        cpu_flags=flags,
        cpus=tuple(cpus),
        smt_siblings=tuple(sorted(groups)),
        nodes=tuple(nodes),
        mem_total_bytes=mem_total,
        mem_available_bytes=meminfo.get("MemAvailable", meminfo.get("MemFree")),
    )


# ---------------------------------------------------------------- pinning


def _ordered_core_groups(topo: Topology, node: int | None) -> list[tuple[int, ...]]:
    """Sibling groups ordered node by node, then package, then core id."""
    by_id = {cpu.id: cpu for cpu in topo.cpus}
    if node is not None:
        topo.node(node)  # raises a UserError naming the existing nodes
    groups = [g for g in topo.smt_siblings if node is None or by_id[g[0]].node == node]

    def key(group: tuple[int, ...]) -> tuple[int, int, int, int]:
        first = by_id[group[0]]
        return (first.node, first.package, first.core, first.id)

    return sorted(groups, key=key)


def physical_core_order(topo: Topology, node: int | None = None) -> list[int]:
    """One logical CPU per physical core (its lowest-numbered sibling).

    Ordered node by node, then by package and core, so taking the first N keeps
    threads on as few nodes as possible (local memory, one set of caches). With
    ``node`` only that node's cores are returned.
    """
    return [group[0] for group in _ordered_core_groups(topo, node)]


def cpus_for_threads(
    topo: Topology, n_threads: int, node: int | None = None, allow_smt: bool = False
) -> list[int]:
    """The CPUs to pin ``n_threads`` threads to: every physical core before any sibling.

    More threads than physical cores is an error unless ``allow_smt``; then the second
    sibling of every core (in core order) is used, then the third, and so on. SMT
    siblings share a core's execution units, so they rarely speed up decode.
    """
    where = f"NUMA node {node}" if node is not None else "this machine"
    groups = _ordered_core_groups(topo, node)
    if n_threads < 1:
        raise UserError(f"thread count must be at least 1, got {n_threads}")
    if n_threads <= len(groups):
        return [group[0] for group in groups[:n_threads]]
    if not allow_smt:
        raise UserError(
            f"{n_threads} threads requested but {where} has {len(groups)} physical cores; "
            f"use at most {len(groups)} threads (or allow SMT siblings)"
        )
    order = [group[0] for group in groups]
    for rank in range(1, max(len(g) for g in groups)):
        order.extend(group[rank] for group in groups if len(group) > rank)
    if n_threads > len(order):
        raise UserError(f"{n_threads} threads requested but {where} has {len(order)} logical CPUs")
    return order[:n_threads]


def meaningful_numa_policies(topo: Topology) -> list[str]:
    """The NUMA policies worth trying on this machine.

    With one node they all collapse to "none": numactl interleave or bind over a single
    node is the default allocation, and llama.cpp's --numa distribute/isolate only
    change anything when there are several nodes. Trying them would spend trials
    measuring noise.
    """
    return list(NUMA_POLICIES) if len(topo.nodes) > 1 else ["none"]


# ---------------------------------------------------------------- host state


def is_live_root(root: Path) -> bool:
    return Path(root).resolve() == LIVE_ROOT


def read_thp_mode(root: Path = LIVE_ROOT) -> str | None:
    """Transparent hugepage mode: the bracketed value of "always [madvise] never"."""
    text = _read(Path(root), THP_ENABLED)
    match = re.search(r"\[(\w+)\]", text or "")
    return match.group(1) if match else None


def read_governors(root: Path, cpus: Iterable[int]) -> dict[int, str]:
    """cpufreq governor per CPU; CPUs without cpufreq (VMs) are left out."""
    governors = {}
    for cpu in cpus:
        text = _read(Path(root), SYS_CPU / f"cpu{cpu}" / CPU_GOVERNOR_FILE)
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
    fields = (_read(Path(root), PROC_LOADAVG) or "").split()
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


# ---------------------------------------------------------------- fingerprint


def fingerprint(
    topo: Topology,
    build_manifest: Mapping | None,
    host: HostState | None = None,
    bandwidth_bytes_per_s: float | None = None,
) -> dict:
    """A JSON-serialisable description of the machine and llama.cpp build.

    Fields named in ``COMPARABILITY_KEYS`` decide whether two results may be compared;
    the rest (load, free memory, governor, THP, bandwidth, ...) is provenance.
    """
    manifest = dict(build_manifest or {})
    fp: dict = {
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
    }
    if host is not None:
        fp.update({
            "hostname": host.hostname,
            "thp_mode": host.thp_mode,
            "governors": summarize_governors(host.governors),
            "load_avg": [host.load.one, host.load.five, host.load.fifteen] if host.load else None,
            "affinity": format_cpu_list(host.affinity) if host.affinity is not None else None,
            "numactl": host.numactl,
        })
    return fp


def compare_fingerprints(study_fp: Mapping, host_fp: Mapping) -> list[str]:
    """Why results from these two fingerprints are not comparable (empty: they are)."""
    return [
        f"{key} differs: study has {study_fp.get(key)!r}, this host has {host_fp.get(key)!r}"
        for key in COMPARABILITY_KEYS
        if study_fp.get(key) != host_fp.get(key)
    ]


# ---------------------------------------------------------------- recording


def _recorded_files(root: Path) -> list[Path]:
    """Relative paths of every file the readers above consult, as present under root."""
    files = [SYS_CPU / "online", PROC_CPUINFO, PROC_MEMINFO, PROC_LOADAVG, THP_ENABLED]
    for cpu in _online_cpus(root):
        cpu_dir = SYS_CPU / f"cpu{cpu}"
        files += [cpu_dir / "topology" / name for name in CPU_TOPOLOGY_FILES]
        files.append(cpu_dir / CPU_GOVERNOR_FILE)
    for node_id in _node_ids(root):
        files += [SYS_NODE / f"node{node_id}" / name for name in NODE_FILES]
    return [f for f in files if (root / f).is_file()]


def record_sysfs(dest: Path, root: Path = LIVE_ROOT) -> list[Path]:
    """Copy the sysfs/procfs files ``read_topology`` reads into ``dest``, same layout.

    Lets a user send their machine's topology for tests. /proc/cpuinfo is cut to its
    first processor block (the only one read), which keeps big machines' records small.
    Returns the relative paths written.
    """
    root, dest = Path(root), Path(dest)
    written = []
    for relative in _recorded_files(root):
        text = _read(root, relative)
        if text is None:
            continue
        if relative == PROC_CPUINFO:
            text = text.lstrip("\n").split("\n\n", 1)[0] + "\n"
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        written.append(relative)
    return written
