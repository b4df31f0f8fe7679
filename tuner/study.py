"""Running a study: spec -> Optuna study -> one pinned llama.cpp run per trial -> storage.

Lifecycle of ``run_study``:
1. ``prepare`` reads the models' GGUF headers, refuses incompatible drafts, resolves
   the search space for this machine, loads the workload and takes the fingerprint;
   nothing is written before all of it succeeded.
2. ``open_study`` creates or resumes the Optuna study. A new study records the
   hardware fingerprint, the llama.cpp build manifest, the model metadata and the
   space digest; a resumed one is refused if any of those no longer match.
3. The baseline trial (target alone, default experts, greedy, default threads) runs
   first, once across all workers; its outputs become the quality reference and its
   tokens/s the speedup base. Warm-start configurations are enqueued after it.
4. The sampler proposes the rest until the budget (trials and/or minutes) is spent;
   the budget counts finished trials (not interrupted ones, a retried one once), so a
   resumed study just continues.

One measured trial at a time: two llama.cpp runs on one box measure each other. More
hosts share one study through PostgreSQL (``tuner worker``, see ``tuner.worker``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import optuna

from tuner.errors import UserError
from tuner.failures import PERMANENT, FailureReason, TrialFailure
from tuner.gguf_info import ModelInfo, check_draft_compatibility, read_model_info
from tuner.hardware import (
    measure_memory_bandwidth,
    Topology,
    compare_fingerprints,
    fingerprint,
    meaningful_numa_policies,
    numactl_path,
    read_host_state,
    read_topology,
)
from tuner.launch import LaunchContext, build_server_argv, model_flags
from tuner.llama_build import binary, find_build_info, resolve_bin_dir
from tuner.measure import MeasurementSettings, Sample, outputs_by_prompt, run_workload, summarize
from tuner.paths import storage_dir
from tuner.runner import LlamaServer, free_port, read_log_tail
from tuner.sampling import NoRepeatSampler
from tuner.space import (
    KNOB_TYPES,
    ResolvedSpace,
    TrialConfig,
    baseline_config,
    resolve_space,
    suggest,
)
from tuner.spec import StudySpec, WorkersSpec, load_spec
from tuner import quality as quality_scorers
from tuner.validate import Fields
from tuner.worker import (
    ensure_baseline,
    fail_orphans,
    hold_sqlite_study,
    open_storage,
    run_until_budget,
    safe_url,
    tally,
    worker_id,
)
from tuner.workload import Workload, load_workload

INIT_WAIT_S = 10.0  # how long a joining worker waits for the study's creator to record its attrs


@dataclass(frozen=True)
class StudyContext:
    """Everything fixed for the lifetime of one study run on this host."""

    spec: StudySpec
    target: ModelInfo
    drafts: dict[str, ModelInfo]
    space: ResolvedSpace
    launch: LaunchContext
    workload: Workload
    settings: MeasurementSettings
    fingerprint: dict
    build: dict
    log_dir: Path


def check_models_and_space(
    spec: StudySpec, topo: Topology, numactl: str | None
) -> tuple[ModelInfo, dict[str, ModelInfo], ResolvedSpace]:
    """Read the GGUF headers, refuse incompatible drafts, fit the space to this machine."""
    target = read_model_info(spec.target)
    drafts: dict[str, ModelInfo] = {}
    for i, path in enumerate(spec.drafts):
        info = read_model_info(path)
        compat = check_draft_compatibility(target, info)
        if not compat.ok:
            raise UserError(
                f"{spec.path}: drafts[{i}]: {path.name} cannot draft for {spec.target.name} "
                f"({'; '.join(compat.reasons)}); remove it from drafts"
            )
        drafts[path.stem] = info
    space = resolve_space(
        spec.space,
        fields=Fields(spec.path, {}),
        draft_names=tuple(drafts),
        expert_used_count=target.expert_used_count if target.is_moe else None,
        expert_count=target.expert_count,
        physical_cores=topo.physical_cores,
        logical_cpus=topo.logical_cpus,
        numa_policies=tuple(p for p in meaningful_numa_policies(topo) if numactl or p not in ("interleave", "bind")),
        numa_nodes=tuple(n.id for n in topo.nodes),
    )
    for i, item in enumerate(spec.warm_start):
        unknown = [k for k in item if k not in KNOB_TYPES and k != "numa_node"]
        if unknown:
            raise UserError(f"{spec.path}: warm_start[{i}].{unknown[0]}: unknown knob; known: {', '.join(KNOB_TYPES)}")
    return target, drafts, space


def prepare(spec: StudySpec) -> StudyContext:
    """Check everything a study needs before anything is written or launched."""
    topo = read_topology()
    numactl = numactl_path()
    target, drafts, space = check_models_and_space(spec, topo, numactl)
    bin_dir = resolve_bin_dir(spec.bin_dir)
    server = binary("llama-server", bin_dir)
    build = find_build_info(bin_dir)
    workload = load_workload(list(spec.suites), spec.base_dir)
    m = spec.measurement
    settings = MeasurementSettings(warmup=m.warmup, repetitions=m.repetitions, n_predict=m.n_predict,
                                   seed=m.seed, noise_cv=m.noise_cv)
    launch = LaunchContext(
        server_binary=server,
        target=spec.target.resolve(),
        drafts={name: info.path.resolve() for name, info in drafts.items()},
        expert_override_key=target.expert_override_key,
        topology=topo,
        numactl=numactl,
        ctx_size=m.ctx_size,
        allow_smt=spec.space.allow_smt,
        extra_args=spec.extra_args,
    )
    return StudyContext(
        spec=spec,
        target=target,
        drafts=drafts,
        space=space,
        launch=launch,
        workload=workload,
        settings=settings,
        # the bandwidth probe (~1 s) is provenance for the report's roofline, not a comparability key
        fingerprint=fingerprint(topo, build, host=read_host_state(topo),
                                bandwidth_bytes_per_s=measure_memory_bandwidth()),
        build=build,
        log_dir=storage_dir() / "logs" / spec.name,
    )


def make_storage(url: str, workers: WorkersSpec = WorkersSpec()) -> optuna.storages.BaseStorage:
    """An RDB storage with heartbeats; an unreachable URL is a one-line error, not a traceback."""
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    try:
        return open_storage(url, workers)
    except Exception as err:  # sqlalchemy raises many kinds; all mean "cannot use this URL"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        fix = ("install the PostgreSQL driver: pip install -e '.[postgres]'" if isinstance(err, ImportError)
               else "check the URL and that the database is reachable")
        raise UserError(f"storage {safe_url(url)}: cannot open ({first}); {fix}") from err


def make_sampler(spec: StudySpec) -> optuna.samplers.BaseSampler:
    return sampler_for(spec.sampler, spec.seed, spec.budget_trials)


def sampler_for(name: str, seed: int, budget_trials: int) -> optuna.samplers.BaseSampler:
    """Default TPE: multivariate with groups handles the conditional knobs (K only when
    speculating); the quality floor reaches every sampler through ``trial.set_constraint``;
    its startup is short because budgets are;
    it never re-measures a configuration nor proposes a knob value blamed for failed or
    infeasible trials (see tuner.sampling). Separate from the spec so
    `tuner bench-search` replays exactly these settings."""
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(20, budget_trials // 3)))
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "structured":  # stages and a model of speculation; NoRepeat(TPE) where it has no plan
        from tuner.search.sampler import StructuredSampler

        return StructuredSampler(sampler_for("tpe", seed, budget_trials), seed=seed)
    with warnings.catch_warnings():  # multivariate/group are "experimental" since Optuna 2.x
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        tpe = optuna.samplers.TPESampler(
            seed=seed,
            multivariate=True,
            group=True,
            # 5, not TPE's 10: the wrapper's start-up already spreads over unmeasured, unblamed
            # configurations, and replayed grids found the best 1-4 trials sooner with 5.
            n_startup_trials=max(4, min(5, budget_trials // 4)),
        )
    return NoRepeatSampler(tpe, seed=seed)


def open_study(ctx: StudyContext) -> optuna.Study:
    """Create or resume; refuse to mix hardware, builds or search spaces in one study.

    Of several workers starting at once exactly one creates the study (and later runs the
    baseline, see ``tuner.worker``); the others wait for it to record the study's attrs.
    """
    spec = ctx.spec
    storage = make_storage(spec.storage, spec.workers)
    directions = [o.direction for o in spec.objectives]
    try:  # creation is atomic: with several workers starting at once, exactly one creates
        study = optuna.create_study(study_name=spec.name, storage=storage, directions=directions,
                                    sampler=make_sampler(spec))
        study.set_user_attr("created_by", worker_id())
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=spec.name, storage=storage, sampler=make_sampler(spec))
    if list(study.directions) != [optuna.study.StudyDirection[d.upper()] for d in directions]:
        raise UserError(f"{spec.path}: objectives: study {spec.name!r} exists with other objective directions; use a new name")
    attrs = study.user_attrs
    waited = time.monotonic() + INIT_WAIT_S
    while "fingerprint" not in attrs and attrs.get("created_by") != worker_id() and time.monotonic() < waited:
        # joining a study whose creator is recording them right now
        time.sleep(0.2)
        attrs = study.user_attrs
    if "fingerprint" not in attrs:  # created here, or its creator died before recording them
        study.set_user_attr("created_by", worker_id())
        study.set_user_attr("build", ctx.build)
        study.set_user_attr("target", ctx.target.to_dict())
        study.set_user_attr("drafts", {name: info.to_dict() for name, info in ctx.drafts.items()})
        study.set_user_attr("space", ctx.space.describe())
        study.set_user_attr("space_digest", ctx.space.digest())
        study.set_user_attr("space_notes", list(ctx.space.notes))
        study.set_user_attr("objectives", [o.metric for o in spec.objectives])
        study.set_user_attr("quality", {"scorer": spec.quality.scorer, "floor": spec.quality.floor})
        study.set_user_attr("spec_path", str(spec.path.resolve()))
        study.set_user_attr("workload", [p.id for p in ctx.workload.prompts])
        study.set_user_attr("measurement", asdict(ctx.settings))
        study.set_user_attr("fingerprint", ctx.fingerprint)  # last: joining workers wait for it
        return study
    mismatch = compare_fingerprints(attrs["fingerprint"], ctx.fingerprint)
    if mismatch:
        raise UserError(
            f"study {spec.name!r} was measured on other hardware or another llama.cpp build: {mismatch[0]}; "
            "this host cannot add comparable trials to it: use a new study name here"
        )
    if attrs.get("space_digest") != ctx.space.digest():
        raise UserError(
            f"{spec.path}: search_space: study {spec.name!r} exists with a different search space; "
            "revert the change or use a new study name"
        )
    if attrs.get("objectives") != [o.metric for o in spec.objectives]:
        raise UserError(f"{spec.path}: objectives: study {spec.name!r} exists with other objectives; use a new name")
    return study


class TrialRunner:
    """The objective: one trial = one launch, one workload, scores and evidence stored."""

    def __init__(self, ctx: StudyContext, study: optuna.Study, progress: Callable[[str], None] = print):
        self.ctx = ctx
        self.study = study
        self.progress = progress

    def __call__(self, trial: optuna.Trial) -> tuple[float, ...]:
        role = trial.user_attrs.get("role", "search")
        config = suggest(trial, self.ctx.space)
        trial.set_user_attr("config", config.as_dict())
        trial.set_user_attr("worker", worker_id())
        try:
            return self._measure(trial, config, role)
        except TrialFailure as failure:
            self._record_failure(trial, failure)
            raise
        except KeyboardInterrupt:
            self._record_failure(trial, TrialFailure(FailureReason.INTERRUPTED, "interrupted by the user or SIGTERM",
                                                     read_log_tail(self._log_path(trial), 40)))
            raise

    def _log_path(self, trial: optuna.Trial) -> Path:
        return self.ctx.log_dir / f"trial-{trial.number}.log"

    def _measure(self, trial: optuna.Trial, config: TrialConfig, role: str) -> tuple[float, ...]:
        ctx = self.ctx
        known = self._known_permanent_failure(config)
        if known:
            raise TrialFailure(FailureReason(known["reason"]),
                               f"same configuration already failed permanently in trial {known['trial']}",
                               known["log_tail"])
        argv = build_server_argv(config, ctx.launch)
        ctx.log_dir.mkdir(parents=True, exist_ok=True)
        timeout = ctx.spec.measurement.trial_timeout_s
        server = LlamaServer(argv, free_port(), self._log_path(trial),
                             ready_timeout_s=timeout, request_timeout_s=timeout)
        trial.set_user_attr("argv", argv)
        with server:
            trial.set_user_attr("argv", server.argv + ["--host", server.host, "--port", str(server.port)])
            samples = run_workload(server, ctx.workload, ctx.settings, config.temperature)
            spec_problem = server.speculation_log_problem()
            log_tail = server.log_tail()
        scores = summarize(samples, ctx.settings)
        trial.set_user_attr("log_tail", log_tail)
        if config.speculative and scores.drafted == 0:
            raise TrialFailure(
                FailureReason.SPECULATION_UNAVAILABLE,
                f"asked for {config.spec_type} but llama.cpp drafted nothing"
                + (f": {spec_problem}" if spec_problem else ""),
                log_tail,
            )
        outputs = outputs_by_prompt(samples)
        if role == "baseline":
            self.study.set_user_attr("reference", {
                "trial": trial.number,
                "tokens": {pid: list(s.tokens) for pid, s in outputs.items()},
                "texts": {pid: s.text for pid, s in outputs.items()},
                "tokens_per_second": scores.tokens_per_second,
            })
        reference = self.study.user_attrs.get("reference") or {}
        quality = self._quality(config, outputs, reference)
        baseline_tps = reference.get("tokens_per_second")
        speedup = scores.tokens_per_second / baseline_tps if baseline_tps else 1.0
        metrics = {
            "tokens_per_second": scores.tokens_per_second,
            "acceptance": scores.acceptance,
            "quality": quality,
            "speedup": speedup,
        }
        trial.set_user_attr("metrics", metrics)
        trial.set_user_attr("speedup", speedup)
        trial.set_user_attr("cv", scores.cv)
        trial.set_user_attr("noisy", scores.noisy)
        trial.set_user_attr("drafted", scores.drafted)
        trial.set_user_attr("accepted", scores.accepted)
        trial.set_user_attr("per_suite_tokens_per_second", scores.per_suite_tokens_per_second)
        trial.set_user_attr("samples", [sample_record(s) for s in samples])
        trial.set_user_attr("outputs", {pid: s.text for pid, s in outputs.items()})
        # Feasible when <= 0: samplers use it, and nothing below the floor is reported as best.
        trial.set_constraint("quality_floor", self.ctx.spec.quality.floor - quality)
        trial.set_user_attr("constraint_quality", self.ctx.spec.quality.floor - quality)
        return tuple(metrics[o.metric] for o in self.ctx.spec.objectives)

    def _quality(self, config: TrialConfig, outputs: dict, reference: dict) -> float:
        scorer = self.ctx.spec.quality.scorer
        if scorer == "answers":
            return quality_scorers.answer_score({pid: s.text for pid, s in outputs.items()}, self.ctx.workload)
        if scorer == "perplexity":
            return quality_scorers.perplexity_ratio(self._perplexity(baseline_config(self.ctx.space)),
                                                    self._perplexity(config))
        ref_tokens = {pid: tuple(tokens) for pid, tokens in reference.get("tokens", {}).items()}
        return quality_scorers.agreement({pid: tuple(s.tokens) for pid, s in outputs.items()}, ref_tokens)

    def _perplexity(self, config: TrialConfig) -> float:
        """Perplexity depends only on the model flags (experts), not on speculation or
        temperature or threads, so it is measured once per distinct expert count."""
        baseline = baseline_config(self.ctx.space)
        flags = model_flags(replace(config, threads=baseline.threads, threads_batch=None), self.ctx.launch)
        key = " ".join(flags)
        cache = dict(self.study.user_attrs.get("perplexity", {}))
        if key not in cache:
            cache[key] = quality_scorers.measure_perplexity(
                flags, self.ctx.spec.quality.text_file, bin_dir=self.ctx.launch.server_binary.parent,
                timeout_s=self.ctx.spec.measurement.trial_timeout_s)
            self.study.set_user_attr("perplexity", cache)
        return cache[key]

    def _known_permanent_failure(self, config: TrialConfig) -> dict | None:
        """A configuration that failed for a reason that will not change is not relaunched."""
        wanted = config.as_dict()
        for past in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)):
            reason = past.user_attrs.get("failure_reason")
            if past.user_attrs.get("config") == wanted and reason in {r.value for r in PERMANENT}:
                return {"trial": past.number, "reason": reason, "log_tail": past.user_attrs.get("log_tail", "")}
        return None

    def _record_failure(self, trial: optuna.Trial, failure: TrialFailure) -> None:
        trial.set_user_attr("failure_reason", failure.reason.value)
        trial.set_user_attr("failure_detail", failure.detail)
        if failure.log_tail:
            trial.set_user_attr("log_tail", failure.log_tail)


def sample_record(sample: Sample) -> dict:
    """A raw per-prompt sample for the trial's attrs (tokens and text left out: see outputs)."""
    return {k: v for k, v in asdict(sample).items() if k not in ("tokens", "text")}


def best_feasible(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """Highest tokens/s among complete trials that meet the quality floor."""
    feasible = [
        t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.user_attrs.get("constraint_quality", 1.0) <= 0
    ]
    return max(feasible, key=lambda t: t.user_attrs["metrics"]["tokens_per_second"], default=None)


def describe_trial(trial: optuna.trial.FrozenTrial) -> str:
    config = trial.user_attrs.get("config", {})
    knobs = " ".join(f"{k}={v}" for k, v in config.items())
    if trial.state == optuna.trial.TrialState.COMPLETE:
        m = trial.user_attrs["metrics"]
        flag = " (noisy)" if trial.user_attrs.get("noisy") else ""
        return (f"{m['tokens_per_second']:.1f} t/s{flag}, x{m['speedup']:.2f}, acceptance {m['acceptance']:.2f}, "
                f"quality {m['quality']:.3f} | {knobs}")
    return f"FAILED ({trial.user_attrs.get('failure_reason', 'error')}: {trial.user_attrs.get('failure_detail', '')}) | {knobs}"


def run_study(spec: StudySpec, trials: int | None = None, progress: Callable[[str], None] = print) -> optuna.Study:
    """Run or resume a study until its budget is spent, alone or as one of its workers; returns the study."""
    ctx = prepare(spec)
    lock = hold_sqlite_study(spec.storage, spec.name)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # our progress line replaces Optuna's
    try:
        study = open_study(ctx)
        if study.user_attrs.get("created_by") != worker_id():
            study.sampler.reseed_rng()  # a joining worker or a resumed run must not replay the creator's proposals
        if lock:
            fail_orphans(study, spec.workers)
        for note in ctx.space.notes:
            progress(f"note: {note}")
        budget = trials or spec.budget_trials
        objective = TrialRunner(ctx, study, progress)
        deadline = time.monotonic() + spec.budget_minutes * 60 if spec.budget_minutes else None

        def report(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
            best = best_feasible(study)
            best_text = (f"best feasible {best.user_attrs['metrics']['tokens_per_second']:.1f} t/s (trial {best.number})"
                         if best else "no feasible trial yet")
            progress(f"[{tally(study).counted}/{budget}] trial {trial.number}: {describe_trial(trial)} | {best_text}")

        def run_one() -> None:
            timeout = max(1.0, deadline - time.monotonic()) if deadline else None
            study.optimize(objective, n_trials=1, timeout=timeout, catch=(TrialFailure,), callbacks=[report])

        done = tally(study).counted
        progress(f"study {spec.name}: {done} of {budget} trials done; storage {safe_url(spec.storage)}")
        if done < budget:
            ensure_baseline(study, ctx, run_one, progress)
            run_until_budget(study, run_one, budget, spec.workers, deadline, progress)
    finally:
        optuna.logging.set_verbosity(verbosity)
        if lock:
            lock.close()
    return study


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run or resume an Optuna study of llama.cpp launch configurations. Each trial launches "
        "a pinned llama-server, measures decode tokens/s, draft acceptance and output quality, "
        "and stores them with the exact argv in the study's storage. Running the same study "
        "again resumes it."
    )
    parser.add_argument("study", help="study file, e.g. studies/demo.yaml")
    parser.add_argument("--trials", type=int, help="total trial budget (default: the study's budget.trials)")
    parser.add_argument("--check", action="store_true", help="validate the study file and models, print the resolved space, run nothing")


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.study)
    if args.trials is not None and args.trials < 1:
        raise UserError(f"--trials: must be >= 1, got {args.trials}")
    if args.check:
        ctx = prepare(spec)
        print(json.dumps({"study": spec.name, "space": ctx.space.describe(), "notes": list(ctx.space.notes),
                          "drafts": list(ctx.drafts), "prompts": len(ctx.workload.prompts)}, indent=2, default=str))
        return 0
    try:
        study = run_study(spec, args.trials)
    except KeyboardInterrupt:
        print(f"tuner run: interrupted; measured trials are stored, run `tuner run {args.study}` again to resume",
              file=sys.stderr)
        return 130
    best = best_feasible(study)
    if best is None:
        print("no feasible trial: every trial failed or fell below the quality floor")
        return 1
    print(f"best feasible: trial {best.number}: {describe_trial(best)}")
    return 0
