"""NUMA-true placement: a trial's weights sit where its own NUMA policy put them.

Why: llama.cpp mmaps the GGUF, so the weights live in the page cache, on whichever node
first read them. A trial under ``numactl --interleave=all`` launched right after one
under ``--membind=0`` would decode from pages the earlier trial placed on node 0: the
policy being measured would not be the one in force.

Choice: before a trial whose NUMA policy differs from the previous trial's, the model
files' pages are evicted from the page cache with ``posix_fadvise(POSIX_FADV_DONTNEED)``
(no root needed; it drops clean pages no process has mapped, and no tuner-started
server is alive between trials), so the next launch reads them again under its own
policy. The cost is one cold read of the models per policy change (seconds per GB from
disk, at most once per trial); nothing extra stays in memory, unlike ``--no-mmap``,
which would copy the weights into each server's anonymous memory (a second copy for the
length of the trial) and slow every launch.

After the workload, ``/proc/PID/numa_maps`` of the server says how many of each model
file's mapped pages sit on each node; a placement that contradicts the policy (bind to
node N with most pages elsewhere, interleave with nearly all pages on one node of
several) is flagged on the trial.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
from collections.abc import Set
from pathlib import Path

from tuner.machine.topology import format_cpu_list, parse_cpu_list

PAGE = mmap.PAGESIZE
NODE_FIELD = re.compile(r"\bN(\d+)=(\d+)")
BIND_TOLERANCE = 0.10  # a bound trial may have this share of its pages elsewhere (shared libraries aside)
INTERLEAVE_MAX_SHARE = 0.90  # an interleaved trial with more than this on one node was not interleaved


def evict(paths: list[Path]) -> None:
    """Drop the files' clean pages from the page cache (advice: the kernel may keep pages still mapped)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_fraction(path: Path) -> float:
    """Share of the file's pages in the page cache, from mincore(2) on a read-only mapping."""
    size = path.stat().st_size
    if size == 0:
        return 0.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    pages = (size + PAGE - 1) // PAGE
    with open(path, "rb") as fh:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fh.fileno(), 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            vector = ctypes.create_string_buffer(pages)
            if libc.mincore(address, size, vector) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            return sum(b & 1 for b in vector.raw) / pages
        finally:
            libc.munmap(address, size)


def parse_numa_maps(text: str, files: list[str]) -> dict[str, dict[int, int]]:
    """Pages per NUMA node of each of ``files`` (by path) in a ``/proc/PID/numa_maps`` text."""
    pages: dict[str, dict[int, int]] = {f: {} for f in files}
    for line in text.splitlines():
        match = re.search(r"\bfile=(\S+)", line)
        if not match or match.group(1) not in pages:
            continue
        by_node = pages[match.group(1)]
        for node, count in NODE_FIELD.findall(line):
            by_node[int(node)] = by_node.get(int(node), 0) + int(count)
    return pages


def read_numa_maps(pid: int, files: list[Path]) -> dict[str, dict[int, int]]:
    try:
        text = Path(f"/proc/{pid}/numa_maps").read_text()
    except OSError:
        return {}
    return parse_numa_maps(text, [str(f) for f in files])


# What /proc/PID/smaps_rollup says about a server's memory: resident, anonymous (weights read into memory
# with mmap off, the KV cache, buffers), in transparent huge pages (anonymous, and file pages mapped by
# PMD: a mapped GGUF in huge pages), and locked (mlock).
SMAPS_FIELDS = ("Rss", "Anonymous", "AnonHugePages", "FilePmdMapped", "Locked")


def parse_smaps_rollup(text: str) -> dict[str, int]:
    """SMAPS_FIELDS in kB from a ``smaps_rollup`` text (a field the kernel does not report is left out)."""
    found = dict(re.findall(r"^(\w+):\s+(\d+) kB", text, flags=re.MULTILINE))
    return {name: int(found[name]) for name in SMAPS_FIELDS if name in found}


def read_smaps_rollup(pid: int) -> dict[str, int]:
    """The server's memory by kind after its workload (which pages were huge); empty when unreadable."""
    try:
        return parse_smaps_rollup(Path(f"/proc/{pid}/smaps_rollup").read_text())
    except OSError:
        return {}


def contradiction(
    policy: str, node: int | None, pages: dict[str, dict[int, int]], n_nodes: int
) -> str | None:
    """Why the placement does not follow the policy, or None."""
    total: dict[int, int] = {}
    for by_node in pages.values():
        for node_id, count in by_node.items():
            total[node_id] = total.get(node_id, 0) + count
    count = sum(total.values())
    if not count or n_nodes < 2:
        return None
    if policy == "bind" and node is not None:
        elsewhere = (count - total.get(node, 0)) / count
        if elsewhere > BIND_TOLERANCE:
            return f"bound to node {node} but {elsewhere:.0%} of the model's pages sit on other nodes"
    if policy == "interleave":
        top_node, top = max(total.items(), key=lambda kv: kv[1])
        if top / count > INTERLEAVE_MAX_SHARE:
            return f"interleaved but {top / count:.0%} of the model's pages sit on node {top_node}"
    return None


def read_thread_cpus(pid: int) -> dict[int, frozenset[int]]:
    """Each thread of process ``pid`` and the CPUs the kernel lets it run on (``/proc/PID/task/TID/status``,
    ``Cpus_allowed_list``); empty when the process has gone, a thread that ended meanwhile left out."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return {}
    found = {}
    for task in tasks:
        try:
            text = (task / "status").read_text()
        except OSError:
            continue
        match = re.search(r"^Cpus_allowed_list:\s*(\S+)", text, flags=re.MULTILINE)
        if match and task.name.isdigit():
            found[int(task.name)] = frozenset(parse_cpu_list(match.group(1)))
    return found


def pinning_problem(asked: Set[int], threads: dict[int, frozenset[int]], compute: int) -> str | None:
    """Why a server's threads are not held to the CPUs its configuration asked for, or None: fewer of its threads
    held to them than it computes on (``compute``). llama.cpp pins only the threads that compute (with
    ``--cpu-mask``; numactl holds every thread), so its HTTP and logging threads may run anywhere; a build that
    ignores the mask (upstream once did, silently), or one compute thread it leaves unpinned, shows as fewer held
    threads, and its rate measures another placement than the one recorded."""
    held = sum(1 for cpus in threads.values() if cpus <= asked)
    if not asked or not threads or held >= compute:
        return None
    outside = frozenset().union(*(cpus - asked for cpus in threads.values()))
    return (
        f"{held} of {len(threads)} server threads held to the asked CPUs {format_cpu_list(asked)}, fewer than "
        f"its {compute} compute threads; the others may run on {format_cpu_list(outside)}"
    )
