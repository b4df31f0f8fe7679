"""The tuner's figures and wall time against llama-bench's, alternating in one session.

Why: a tuner's numbers are only useful if they are the numbers llama.cpp itself gives,
and its harness must not cost more than the measurement. The same work on both sides:
one tuner trial of the baseline configuration whose workload is one prompt, a warm-up
request and R measured requests of N tokens, against llama-bench's tg test with the
same model, threads and pinning, R + 1 runs of N tokens without its own warm-up, the
first run discarded as the tuner discards its warm-up, each at the depth the tuner
decodes at (``-d`` = the prompt's tokens). Its figure is read from its JSONL
``samples_ts``, and both sides report the median over the R runs. Rounds alternate the
order (trial then bench, then bench then trial), so a change in load hits both sides.

Results: (a) tuner tokens/s / llama-bench t/s (target: within 5%); (b) the trial's wall
time / llama-bench's wall time (target: at most 1.25); and where a trial's time goes:
launching and loading (until /health answers), measuring, stopping. The same split is
taken once for a trial of the study's own workload, the figure that says whether
loading dominates a real study.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tuner.errors import UserError
from tuner.knobs.config import TrialConfig
from tuner.machine.llama_build import binary
from tuner.measurement.launch import build_server_argv
from tuner.measurement.measure import MeasurementSettings, summarize
from tuner.measurement.measured_launch import Requests, ServerLaunch, measured_launch
from tuner.measurement.workload import Workload
from tuner.prepare import StudyContext
from tuner.progress import Progress
from tuner.search.space import baseline_config

TPS_TOLERANCE = 0.05
WALL_RATIO_TARGET = 1.25


@dataclass(frozen=True)
class TrialTiming:
    """One tuner trial, timed by stage (wall clock) with its measured decode speed."""

    tokens_per_second: float
    tokens: int
    prompt_tokens: int  # the depth at which it decoded
    launch_s: float  # process start until /health answers: loading included
    measure_s: float
    stop_s: float

    @property
    def wall_s(self) -> float:
        return self.launch_s + self.measure_s + self.stop_s


@dataclass(frozen=True)
class BenchRun:
    tokens_per_second: float  # median of llama-bench's samples_ts after the first (its warm-up)
    samples_ts: tuple[float, ...]
    wall_s: float


def timed_trial(
    ctx: StudyContext, config: TrialConfig, workload: Workload, settings: MeasurementSettings, log_path: Path
) -> TrialTiming:
    """What ``StudyObjective`` does for one trial (launch, workload, stop), with a clock per stage;
    then, untimed, one token more to learn the prompt's length from llama.cpp's timings."""
    measured = measured_launch(
        ServerLaunch(
            build_server_argv(config, ctx.launch), log_path, timeout_s=ctx.spec.measurement.trial_timeout_s
        ),
        requests=Requests(workload, settings, config.temperature, remembers=config.remembers_requests),
        then=lambda server: (
            server.complete(workload.prompts[0].text, 1, config.temperature, settings.seed).prompt_n
        ),
    )
    samples = measured.samples
    scores = summarize(samples, settings)
    assert measured.then is not None  # the prompt's length, asked once the workload was measured
    return TrialTiming(
        scores.tokens_per_second,
        sum(s.predicted_n for s in samples),
        measured.then,
        measured.ready_s,
        measured.measure_s,
        measured.stop_s,
    )


def bench_argv(
    ctx: StudyContext, config: TrialConfig, n_predict: int, repetitions: int, depth: int
) -> list[str]:
    """llama-bench's tg test with the trial's model, threads and pinning (numactl prefix or CPU
    mask): R + 1 runs at the trial's depth, the first to be discarded like the trial's warm-up."""
    server_argv = build_server_argv(config, ctx.launch)
    server_at = server_argv.index(str(ctx.launch.server_binary))
    pinning = []
    if "--cpu-mask" in server_argv:
        mask_at = server_argv.index("--cpu-mask")
        pinning = ["--cpu-mask", server_argv[mask_at + 1], "--cpu-strict", "1"]
    return [
        *server_argv[:server_at],
        str(binary("llama-bench", ctx.launch.server_binary.parent)),
        "-m",
        str(ctx.launch.target),
        "-t",
        str(config.threads),
        *pinning,
        "-p",
        "0",
        "-n",
        str(n_predict),
        "-d",
        str(depth),
        "-r",
        str(repetitions + 1),
        "--no-warmup",
        "-o",
        "jsonl",
    ]


def run_llama_bench(argv: list[str], n_predict: int, timeout_s: float) -> BenchRun:
    """Run llama-bench once (killed and reaped on timeout or Ctrl-C by subprocess.run)."""
    started = time.monotonic()
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as err:
        raise UserError(f"llama-bench did not finish within {timeout_s:g} s") from err
    wall = time.monotonic() - started
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise UserError(f"llama-bench failed (exit code {proc.returncode}):\n{tail}")
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip().startswith("{")]
    tg = [r for r in records if r.get("n_prompt") == 0 and r.get("n_gen") == n_predict]
    if not tg or len(tg[0].get("samples_ts") or ()) < 2:
        raise UserError(
            f"llama-bench printed no tg{n_predict} record with 2+ runs; its output was:\n{proc.stdout[-500:]}"
        )
    samples = tuple(float(x) for x in tg[0]["samples_ts"])
    return BenchRun(statistics.median(samples[1:]), samples, wall)


@dataclass(frozen=True)
class OverheadResult:
    model: str
    threads: int
    n_predict: int
    repetitions: int
    depth: int  # prompt tokens: the context depth of both sides' decoding
    rounds: int
    bench: list[BenchRun]
    trials: list[TrialTiming]
    study_trial: TrialTiming  # a trial of the study's own workload and settings
    tps_ratios: list[float]  # per round: tuner tokens/s / llama-bench t/s, seconds apart
    wall_ratios: list[float]  # per round: trial wall / llama-bench wall
    tps_ratio: float  # median of the per-round ratios (paired: load drifts between rounds)
    wall_ratio: float
    launch_share: float  # median share of a trial's wall time spent launching and loading
    study_launch_share: float

    @property
    def met(self) -> bool:
        return abs(self.tps_ratio - 1.0) <= TPS_TOLERANCE and self.wall_ratio <= WALL_RATIO_TARGET

    def to_dict(self) -> dict:
        out = asdict(self)
        for item in out["trials"] + [out["study_trial"]]:
            item["wall_s"] = item["launch_s"] + item["measure_s"] + item["stop_s"]
        out["met"] = self.met
        return out


def measure_overhead(
    ctx: StudyContext, *, n_predict: int = 64, repetitions: int = 3, rounds: int = 3, progress: Progress
) -> OverheadResult:
    """Alternating rounds of llama-bench and a tuner trial of the baseline configuration."""
    config = baseline_config(ctx.space)
    workload = Workload(prompts=ctx.workload.prompts[:1])
    settings = replace(ctx.settings, warmup=1, repetitions=repetitions, n_predict=n_predict)
    timeout = ctx.spec.measurement.trial_timeout_s
    log = ctx.log_dir / "bench-overhead.log"
    bench: list[BenchRun] = []
    trials: list[TrialTiming] = []
    for round_index in range(rounds):
        for step in (
            ("trial", "bench") if round_index % 2 == 0 else ("bench", "trial")
        ):  # a trial first: it knows the depth
            if step == "bench":
                argv = bench_argv(ctx, config, n_predict, repetitions, trials[0].prompt_tokens)
                bench.append(run_llama_bench(argv, n_predict, timeout))
            else:
                trials.append(timed_trial(ctx, config, workload, settings, log))
        progress(
            f"overhead round {round_index + 1}/{rounds}: llama-bench {bench[-1].tokens_per_second:.1f} t/s in "
            f"{bench[-1].wall_s:.2f} s; tuner {trials[-1].tokens_per_second:.1f} t/s in {trials[-1].wall_s:.2f} s "
            f"(launch {trials[-1].launch_s:.2f} s)"
        )
    study_trial = timed_trial(ctx, config, ctx.workload, ctx.settings, log)
    progress(
        f"a {ctx.spec.name} trial: launch {study_trial.launch_s:.2f} s, measure {study_trial.measure_s:.2f} s, "
        f"stop {study_trial.stop_s:.2f} s"
    )
    median = statistics.median
    tps_ratios = [t.tokens_per_second / b.tokens_per_second for t, b in zip(trials, bench)]
    wall_ratios = [t.wall_s / b.wall_s for t, b in zip(trials, bench)]
    return OverheadResult(
        model=ctx.launch.target.name,
        threads=config.threads,
        n_predict=n_predict,
        repetitions=repetitions,
        depth=trials[0].prompt_tokens,
        rounds=rounds,
        bench=bench,
        trials=trials,
        study_trial=study_trial,
        tps_ratios=tps_ratios,
        wall_ratios=wall_ratios,
        tps_ratio=median(tps_ratios),
        wall_ratio=median(wall_ratios),
        launch_share=median(t.launch_s / t.wall_s for t in trials),
        study_launch_share=study_trial.launch_s / study_trial.wall_s,
    )


def markdown(result: OverheadResult) -> str:
    median = statistics.median
    rounds = lambda ratios, digits: ", ".join(f"{r:.{digits}f}" for r in ratios)  # noqa: E731
    return "\n".join(
        [
            f"| {result.model}, {result.threads} threads, tg{result.n_predict} @ depth {result.depth} x {result.repetitions}, "
            f"{result.rounds} alternating rounds | llama-bench | tuner trial | tuner / llama-bench (per round) | target |",
            "|---|---|---|---|---|",
            f"| decode tokens/s (median) | {median(b.tokens_per_second for b in result.bench):.1f} | "
            f"{median(t.tokens_per_second for t in result.trials):.1f} | {result.tps_ratio:.3f} "
            f"({rounds(result.tps_ratios, 3)}) | within {TPS_TOLERANCE:.0%} |",
            f"| wall time per run, s (median) | {median(b.wall_s for b in result.bench):.2f} | "
            f"{median(t.wall_s for t in result.trials):.2f} | {result.wall_ratio:.2f} ({rounds(result.wall_ratios, 2)}) "
            f"| <= {WALL_RATIO_TARGET} |",
            "",
            f"Trial time spent launching and loading: {result.launch_share:.0%} (same work as llama-bench); "
            f"{result.study_launch_share:.0%} for a trial of the study's own workload "
            f"(launch {result.study_trial.launch_s:.2f} s, measure {result.study_trial.measure_s:.2f} s, "
            f"stop {result.study_trial.stop_s:.2f} s). Targets {'met' if result.met else 'MISSED'}.",
            "",
        ]
    )
