"""Topology parsing, pinning and fingerprints, against recorded sysfs trees."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tuner.errors import UserError
from tuner.machine import bandwidth as bandwidths
from tuner.machine import fingerprint as fingerprints
from tuner.machine import host as hosts
from tuner.machine import topology
from tuner.measurement import launch

SYSFS = Path(__file__).parent / "data" / "sysfs"
ONE_NODE = SYSFS / "one-node-2core"
FOUR_NODE = SYSFS / "two-socket-4node-smt"
KIB = 1024


@pytest.fixture(scope="module")
def big() -> topology.Topology:
    return topology.read_topology(FOUR_NODE)


@pytest.fixture(scope="module")
def small() -> topology.Topology:
    return topology.read_topology(ONE_NODE)


# ---------------------------------------------------------------- parsing


def test_four_node_tree_counts(big):
    assert big.cpu_model == "AMD EPYC 7313 16-Core Processor"
    assert big.logical_cpus == 64
    assert big.physical_cores == 32
    assert big.threads_per_core == 2 and big.has_smt
    assert "avx2" in big.cpu_flags and "avx512f" not in big.cpu_flags
    assert [node.id for node in big.nodes] == [0, 1, 2, 3]


def test_four_node_tree_siblings_and_packages(big):
    assert big.smt_siblings[0] == (0, 32)
    assert all(group == (i, i + 32) for i, group in enumerate(big.smt_siblings))
    by_id = {cpu.id: cpu for cpu in big.cpus}
    # core_id repeats across packages: cpu 16 is core 0 of the second package.
    assert (by_id[16].package, by_id[16].core) == (1, 0)
    assert (by_id[0].package, by_id[0].core) == (0, 0)
    assert by_id[40].node == 1 and by_id[63].node == 3


def test_four_node_tree_node_cpus_and_memory(big):
    node2 = big.node(2)
    assert node2.cpus == tuple(range(16, 24)) + tuple(range(48, 56))
    assert node2.mem_total_bytes == 66060348 * KIB
    assert node2.mem_free_bytes == 64120036 * KIB
    assert big.mem_total_bytes == sum(node.mem_total_bytes for node in big.nodes)
    assert big.mem_available_bytes > sum(node.mem_free_bytes for node in big.nodes)
    with pytest.raises(UserError, match="nodes: 0, 1, 2, 3"):
        big.node(7)


def test_one_node_tree(small):
    assert small.logical_cpus == 2 and small.physical_cores == 2
    assert not small.has_smt
    assert small.smt_siblings == ((0,), (1,))
    assert len(small.nodes) == 1 and small.nodes[0].cpus == (0, 1)
    assert small.nodes[0].mem_total_bytes > 0
    assert small.mem_total_bytes >= small.mem_available_bytes > 0


def test_machine_without_node_directory_is_one_implicit_node(tmp_path, small):
    shutil.copytree(ONE_NODE, tmp_path / "root")
    shutil.rmtree(tmp_path / "root" / topology.SYS_NODE)
    topo = topology.read_topology(tmp_path / "root")
    (node,) = topo.nodes
    assert node.cpus == (0, 1)
    assert node.mem_total_bytes == small.mem_total_bytes  # taken from /proc/meminfo
    assert all(cpu.node == 0 for cpu in topo.cpus)


def test_offline_cpus_are_left_out(tmp_path):
    shutil.copytree(FOUR_NODE, tmp_path / "root")
    (tmp_path / "root" / topology.SYS_CPU / "online").write_text("0-32,34-63\n")
    topo = topology.read_topology(tmp_path / "root")
    assert topo.logical_cpus == 63
    assert topo.smt_siblings[1] == (1,)  # cpu 33, sibling of cpu 1, is offline
    assert 33 not in topo.node(0).cpus


def test_empty_root_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no CPUs found"):
        topology.read_topology(tmp_path)


def test_live_machine_parses():
    topo = topology.read_topology()
    assert topo.logical_cpus >= 1 and topo.physical_cores >= 1
    assert sum(len(node.cpus) for node in topo.nodes) == topo.logical_cpus


def test_recorder_round_trips(tmp_path, big):
    written = topology.record_sysfs(tmp_path, FOUR_NODE)
    assert topology.PROC_CPUINFO in written
    assert topology.read_topology(tmp_path) == big
    governor = tmp_path / topology.SYS_CPU / "cpu40" / topology.CPU_GOVERNOR_FILE
    assert governor.read_text() == "performance\n"


# ---------------------------------------------------------------- pinning


def test_physical_core_order_big(big):
    order = launch.physical_core_order(big)
    assert order == list(range(32))  # one lowest sibling per core, node by node
    assert launch.physical_core_order(big, node=1) == list(range(8, 16))


def test_physical_core_order_small(small):
    assert launch.physical_core_order(small) == [0, 1]
    assert launch.physical_core_order(small, node=0) == [0, 1]


def test_cpus_for_threads_uses_physical_cores_first(big):
    assert launch.cpus_for_threads(big, 4) == [0, 1, 2, 3]
    assert launch.cpus_for_threads(big, 32) == list(range(32))
    with_smt = launch.cpus_for_threads(big, 34, allow_smt=True)
    assert with_smt[:32] == list(range(32)) and with_smt[32:] == [32, 33]


def test_cpus_for_threads_on_one_node(big):
    assert launch.cpus_for_threads(big, 3, node=2) == [16, 17, 18]
    assert launch.cpus_for_threads(big, 10, node=2, allow_smt=True) == list(range(16, 24)) + [48, 49]
    with pytest.raises(UserError, match="NUMA node 2 has 8 physical cores"):
        launch.cpus_for_threads(big, 9, node=2)
    with pytest.raises(UserError, match="does not exist"):
        launch.cpus_for_threads(big, 1, node=4)


def test_cpus_for_threads_refuses_too_many(big, small):
    with pytest.raises(UserError, match="has 32 physical cores"):
        launch.cpus_for_threads(big, 33)
    with pytest.raises(UserError, match="has 64 logical CPUs"):
        launch.cpus_for_threads(big, 65, allow_smt=True)
    with pytest.raises(UserError, match="has 2 physical cores"):
        launch.cpus_for_threads(small, 3)
    with pytest.raises(UserError, match="has 2 logical CPUs"):
        launch.cpus_for_threads(small, 3, allow_smt=True)  # no siblings to fall back on
    with pytest.raises(UserError, match="at least 1"):
        launch.cpus_for_threads(small, 0)


def test_numa_policies(big, small):
    assert launch.meaningful_numa_policies(small) == ["none"]
    assert launch.meaningful_numa_policies(big) == ["none", "interleave", "bind", "distribute", "isolate"]


# ---------------------------------------------------------------- cpu lists


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        ([0, 1, 2, 5], "0-2,5"),
        ([], ""),
        ([7], "7"),
        ([0, 2, 4], "0,2,4"),
        (list(range(8)) + list(range(32, 40)), "0-7,32-39"),
    ],
)
def test_cpu_list_round_trip(cpus, text):
    assert topology.format_cpu_list(cpus) == text
    assert topology.parse_cpu_list(text) == cpus


def test_cpu_list_parsing_edge_cases():
    assert topology.parse_cpu_list("0-3\n") == [0, 1, 2, 3]
    assert topology.format_cpu_list([3, 1, 2, 2]) == "1-3"
    for bad in ("a-b", "3-1", "1,,x"):
        with pytest.raises(UserError, match="bad CPU list"):
            topology.parse_cpu_list(bad)


# ---------------------------------------------------------------- host state


def test_host_state_from_recorded_tree(big):
    host = hosts.read_host_state(big, FOUR_NODE)
    assert host.thp_mode == "never"
    assert hosts.summarize_governors(host.governors) == {"performance": "32-63", "powersave": "0-31"}
    assert host.load == hosts.LoadAverage(0.48, 0.61, 0.57)
    assert host.affinity is None and host.hostname is None  # not the live machine


def test_host_state_tolerates_missing_files(tmp_path, small):
    host = hosts.read_host_state(small, tmp_path)
    assert host.thp_mode is None and host.governors == {} and host.load is None


def test_live_affinity_is_within_online_cpus():
    topo = topology.read_topology()
    affinity = hosts.current_affinity()
    assert affinity and set(affinity) <= {cpu.id for cpu in topo.cpus}


@pytest.mark.parametrize(
    ("seconds", "readings", "best_s"),
    [
        # the deadline (0 + 5) passes during the first copy: still three copies, the best one counts
        (5.0, [0, 10, 13, 20, 21, 30, 32, 99], 1.0),
        # more copies while the deadline (0 + 50) has not passed
        (50.0, [0, 10, 13, 20, 21, 30, 32, 40, 41, 41.5, 60], 0.5),
    ],
)
def test_memory_bandwidth_is_bytes_read_and_written_over_the_best_copy(seconds, readings, best_s):
    clock = iter(readings)
    bandwidth = bandwidths.measure_memory_bandwidth(
        seconds=seconds, size_bytes=8 * KIB, clock=lambda: next(clock)
    )
    assert bandwidth == 2 * 8 * KIB / best_s
    assert next(clock, None) is None  # read exactly as scripted: no copy more, none fewer


def test_a_study_fingerprint_probes_bandwidth_unless_given_a_figure(tmp_path, monkeypatch):
    from fake_llama_server import write_study

    from tuner.prepare import prepare
    from tuner.studyfile.spec import load_spec

    spec = load_spec(write_study(tmp_path, f"sqlite:///{tmp_path / 'studies.db'}"))
    curve = bandwidths.BandwidthCurve({1: 6e9, 2: 14e9, 4: 12.5e9})
    monkeypatch.setattr(bandwidths, "probe_bandwidth_curve", lambda cores: curve)
    monkeypatch.delenv(bandwidths.BANDWIDTH_ENV)
    fp = prepare(spec).fingerprint
    assert fp["bandwidth_bytes_per_s"] == 12.5e9  # the curve's figure at all cores: one probe, not two
    assert fp["bandwidth_by_threads"] == {"1": 6e9, "2": 14e9, "4": 12.5e9}
    monkeypatch.setenv(bandwidths.BANDWIDTH_ENV, "3.5e10")  # a figure given: no probe (conftest gives one)
    fp = prepare(spec).fingerprint
    assert fp["bandwidth_bytes_per_s"] == 3.5e10 and fp["bandwidth_by_threads"] is None
    for bad in ("fast", "0", "nan"):
        monkeypatch.setenv(bandwidths.BANDWIDTH_ENV, bad)
        with pytest.raises(UserError, match=f"TUNER_MEMORY_BANDWIDTH='{bad}': expected bytes per second"):
            prepare(spec)


# ---------------------------------------------------------------- fingerprint

MANIFEST = {"commit": "0c1e570", "build_number": 1, "cmake_flags": ["-DCMAKE_BUILD_TYPE=Release"]}


def test_fingerprint_is_json_and_has_every_key(big):
    host = hosts.read_host_state(big, FOUR_NODE)
    fp = fingerprints.fingerprint(big, MANIFEST, host, bandwidth_bytes_per_s=1.5e10)
    assert json.loads(json.dumps(fp)) == fp
    assert set(fingerprints.COMPARABILITY_KEYS) <= set(fp)
    assert fp["numa_nodes"] == ["0-7,32-39", "8-15,40-47", "16-23,48-55", "24-31,56-63"]
    assert fp["memory_gib"] == 252
    assert fp["llama_commit"] == "0c1e570"
    assert fp["governors"] == {"performance": "32-63", "powersave": "0-31"}


def test_key_field_change_is_a_mismatch(big, small):
    study = fingerprints.fingerprint(big, MANIFEST)
    assert fingerprints.compare_fingerprints(study, fingerprints.fingerprint(big, MANIFEST)) == []
    other_build = fingerprints.fingerprint(big, {**MANIFEST, "commit": "deadbee"})
    (message,) = fingerprints.compare_fingerprints(study, other_build)
    assert "llama_commit" in message and "0c1e570" in message and "deadbee" in message
    mismatched = fingerprints.compare_fingerprints(study, fingerprints.fingerprint(small, MANIFEST))
    assert {m.split()[0] for m in mismatched} == {
        "cpu_model",
        "logical_cpus",
        "physical_cores",
        "numa_nodes",
        "memory_gib",
    }


def test_provenance_change_is_not_a_mismatch(big, tmp_path):
    study = fingerprints.fingerprint(big, MANIFEST, hosts.read_host_state(big, FOUR_NODE), 1e10)
    shutil.copytree(FOUR_NODE, tmp_path / "root")
    (tmp_path / "root" / topology.PROC_LOADAVG).write_text("31.50 30.00 12.00 40/1734 982211\n")
    (tmp_path / "root" / topology.THP_ENABLED).write_text("[always] madvise never\n")
    topo = topology.read_topology(tmp_path / "root")
    later = fingerprints.fingerprint(topo, MANIFEST, hosts.read_host_state(topo, tmp_path / "root"), 2e10)
    assert later["load_avg"] != study["load_avg"] and later["thp_mode"] == "always"
    assert fingerprints.compare_fingerprints(study, later) == []
