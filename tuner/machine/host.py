"""Host state: what may change between runs on the same machine (provenance, never a key).

THP mode, cpufreq governors, load, numactl, affinity, and each trial's hygiene (boost,
temperature, busy processes); the memory bandwidth probe is ``tuner.machine.bandwidth``.
Read under a ``root`` like ``tuner.machine.topology``.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tuner.machine.topology import (
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


# ---------------------------------------------------------------- per-trial hygiene

BUSY_CORES = 1.0  # other processes together using more than this many cores during a trial: a busy host
BUSY_SHARE = 0.25  # ...or, on a host of fewer than four CPUs, more than this share of them
LISTED_CORES = 0.25  # ...and those using more than this are named
BOOST_FILES = (
    Path("sys/devices/system/cpu/cpufreq/boost"),
    Path("sys/devices/system/cpu/intel_pstate/no_turbo"),
)


def read_boost(root: Path = LIVE_ROOT) -> bool | None:
    """CPU boost/turbo on (True), off (False), or unknown (None: most VMs)."""
    for relative in BOOST_FILES:
        text = read_text(Path(root), relative)
        if text is not None and text.strip() in ("0", "1"):
            on = text.strip() == "1"
            return (not on) if relative.name == "no_turbo" else on
    return None


def read_temperature_c(root: Path = LIVE_ROOT) -> float | None:
    """The hottest CPU-looking thermal zone or hwmon sensor in degrees C, None when there is none."""
    readings = []
    for zone in sorted(Path(root, "sys/class/thermal").glob("thermal_zone*")):
        kind = (read_text(zone, Path("type")) or "").strip().lower()
        value = read_text(zone, Path("temp"))
        if (
            value
            and value.strip().lstrip("-").isdigit()
            and any(k in kind for k in ("cpu", "x86", "pkg", "soc", "k10"))
        ):
            readings.append(int(value) / 1000)
    for sensor in sorted(Path(root, "sys/class/hwmon").glob("hwmon*/temp*_input")):
        value = read_text(sensor.parent, Path(sensor.name))
        if value and value.strip().isdigit():
            readings.append(int(value) / 1000)
    return max(readings) if readings else None


HOST_PID = -1  # the entry holding the whole host's busy CPU seconds (/proc/stat), no process's


def host_busy_seconds() -> float | None:
    """CPU seconds the whole host spent busy so far (all CPUs: /proc/stat's time but idle and iowait)."""
    text = read_text(LIVE_ROOT, Path("proc/stat"))
    if not text or not text.startswith("cpu "):
        return None
    fields = [int(x) for x in text.splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def cpu_seconds_by_process() -> dict[int, tuple[str, float]]:
    """pid -> (name, user + system CPU seconds so far), for every readable process; ``HOST_PID`` -> the host's
    busy seconds, which also count the processes that start and end between two snapshots (a build's compilers,
    a model generator's steps), which no pid shows."""
    tick = os.sysconf("SC_CLK_TCK")
    host = host_busy_seconds()
    out = {} if host is None else {HOST_PID: ("host", host)}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.find("(") + 1 : text.rfind(")")]
        fields = text[text.rfind(")") + 2 :].split()
        out[int(stat.parent.name)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def busy_processes(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], wall_s: float, ours: set[int]
) -> dict[str, float]:
    """CPU cores used between two snapshots by processes other than ``ours``: those above
    LISTED_CORES by name (``name[pid]``), and ``"all others"``, the total: the host's busy time less ours where
    both snapshots have it (processes that came and went count there), else the sum over the processes seen."""
    if wall_s <= 0:
        return {"all others": 0.0}
    busy: dict[str, float] = {}
    total = mine = 0.0

    def used(pid: int, name: str, seconds: float) -> float:
        return max(0.0, seconds - before.get(pid, (name, 0.0))[1]) / wall_s

    for pid, (name, seconds) in after.items():
        if pid == HOST_PID:
            continue
        cores = used(pid, name, seconds)
        if pid in ours:
            mine += cores
            continue
        total += cores
        if cores > LISTED_CORES:
            busy[f"{name}[{pid}]"] = round(cores, 2)
    if HOST_PID in before and HOST_PID in after:
        total = max(total, used(HOST_PID, *after[HOST_PID]) - mine)
    return {**busy, "all others": round(total, 2)}


def host_was_busy(host: dict) -> bool:
    """Other processes took more than ``BUSY_CORES`` (``BUSY_SHARE`` of a small host's CPUs): on two cores one
    other busy process takes a third of a two-thread trial's time and reads as a slower configuration."""
    limit = min(BUSY_CORES, BUSY_SHARE * (os.cpu_count() or 4))
    return (host.get("busy_processes") or {}).get("all others", 0.0) > limit


def busy_text(busy: dict[str, float]) -> str:
    """``host busy: NAME[PID], ...``: who made a launch's host busy, in words."""
    others = [name for name in busy if name != "all others"]
    return f"host busy: {', '.join(others) or 'many small processes'}"


def trial_host_state(topo: Topology, busy: dict[str, float]) -> dict:
    """What a trial records about its host: a busy host's figures are flagged, never silently kept."""
    load = read_load_average()
    return {
        "governors": summarize_governors(read_governors(LIVE_ROOT, (cpu.id for cpu in topo.cpus))),
        "boost": read_boost(),
        "thp_mode": read_thp_mode(),
        "load_avg_1m": load.one if load else None,
        "temperature_c": read_temperature_c(),
        "busy_processes": busy,
    }
