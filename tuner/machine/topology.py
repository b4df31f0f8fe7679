"""Machine topology: CPUs, physical cores, SMT siblings, NUMA nodes and memory.

Read from sysfs and procfs under a ``root`` directory so that tests (and users
reporting a bug) can pass a recorded tree instead of the live machine; see
``record_sysfs``. What changes between runs on one machine is ``tuner.machine.host``'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import UserError

LIVE_ROOT = Path("/")

# Paths relative to the root, shared by the readers (here and in tuner.machine.host) and by ``record_sysfs``.
SYS_CPU = Path("sys/devices/system/cpu")
SYS_NODE = Path("sys/devices/system/node")
PROC_CPUINFO = Path("proc/cpuinfo")
PROC_MEMINFO = Path("proc/meminfo")
PROC_LOADAVG = Path("proc/loadavg")
THP_ENABLED = Path("sys/kernel/mm/transparent_hugepage/enabled")
CPU_TOPOLOGY_FILES = ("physical_package_id", "core_id", "thread_siblings_list")
CPU_GOVERNOR_FILE = Path("cpufreq/scaling_governor")
NODE_FILES = ("cpulist", "meminfo")


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


def read_text(root: Path, relative: Path) -> str | None:
    """A file's text, or None when it is missing or unreadable (tolerant by design)."""
    try:
        return (root / relative).read_text()
    except OSError:
        return None


def _read_int(root: Path, relative: Path) -> int | None:
    text = read_text(root, relative)
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
        (fields[k] for k in ("model name", "Model", "Hardware", "cpu model") if fields.get(k)), "unknown"
    )
    flags = fields.get("flags") or fields.get("Features") or ""
    return model, tuple(sorted(set(flags.split())))


def _online_cpus(root: Path) -> list[int]:
    online = read_text(root, SYS_CPU / "online")
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

    model, flags = _parse_cpuinfo(read_text(root, PROC_CPUINFO) or "")
    meminfo = _parse_meminfo(read_text(root, PROC_MEMINFO) or "")

    nodes: list[NumaNode] = []
    for node_id in _node_ids(root):
        node_dir = SYS_NODE / f"node{node_id}"
        node_cpus = [
            c for c in parse_cpu_list(read_text(root, node_dir / "cpulist") or "") if c in online_set
        ]
        node_mem = _parse_meminfo(read_text(root, node_dir / "meminfo") or "")
        nodes.append(NumaNode(node_id, tuple(node_cpus), node_mem.get("MemTotal"), node_mem.get("MemFree")))
    if not nodes:
        nodes.append(NumaNode(0, tuple(online), meminfo.get("MemTotal"), meminfo.get("MemFree")))
    node_of = {cpu: node.id for node in nodes for cpu in node.cpus}

    cpus: list[Cpu] = []
    groups: set[tuple[int, ...]] = set()
    for cpu_id in online:
        topo_dir = SYS_CPU / f"cpu{cpu_id}" / "topology"
        package = _read_int(root, topo_dir / "physical_package_id")
        core = _read_int(root, topo_dir / "core_id")
        siblings_text = read_text(root, topo_dir / "thread_siblings_list")
        siblings = parse_cpu_list(siblings_text) if siblings_text is not None else [cpu_id]
        groups.add(tuple(c for c in siblings if c in online_set) or (cpu_id,))
        cpus.append(
            Cpu(
                id=cpu_id,
                package=package if package is not None else 0,
                core=core if core is not None else cpu_id,
                node=node_of.get(cpu_id, nodes[0].id),
            )
        )

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
        text = read_text(root, relative)
        if text is None:
            continue
        if relative == PROC_CPUINFO:
            text = text.lstrip("\n").split("\n\n", 1)[0] + "\n"
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        written.append(relative)
    return written
