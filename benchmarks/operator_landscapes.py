"""Operator-scale landscapes: a 96-core box's search space as a model built from the research tables.

Why: the recorded synthetic grid has 76 configurations, where any sampler finds the best
in 15 trials. An operator's space (three drafts, K 1-48, eight thread counts with SMT,
four NUMA policies, four temperatures) has tens of thousands, and a trial of a 32B target
costs minutes. These landscapes are that space as a pure-Python model, so a search
strategy can be replayed on it in seconds. They are *not* measured on this machine: every
number comes from the published tables of the research notes (each figure's note and section: docs/decisions.md,
"The research's figures").

The tables set figures; ``benchmarks/landscape_model`` says what they mean (how a configuration decodes) and
``benchmarks/landscape_simulation`` how a replay sees a landscape (its whole space, a noisy trial). The space
here is the one a study would resolve for a 96-core / 192-thread, 4-node topology (``operator_space``).

Variants (``LANDSCAPES``):
- ``dense-code``: Qwen2.5-Coder-32B with three drafts on code prompts (optimum: the 0.5B
  draft at a large K, interleave, 96 threads, greedy);
- ``dense-prose``: the same on prose (small K);
- ``dense-moved``: another host and workload where the optima move: mixed prompts, the
  1.5B draft best, temperature 0.5 helps acceptance (0.7 is faster but below the quality
  floor), ``distribute`` beats interleave and 72 threads beat 96 (and fewer still with a
  draft, whose cost grows with threads);
- ``moe-lookup``: Qwen3-Coder-30B-A3B with an expert count and prompt-lookup (n-gram)
  speculation on grounded prompts, alone or stacked on a 0.6B draft, with n-gram key length,
  minimum hits and draft length; one n-gram type drafts nothing (a failed trial);
- ``dense-stack``: Qwen2.5-Coder-32B with three drafts and three lookup types, alone and stacked
  (``--spec-type ngram-map-k,draft-simple``), on summaries, code edits and chat (optimum: a stack);
- ``dense-serve``: Qwen2.5-Coder-32B with three drafts served to 8 users at once (the objective:
  aggregate tokens/s at 8 users) with the serving knobs: slots, batch sizes, flash attention and KV
  cache types (a quantized cache costs quality: the landscape knows which are below the floor).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.landscape_model import LOGICAL_CPUS, N_PREDICT, Draft, Grounding, Hardware, Lookup, Serving
from benchmarks.landscape_simulation import OperatorLandscape
from tuner.knobs.config import Choices, Domain, IntRange, RawSpace
from tuner.search.space import ResolvedSpace, SpaceHost, SpaceTarget, resolve_space
from tuner.studyfile.validate import Fields


@dataclass(frozen=True)
class SpaceOptions:
    """What an operator landscape's space holds besides its speculative types and drafts: temperatures, the
    expert count, the lookups stacked on the draft models. ``k_high`` and ``threads_high`` shrink it for tests;
    ``serving``: the serving knobs' domains, for ``users`` at once (as a study's ``concurrent:`` section). With
    ``hardware``, the space a study resolves on that host by default: every thread count from 1 to its logical
    CPUs (SMT siblings above the physical cores), where the 96-core landscapes step by 24."""

    temperatures: tuple[float, ...] = (0.0, 0.3, 0.5, 0.7)
    experts: int | None = None
    k_high: int = 48
    threads_high: int = LOGICAL_CPUS
    lookups: tuple[str, ...] = ()
    serving: dict | None = None
    users: int = 1
    hardware: Hardware | None = None


def operator_space(
    spec_types: tuple[str, ...], drafts: tuple[str, ...], options: SpaceOptions = SpaceOptions()
) -> ResolvedSpace:
    """The space a study would resolve on the 96-core / 192-thread, 4-node box (SMT allowed), as ``options``
    shape it. N-gram sizes are searched wherever a lookup type is in play: lookups of 3-4 tokens find keys
    in short answers where llama.cpp's default of 12 finds nothing."""
    temperatures, experts, lookups, hardware = (
        options.temperatures,
        options.experts,
        options.lookups,
        options.hardware,
    )
    k_high, threads_high, serving, users = (
        options.k_high,
        options.threads_high,
        options.serving,
        options.users,
    )
    topology = hardware or EPYC
    # one node: every policy is the default allocation (tuner.measurement.launch.meaningful_numa_policies)
    policies = ("none", "interleave", "bind", "distribute") if len(topology.nodes) > 1 else ("none",)
    domains: dict[str, Domain] = {
        "spec_type": Choices(spec_types),
        "draft_max": IntRange(1, k_high),
        "temperature": Choices(tuple(temperatures)),
        "numa": Choices(policies),
        # as a host presents it (every integer), or 8 thread counts with SMT above 96
        "threads": IntRange(1, topology.logical) if hardware else IntRange(24, threads_high, step=24),
        "ngram_key": IntRange(1, 8),
        "ngram_min_hits": IntRange(1, 3),
        "lookup_max": IntRange(4, k_high, step=4),
    }
    if drafts:
        domains["draft"] = Choices(drafts)
    if lookups:
        domains["lookup"] = Choices(("none", *lookups))
    if experts:
        domains["experts"] = IntRange(1, experts)
    return resolve_space(
        RawSpace(domains, allow_smt=True, concurrent=serving or {}),
        fields=Fields(Path("operator-landscape"), {}),
        concurrency=(1, users),
        target=SpaceTarget(
            drafts=drafts, expert_used_count=experts, expert_count=experts * 16 if experts else None
        ),
        host=SpaceHost(
            physical_cores=topology.cores,
            logical_cpus=topology.logical,
            numa_policies=policies,
            numa_nodes=topology.nodes,
        ),
    )


# -- the variants ---------------------------------------------------------------------------

DENSE_DRAFTS = ("qwen2.5-0.5b-instruct-q8_0", "qwen2.5-coder-1.5b-q4_k_m", "qwen2.5-coder-32b-q2_k")

# Qwen2.5-Coder-32B tg128 on the EPYC: interleave -t 96 3.77 t/s = 1.0; membind=0 -t 96 2.05 (0.54);
# cpunodebind=0+membind=0 -t 48 2.10 (0.56); interleave -t 192 1.62 (0.43: SMT hurts). "none" (first touch,
# the weights on the node that read them) is set so the baseline decodes 2.9 t/s (2.89 t/s measured).
EPYC = Hardware(
    numa={"interleave": 1.0, "distribute": 0.93, "none": 0.77, "bind": 0.62},
    tau=28.0,
    contention_from=96,
    contention=0.0,
    smt_penalty=0.57,
    draft_thread_coupling=0.25,
    bind_node={0: 0.97, 1: 1.0, 2: 1.0, 3: 0.99},
)


# Weight bytes of the dense landscapes' GGUF files, as the study record would carry them: the 32B Q4_K_M
# target 19 GB, its Q2_K self-draft 12 GB and the 0.5B Q8_0 507 MB (the research notes' model table); the 1.5B
# Q4_K_M and the 0.5B Q4_K_M about 1.1 GB and 0.4 GB (their published files). The probes read a draft's bytes
# against the target's (``tuner.search.speedup_model.byte_ceiling``).
CODER_WEIGHTS_BYTES = {
    "Qwen2.5-Coder-32B-Instruct Q4_K_M": 19e9,
    "qwen2.5-coder-32b-q2_k": 12e9,
    "qwen2.5-coder-1.5b-q4_k_m": 1.1e9,
    "qwen2.5-0.5b-instruct-q8_0": 0.507e9,
    "qwen2.5-0.5b-instruct-q4_k_m": 0.4e9,
}


def _dense(
    name: str,
    description: str,
    prompts: tuple[str, ...],
    drafts: dict[str, Draft],
    hardware: Hardware,
    quality_temp: float = 0.05,
    quality_floor: float = 0.97,
) -> OperatorLandscape:
    return OperatorLandscape(
        name=name,
        description=description,
        space=operator_space(("none", "draft-simple"), tuple(drafts)),
        prompts=prompts,
        base_rate={"code": 3.77, "prose": 3.77},  # 3.77 t/s at interleave, 96 threads
        drafts=drafts,
        hardware=hardware,
        verify_cost=0.012,
        decay=0.9985,
        quality_temp=quality_temp,
        quality_floor=quality_floor,
        weights_bytes=CODER_WEIGHTS_BYTES,
    )


# Acceptance and cost per draft, Qwen2.5-Coder-32B target:
# 0.5B Q8_0: code K=4 96.8%, K=24 83.3% -> a = 0.985; prose K=8 32.4% -> a = 0.74; speedup 10x at K=24 -> c = 0.046.
# Coder-1.5B Q4_K_M: same acceptance as the 0.5B (58% vs 58%) at 12.5 vs 22.5 t/s -> c = 0.13.
# 32B Q2_K self-draft: 60.7% at K=8, 0.63x -> a = 0.89, c = 1.0 (a 12 GB draft; never worth it).
# Temperature: Coder-32B 26.6 t/s at 0, 19.0 at 0.5, 19.4 at 0.7 -> acceptance falls ~0.06/unit.
CODER_DRAFTS = {
    "qwen2.5-0.5b-instruct-q8_0": Draft(
        0.046, {"code": 0.985, "prose": 0.74}, {"code": -0.06, "prose": -0.08}, load_s=0.5
    ),
    "qwen2.5-coder-1.5b-q4_k_m": Draft(
        0.13, {"code": 0.988, "prose": 0.76}, {"code": -0.05, "prose": -0.07}, load_s=1.0
    ),
    "qwen2.5-coder-32b-q2_k": Draft(
        1.0, {"code": 0.93, "prose": 0.86}, {"code": -0.04, "prose": -0.04}, load_s=5.0
    ),
}
# Another host and draft builds: the 0.5B draft matches poorly here, the 1.5B is Q2_K (cheaper), temperature
# *raises* acceptance as for Qwen2.5-VL-7B (28.3 -> 57.1 t/s at 0.7) and Qwen2.5-Math-72B (best at 0.5).
MOVED_DRAFTS = {
    "qwen2.5-0.5b-instruct-q8_0": Draft(
        0.05, {"code": 0.93, "prose": 0.62}, {"code": 0.02, "prose": 0.10}, load_s=0.5
    ),
    "qwen2.5-coder-1.5b-q4_k_m": Draft(
        0.075, {"code": 0.975, "prose": 0.80}, {"code": 0.02, "prose": 0.16}, load_s=1.0
    ),
    "qwen2.5-coder-32b-q2_k": Draft(
        0.9, {"code": 0.94, "prose": 0.88}, {"code": 0.0, "prose": 0.02}, load_s=5.0
    ),
}
# A host where bandwidth saturates early and 96 threads contend: 72 threads best; distribute beats interleave.
MOVED_HARDWARE = Hardware(
    numa={"distribute": 1.0, "interleave": 0.94, "none": 0.74, "bind": 0.6},
    tau=18.0,
    contention_from=72,
    contention=0.45,
    smt_penalty=0.6,
    draft_thread_coupling=0.9,
    bind_node={0: 1.0, 1: 0.98, 2: 1.0, 3: 0.97},
)

# Qwen3-Coder-30B-A3B: 26.6 t/s alone, 22.8 at the study's baseline (first touch);
# 6 experts 30.1, 4 experts ~35, 3 experts ~38 (Qwen3-VL-30B: 37.7, "3 experts safe"); lookup alone 43.2
# (summarize) / 40.9 (code) with near-100% acceptance of what it drafts; MoE + lookup 47.5 t/s.
# A 0.6B draft does not help a 3B-active MoE (its step costs near half the target's): c ~ 0.45.
MOE_HARDWARE = Hardware(
    numa={"interleave": 1.0, "distribute": 0.95, "none": 0.857, "bind": 0.7},
    tau=22.0,
    contention_from=96,
    contention=0.0,
    smt_penalty=0.5,
    draft_thread_coupling=0.3,
    bind_node={0: 0.97, 1: 1.0, 2: 0.99, 3: 1.0},
)
MOE_DRAFTS = {
    "qwen3-0.6b-q8_0": Draft(0.45, {"code": 0.7, "prose": 0.6}, {"code": -0.05, "prose": -0.05}, load_s=0.8)
}
# The n-gram types: ngram-simple drafts the continuation of the last occurrence, the map types the most frequent
# one, ngram-mod hashes n-grams into a shared pool (more collisions: chance). Near-100% acceptance of what lookup
# drafts on the MoE targets; acceptance falls with temperature as a sample leaves the copy.
LOOKUPS = {
    "ngram-simple": Lookup(fidelity=0.93),
    "ngram-map-k": Lookup(fidelity=0.97, chance=0.8),
    "ngram-mod": Lookup(fidelity=0.95, chance=1.3, key_default=24, length_default=64),
}
MOE_LOOKUPS = {**LOOKUPS, "ngram-map-k4v": Lookup(fidelity=0.97, fails=True)}
# Qwen3-Coder-30B-A3B lookup alone: 43.2 t/s summarizing, 40.9 on code against 26.6 (x1.6, x1.5):
# short copies (the answers quote names and phrases of long prompts), more of them in summaries.
MOE_GROUNDING = {
    "prose": Grounding(copy=0.55, span=9.0, chance=0.5, repeated=0.4),
    "code": Grounding(copy=0.5, span=8.0, chance=0.6, repeated=0.5),
}
_MOE_QUALITY = {8: 1.0, 7: 0.996, 6: 0.992, 5: 0.985, 4: 0.978, 3: 0.968, 2: 0.9, 1: 0.6}


def _moe() -> OperatorLandscape:
    return OperatorLandscape(
        name="moe-lookup",
        description="Qwen3-Coder-30B-A3B: experts 1-8, a 0.6B draft and four n-gram types alone or stacked on it, "
        "n-gram sizes, grounded prompts",
        space=operator_space(
            ("none", "draft-simple", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"),
            ("qwen3-0.6b-q8_0",),
            SpaceOptions(experts=8, lookups=tuple(MOE_LOOKUPS)),
        ),
        prompts=("prose", "code", "prose", "code", "prose", "code", "prose", "code", "prose"),
        base_rate={"code": 26.6, "prose": 26.6},
        drafts=MOE_DRAFTS,
        hardware=MOE_HARDWARE,
        lookups=MOE_LOOKUPS,
        grounding=MOE_GROUNDING,
        verify_cost=0.05,  # a MoE verifies K tokens through more experts than one
        decay=0.995,
        quality_temp=0.04,
        quality_floor=0.96,
        # 1/rate = fixed + per expert: 26.6 t/s at 8, 30.1 at 6, 35 at 4
        expert_speed=lambda e: (0.0196 + 0.00225 * 8) / (0.0196 + 0.00225 * e),
        expert_quality=lambda e: _MOE_QUALITY[e],
        prompt_tokens={"code": 60, "prose": 600},  # summarization prompts are long: that is why lookup works
        prefill_rate=150.0,
        launch_s=12.0,
        target="Qwen3-Coder-30B-A3B-Instruct Q4_K_M",
    )


# Qwen2.5-Coder-32B on grounded work: summaries copy nearly all of their document in long spans (lookup alone
# x12.7 on summarization), code edits copy half (lookup x1.7-1.9 on code; "2-4x" in the literature), chat almost
# nothing. The drafts as on code and prose, and summaries as predictable for them as for the target. Stacked on
# the 0.5B draft at K=24, lookup added a fifth on code (39.44 t/s against 33.0).
STACK_GROUNDING = {
    "summarize": Grounding(copy=0.98, span=80.0, chance=0.5, repeated=0.3),
    "code": Grounding(copy=0.5, span=40.0, chance=0.6, repeated=0.5),
    "prose": Grounding(copy=0.05, span=6.0, chance=0.4, repeated=0.3),
}
STACK_DRAFTS = {
    name: replace(
        d,
        accept={**d.accept, "summarize": d.accept["prose"] + 0.06},
        temp_slope={**d.temp_slope, "summarize": d.temp_slope["prose"]},
    )
    for name, d in CODER_DRAFTS.items()
}


def _stack() -> OperatorLandscape:
    lookups = ("ngram-simple", "ngram-map-k", "ngram-mod")
    return replace(
        _dense(
            "dense-stack",
            "Qwen2.5-Coder-32B, three drafts and three lookup types alone or stacked, n-gram "
            "sizes; summaries, code edits and chat",
            ("summarize", "code", "prose") * 3,
            STACK_DRAFTS,
            EPYC,
        ),
        space=operator_space(
            ("none", "draft-simple", *lookups), tuple(STACK_DRAFTS), SpaceOptions(lookups=lookups)
        ),
        base_rate={"summarize": 3.77, "code": 3.77, "prose": 3.77},
        lookups=LOOKUPS,
        grounding=STACK_GROUNDING,
        prompt_tokens={"summarize": 800, "code": 200, "prose": 60},
    )


# Qwen2.5-Coder-32B served to 8 users (an editor plugin's team): code edits and chat. Batched decode: prompt
# processing runs 69.05 t/s where decode runs 2.89, so a batch is compute-bound near 24 tokens per
# decode step; below that, a batch costs one pass over the weights plus verification's cost per token (the dense
# landscapes' verify_cost, fitted to the research's speedups at large K). The KV cache per context token: 64
# layers x 8 KV heads x 128 dims x (K, V) x 2 bytes = 256 KiB at f16 (the model's config.json) against 19 GB of
# weights; without flash attention the f32 scores of 40 query heads are written and read three
# times per context token and layer (64 x 40 x 4 x 3 bytes).
SERVE = Serving(
    users=8,
    ceiling=69.05 / 2.89,
    kv_bytes=64 * 8 * 128 * 2 * 2 / 19e9,
    scores_bytes=64 * 40 * 4 * 3 / 19e9,
    context={"code": 300 + N_PREDICT // 2, "prose": 100 + N_PREDICT // 2},
)
SERVING_DOMAINS = {
    "parallel": Choices((1, 2, 4, 8, 16)),
    "batch": Choices((512, 2048)),
    "ubatch": Choices((64, 128, 256, 512, 1024, 2048)),
    "flash_attn": Choices(("auto", "on", "off")),
    "cache_type_k": Choices(("f16", "q8_0", "q4_0")),
    "cache_type_v": Choices(("f16", "q8_0", "q4_0")),
}


def _serve() -> OperatorLandscape:
    return replace(
        _dense(
            "dense-serve",
            "Qwen2.5-Coder-32B, three drafts, 8 users at once (aggregate tokens/s): slots, batch "
            "sizes, flash attention, KV cache types; code edits and chat",
            ("code", "prose") * 4 + ("code",),
            CODER_DRAFTS,
            EPYC,
        ),
        space=operator_space(
            ("none", "draft-simple"),
            tuple(CODER_DRAFTS),
            SpaceOptions(temperatures=(0.0,), serving=SERVING_DOMAINS, users=SERVE.users),
        ),
        serving=SERVE,
        prompt_tokens={"code": 300, "prose": 100},
    )


# Hosts as they present threads: every integer from 1 to the logical CPUs. Decode is memory-bound: it gains
# threads until the memory bandwidth saturates, then loses to contention. llama.cpp users report a 96-core EPYC
# 9654 topping out near 60 threads (llama.cpp #6434); on a 16-core Xeon llama-bench put 10-14 threads level with
# 16 (docs/decisions.md, "Thread ties"). The NUMA factors as on the EPYC.
PEAK_60 = replace(EPYC, tau=14.0, contention_from=60, contention=0.35, smt_penalty=0.6)
PEAK_40 = replace(EPYC, tau=9.0, contention_from=40, contention=0.3, smt_penalty=0.6)
ALL_CORES = replace(EPYC, tau=30.0, contention_from=96, contention=0.0, smt_penalty=0.57)
# level from about 40 threads, drafts included (their cost does not grow with threads here)
FLAT = replace(EPYC, tau=10.0, contention_from=96, contention=0.0, smt_penalty=0.6, draft_thread_coupling=0.0)
# A 2-socket, 64-core host (2 x 32 cores, SMT): a model that fits one node runs best bound to it, where no page
# crosses the socket link; the node's bandwidth saturates near 20 of its 32 cores and more threads contend.
TWO_NODE = Hardware(
    numa={"bind": 1.0, "interleave": 0.9, "distribute": 0.88, "none": 0.78},
    tau=16.0,
    contention_from=44,
    contention=0.35,
    smt_penalty=0.6,
    draft_thread_coupling=0.25,
    bind_node={0: 1.0, 1: 0.985},
    cores=64,
    logical=128,
    nodes=(0, 1),
    node_scaled=True,
)
REAL_RANGE = {
    "threads-60": (PEAK_60, "decode tops out near 60 of 96 cores (bandwidth saturates, then contention)"),
    "threads-40": (PEAK_40, "decode tops out near 40 of 96 cores"),
    "threads-all": (ALL_CORES, "decode gains up to all 96 cores (SMT siblings above them lose)"),
    "threads-flat": (FLAT, "decode level within 1% from about 40 threads to all 96 cores"),
    "threads-2node": (TWO_NODE, "a 2-node, 64-core host: bind to one node wins, at about 20 of its 32 cores"),
}


# Two builds of the 0.5B draft: the Q4_K_M is cheaper and accepts a little less, so at their best K the two are
# within 2% of each other, less than one trial's noise on a host whose launches spread 3%: a search that trusts
# one noisy comparison of them, made at other threads, ends on the wrong one.
TWIN_DRAFTS = {
    **CODER_DRAFTS,
    "qwen2.5-0.5b-instruct-q4_k_m": Draft(
        0.038, {"code": 0.982, "prose": 0.72}, {"code": -0.06, "prose": -0.08}, load_s=0.4
    ),
}
TWIN_LAUNCH_SPREAD = 0.03


def _real_range(name: str, drafts: dict[str, Draft] = CODER_DRAFTS) -> OperatorLandscape:
    """Qwen2.5-Coder-32B with its drafts on code, on a host whose ``threads`` is every integer."""
    hardware, what = REAL_RANGE[name]
    return replace(
        _dense(
            name, f"{what}; threads 1..{hardware.logical}, every integer", ("code",) * 9, drafts, hardware
        ),
        space=operator_space(
            ("none", "draft-simple"), tuple(drafts), SpaceOptions(temperatures=(0.0,), hardware=hardware)
        ),
        host=f"{hardware.cores}-core host ({name})",
        probed=True,
    )


def landscapes() -> dict[str, OperatorLandscape]:
    code, prose = ("code",) * 9, ("prose",) * 9
    return {
        "dense-code": _dense(
            "dense-code", "Qwen2.5-Coder-32B, three drafts, nine code prompts", code, CODER_DRAFTS, EPYC
        ),
        "dense-prose": _dense(
            "dense-prose", "Qwen2.5-Coder-32B, three drafts, nine prose prompts", prose, CODER_DRAFTS, EPYC
        ),
        "dense-moved": replace(
            _dense(
                "dense-moved",
                "another host: mixed prompts, optima moved (draft, K, temperature, NUMA, threads)",
                ("code", "prose") * 4 + ("code",),
                MOVED_DRAFTS,
                MOVED_HARDWARE,
                quality_temp=0.05,
                quality_floor=0.97,
            ),
            host="Intel Xeon 6980P (SNC3)",
        ),
        "moe-lookup": _moe(),
        "dense-stack": _stack(),
        "dense-serve": _serve(),
        **{name: _real_range(name) for name in REAL_RANGE},
        "threads-40-twins": replace(
            _real_range("threads-40", TWIN_DRAFTS),
            name="threads-40-twins",
            description="decode tops out near 40 of 96 cores; two 0.5B drafts within 2% of each other, launches "
            f"spread {TWIN_LAUNCH_SPREAD:.0%}; threads 1..192, every integer",
            cv_launch=TWIN_LAUNCH_SPREAD,
        ),
    }


# Landscapes whose threads are every integer, as a host presents them: the real-range targets apply.
REAL_RANGE_LANDSCAPES = (*REAL_RANGE, "threads-40-twins")
LANDSCAPES = (
    "dense-code",
    "dense-prose",
    "dense-moved",
    "moe-lookup",
    "dense-stack",
    "dense-serve",
    *REAL_RANGE_LANDSCAPES,
)
