"""A warm start from earlier studies in the same storage: what they found, as a prior for a new one.

Why: threads and NUMA placement are properties of the host (memory channels, nodes, SMT), so
the best pair an earlier study found on the same machine is the first hardware worth trying
for any model there; an earlier study of the same target on the same machine also gives a
whole configuration to try right after the baseline, when it measured the same workload (the
best K depends on the content: a code study's K is wrong for prose). Trying them costs a trial each and can
save the hardware stage's probes (``tuner.search.stages.hardware``); a prior that loses to the
baseline's hardware is simply outvoted by the measurements.

"The same machine" is the fingerprint's machine keys (CPU model, logical CPUs, physical cores,
NUMA layout, memory), not the llama.cpp build: a rebuild does not move the best thread count.
"The same target" is the model's content identity (``tuner.storage.records.model_identity``), "the same
workload" the digest of the prompt texts. Of several earlier studies, one of the same target
and workload wins, then one of the same target, then another model's; then the newest.
Values the new study's space does not admit are dropped (a draft it does not have, a thread
count outside its range); the prior is stored once, when the study is created, so every
worker plans from the same one.
"""

from __future__ import annotations

from typing import Any

from tuner.search.space import ResolvedSpace, outside
from tuner.storage import store
from tuner.storage.records import StudyRecord, TrialRecord, WarmStartPrior, model_identity

MACHINE_KEYS = ("cpu_model", "logical_cpus", "physical_cores", "numa_nodes", "memory_gib")
HW_KNOBS = ("numa", "numa_node", "threads")


def same_machine(one: StudyRecord, other: StudyRecord) -> bool:
    return bool(one.fingerprint) and all(
        one.fingerprint.get(k) == other.fingerprint.get(k) for k in MACHINE_KEYS
    )


def admitted(params: dict[str, Any], space: ResolvedSpace) -> dict[str, Any]:
    """The params whose values the space admits (numa_node only under bind)."""
    kept = {k: v for k, v in params.items() if k in space.domains and outside(space.domains[k], v) is None}
    if kept.get("numa") != "bind":
        kept.pop("numa_node", None)
    return kept


def choose(
    record: StudyRecord, space: ResolvedSpace, winners: list[tuple[str, StudyRecord, TrialRecord, dict]]
) -> WarmStartPrior | None:
    """The prior for a new study (``record``, ``space``) from earlier studies' winners, as stored."""
    mine = [w for w in winners if same_machine(w[1], record)]
    if not mine:
        return None
    target, workload = model_identity(record.target), record.workload.get("digest")

    def likeness(entry) -> tuple[bool, bool]:
        same = model_identity(entry[1].target) == target
        return same and entry[1].workload.get("digest") == workload, same

    mine.sort(key=likeness)  # stable: the likest last, and the newest of those last
    name, earlier, winner, params = mine[-1]
    same_workload, same_target = likeness(mine[-1])
    hardware = {k: v for k, v in admitted(params, space).items() if k in HW_KNOBS}
    whole = admitted(params, space) if same_workload else {}
    config = whole if whole.keys() == {k for k in params if k in space.domains or k == "numa_node"} else None
    if not hardware and config is None:
        return None
    assert winner.metrics is not None, "an earlier study's winner is a measured trial"
    return {
        "study": name,
        "trial": winner.number,
        "tokens_per_second": winner.metrics.tokens_per_second,
        "same_target": same_target,
        "same_workload": same_workload,
        "hardware": hardware,
        "params": config,
    }


def find_prior(storage, record: StudyRecord, space: ResolvedSpace) -> WarmStartPrior | None:
    return choose(record, space, store.stored_winners(storage, exclude=record.name))


def describe_prior(prior: WarmStartPrior) -> str:
    what = (
        "the same target and workload"
        if prior.get("same_workload")
        else "the same target, another workload"
        if prior["same_target"]
        else "another model"
    )
    return f"study {prior['study']} (trial {prior['trial']}, {prior['tokens_per_second']:.1f} t/s, {what}, this host)"
