"""``tuner doctor``: the machine fingerprint, and advice before measuring.

Like pyperf's system check, it never fails on a noisy machine: it says what will skew
the figures and how to fix it, and exits 0. ``--record-sysfs`` writes the topology
files of this machine so a user can send them for tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.errors import UserError
from tuner.machine import fingerprint as fingerprints
from tuner.machine import host as hosts
from tuner.machine import topology
from tuner.machine.bandwidth import BANDWIDTH_ENV, BandwidthCurve, fingerprint_bandwidth
from tuner.machine.host import HostState
from tuner.machine.topology import Topology
from tuner.measurement import launch

if TYPE_CHECKING:
    from tuner.storage.records import StudyRecord

NOISY_GOVERNORS = frozenset({"powersave", "ondemand", "conservative", "schedutil"})
LOAD_ADVICE_FRACTION = 0.10
NUMACTL_TIMEOUT_S = 10


def find_build() -> tuple[dict | None, str | None]:
    """The llama.cpp build manifest, or None and the reason it is unavailable."""
    try:
        from tuner.machine.llama_build import find_build_info
    except ImportError as err:
        return None, f"the build module is unavailable ({err})"
    try:
        return dict(find_build_info()), None
    except (UserError, OSError) as err:
        return None, str(err)


HOT_C = 85.0
BUSY_SAMPLE_S = 0.5


def advice(topo: Topology, host: HostState, build: dict | None, live: bool = False) -> list[str]:
    """Things that will skew or limit measurements; never a reason to stop."""
    lines = []
    noisy = sorted(set(host.governors.values()) & NOISY_GOVERNORS)
    if noisy:
        lines.append(
            f"cpufreq governor {'/'.join(noisy)}: clock speed follows load, expect noisy figures; "
            "set `performance` (cpupower frequency-set -g performance)"
        )
    if host.load is not None and host.load.one > LOAD_ADVICE_FRACTION * topo.physical_cores:
        lines.append(
            f"load average {host.load.one:.2f} on {topo.physical_cores} cores: "
            "other work is running and will skew measurements"
        )
    if host.thp_mode == "never":
        lines.append(
            "transparent hugepages are off (never): consider `madvise` or `always` "
            "(echo madvise > /sys/kernel/mm/transparent_hugepage/enabled) to cut TLB misses on big weights"
        )
    if topo.has_smt:
        lines.append(
            f"SMT is on ({topo.threads_per_core} threads per core): the tuner pins one thread per "
            "physical core first and never uses siblings unless asked"
        )
    if len(topo.nodes) > 1 and host.numactl is None:
        lines.append(
            f"{len(topo.nodes)} NUMA nodes but numactl is missing: install it (apt-get install numactl) "
            "so interleave/bind policies can be tried"
        )
    if len(topo.nodes) == 1:
        lines.append("one NUMA node: the NUMA knob collapses to `none`")
    online = tuple(cpu.id for cpu in topo.cpus)
    if host.affinity is not None and host.affinity != online:
        lines.append(
            f"this process may only run on CPUs {topology.format_cpu_list(host.affinity)} "
            "(taskset or cgroup limit): pinning outside them will fail"
        )
    if build is None:
        lines.append("llama.cpp is not built: run `make llama` before tuning")
    if live:
        lines += live_advice()
    return lines


def live_advice() -> list[str]:
    """This machine right now: boost, temperature, busy processes (not part of a recorded sysfs tree)."""
    lines = []
    if hosts.read_boost() is True:
        lines.append(
            "CPU boost/turbo is on: clocks depend on temperature and how many cores are busy, so figures "
            "drift; turn it off for tuning (echo 0 > /sys/devices/system/cpu/cpufreq/boost, or "
            "intel_pstate/no_turbo 1)"
        )
    temperature = hosts.read_temperature_c()
    if temperature is not None and temperature >= HOT_C:
        lines.append(
            f"CPU at {temperature:.0f} C: it may throttle during a study; let it cool or check its cooling"
        )
    before = hosts.cpu_seconds_by_process()
    time.sleep(BUSY_SAMPLE_S)
    busy = hosts.busy_processes(before, hosts.cpu_seconds_by_process(), BUSY_SAMPLE_S, {os.getpid()})
    if busy.get("all others", 0.0) > hosts.BUSY_CORES:
        named = (
            ", ".join(f"{k} ({v:g} cores)" for k, v in busy.items() if k != "all others") or "many small ones"
        )
        lines.append(
            f"other processes use {busy['all others']:g} cores right now ({named}): "
            "stop them, or every trial will be flagged as measured on a busy host"
        )
    return lines


HUGE_SHARE = 0.5  # a server with this share of its resident memory in huge pages got them


def thp_measured(study: str, hosts: list[dict], thp_now: str | None) -> list[str]:
    """Advice from what a study's trials recorded (``host``: THP's mode and the server's smaps_rollup after
    its workload): whether huge pages backed the servers' memory, and what would change it."""
    kib = [h["smaps_kib"] for h in hosts if h.get("smaps_kib", {}).get("Rss")]
    if not kib:
        return [
            f"study {study}: no trial recorded its server's memory (measured before the tuner recorded it)"
        ]
    modes = sorted({str(h.get("thp_mode")) for h in hosts if h.get("smaps_kib")})
    huge = [(k.get("AnonHugePages", 0) + k.get("FilePmdMapped", 0)) / k["Rss"] for k in kib]
    best = max(huge)
    said = f"study {study}: THP {'/'.join(modes)}, at most {best:.0%} of a server's memory in huge pages"
    if best >= HUGE_SHARE:
        return [f"{said} over {len(kib)} trial(s): huge pages backed the weights"]
    if "never" in modes or thp_now == "never":
        return [
            f"{said}: THP is off; `madvise` or `always` (/sys/kernel/mm/transparent_hugepage/enabled) can cut TLB misses"
        ]
    return [
        f"{said}: llama.cpp never asks for huge pages (madvise), so under THP `madvise` only the file system's "
        "large folios are huge (FilePmdMapped); THP `always` makes anonymous memory huge: the KV cache, and the "
        "weights with mmap: off (search mmap: [on, off] to measure it)"
    ]


def _measured_advice(
    study_name: str, storage: str | None, host: HostState, topo: Topology
) -> tuple[list[str], str]:
    """``--study``: THP advice tied to that study's trials, and the memory its largest configuration needs
    against what this host has."""
    from tuner.storage import store

    study, record = store.open_stored_study(study_name, storage)
    hosts = [r.host for r in store.read_trials(study) if r.host]
    return thp_measured(record.name, hosts, host.thp_mode), _memory_line(record, topo)


def _memory_line(record: StudyRecord, topo: Topology) -> str:
    """The study's largest configuration against this host's memory; its models not here: which one."""
    from tuner.models.memory_fit import available_bytes, misfit
    from tuner.prepare.memory import stored_largest

    try:
        size = stored_largest(record)
    except UserError as err:
        return f"memory: study {record.name}'s models cannot be read here ({err}), so its size is unknown"
    room = available_bytes(topo)
    text = f"memory: the largest configuration of study {record.name} needs {size.text()}"
    if why := misfit(size, topo):
        return f"{text}; DOES NOT FIT: {why}"
    return text + (f", {room / 1e9:.2f} GB available" if room else "")


def _gib(n_bytes: int | None) -> str:
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes is not None else "unknown"


def _siblings_text(topo: Topology, shown: int = 4) -> str:
    groups = [",".join(map(str, g)) for g in topo.smt_siblings if len(g) > 1]
    more = f" ... ({len(groups)} cores)" if len(groups) > shown else ""
    return " ".join(groups[:shown]) + more


def _build_text(build: dict | None, reason: str | None) -> list[str]:
    if build is None:
        return ["llama.cpp: not built (run `make llama`)", f"  why: {reason}"]
    lines = [
        f"llama.cpp: commit {build.get('commit')}, build {build.get('build_number')} ({build.get('source')})"
    ]
    lines += [
        f"  {key}: {build[key]}" for key in ("compiler", "target", "cmake_flags", "bin_dir") if build.get(key)
    ]
    return lines


def _numactl_hardware(numactl: str) -> str:
    try:
        done = subprocess.run(
            [numactl, "--hardware"], capture_output=True, text=True, timeout=NUMACTL_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"(numactl --hardware failed: {err})"
    return (done.stdout or done.stderr).rstrip()


def report(
    topo: Topology,
    host: HostState,
    build: dict | None,
    build_reason: str | None,
    bandwidth: float | None,
    live: bool,
    curve: BandwidthCurve | None = None,
) -> list[str]:
    """The machine as text, then the advice; the bandwidth and its curve where they were measured."""
    lines = [
        f"CPU: {topo.cpu_model}",
        f"cores: {topo.physical_cores} physical, {topo.logical_cpus} logical CPUs",
    ]
    if topo.has_smt:
        lines.append(f"SMT: {topo.threads_per_core} threads per core, siblings {_siblings_text(topo)}")
    else:
        lines.append("SMT: off (one logical CPU per core)")
    lines.append(f"NUMA nodes: {len(topo.nodes)}")
    for node in topo.nodes:
        lines.append(
            f"  node {node.id}: CPUs {topology.format_cpu_list(node.cpus) or '(none)'}, "
            f"memory {_gib(node.mem_total_bytes)} total, {_gib(node.mem_free_bytes)} free"
        )
    if live and host.numactl:
        lines += ["numactl --hardware:"] + [
            f"  {line}" for line in _numactl_hardware(host.numactl).splitlines()
        ]
    lines.append(f"memory: {_gib(topo.mem_total_bytes)} total, {_gib(topo.mem_available_bytes)} available")
    lines.append(f"transparent hugepages: {host.thp_mode or 'unknown'}")
    governors = hosts.summarize_governors(host.governors)
    lines.append(
        "cpufreq governor: "
        + (
            ", ".join(f"{name} (CPUs {cpus})" for name, cpus in governors.items())
            or "not exposed (VM or no cpufreq)"
        )
    )
    if host.load is not None:
        lines.append(
            f"load average: {host.load.one:.2f} {host.load.five:.2f} {host.load.fifteen:.2f} (1/5/15 min)"
        )
    else:
        lines.append("load average: unknown")
    if host.affinity is not None:
        lines.append(f"CPU affinity of this process: {topology.format_cpu_list(host.affinity)}")
    lines.append(f"numactl: {host.numactl or 'not found'}")
    lines += _build_text(build, build_reason)
    lines.append(f"NUMA policies worth trying: {', '.join(launch.meaningful_numa_policies(topo))}")
    lines += _bandwidth_lines(bandwidth, curve)
    if live:
        boost, temperature = hosts.read_boost(), hosts.read_temperature_c()
        lines.append(f"CPU boost: {'unknown (not exposed)' if boost is None else 'on' if boost else 'off'}")
        lines.append(
            f"CPU temperature: {'unknown (no sensor exposed)' if temperature is None else f'{temperature:.0f} C'}"
        )
    lines += [f"ADVICE: {line}" for line in advice(topo, host, build, live)]
    return lines


def _bandwidth_lines(bandwidth: float | None, curve: BandwidthCurve | None) -> list[str]:
    if bandwidth is None:
        return []
    if curve is None:
        return [f"memory bandwidth: {bandwidth / 1e9:.1f} GB/s (given in {BANDWIDTH_ENV}, not probed)"]
    return [
        curve.text(),
        f"  at all {max(curve.points)} cores: {bandwidth / 1e9:.1f} GB/s (STREAM-counted read + write; "
        "the roofline's bandwidth)",
    ]


def _probe(
    sysfs_root: Path, probe: bool | None, topo: Topology
) -> tuple[float | None, BandwidthCurve | None]:
    """The bandwidth by threads of this machine: probed by default on the live machine (a few seconds);
    a recorded tree is another machine, so only ``--bandwidth`` (``probe``) probes this one for it."""
    live = hosts.is_live_root(sysfs_root)
    if not (live if probe is None else probe):
        return None, None
    return fingerprint_bandwidth((topo if live else topology.read_topology()).physical_cores)


def record_topology(into: Path, root: Path) -> None:
    """``--record-sysfs``: copy the topology files this command reads from ``root`` into ``into``."""
    written = topology.record_sysfs(into, root)
    if not written:
        raise UserError(f"nothing to record under {root}: no sysfs/procfs files found")
    print(f"recorded {len(written)} files from {root} into {into}")


def print_doctor(
    root: Path, bandwidth_probe: bool | None, study: str | None, storage: str | None, as_json: bool
) -> None:
    """The fingerprint, host state and advice of the machine under ``root``, as text or JSON; with ``study``,
    THP advice tied to what its trials measured."""
    topo = topology.read_topology(root)
    host = hosts.read_host_state(topo, root)
    build, build_reason = find_build()
    bandwidth, curve = _probe(root, bandwidth_probe, topo)
    measured, memory = _measured_advice(study, storage, host, topo) if study else ([], "")
    if as_json:
        document = {
            "fingerprint": fingerprints.fingerprint(topo, build, host, bandwidth, curve),
            "comparability_keys": list(fingerprints.COMPARABILITY_KEYS),
            "topology": asdict(topo),
            "numa_policies": launch.meaningful_numa_policies(topo),
            "advice": advice(topo, host, build, hosts.is_live_root(root)) + measured,
            **({"memory": memory} if memory else {}),
        }
        print(json.dumps(document, indent=2))
        return
    lines = report(topo, host, build, build_reason, bandwidth, hosts.is_live_root(root), curve)
    lines += [memory] if memory else []
    lines += [f"ADVICE: {line}" for line in measured]
    print("\n".join(lines))
