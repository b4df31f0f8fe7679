"""Operator-scale landscapes: a 96-core box's search space as a model built from the research tables.

Why: the recorded synthetic grid has 76 configurations, where any sampler finds the best
in 15 trials. An operator's space (three drafts, K 1-48, eight thread counts with SMT,
four NUMA policies, four temperatures) has tens of thousands, and a trial of a 32B target
costs minutes. These landscapes are that space as a pure-Python model, so a search
strategy can be replayed on it in seconds. They are *not* measured on this machine: every
number comes from the published tables in ``/work/shared/seeds`` (cited where used), and
the shape of the speculative curve is deliberately not the sampler's own model
(acceptance decays along the draft, verification of K tokens costs a little more than
one step, the draft's cost grows with the thread count): a search must find optima, not
recompute them.

A configuration is a ``tuner.search.space.TrialConfig`` from the real ``suggest`` on a
``ResolvedSpace`` made by ``tuner.search.space.resolve_space`` for a 96-core / 192-thread,
4-node topology. ``evaluate`` gives its true per-content rates, acceptance, quality and
feasibility; ``measure`` simulates a trial the way ``tuner.measurement.measure.run_workload`` runs
one (launch, one warm-up request, repetitions over the prompts, one sample per request)
with noise, and its seconds; a ``stop`` callback sees every sample, so pruning shows up
in the seconds.

Variants (``LANDSCAPES``):
- ``dense-code``: Qwen2.5-Coder-32B with three drafts on code prompts (optimum: the 0.5B
  draft at a large K, interleave, 96 threads, greedy);
- ``dense-prose``: the same on prose (small K);
- ``dense-moved``: another host and workload where the optima move: mixed prompts, the
  1.5B draft best, temperature 0.5 helps acceptance (0.7 is faster but below the quality
  floor), ``distribute`` beats interleave and 72 threads beat 96 (and fewer still with a
  draft, whose cost grows with threads);
- ``moe-lookup``: Qwen3-Coder-30B-A3B with an expert count and prompt-lookup (n-gram)
  speculation on grounded prompts; one n-gram type drafts nothing (a failed trial).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable

import numpy as np

from tuner.measurement.failures import FailureReason
from tuner.storage.records import StudyRecord, digest
from tuner.search.space import Choices, FloatRange, IntRange, RawSpace, ResolvedSpace, TrialConfig, resolve_space
from tuner.studyfile.validate import Fields

N_PREDICT = 128  # tokens per request, as in the research's protocol (seed 000, 3.3)
REPETITIONS = 3  # passes over the prompts (seed 000, 3.3: "3+ runs per configuration")
PHYSICAL_CORES, LOGICAL_CPUS, NODES = 96, 192, (0, 1, 2, 3)  # EPYC 9655 (seed 002, 1), NPS4


@dataclass(frozen=True)
class Draft:
    """A draft model (or an n-gram type: ``cost`` 0, ``match`` < 1)."""

    cost: float  # draft step / target step at 96 threads
    accept: dict[str, float]  # per-token acceptance at temperature 0, per content type
    temp_slope: dict[str, float] = field(default_factory=dict)  # d(acceptance)/d(temperature)
    match: dict[str, float] = field(default_factory=dict)  # n-gram: share of rounds that find a draft
    load_s: float = 1.0
    fails: bool = False  # drafts nothing on this workload


@dataclass(frozen=True)
class Hardware:
    """How NUMA policy and thread count scale decode (seed 003, Track A table)."""

    numa: dict[str, float]  # factor at the best thread count
    tau: float  # threads at which bandwidth saturates (1 - e^-t/tau)
    contention_from: int  # above this, more threads contend (physical cores)
    contention: float  # factor lost per 96 threads above contention_from
    smt_penalty: float  # factor lost per 96 threads above the physical cores
    draft_thread_coupling: float  # draft cost grows by this per 96 threads (small models do not scale)
    bind_node: dict[int, float] = field(default_factory=dict)  # small per-node differences under bind


@dataclass(frozen=True)
class Outcome:
    ok: bool
    failure: str | None
    rates: dict[str, float]  # true tokens/s per content type
    acceptance: float
    quality: float
    feasible: bool


@dataclass(frozen=True)
class Measurement:
    """One simulated trial: what ``run_workload`` would have returned, and what it cost."""

    samples: tuple[dict, ...]  # per request: prompt_id, suite (content type), repetition, tokens_per_second
    tokens_per_second: float  # median over repetitions of each repetition's pooled rate (0 when stopped early)
    acceptance: float
    seconds: float
    stopped: bool  # the stop callback ended it early (a pruned trial)


@dataclass(frozen=True)
class OperatorLandscape:
    name: str
    description: str
    space: ResolvedSpace
    prompts: tuple[str, ...]  # content type per prompt, in workload order
    base_rate: dict[str, float]  # target alone at the best hardware, default experts, per content type
    drafts: dict[str, Draft]  # by draft name, and by spec_type for n-gram types
    hardware: Hardware
    verify_cost: float  # verifying K tokens costs 1 + verify_cost * K target steps
    decay: float  # per-position acceptance decay along a draft
    quality_temp: float  # quality lost per unit temperature
    quality_floor: float
    expert_speed: Callable[[int], float] | None = None  # rate factor vs default experts
    expert_quality: Callable[[int], float] | None = None
    prompt_tokens: dict[str, int] = field(default_factory=lambda: {"code": 40, "prose": 60})
    prefill_rate: float = 69.0  # prompt tokens/s at the best hardware (seed 002, 3.1: 69.05 t/s for 32B)
    launch_s: float = 13.0  # server start and model load from the page cache (19 GB)
    request_overhead_s: float = 0.3
    cv_request: float = 0.03  # spread of one request's rate
    cv_launch: float = 0.012  # spread of a whole launch (placement, clocks)
    host: str = "AMD EPYC 9655 (NPS4)"  # the machine (warm starts match on it: tuner.search.prior)
    target: str = "Qwen2.5-Coder-32B-Instruct Q4_K_M"  # the target model's identity

    def study_record(self, objectives: tuple[str, ...]) -> StudyRecord:
        """The record a study of this landscape stores: its space, objectives, machine and target."""
        fingerprint = {"cpu_model": self.host, "logical_cpus": LOGICAL_CPUS, "physical_cores": PHYSICAL_CORES,
                       "numa_nodes": [str(n) for n in NODES], "memory_gib": 768}
        return StudyRecord.for_replay(self.name, self.space.describe(), objectives, fingerprint=fingerprint,
                                      target={"name": self.target}, workload={"digest": digest(self.prompts)})

    # -- the true landscape -------------------------------------------------------------

    def hardware_factor(self, config: TrialConfig) -> float:
        hw = self.hardware
        t = config.threads
        if config.numa == "bind":  # one node: its own cores, its own memory
            node_cores = PHYSICAL_CORES // len(NODES)
            sat = 1 - math.exp(-min(t, node_cores) / (hw.tau / len(NODES)))
            over = max(0, t - node_cores) / node_cores
            # more threads than the node has cores share them (SMT, then oversubscription)
            factor = hw.numa["bind"] * hw.bind_node.get(config.numa_node or 0, 1.0) * sat * max(0.35, 1 - 0.15 * over)
            return max(factor, 0.02)
        sat = (1 - math.exp(-min(t, PHYSICAL_CORES) / hw.tau)) / (1 - math.exp(-hw.contention_from / hw.tau))
        sat = min(sat, 1.0)
        cont = hw.contention * max(0, min(t, PHYSICAL_CORES) - hw.contention_from) / PHYSICAL_CORES
        smt = hw.smt_penalty * max(0, t - PHYSICAL_CORES) / PHYSICAL_CORES
        return max(hw.numa[config.numa] * sat * (1 - cont) * (1 - smt), 0.02)

    def _speculation(self, config: TrialConfig, content: str, target_rate: float) -> tuple[float, float]:
        """(rate factor over the target alone, measured acceptance) for one content type."""
        if not config.speculative:
            return 1.0, 0.0
        d = self.drafts[config.draft if config.spec_type == "draft-simple" else config.spec_type]
        k = config.draft_max or 8
        a0 = d.accept[content] + d.temp_slope.get(content, 0.0) * config.temperature
        a0 = min(max(a0, 0.0), 0.999)
        # accepted prefix with per-position acceptance a0 * decay^(i-1)
        survive, accepted = 1.0, 0.0
        for i in range(k):
            survive *= a0 * self.decay ** i
            accepted += survive
        coupling = 1 + self.hardware.draft_thread_coupling * (config.threads / PHYSICAL_CORES - 1)
        # a faster target (fewer experts) makes the same draft relatively dearer
        cost = d.cost * coupling * (target_rate / self.base_rate[content])
        verify = 1 + self.verify_cost * k * (target_rate / self.base_rate[content])
        m = d.match.get(content, 1.0)
        tokens = m * (1 + accepted) + (1 - m)
        time = m * (verify + cost * k) + (1 - m) * (1 + cost)
        return tokens / time, accepted / k

    def evaluate(self, config: TrialConfig) -> Outcome:
        spec_draft = self.drafts.get(config.draft if config.spec_type == "draft-simple" else config.spec_type)
        quality = 1.0 - self.quality_temp * config.temperature
        experts_factor = 1.0
        if config.experts is not None and self.expert_speed:
            experts_factor = self.expert_speed(config.experts)
            quality -= 1.0 - self.expert_quality(config.experts)
        if config.speculative and (spec_draft is None or spec_draft.fails):
            return Outcome(False, FailureReason.SPECULATION_UNAVAILABLE.value, {}, 0.0, 0.0, False)
        hw = self.hardware_factor(config)
        rates, accept = {}, []
        for content in set(self.prompts):
            target = self.base_rate[content] * experts_factor
            ratio, acc = self._speculation(config, content, target)
            rates[content] = target * hw * ratio
            accept.append(acc)
        quality = round(quality, 6)
        return Outcome(True, None, rates, float(np.mean(accept)), quality, quality >= self.quality_floor)

    def true_rate(self, config: TrialConfig) -> float:
        """Pooled tokens/s over the workload without noise (equal tokens per prompt: a harmonic mean)."""
        out = self.evaluate(config)
        if not out.ok:
            return 0.0
        return len(self.prompts) / sum(1.0 / out.rates[c] for c in self.prompts)

    # -- the whole space ------------------------------------------------------------------

    def configurations(self):
        """Every configuration ``suggest`` can return on this space."""
        d = self.space.domains
        values = lambda name: _values(d[name]) if name in d else [None]  # noqa: E731
        specs = []
        for spec in d["spec_type"].values:
            if spec == "none":
                specs.append((spec, None, None))
            else:
                drafts = values("draft") if spec == "draft-simple" else [None]
                specs.extend((spec, dr, k) for dr in drafts for k in values("draft_max"))
        numas = [(p, n) for p in values("numa") for n in (values("numa_node") if p == "bind" else [None])]
        for (spec, draft, k), temp, experts, (numa, node), threads in itertools.product(
                specs, values("temperature"), values("experts"), numas, values("threads")):
            yield TrialConfig(spec_type=spec, draft=draft, draft_max=k, temperature=temp, experts=experts,
                              numa=numa, numa_node=node, threads=threads)

    @cached_property
    def size(self) -> int:
        return sum(1 for _ in self.configurations())

    @cached_property
    def optimum(self) -> tuple[float, TrialConfig]:
        """The best feasible configuration and its true tokens/s (exhaustive; a few seconds)."""
        best, best_config = 0.0, None
        for config in self.configurations():
            out = self.evaluate(config)
            if out.ok and out.feasible:
                rate = len(self.prompts) / sum(1.0 / out.rates[c] for c in self.prompts)
                if rate > best:
                    best, best_config = rate, config
        return best, best_config

    # -- one simulated trial --------------------------------------------------------------

    def measure(self, config: TrialConfig, rng: np.random.Generator,
                stop: Callable[[list[dict]], bool] | None = None) -> tuple[Outcome, Measurement]:
        """Launch, warm up with one request of the first prompt, then repetitions over the prompts.

        ``stop(samples)`` is asked after every request but the last; True ends the trial there.
        """
        out = self.evaluate(config)
        draft = self.drafts.get(config.draft or "")
        seconds = self.launch_s + (draft.load_s if draft and config.spec_type == "draft-simple" else 0.0)
        if not out.ok:  # the server starts, serves, drafts nothing: one request shows it
            return out, Measurement((), 0.0, 0.0, seconds + N_PREDICT / 20.0, False)
        hw = self.hardware_factor(config)
        launch = max(0.5, 1 + self.cv_launch * rng.standard_normal())

        def request(content: str, prompt: int) -> tuple[float, float]:
            rate = out.rates[content] * launch * self._prompt_factor[prompt] * max(
                0.5, 1 + self.cv_request * rng.standard_normal())
            secs = N_PREDICT / rate + self.prompt_tokens[content] / (self.prefill_rate * hw) + self.request_overhead_s
            return rate, secs

        _, secs = request(self.prompts[0], 0)  # warm-up, discarded
        seconds += secs
        samples: list[dict] = []
        for repetition in range(REPETITIONS):
            for i, content in enumerate(self.prompts):
                rate, secs = request(content, i)
                seconds += secs
                samples.append({"prompt_id": f"p{i}", "suite": content, "repetition": repetition,
                                "tokens_per_second": rate})
                last = repetition + 1 == REPETITIONS and i + 1 == len(self.prompts)
                if stop and not last and stop(samples):  # as a study: never after the last request
                    return out, Measurement(tuple(samples), pooled(samples), out.acceptance, seconds, True)
        per_rep = [pooled([s for s in samples if s["repetition"] == r]) for r in range(REPETITIONS)]
        return out, Measurement(tuple(samples), float(np.median(per_rep)), out.acceptance, seconds, False)

    @cached_property
    def _prompt_factor(self) -> tuple[float, ...]:
        """Prompts differ in speed (length of the answer's easy parts); fixed per landscape."""
        rng = np.random.default_rng(sum(map(ord, self.name)))
        return tuple(float(v) for v in np.exp(0.06 * rng.standard_normal(len(self.prompts))))


def pooled(samples: list[dict]) -> float:
    """Total tokens over total decode time, equal tokens per request (``tuner.measurement.measure.pooled_rate``)."""
    return len(samples) / sum(1.0 / s["tokens_per_second"] for s in samples) if samples else 0.0


def _values(domain) -> list:
    if isinstance(domain, Choices):
        return list(domain.values)
    if isinstance(domain, IntRange):
        return list(range(domain.low, domain.high + 1, domain.step))
    assert isinstance(domain, FloatRange) and domain.step
    n = int(round((domain.high - domain.low) / domain.step))
    return [round(domain.low + i * domain.step, 10) for i in range(n + 1)]


def operator_space(spec_types: tuple[str, ...], drafts: tuple[str, ...], *, temperatures=(0.0, 0.3, 0.5, 0.7),
                   experts: int | None = None, k_high: int = 48, threads_high: int = LOGICAL_CPUS) -> ResolvedSpace:
    """The space a study would resolve on the 96-core / 192-thread, 4-node box (SMT allowed).

    ``k_high`` and ``threads_high`` shrink it for tests."""
    domains = {
        "spec_type": Choices(spec_types),
        "draft_max": IntRange(1, k_high),
        "temperature": Choices(tuple(temperatures)),
        "numa": Choices(("none", "interleave", "bind", "distribute")),
        "threads": IntRange(24, threads_high, step=24),  # 8 thread counts, SMT above 96
    }
    if drafts:
        domains["draft"] = Choices(drafts)
    if experts:
        domains["experts"] = IntRange(1, experts)
    return resolve_space(RawSpace(domains, allow_smt=True), fields=Fields("operator-landscape", {}),
                         draft_names=drafts, expert_used_count=experts, expert_count=experts * 16 if experts else None,
                         physical_cores=PHYSICAL_CORES, logical_cpus=LOGICAL_CPUS,
                         numa_policies=("none", "interleave", "bind", "distribute"), numa_nodes=NODES)


# -- the variants ---------------------------------------------------------------------------

DENSE_DRAFTS = ("qwen2.5-0.5b-instruct-q8_0", "qwen2.5-coder-1.5b-q4_k_m", "qwen2.5-coder-32b-q2_k")

# seed 003, Track A (Qwen2.5-Coder-32B tg128): interleave -t 96 3.77 t/s = 1.0; membind=0 -t 96 2.05 (0.54);
# cpunodebind=0+membind=0 -t 48 2.10 (0.56); interleave -t 192 1.62 (0.43: SMT hurts). "none" (first touch,
# the weights on the node that read them) is set so the baseline decodes 2.9 t/s (seed 002, 3.1: 2.89 t/s).
EPYC = Hardware(numa={"interleave": 1.0, "distribute": 0.93, "none": 0.77, "bind": 0.62},
                tau=28.0, contention_from=96, contention=0.0, smt_penalty=0.57, draft_thread_coupling=0.25,
                bind_node={0: 0.97, 1: 1.0, 2: 1.0, 3: 0.99})


def _dense(name: str, description: str, prompts: tuple[str, ...], drafts: dict[str, Draft], hardware: Hardware,
           quality_temp: float = 0.05, quality_floor: float = 0.97) -> OperatorLandscape:
    return OperatorLandscape(
        name=name, description=description,
        space=operator_space(("none", "draft-simple"), tuple(drafts)),
        prompts=prompts,
        base_rate={"code": 3.77, "prose": 3.77},  # seed 003, Track A: 3.77 t/s at interleave, 96 threads
        drafts=drafts, hardware=hardware,
        verify_cost=0.012, decay=0.9985, quality_temp=quality_temp, quality_floor=quality_floor,
    )


# Acceptance and cost per draft, Qwen2.5-Coder-32B target (seed 002, 3.2-3.3 and appendix D; seed 003, Track C):
# 0.5B Q8_0: code K=4 96.8%, K=24 83.3% -> a = 0.985; prose K=8 32.4% -> a = 0.74; speedup 10x at K=24 -> c = 0.046.
# Coder-1.5B Q4_K_M: same acceptance as the 0.5B (58% vs 58%) at 12.5 vs 22.5 t/s -> c = 0.13.
# 32B Q2_K self-draft: 60.7% at K=8, 0.63x -> a = 0.89, c = 1.0 (a 12 GB draft; never worth it).
# Temperature: Coder-32B 26.6 t/s at 0, 19.0 at 0.5, 19.4 at 0.7 (seed 003, Track 1) -> acceptance falls ~0.06/unit.
CODER_DRAFTS = {
    "qwen2.5-0.5b-instruct-q8_0": Draft(0.046, {"code": 0.985, "prose": 0.74}, {"code": -0.06, "prose": -0.08}, load_s=0.5),
    "qwen2.5-coder-1.5b-q4_k_m": Draft(0.13, {"code": 0.988, "prose": 0.76}, {"code": -0.05, "prose": -0.07}, load_s=1.0),
    "qwen2.5-coder-32b-q2_k": Draft(1.0, {"code": 0.93, "prose": 0.86}, {"code": -0.04, "prose": -0.04}, load_s=5.0),
}
# Another host and draft builds: the 0.5B draft matches poorly here, the 1.5B is Q2_K (cheaper), temperature
# *raises* acceptance as for Qwen2.5-VL-7B (28.3 -> 57.1 t/s at 0.7) and Qwen2.5-Math-72B (best at 0.5), seed 003.
MOVED_DRAFTS = {
    "qwen2.5-0.5b-instruct-q8_0": Draft(0.05, {"code": 0.93, "prose": 0.62}, {"code": 0.02, "prose": 0.10}, load_s=0.5),
    "qwen2.5-coder-1.5b-q4_k_m": Draft(0.075, {"code": 0.975, "prose": 0.80}, {"code": 0.02, "prose": 0.16}, load_s=1.0),
    "qwen2.5-coder-32b-q2_k": Draft(0.9, {"code": 0.94, "prose": 0.88}, {"code": 0.0, "prose": 0.02}, load_s=5.0),
}
# A host where bandwidth saturates early and 96 threads contend: 72 threads best; distribute beats interleave.
MOVED_HARDWARE = Hardware(numa={"distribute": 1.0, "interleave": 0.94, "none": 0.74, "bind": 0.6},
                          tau=18.0, contention_from=72, contention=0.45, smt_penalty=0.6,
                          draft_thread_coupling=0.9, bind_node={0: 1.0, 1: 0.98, 2: 1.0, 3: 0.97})

# Qwen3-Coder-30B-A3B (seed 003, Tracks 2 and 8): 26.6 t/s alone, 22.8 at the study's baseline (first touch);
# 6 experts 30.1, 4 experts ~35, 3 experts ~38 (Qwen3-VL-30B: 37.7, "3 experts safe"); lookup alone 43.2
# (summarize) / 40.9 (code) with near-100% acceptance of what it drafts; MoE + lookup 47.5 t/s.
# A 0.6B draft does not help a 3B-active MoE (seed 000, 4.3): c ~ 0.45.
MOE_HARDWARE = Hardware(numa={"interleave": 1.0, "distribute": 0.95, "none": 0.857, "bind": 0.7},
                        tau=22.0, contention_from=96, contention=0.0, smt_penalty=0.5, draft_thread_coupling=0.3,
                        bind_node={0: 0.97, 1: 1.0, 2: 0.99, 3: 1.0})
MOE_DRAFTS = {
    "qwen3-0.6b-q8_0": Draft(0.45, {"code": 0.7, "prose": 0.6}, {"code": -0.05, "prose": -0.05}, load_s=0.8),
    "ngram-simple": Draft(0.0, {"code": 0.78, "prose": 0.84}, {"code": -0.25, "prose": -0.25},
                          match={"code": 0.2, "prose": 0.3}),
    "ngram-map-k": Draft(0.0, {"code": 0.84, "prose": 0.88}, {"code": -0.25, "prose": -0.25},
                         match={"code": 0.22, "prose": 0.32}),
    "ngram-map-k4v": Draft(0.0, {"code": 0.9, "prose": 0.9}, match={"code": 0.0, "prose": 0.0}, fails=True),
    "ngram-mod": Draft(0.0, {"code": 0.88, "prose": 0.9}, {"code": -0.2, "prose": -0.2},
                       match={"code": 0.16, "prose": 0.25}),
}
_MOE_QUALITY = {8: 1.0, 7: 0.996, 6: 0.992, 5: 0.985, 4: 0.978, 3: 0.968, 2: 0.9, 1: 0.6}


def _moe() -> OperatorLandscape:
    return OperatorLandscape(
        name="moe-lookup",
        description="Qwen3-Coder-30B-A3B: experts 1-8, a 0.6B draft and four n-gram types, grounded prompts",
        space=operator_space(("none", "draft-simple", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"),
                             ("qwen3-0.6b-q8_0",), experts=8),
        prompts=("prose", "code", "prose", "code", "prose", "code", "prose", "code", "prose"),
        base_rate={"code": 26.6, "prose": 26.6},
        drafts=MOE_DRAFTS, hardware=MOE_HARDWARE,
        verify_cost=0.05,  # a MoE verifies K tokens through more experts than one
        decay=0.995, quality_temp=0.04, quality_floor=0.96,
        # 1/rate = fixed + per expert: 26.6 t/s at 8, 30.1 at 6, 35 at 4 (seed 003, Track 2)
        expert_speed=lambda e: (0.0196 + 0.00225 * 8) / (0.0196 + 0.00225 * e),
        expert_quality=lambda e: _MOE_QUALITY[e],
        prompt_tokens={"code": 60, "prose": 600},  # summarization prompts are long: that is why lookup works
        prefill_rate=150.0, launch_s=12.0, target="Qwen3-Coder-30B-A3B-Instruct Q4_K_M",
    )


def landscapes() -> dict[str, OperatorLandscape]:
    code, prose = ("code",) * 9, ("prose",) * 9
    return {
        "dense-code": _dense("dense-code", "Qwen2.5-Coder-32B, three drafts, nine code prompts", code,
                             CODER_DRAFTS, EPYC),
        "dense-prose": _dense("dense-prose", "Qwen2.5-Coder-32B, three drafts, nine prose prompts", prose,
                              CODER_DRAFTS, EPYC),
        "dense-moved": replace(
            _dense("dense-moved", "another host: mixed prompts, optima moved (draft, K, temperature, NUMA, threads)",
                   ("code", "prose") * 4 + ("code",), MOVED_DRAFTS, MOVED_HARDWARE, quality_temp=0.05,
                   quality_floor=0.97),
            host="Intel Xeon 6980P (SNC3)"),
        "moe-lookup": _moe(),
    }


LANDSCAPES = ("dense-code", "dense-prose", "dense-moved", "moe-lookup")
