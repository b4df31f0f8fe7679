"""``prepare``: everything a study needs, checked before anything is written or launched."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from tuner.errors import UserError
from tuner.machine.bandwidth import fingerprint_bandwidth
from tuner.machine.fingerprint import fingerprint
from tuner.machine.host import numactl_path, read_host_state
from tuner.machine.llama_build import binary, build_label, find_build_info, resolve_bin_dir
from tuner.machine.topology import read_topology
from tuner.measurement.launch import LaunchContext
from tuner.paths import inside, storage_dir
from tuner.prepare.context import StudyContext
from tuner.prepare.fitted_space import check_launchable, check_models_and_space, max_slots
from tuner.prepare.loaded_workload import chat_template, check_prompts_fit, study_workload
from tuner.prepare.models import make_target_variants, make_variants
from tuner.progress import Progress
from tuner.storage.records import StudyRecord, changes
from tuner.studyfile.spec import StudySpec, load_spec


def prepare(spec: StudySpec, progress: Progress | None = None) -> StudyContext:
    """Check everything a study needs before anything is written or launched; its notes to ``progress``
    (default: stderr, as they are)."""
    progress = Progress.untimed(_to_stderr) if progress is None else progress
    topo = read_topology()
    numactl = numactl_path()
    bin_dir = resolve_bin_dir(spec.bin_dir)
    quantized = make_variants(spec, bin_dir, progress)
    variants = make_target_variants(spec, bin_dir, progress)
    workload = study_workload(spec)
    target, drafts, space = check_models_and_space(
        spec, topo, numactl, {name: v.path for name, v in quantized.items()}, workload
    )
    server = binary("llama-server", bin_dir)
    build = find_build_info(bin_dir)
    template = chat_template(spec, target, workload)
    check_prompts_fit(spec, workload, bin_dir, progress, max_slots(spec, space), template)
    launch = LaunchContext(
        server_binary=server,
        target=spec.target.resolve(),
        drafts={name: info.path.resolve() for name, info in drafts.items()},
        expert_override_key=target.expert_override_key,
        topology=topo,
        numactl=numactl,
        ctx_size=spec.measurement.ctx_size,
        allow_smt=spec.space.allow_smt,
        extra_args=spec.extra_args,
        slots=max(spec.measurement.concurrency),
        chat_template=spec.chat_template.resolve() if spec.chat_template and workload.chat else None,
        chat=workload.chat,
        target_variants={name: v.variant.path.resolve() for name, v in variants.items()},
        server_flags=frozenset(build["server_flags"]),
        build=build_label(build),
    )
    check_launchable(space, launch)
    bandwidth, curve = fingerprint_bandwidth(topo.physical_cores)
    return StudyContext(
        spec=spec,
        target=target,
        drafts=drafts,
        space=space,
        launch=launch,
        workload=workload,
        # the bandwidth and its curve are provenance (roofline, threads), not comparability keys
        fingerprint=fingerprint(topo, build, read_host_state(topo), bandwidth, curve),
        build=build,
        log_dir=inside(storage_dir() / "logs", spec.name, "study"),
        quantized=quantized,
        target_variants=variants,
    )


def prepare_again(
    record: StudyRecord,
    command: str = "export",
    instead: str = " or pass --no-race",
    ignore: tuple[str, ...] = ("search space", "measurement of a lookup that remembers"),
    bin_dir: Path | None = None,
) -> StudyContext:
    """A stored study prepared again from its study file (with ``bin_dir``: on that llama.cpp build), for a race
    that re-measures it; refused if what it measures changed since (``ignore``: the comparability fields that may
    differ, by default the space and how a lookup that remembers is measured: a race launches every finalist
    afresh, the current way; ``instead``: the way out, ``command``: who asks)."""
    spec_path = Path(record.spec_path)
    if not spec_path.is_file():
        raise UserError(
            f"study {record.name!r}: its study file {spec_path} is not here, so its workload "
            f"cannot be re-run; {command} on the study's host{instead}"
        )
    spec = load_spec(spec_path)
    ctx = prepare(spec if bin_dir is None else replace(spec, bin_dir=bin_dir))
    changed = changes(record, ctx.study_record(record.created_by), ignore=ignore)
    if changed:
        raise UserError(
            f"{spec_path}: {changed[0]}: a re-measure now would not compare with the study's figures; "
            f"revert the change{instead.replace(' or', ', or', 1)}"
        )
    return ctx


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)
