"""The load generator against llama-batched-bench: are its aggregate tokens/s the server's, not the client's?

Why: a study of several users ranks configurations by the aggregate tokens/s the load generator
(``tuner.measurement.load``) measures through HTTP, Python threads and llama-server's scheduler.
llama.cpp's own ``llama-batched-bench`` decodes B sequences in one process, no server in between: the
reference for batched throughput. Both run on the same model, threads and pinning, at the same levels:
the load generator's level of B users (each request ``tg`` tokens, ``ignore_eos``) against
batched-bench's ``-npl B`` with ``-ntg tg`` and ``-npp`` the median prompt length of the load's
requests, counted as generated tokens over the whole time (``B * tg / t``: prompts included on both
sides, as the load's wall time includes them). Both run on all physical cores but one: the clients
(HTTP, JSON, Python threads) get a core of their own, as they would on another machine, and server
threads that spin-wait do not collapse when the client preempts one. Rounds alternate which side goes
first, so a change in load hits both; the median of the per-round ratios is printed per level
(target: within 10%), so a round that a neighbour's burst hit on one side does not decide it.
"""

from __future__ import annotations

import fcntl
import json
import os
import statistics
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from tuner.errors import UserError
from tuner.knobs.config import TrialConfig
from tuner.machine.llama_build import (
    binary,
    pinned_bin_dir,
    pinned_root,
    require_build_tools,
    resolve_bin_dir,
    run_logged,
)
from tuner.measurement.launch import build_server_command, model_options
from tuner.measurement.load import Level, run_level
from tuner.measurement.measured_launch import ServerLaunch, measured_launch
from tuner.measurement.server_process import LlamaServer
from tuner.prepare import StudyContext
from tuner.search.space import baseline_config

LEVELS = (1, 2, 4)
TOLERANCE = 0.10
SLOT_CTX = 512  # tokens per slot: a suite prompt and tg tokens fit
PINNING_FLAGS = ("--cpu-mask", "--cpu-strict", "--numa")
LOST_ROW_LAUNCHES = 3  # batched-bench launches for one set of levels: rows its logger lost are measured again


def batched_bench_binary(bin_dir: str | os.PathLike | None = None) -> Path:
    """llama-batched-bench of the pinned build, compiled into its build folder the first time it is asked for (a
    minute: the libraries are built already; not in the build's TOOLS, whose list keys the cache); a user build must
    have it."""
    name = "llama-batched-bench"
    folder = resolve_bin_dir(bin_dir)
    if folder != pinned_bin_dir() or (folder / name).is_file():
        return binary(name, bin_dir)
    require_build_tools()
    root = pinned_root()
    with open(root.parent / f"{root.name}.lock", "w") as lock, open(root / "build.log", "a") as log:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / name).is_file():
            print(f"llama.cpp: building {name} (log: {root / 'build.log'})", flush=True)
            run_logged(
                ["cmake", "--build", str(root / "build"), "-j", str(os.cpu_count() or 2), "--target", name],
                log,
            )
    return binary(name, bin_dir)


@dataclass(frozen=True)
class LevelComparison:
    users: int
    load: tuple[float, ...]  # the load generator's aggregate tokens/s, one per round
    bench: tuple[float, ...]  # batched-bench's B * tg / t, one per round

    @property
    def ratio(self) -> float:
        return statistics.median(a / b for a, b in zip(self.load, self.bench))

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1.0) <= TOLERANCE


def parse_batched_bench(jsonl: str) -> dict[int, float]:
    """B -> generated tokens over the whole time (B * tg / t) from batched-bench's JSONL rows."""
    rates: dict[int, float] = {}
    for line in jsonl.splitlines():
        try:
            row = json.loads(line) if line.startswith("{") else None
        except json.JSONDecodeError:
            continue  # a row cut short at exit (``batched_bench``): that level is launched again
        if row is not None:  # a level's first row: a level run again at the end is ``batched_bench``'s pad
            rates.setdefault(int(row["pl"]), row["pl"] * row["tg"] / row["t"])
    return rates


def bench_config(ctx: StudyContext) -> TrialConfig:
    """The baseline configuration on every physical core but one (the clients'), where there are two."""
    config = baseline_config(ctx.space)
    return replace(config, threads=max(1, min(config.threads, ctx.space.physical_cores - 1)))


def batched_bench(
    ctx: StudyContext, pp: int, tg: int, levels: tuple[int, ...], ctx_size: int
) -> dict[int, float]:
    """llama-batched-bench over every level, with the server's model options and pinning.

    Why the care: batched-bench prints its rows through llama.cpp's logger, whose thread writes them after the
    program has queued them, and the program exits without waiting for it (common/log.cpp, which says so and
    cites ggml-org/llama.cpp#22142): on a busy host the last rows are lost with exit 0 (a quarter of the
    launches on the 2-core VM beside two CPU hogs). So each launch runs the smallest level once more at the end,
    its row unused (``batched_bench_argv``), which gives the logger's thread the time to write the rows used; a
    level whose row is still missing is launched again, up to ``LOST_ROW_LAUNCHES`` launches (each launch warms
    up first, so a level measured in a launch of its own is measured as in the shared one)."""
    rates: dict[int, float] = {}
    for _ in range(LOST_ROW_LAUNCHES):
        missing = tuple(level for level in levels if level not in rates)
        proc = subprocess.run(
            batched_bench_argv(ctx, pp, tg, missing, ctx_size),
            capture_output=True,
            text=True,
            timeout=ctx.settings.trial_timeout_s,
        )
        if proc.returncode != 0:
            said = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
            raise UserError(f"llama-batched-bench failed (exit {proc.returncode}); its last line: {said}")
        rates.update(parse_batched_bench(proc.stdout))  # this launch ran the missing levels only
        if len(rates) == len(levels):
            return rates
    raise UserError(
        f"llama-batched-bench printed rows for levels {sorted(rates)} of {list(levels)} in "
        f"{LOST_ROW_LAUNCHES} launches (exit 0; llama.cpp's logger drops the rows still queued at exit on a busy "
        "host): run the bench again on a quieter host"
    )


def batched_bench_argv(
    ctx: StudyContext, pp: int, tg: int, levels: tuple[int, ...], ctx_size: int
) -> list[str]:
    config = bench_config(ctx)
    command = build_server_command(config, ctx.launch)
    pinning: list[str] = []
    for flag, value in command.options:
        if flag in PINNING_FLAGS:
            assert value is not None, f"{flag} takes a value"
            pinning += [flag, value]
    model = [item for pair in model_options(config, ctx.launch) for item in pair]
    return [
        *command.prefix,
        str(batched_bench_binary(ctx.spec.bin_dir)),
        *model,
        *pinning,
        "-c",
        str(ctx_size),
        "-npp",
        str(pp),
        "-ntg",
        str(tg),
        "-npl",  # the levels, then the smallest once more: a pad whose row is not used (``batched_bench``)
        ",".join(map(str, (*levels, min(levels)))),
        "--output-format",
        "jsonl",
    ]


def load_round(
    ctx: StudyContext, levels: tuple[int, ...], tg: int, per_client: int, ctx_size: int, log_path: Path
) -> tuple[dict[int, float], int]:
    """One server launch with max(levels) slots, every level in turn: (users -> aggregate tokens/s,
    the median prompt length of its requests)."""
    config = replace(bench_config(ctx), parallel=max(levels))
    launch = replace(ctx.launch, ctx_size=ctx_size)
    prompts = ctx.workload.prompts

    def every_level(server: LlamaServer) -> dict[int, Level]:
        server.complete(prompts[0].text, tg, 0.0, ctx.settings.seed)  # warm-up, as batched-bench warms up
        return {
            users: run_level(server, prompts, users, tg, 0.0, ctx.settings.seed, rounds=per_client)
            for users in levels
        }

    found = measured_launch(
        ServerLaunch(
            build_server_command(config, launch).argv, log_path, timeout_s=ctx.settings.trial_timeout_s
        ),
        then=every_level,
    ).then
    assert found is not None  # every_level always answers
    prompt_tokens = statistics.median(r.prompt_n for level in found.values() for r in level.requests)
    return {users: level.aggregate_tokens_per_second for users, level in found.items()}, int(prompt_tokens)


def measure_concurrency(
    ctx: StudyContext, levels: tuple[int, ...] = LEVELS, rounds: int = 3, tg: int = 128, per_client: int = 4
) -> list[LevelComparison]:
    """Alternating rounds of the load generator and batched-bench on the study's target."""
    ctx_size = max(levels) * SLOT_CTX
    log_dir = ctx.log_dir / "bench-concurrency"
    load: dict[int, list[float]] = {u: [] for u in levels}
    bench: dict[int, list[float]] = {u: [] for u in levels}
    pp = 0
    for round_index in range(
        rounds
    ):  # round 0 starts with the load: batched-bench takes the prompt length it measured
        for side in ("load", "bench") if round_index % 2 == 0 else ("bench", "load"):
            if side == "load":
                rates, pp = load_round(
                    ctx, levels, tg, per_client, ctx_size, log_dir / f"round-{round_index}.log"
                )
            else:
                rates = batched_bench(ctx, pp, tg, levels, ctx_size)
            for users, rate in rates.items():
                (load if side == "load" else bench)[users].append(rate)
    return [LevelComparison(u, tuple(load[u]), tuple(bench[u])) for u in levels]


def to_dict(found: list[LevelComparison]) -> dict:
    return {
        "levels": [
            {
                "users": c.users,
                "load": list(c.load),
                "batched_bench": list(c.bench),
                "ratio": c.ratio,
                "within": c.within,
            }
            for c in found
        ],
        "tolerance": TOLERANCE,
    }


def markdown(found: list[LevelComparison]) -> str:
    rows = [
        "| users | load generator t/s | llama-batched-bench t/s | ratio | within 10% |",
        "|---|---|---|---|---|",
    ]
    rows += [
        f"| {c.users} | {statistics.median(c.load):.1f} | {statistics.median(c.bench):.1f} | {c.ratio:.3f} | "
        f"{'yes' if c.within else 'no'} |"
        for c in found
    ]
    return "\n".join(rows) + "\n"
