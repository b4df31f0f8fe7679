"""What a study needs before anything is written or launched, checked once: ``prepare``.

Reads the models' GGUF headers, refuses incompatible drafts, resolves the search space
for this machine, loads the workload, finds the llama.cpp build and takes the
fingerprint. Study runs, the grid recorder and the benchmarks all start here.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tuner import eta
from tuner.decisions.per_type import type_rounds
from tuner.decisions.race import DECISION_ROUNDS
from tuner.errors import MissingBinaryError, UserError
from tuner.knobs.config import Choices, Domain, FloatRange, IntRange
from tuner.knobs.registry import KNOB_TYPES, NAMES
from tuner.machine.bandwidth import PLANNER_SHARE, bandwidth_saturation, curve_of, fingerprint_bandwidth
from tuner.machine.fingerprint import Fingerprint, fingerprint
from tuner.machine.host import numactl_path, read_host_state
from tuner.machine.llama_build import binary, find_build_info, resolve_bin_dir
from tuner.machine.roofline import Bandwidth, study_roofline
from tuner.machine.topology import Topology, read_topology
from tuner.measurement.launch import LaunchContext, meaningful_numa_policies
from tuner.measurement.measure import MeasurementSettings
from tuner.measurement.workload import (
    BUILTIN_CHAT_TEMPLATES,
    TOKENS_PER_BYTE_SLACK,
    Workload,
    llama_tokenize_count,
    load_workload,
    restrict,
    split,
    too_long,
)
from tuner.models.gguf_info import ModelInfo, check_draft_compatibility, read_model_info
from tuner.models.quantize import Variant, ensure_variant
from tuner.paths import inside, storage_dir
from tuner.progress import Progress
from tuner.search.space import ResolvedSpace, SpaceHost, SpaceTarget, baseline_config, outside, resolve_space
from tuner.search.stages.configs import KnobValues
from tuner.search.stages.hardware import walk_text
from tuner.storage.records import StudyRecord
from tuner.studyfile.spec import StudySpec
from tuner.studyfile.validate import Fields


@dataclass(frozen=True)
class StudyContext:
    """Everything fixed for the lifetime of one study run on this host."""

    spec: StudySpec
    target: ModelInfo
    drafts: dict[str, ModelInfo]
    space: ResolvedSpace
    launch: LaunchContext
    workload: Workload
    fingerprint: Fingerprint
    build: dict
    log_dir: Path
    quantized: dict[str, Variant] | None = None  # draft name -> variant made by llama-quantize

    @property
    def settings(self) -> MeasurementSettings:
        return self.spec.measurement

    def study_record(self, created_by: str) -> StudyRecord:
        """What this run would store for a new study, and compare against a stored one."""
        spec = self.spec
        return StudyRecord(
            name=spec.name,
            created_by=created_by,
            fingerprint=self.fingerprint,
            build=self.build,
            target=self.target.to_dict(),
            drafts={name: info.to_dict() for name, info in self.drafts.items()},
            space=self.space.as_dict(),
            space_digest=self.space.digest(),
            space_notes=tuple(self.space.notes),
            objectives=tuple(o.metric for o in spec.objectives),
            quality=quality_record(spec),
            spec_path=str(spec.path.resolve()),
            workload=workload_record(spec, self.workload),
            measurement=self.settings.comparability(),
            quantized_drafts={name: v.provenance for name, v in (self.quantized or {}).items()},
        )


def workload_record(spec: StudySpec, workload: Workload) -> dict:
    """The workload as stored: prompts and digest and, only for a study of several users or load bounds,
    the concurrency levels and the bounds (so a study of one user stores what it always stored)."""
    record: dict[str, Any] = {"prompts": [p.id for p in workload.prompts], "digest": workload.digest()}
    if spec.load_levels:
        record["concurrency"] = list(spec.load_levels)
    if spec.constraints:
        record["constraints"] = {c.name: c.limit for c in spec.constraints}
    return record


def quality_record(spec: StudySpec) -> dict:
    """The scorer as stored: name, floor and, for kld/perplexity, the ceiling and the text's digest."""
    quality = spec.quality
    record = {"scorer": quality.scorer, "floor": quality.floor}
    if quality.max_kld is not None:
        record["max_kld"] = quality.max_kld
    if quality.text_file is not None:
        record["text_digest"] = hashlib.sha256(quality.text_file.read_bytes()).hexdigest()[:16]
    return record


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
    target = read_model_info(spec.target)
    drafts: dict[str, ModelInfo] = {}
    named = [(f"drafts[{i}]", path.stem, path) for i, path in enumerate(spec.drafts)]
    named += [(f"drafts (quantize {name})", name, path) for name, path in (quantized or {}).items()]
    for where, name, path in named:
        info = read_model_info(path)
        compat = check_draft_compatibility(target, info)
        if not compat.ok:
            raise UserError(
                f"{spec.path}: {where}: {path.name} cannot draft for {spec.target.name} "
                f"({'; '.join(compat.reasons)}); remove it from drafts"
            )
        drafts[name] = info
    space = resolve_space(
        spec.space,
        fields=Fields(spec.path, {}),
        target=SpaceTarget(
            name=spec.target.name,
            drafts=tuple(drafts),
            expert_used_count=target.expert_used_count if target.is_moe else None,
            expert_count=target.expert_count,
            announced=target.speculative_types,
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


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def make_variants(spec: StudySpec, bin_dir: Path, progress: Progress) -> dict[str, Variant]:
    """Every quantize variant the study asks for, made now or taken from the cache (tuner.models.quantize)."""
    variants = {}
    for request in spec.quantize:
        variant = ensure_variant(request, bin_dir, source_file_type=read_model_info(request.source).file_type)
        progress(f"draft {request.name}: {'made' if variant.made else 'cached'} {variant.path}")
        variants[request.name] = variant
    return variants


def max_slots(spec: StudySpec, space: ResolvedSpace) -> int:
    """The most server slots a trial launches with: ctx_size is split among them."""
    parallel = space.domains.get("parallel")
    assert not isinstance(parallel, FloatRange), "slots are counted in whole numbers"
    top = (max(parallel.values) if isinstance(parallel, Choices) else parallel.high) if parallel else 1
    return max(top, *spec.measurement.concurrency)


def chat_template(spec: StudySpec, target: ModelInfo, workload: Workload) -> str | None:
    """The Jinja source chat suites are served through: the study's ``llama_cpp.chat_template``, else the
    target's own; a chat suite on a target without one is refused (llama-server would fall back to
    ChatML, which a model never trained on it answers with noise)."""
    if not workload.chat:
        return None
    if spec.chat_template is not None:
        return spec.chat_template.read_text(encoding="utf-8")
    if target.chat_template is None:
        chats = [p.suite for p in workload.prompts if p.chat]
        raise UserError(
            f"{spec.path}: workload.suites: suite {chats[0]} holds conversations, but {spec.target.name} has "
            "no chat template (no tokenizer.chat_template); name one in llama_cpp.chat_template (a built-in: "
            f"{', '.join(BUILTIN_CHAT_TEMPLATES)}, or a Jinja file)"
        )
    return target.chat_template


def check_prompts_fit(
    spec: StudySpec,
    workload: Workload,
    bin_dir: Path,
    progress: Progress,
    slots: int = 1,
    template: str | None = None,
) -> None:
    """Every prompt leaves room for n_predict tokens in its slot's share of ctx_size, counted in the
    target's own vocabulary; else one line naming the prompt, where it is defined, its tokens and the
    ctx_size it needs."""
    measurement = replace(spec.measurement, ctx_size=spec.measurement.ctx_size // slots)
    field = "measurement.ctx_size" if slots == 1 else "workload.concurrency"
    split = (
        "" if slots == 1 else f" (measurement.ctx_size {spec.measurement.ctx_size} split over {slots} slots)"
    )

    def count(text: str) -> int:
        return llama_tokenize_count(tokenizer, spec.target, text)

    try:
        tokenizer = binary("llama-tokenize", bin_dir)
        long = too_long(workload, measurement.ctx_size, measurement.n_predict, count, template)
    except MissingBinaryError:
        long = too_long(
            workload,
            measurement.ctx_size,
            measurement.n_predict,
            lambda text: len(text.encode()) + TOKENS_PER_BYTE_SLACK,
            template,
        )
        if long:
            progress(
                f"note: prompt '{long[0][0].id}' ({long[0][0].source}) may not fit measurement.ctx_size "
                f"{measurement.ctx_size}, and llama-tokenize is not in {bin_dir} to count it; a prompt that does not "
                "fit fails its trials as context_exceeded"
            )
        return
    if long:
        prompt, tokens = long[0]
        more = f" (and {len(long) - 1} more prompt(s))" if len(long) > 1 else ""
        what = (
            f"conversation '{prompt.id}' ({prompt.source}) reaches {tokens} tokens at its turn "
            f"{prompt.n_turns} (through the chat template, earlier replies of n_predict tokens included)"
            if prompt.chat
            else f"prompt '{prompt.id}' ({prompt.source}) is {tokens} tokens"
        )
        raise UserError(
            f"{spec.path}: {field}: {what} in the "
            f"target's vocabulary (counted by llama-tokenize), which with n_predict {measurement.n_predict} does not fit "
            f"ctx_size {measurement.ctx_size}{split}{more}; raise measurement.ctx_size to at least "
            f"{slots * (tokens + measurement.n_predict + 1)}, or shorten the prompt"
            + (", or lower the level" if slots > 1 else "")
        )


def prepare(spec: StudySpec, progress: Progress | None = None) -> StudyContext:
    """Check everything a study needs before anything is written or launched; its notes to ``progress``
    (default: stderr, as they are)."""
    progress = Progress.untimed(_to_stderr) if progress is None else progress
    topo = read_topology()
    numactl = numactl_path()
    bin_dir = resolve_bin_dir(spec.bin_dir)
    quantized = make_variants(spec, bin_dir, progress)
    try:
        workload = load_workload(list(spec.suites), spec.base_dir)
    except UserError as err:  # name the study file and its field
        raise UserError(f"{spec.path}: workload.suites: {str(err).removeprefix('workload: ')}") from None
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
    )
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
    )


# ---------------------------------------------------------------- `tuner run --check`


def request_prompts(workload: Workload) -> list[int]:
    """The prompt tokens each request has the server process (estimated from characters): a conversation's
    later turns only their new message, the conversation so far being in the server's prompt cache
    (``cache_prompt``, as every request sends it)."""
    tokens = []
    for prompt in workload.prompts:
        tokens.append(
            eta.prompt_tokens("".join(c for _, c in prompt.messages) if prompt.messages else prompt.text)
        )
        tokens += [eta.prompt_tokens(turn) for turn in prompt.turns]
    return tokens


def study_estimate(ctx: StudyContext) -> eta.Estimate:
    """The study's expected time on this machine (``tuner.eta.estimate``): the target's bytes read per
    token against the fingerprint's bandwidth, a launch reading the target and the largest draft; the races
    export runs (per content type on the held-out prompts, per load class) as ``tuner export`` would."""
    spec, settings = ctx.spec, ctx.settings
    bandwidth = float(ctx.fingerprint.get("bandwidth_bytes_per_s") or 0.0)
    roofline = study_roofline(ctx.study_record("check"), Bandwidth(bandwidth or 1.0, "fingerprint", ""))
    per_token = roofline.bytes_per_token(None) if roofline else ctx.target.weights_bytes
    files = ctx.target.file_size_bytes + max((d.file_size_bytes for d in ctx.drafts.values()), default=0)
    splits, _ = split(ctx.workload)
    held_out = restrict(ctx.workload, [i for s in splits.values() for i in s.held_out])
    speculative = any(v != "none" for v in getattr(ctx.space.domains.get("spec_type"), "values", ["none"]))
    prompts = request_prompts(ctx.workload)
    passes = eta.Passes(
        prompts,
        n_predict=settings.n_predict,
        warmup=settings.warmup,
        repetitions=settings.repetitions,
        levels=spec.load_levels,
    )
    search = eta.SearchPlan(
        trials=spec.budget_trials,
        sentinel_every=spec.sentinel.every_trials,
        sentinel_minutes=spec.sentinel.every_minutes,
        budget_minutes=spec.budget_minutes,
        speculative=speculative,
        prune=spec.prune,
    )
    race = eta.RacePlan(
        rounds=spec.race.max_rounds,
        finalists=spec.race.max_finalists,
        confirm_rounds=spec.race.confirm_rounds,
        minutes=spec.race.budget_minutes,
        min_rounds=spec.race.min_rounds,
    )
    est = eta.estimate(eta.machine(per_token, files, bandwidth), passes, search, race)
    return eta.with_export(
        est,
        passes,
        race,
        request_prompts(held_out) if len(splits) >= 2 else (),
        len(splits),
        type_rounds(spec.race),
    )


def describe_domain(domain: Domain) -> str:
    if isinstance(domain, Choices):
        return ", ".join(map(str, domain.values))
    text = f"{domain.low}..{domain.high}"
    step: float | None = domain.step if isinstance(domain, IntRange) and domain.step != 1 else None
    if not isinstance(domain, IntRange):
        step = domain.step
    return text + (f" step {step}" if step else "") + (" (log)" if domain.log else "")


def check_lines(ctx: StudyContext, race: bool = True) -> list[str]:
    """What `tuner run --check` prints: the space, what was left out and why, the workload, and the time."""
    spec, space = ctx.spec, ctx.space
    knobs = [k for k in NAMES if k in space.domains] + [k for k in space.domains if k not in NAMES]
    lines = [f"study {spec.name} ({spec.path}): checked, nothing run", *_models_lines(ctx), ""]
    lines += [f"{'knob':<16}values"] + [f"{k:<16}{describe_domain(space.domains[k])}" for k in knobs]
    dropped = [f"  {note}" for note in space.notes]
    if space.defaults:
        fixed = ", ".join(f"{k} {v}" for k, v in space.defaults.items())
        dropped.append(
            f"  {fixed}: llama.cpp's defaults, not searched (a list in search_space searches them)"
        )
    lines += ["", "left out for this machine or model:", *(dropped or ["  nothing"]), ""]
    return lines + _workload_lines(ctx) + [""] + estimate_lines(study_estimate(ctx), ctx, race)


def _models_lines(ctx: StudyContext) -> list[str]:
    """The target, the drafts, and the machine: cores, nodes, bandwidth and where it saturates."""
    target, fp = ctx.target, ctx.fingerprint
    bandwidth, curve = fp.get("bandwidth_bytes_per_s"), curve_of(fp)
    drafts = ", ".join(f"{n} ({d.file_size_bytes / 1e9:.2f} GB)" for n, d in ctx.drafts.items()) or "none"
    return [
        f"  target   {ctx.spec.target.name}: {target.architecture}, {target.file_type or target.dominant_tensor_type}, "
        f"{target.weights_bytes / 1e9:.2f} GB of weights"
        + (f", {target.expert_used_count} of {target.expert_count} experts" if target.is_moe else ""),
        f"  drafts   {drafts}",
        f"  machine  {fp.get('physical_cores')} cores, {len(ctx.launch.topology.nodes)} NUMA node(s), "
        + (f"{bandwidth / 1e9:.1f} GB/s memory bandwidth (copy probe)" if bandwidth else "bandwidth unknown"),
        *([f"  {curve.text()}"] if curve else []),
        f"  search   {_thread_walk(ctx)}",
    ]


def _thread_walk(ctx: StudyContext) -> str:
    """The hardware stage's thread walk on this machine (``tuner.search.stages.hardware``)."""
    values = KnobValues(ctx.space.as_dict()).values("threads")
    cores = baseline_config(ctx.space).threads
    saturation = bandwidth_saturation(ctx.fingerprint, PLANNER_SHARE)
    return walk_text(values, cores, saturation, max(1, len(ctx.launch.topology.nodes)))


def _workload_lines(ctx: StudyContext) -> list[str]:
    spec, settings, workload = ctx.spec, ctx.settings, ctx.workload
    suites = ", ".join(f"{s} {sum(p.suite == s for p in workload.prompts)}" for s in workload.suites)
    levels = spec.load_levels
    bounds = ", ".join(f"{c.name} {c.limit:g}" for c in spec.constraints)
    return [
        f"prompts      {len(workload.prompts)} ({suites}); n_predict {settings.n_predict}, warm-up {settings.warmup}, "
        f"{settings.repetitions} repetition(s)",
        "users        "
        + (
            f"{', '.join(map(str, levels))} at once, each level in every trial" if levels else "one at a time"
        ),
        f"objectives   {', '.join(o.metric for o in spec.objectives)}; quality {spec.quality.scorer} "
        f">= {spec.quality.floor:g}" + (f"; bounds {bounds}" if bounds else ""),
        f"budget       {spec.budget_trials} trials"
        + (f" or {spec.budget_minutes:g} min" if spec.budget_minutes else ""),
    ]


def estimate_lines(est: eta.Estimate, ctx: StudyContext, race: bool = True) -> list[str]:
    """The time estimate: trials, the race and export's races at their most, the total, and its basis."""
    duration, machine, race_spec = eta.duration, est.machine, ctx.spec.race
    capped = " (budget.minutes)" if est.budget_s and est.trials_s >= est.budget_s else ""
    lines = [
        "time estimate (tuner run" + (", then tuner export)" if race else ")"),
        f"  trials   {est.trials} + {est.sentinels} sentinel(s): ~{duration(est.trial_s)} each, ~{duration(est.reference_s)} the "
        f"baseline and each sentinel = ~{duration(est.trials_s)}{capped}",
    ]
    if race:
        confirm = f" + {race_spec.confirm_rounds} confirmation rounds x 2" if race_spec.confirm_rounds else ""
        lines.append(
            f"  race     at most {race_spec.max_rounds} rounds of {est.finalists + 1} launches, at most {eta.RACE_OPEN} "
            f"after round {race_spec.min_rounds}{confirm}: {est.race_launches} launches, ~{duration(est.launch_s)} each = "
            f"~{duration(est.race_s)}"
            + (
                f" (under {DECISION_ROUNDS} rounds no race decides: each ends with what it may lose)"
                if race_spec.max_rounds < DECISION_ROUNDS
                else ""
            )
        )
        lines += [
            f"  export   {p.what}: {p.how}: {p.launches} launches, ~{duration(p.launch_s)} each = ~{duration(p.seconds)}"
            for p in est.export
        ]
    most = est.trials_s + est.race_s + est.export_s
    lines.append(
        f"  total    ~{duration(est.expected_s(race))}"
        + (
            f" with each race to its last round, {eta.RACE_TYPICAL} launches a round after round "
            f"{race_spec.min_rounds} (at most ~{duration(most)})"
            if race
            else ""
        )
    )
    searched = (
        f"searched trials x{est.speedup:g} faster (speculation, on average)" if est.speedup != 1 else ""
    )
    pruned = f"pruning saves {est.pruned:.0%} of their passes" if est.pruned else ""
    lines.append(
        f"  basis: {machine.bytes_per_token / 1e9:.3f} GB read per token at {eta.DECODE_EFFICIENCY:.0%} of "
        f"{machine.bandwidth / 1e9:.1f} GB/s = {1000 * machine.token_s:.1f} ms/token (at least {1000 * eta.TOKEN_FLOOR_S:g} ms), "
        f"launch ~{machine.launch_s:.1f} s; "
        + "; ".join(x for x in (searched, pruned, "quality runs not counted") if x)
    )
    return lines
