"""The study's search space fitted to its target and this machine (``search.space.resolve_space``), its warm
starts checked against it, and the most server slots a trial launches with."""

from __future__ import annotations

from pathlib import Path

from tuner.errors import UserError
from tuner.knobs.config import Choices, FloatRange
from tuner.knobs.registry import KNOB_TYPES
from tuner.machine.topology import Topology
from tuner.measurement.launch import LaunchContext, build_server_command, meaningful_numa_policies
from tuner.measurement.workload import Workload
from tuner.models.gguf_info import ModelInfo
from tuner.prepare.models import check_models
from tuner.search.space import ResolvedSpace, SpaceHost, SpaceTarget, baseline_config, outside, resolve_space
from tuner.studyfile.spec import StudySpec
from tuner.studyfile.validate import Fields


def check_models_and_space(
    spec: StudySpec,
    topo: Topology,
    numactl: str | None,
    quantized: dict[str, Path] | None = None,
    workload: Workload | None = None,
) -> tuple[ModelInfo, dict[str, ModelInfo], ResolvedSpace]:
    """Read the GGUF headers, refuse incompatible drafts, fit the space to this machine.
    ``quantized``: the quantize variants' files by draft name (see ``make_variants``); ``workload``: whether
    its prompts are long (``long_prompts``) decides if prompt threads are searched apart."""
    target, drafts = check_models(spec, quantized)
    space = resolve_space(
        spec.space,
        fields=Fields(spec.path, {}),
        target=SpaceTarget(
            name=spec.target.name,
            drafts=tuple(drafts),
            expert_used_count=target.expert_used_count if target.is_moe else None,
            expert_count=target.expert_count,
            announced=target.speculative_types,
            quants=tuple(request.type for request in spec.target_quantize),
        ),
        host=SpaceHost(
            physical_cores=topo.physical_cores,
            logical_cpus=topo.logical_cpus,
            numa_policies=tuple(
                p for p in meaningful_numa_policies(topo) if numactl or p not in ("interleave", "bind")
            ),
            numa_nodes=tuple(n.id for n in topo.nodes),
        ),
        concurrency=spec.measurement.concurrency,
        long_prompts=long_prompts(spec, workload),
    )
    check_warm_starts(spec, space)
    return target, drafts, space


def long_prompts(spec: StudySpec, workload: Workload | None) -> str | None:
    """Why the study's prompts are long enough for prompt processing to matter, or None: a bound on time to
    first token, or conversations (each turn's prompt carries the earlier ones; imported logs are these)."""
    ttft = [c.name for c in spec.constraints if "ttft" in c.name] + [
        o.metric for o in spec.objectives if "ttft" in o.metric
    ]
    if ttft:
        return f"the study bounds time to first token: {ttft[0]}"
    if workload is not None and workload.chat:
        return "the workload holds conversations: each turn's prompt carries the earlier turns"
    return None


def check_warm_starts(spec: StudySpec, space: ResolvedSpace) -> None:
    """Every warm-start value lies in the resolved space, or one line names the entry and knob."""
    for index, item in enumerate(spec.warm_start):
        for knob, value in item.items():
            where = f"{spec.path}: warm_start[{index}].{knob}"
            if knob not in KNOB_TYPES and knob != "numa_node":
                raise UserError(f"{where}: unknown knob; known: {', '.join(KNOB_TYPES)}")
            domain = space.domains.get(knob)
            if domain is None:
                raise UserError(
                    f"{where}: not searched by this study on this machine (resolved space: "
                    f"{', '.join(space.domains)}); remove it from the warm start"
                )
            problem = outside(domain, value)
            if problem:
                raise UserError(
                    f"{where}: {value!r} {problem}; use a value of the resolved space "
                    "(`tuner run STUDY --check` prints it)"
                )


def max_slots(spec: StudySpec, space: ResolvedSpace) -> int:
    """The most server slots a trial launches with: ctx_size is split among them."""
    parallel = space.domains.get("parallel")
    assert not isinstance(parallel, FloatRange), "slots are counted in whole numbers"
    top = (max(parallel.values) if isinstance(parallel, Choices) else parallel.high) if parallel else 1
    return max(top, *spec.measurement.concurrency)


def check_launchable(space: ResolvedSpace, launch: LaunchContext) -> None:
    """The baseline's command built on this build before anything runs: a flag of ours the build's ``--help`` does
    not list is one line now (``measurement.launch.for_build``), not mid-study."""
    build_server_command(baseline_config(space), launch)
