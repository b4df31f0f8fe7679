"""`tuner doctor` on recorded trees and on the live machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.machine import fingerprint as fingerprints
from tuner.machine import topology

SYSFS = Path(__file__).parent / "data" / "sysfs"
ONE_NODE = SYSFS / "one-node-2core"
FOUR_NODE = SYSFS / "two-socket-4node-smt"


@pytest.fixture
def no_numactl(tmp_path, monkeypatch):
    """A PATH without numactl, so the numactl advice does not depend on the machine."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def advice_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("ADVICE: ")]


def test_doctor_on_four_node_tree(capsys, no_numactl):
    assert main(["doctor", "--sysfs-root", str(FOUR_NODE)]) == 0
    out = capsys.readouterr().out
    assert "CPU: AMD EPYC 7313 16-Core Processor" in out
    assert "cores: 32 physical, 64 logical CPUs" in out
    assert "NUMA nodes: 4" in out
    assert "  node 3: CPUs 24-31,56-63, memory 63.0 GiB total, 61.0 GiB free" in out
    assert "NUMA policies worth trying: none, interleave, bind, distribute, isolate" in out
    advice = "\n".join(advice_lines(out))
    assert "governor powersave" in advice
    assert "transparent hugepages are off (never)" in advice
    assert "SMT is on (2 threads per core)" in advice
    assert "4 NUMA nodes but numactl is missing" in advice
    assert "load average" not in advice  # 0.48 on 32 cores is quiet
    assert "one NUMA node" not in advice


def test_doctor_on_one_node_tree(capsys, no_numactl):
    assert main(["doctor", "--sysfs-root", str(ONE_NODE)]) == 0
    out = capsys.readouterr().out
    assert "NUMA nodes: 1" in out
    assert "  node 0: CPUs 0-1," in out
    assert "SMT: off" in out
    assert "NUMA policies worth trying: none" in out
    advice = "\n".join(advice_lines(out))
    assert "one NUMA node: the NUMA knob collapses to `none`" in advice
    assert "load average 2.41 on 2 cores" in advice  # recorded while other work ran
    assert "numactl is missing" not in advice  # irrelevant with one node
    assert "SMT" not in advice and "governor" not in advice


def test_doctor_json_carries_fingerprint_and_advice(capsys):
    assert main(["doctor", "--json", "--sysfs-root", str(FOUR_NODE)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["comparability_keys"] == list(fingerprints.COMPARABILITY_KEYS)
    assert document["fingerprint"]["physical_cores"] == 32
    assert document["fingerprint"]["thp_mode"] == "never"
    assert len(document["topology"]["nodes"]) == 4
    assert any("SMT is on" in line for line in document["advice"])


def test_doctor_records_a_tree_it_can_read_back(tmp_path, capsys):
    dest = tmp_path / "recorded"
    assert main(["doctor", "--sysfs-root", str(FOUR_NODE), "--record-sysfs", str(dest)]) == 0
    assert "recorded" in capsys.readouterr().out
    assert topology.read_topology(dest) == topology.read_topology(FOUR_NODE)


def test_doctor_on_empty_root_is_a_one_line_error(tmp_path, capsys):
    assert main(["doctor", "--sysfs-root", str(tmp_path)]) == 2
    assert "no CPUs found" in capsys.readouterr().err


def test_doctor_on_live_machine(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    topo = topology.read_topology()
    assert f"cores: {topo.physical_cores} physical, {topo.logical_cpus} logical CPUs" in out
    assert "llama.cpp: " in out
    assert "CPU affinity of this process: " in out
