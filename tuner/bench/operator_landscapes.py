"""Operator-scale landscapes: a 96-core box's search space as a model built from the research tables.

Why: the recorded synthetic grid has 76 configurations, where any sampler finds the best
in 15 trials. An operator's space (three drafts, K 1-48, eight thread counts with SMT,
four NUMA policies, four temperatures) has tens of thousands, and a trial of a 32B target
costs minutes. These landscapes are that space as a pure-Python model, so a search
strategy can be replayed on it in seconds. They are *not* measured on this machine: every
number comes from the published tables of the research notes (``seeds/`` in the shared folder
beside the repository; cited where used), and
the shape of the speculative curve is deliberately not the sampler's own model
(acceptance decays along the draft, verification of K tokens costs a little more than
one step, the draft's cost grows with the thread count): a search must find optima, not
recompute them.

A configuration is a ``tuner.knobs.config.TrialConfig`` from the real ``suggest`` on a
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
  speculation on grounded prompts, alone or stacked on a 0.6B draft, with n-gram key length,
  minimum hits and draft length; one n-gram type drafts nothing (a failed trial);
- ``dense-stack``: Qwen2.5-Coder-32B with three drafts and three lookup types, alone and stacked
  (``--spec-type ngram-map-k,draft-simple``), on summaries, code edits and chat (optimum: a stack);
- ``dense-serve``: Qwen2.5-Coder-32B with three drafts served to 8 users at once (the objective:
  aggregate tokens/s at 8 users) with the serving knobs: slots, batch sizes, flash attention and KV
  cache types (a quantized cache costs quality: the landscape knows which are below the floor).

Prompt lookup is modelled, not tabulated: an answer is copied spans of the prompt (share
``Grounding.copy``, mean length ``span``) between novel tokens. A key of n tokens is found in
a span once n of its tokens went by, and, falling with n, at novel positions by chance (those
drafts are mostly rejected); ``min_hits`` drops keys seen once. A stack asks the lookup first
and lets the draft model draft where it has nothing, as llama.cpp's ``common_speculative``
does, so a stack takes lookup's copied spans and the draft model's acceptance on the rest.

Several users (``Serving``) are modelled as llama-server batches them: one decode call per round takes
every busy slot's tokens (its own token and its K drafts), so the weights are read once per round for
all slots and a round costs little more than one user's until the batch's arithmetic reaches the
cores' throughput (the prompt-processing rate: compute-bound); drafts run slot by slot; every slot's
KV cache is read each round; each request's prompt is processed at the compute-bound rate too.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Callable

import numpy as np

from tuner.knobs.config import Choices, Domain, FloatRange, IntRange, RawSpace, TrialConfig
from tuner.machine.bandwidth import FINGERPRINT_KEY, probe_counts
from tuner.machine.fingerprint import Fingerprint
from tuner.measurement.failures import FailureReason
from tuner.measurement.measure import pooled_from_rates
from tuner.search.space import ResolvedSpace, resolve_space, suggest
from tuner.storage.records import StudyRecord, digest
from tuner.studyfile.validate import Fields

N_PREDICT = 128  # tokens per request, as in the research's protocol (seed 000, 3.3)
REPETITIONS = 3  # passes over the prompts (seed 000, 3.3: "3+ runs per configuration")
PHYSICAL_CORES, LOGICAL_CPUS, NODES = 96, 192, (0, 1, 2, 3)  # EPYC 9655 (seed 002, 1), NPS4


@dataclass(frozen=True)
class Draft:
    """A draft model."""

    cost: float  # draft step / target step at 96 threads
    accept: dict[str, float]  # per-token acceptance at temperature 0, per content type
    temp_slope: dict[str, float] = field(default_factory=dict)  # d(acceptance)/d(temperature)
    load_s: float = 1.0


@dataclass(frozen=True)
class Lookup:
    """A prompt-lookup (n-gram) type: how faithfully it continues a key it found, and llama.cpp's sizes."""

    fidelity: float  # chance its continuation is the one being copied (map types keep the most frequent)
    temp_slope: float = -0.25  # acceptance change per unit temperature (a sampled answer leaves the copy)
    chance: float = 1.0  # spurious matches relative to the grounding's (ngram-mod's hashes collide)
    key_default: int = (
        12  # llama.cpp's key length when the space leaves it out (size-n 12; ngram-mod n-match 24)
    )
    length_default: int = (
        48  # its draft length when stacked without lookup_max (size-m 48; ngram-mod n-max 64)
    )
    fails: bool = (
        False  # drafts nothing on this workload (alone: a failed trial; stacked: the draft model drafts)
    )


@dataclass(frozen=True)
class Grounding:
    """How a content type's answers copy their context (seed 003, Track 8: summarization > code > chat)."""

    copy: float  # share of answer tokens inside spans copied from the prompt (or the answer so far)
    span: float  # mean copied span, tokens: a key of n tokens is found once n tokens of the span went by
    chance: (
        float  # a novel position whose last token occurs in the context anyway (x CHANCE_DECAY per key token)
    )
    repeated: float  # share of copied keys that occur more than once in the context (what min_hits > 1 keeps)


CHANCE_DECAY = 0.3  # each key token more: a third of the spurious matches
SPURIOUS_ACCEPT = 0.1  # a spurious match's first drafted token is right one time in ten
SPURIOUS_REPEATED = 0.2  # share of spurious keys that occur more than once
NO_GROUNDING = Grounding(copy=0.0, span=2.0, chance=0.0, repeated=0.0)


@dataclass(frozen=True)
class Rounds:
    """One speculative round, as arrays over configurations: what it yields and costs (in target steps)."""

    tokens: np.ndarray  # the target's own token plus the accepted drafts
    time: np.ndarray
    drafted: np.ndarray
    accepted: np.ndarray


# Bytes per KV element of each cache type (ggml's blocks: q8_0 34 bytes per 32 values, q4_0 18, ...).
KV_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}
# Quality a quantized KV cache costs (K, V), on the landscapes' agreement scale: in proportion to the KL divergence
# in llama.cpp PR 7412's table (q8_0 V 0.0007, q8_0 K 0.0009 against 0.0002 for f16; q4 several times q8_0; K more
# sensitive than V). The scale is an assumption: 8-bit is harmless, a 4-bit K falls below a 0.97 floor.
KV_LOSS = {
    "f32": (0.0, 0.0),
    "f16": (0.0, 0.0),
    "bf16": (0.0, 0.0),
    "q8_0": (0.004, 0.002),
    "q5_1": (0.012, 0.006),
    "q5_0": (0.014, 0.007),
    "q4_1": (0.03, 0.014),
    "q4_0": (0.035, 0.015),
    "iq4_nl": (0.03, 0.013),
}
# Micro batches above llama.cpp's default 512 spill the caches: the batched rate falls by this per doubling (an
# assumption; below 512 more passes over the weights cost instead, so the best micro batch depends on the load).
UBATCH_FIT, UBATCH_SPILL = 512, 0.06
TARGET_ALONE = Rounds(np.float64(1.0), np.float64(1.0), np.float64(0.0), np.float64(0.0))
# Knobs that do not change what speculation does (they scale it, or are sent per request): not enumerated.
CONTEXT_KNOBS = ("temperature", "experts", "numa", "numa_node", "threads", "threads_batch")


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
    cores: int = PHYSICAL_CORES  # the host's topology
    logical: int = LOGICAL_CPUS
    nodes: tuple[int, ...] = NODES
    # bind on one node: that node's own saturation and contention (its share of tau and contention_from), where
    # the 96-core landscapes model bind as a plain saturation within the node
    node_scaled: bool = False

    @property
    def node_cores(self) -> int:
        return self.cores // len(self.nodes)

    def bandwidth(self, threads: int) -> float:
        """The share of the peak memory bandwidth a copy with ``threads`` threads reaches (what a probe sees)."""
        return (1 - math.exp(-min(threads, self.cores) / self.tau)) / (1 - math.exp(-self.cores / self.tau))


@dataclass(frozen=True)
class Serving:
    """Several users on one server: the level the objective measures and what a batch costs."""

    users: int  # the objective: aggregate tokens/s at this many users at once
    ceiling: float  # batched tokens per single-user decode step once compute-bound
    kv_bytes: float  # f16 K+V bytes per context token / the weights' bytes (read every round per slot)
    scores_bytes: (
        float  # without flash attention: attention scores written and read per context token / weights
    )
    context: dict[
        str, int
    ]  # a request's mean context while it decodes, per content type (prompt + half the answer)
    sharpness: float = 4.0  # how sharply the bandwidth-bound and compute-bound regimes meet (a soft maximum)


@dataclass(frozen=True)
class Outcome:
    ok: bool
    failure: str | None
    rates: dict[str, float]  # true tokens/s per content type (one request at a time)
    acceptance: float
    quality: float
    feasible: bool
    aggregate: float | None = None  # with ``Serving``: true aggregate tokens/s at its level


@dataclass(frozen=True)
class Measurement:
    """One simulated trial: what ``run_workload`` would have returned, and what it cost."""

    samples: tuple[dict, ...]  # per request: prompt_id, suite (content type), repetition, tokens_per_second
    tokens_per_second: (
        float  # median over repetitions of each repetition's pooled rate (0 when stopped early)
    )
    acceptance: float
    seconds: float
    stopped: bool  # the stop callback ended it early (a pruned trial)
    aggregate: float | None = None  # with ``Serving``: aggregate tokens/s measured at its level


@dataclass(frozen=True)
class OperatorLandscape:
    """One modelled box, target and workload: its parameters (every figure cited where it is set), and what a
    replay asks of it, each answered by the piece that owns it: ``SpeedModel`` (true rates, acceptance,
    quality), ``ServingModel`` (several users in one batch), ``SpaceSurvey`` (every configuration and the best
    of them), ``TrialSimulator`` (one noisy trial, request by request, and its seconds)."""

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
    lookups: dict[str, Lookup] = field(default_factory=dict)  # by n-gram spec_type, alone or stacked
    grounding: dict[str, Grounding] = field(default_factory=dict)  # per content type (none: nothing to copy)
    prompt_tokens: dict[str, int] = field(default_factory=lambda: {"code": 40, "prose": 60})
    prefill_rate: float = 69.0  # prompt tokens/s at the best hardware (seed 002, 3.1: 69.05 t/s for 32B)
    launch_s: float = 13.0  # server start and model load from the page cache (19 GB)
    request_overhead_s: float = 0.3
    cv_request: float = 0.03  # spread of one request's rate
    cv_launch: float = 0.012  # spread of a whole launch (placement, clocks)
    host: str = "AMD EPYC 9655 (NPS4)"  # the machine (warm starts match on it: tuner.search.prior)
    target: str = "Qwen2.5-Coder-32B-Instruct Q4_K_M"  # the target model's identity
    serving: Serving | None = None  # several users at once: the objective is their aggregate tokens/s
    probed: bool = False  # the study record carries a bandwidth-by-threads probe of the host

    @property
    def objectives(self) -> tuple[str, ...]:
        """What a study of this landscape maximises first: tokens/s per request, or aggregate at the level."""
        first = f"aggregate_tokens_per_second_c{self.serving.users}" if self.serving else "tokens_per_second"
        return first, "acceptance", "quality"

    def study_record(self, objectives: tuple[str, ...]) -> StudyRecord:
        """The record a study of this landscape stores: its space, objectives, machine and target."""
        hw = self.hardware
        fingerprint: Fingerprint = {
            "cpu_model": self.host,
            "logical_cpus": hw.logical,
            "physical_cores": hw.cores,
            "numa_nodes": [str(n) for n in hw.nodes],
            "memory_gib": 768,
        }
        if self.probed:  # what the copy probe would have measured on this host (tuner.machine.bandwidth)
            fingerprint[FINGERPRINT_KEY] = {str(t): 4e11 * hw.bandwidth(t) for t in probe_counts(hw.cores)}
        return StudyRecord.for_replay(
            self.name,
            self.space.as_dict(),
            objectives,
            fingerprint=fingerprint,
            target={"name": self.target},
            workload={"digest": digest(self.prompts)},
        )

    # -- its pieces, made once per landscape (a ``replace``d landscape makes its own) -----

    @cached_property
    def speed(self) -> SpeedModel:
        return SpeedModel(self)

    @cached_property
    def survey(self) -> SpaceSurvey:
        return SpaceSurvey(self)

    @cached_property
    def simulator(self) -> TrialSimulator:
        return TrialSimulator(self)

    # -- the true landscape -------------------------------------------------------------

    def hardware_factor(self, config: TrialConfig) -> float:
        return self.speed.hardware_factor(config)

    def cores(self, config: TrialConfig) -> float:
        return self.speed.cores(config)

    def evaluate(self, config: TrialConfig) -> Outcome:
        return self.speed.evaluate(config)

    def true_rate(self, config: TrialConfig) -> float:
        return self.speed.true_rate(config)

    # -- the whole space ------------------------------------------------------------------

    @property
    def variants(self) -> dict[tuple, list[TrialConfig]]:
        return self.survey.variants

    @property
    def size(self) -> int:
        return self.survey.size

    @property
    def optimum(self) -> tuple[float, TrialConfig]:
        return self.survey.optimum

    # -- one simulated trial --------------------------------------------------------------

    def measure(
        self, config: TrialConfig, rng: np.random.Generator, stop: Callable[[list[dict]], bool] | None = None
    ) -> tuple[Outcome, Measurement]:
        return self.simulator.measure(config, rng, stop)


class SpeedModel:
    """The landscape's true speed, without noise: what a configuration decodes per content type (hardware,
    experts and speculation as factors over the target alone), its acceptance, quality and feasibility.
    Rounds are arrays over configurations, so ``SpaceSurvey`` weighs thousands at once."""

    def __init__(self, land: OperatorLandscape):
        self.land = land

    @cached_property
    def batched(self) -> ServingModel:
        """The serving part of the model, for a landscape with ``Serving``."""
        return ServingModel(self.land, self)

    def hardware_factor(self, config: TrialConfig) -> float:
        """How the NUMA policy and thread count scale decode against the best hardware (``Hardware``)."""
        hw = self.land.hardware
        t = config.threads
        if config.numa == "bind" and hw.node_scaled:
            return self._bound_node(hw, t, config.numa_node or 0)
        if config.numa == "bind":  # one node: its own cores, its own memory
            node_cores = hw.node_cores
            sat = 1 - math.exp(-min(t, node_cores) / (hw.tau / len(hw.nodes)))
            over = max(0, t - node_cores) / node_cores
            # more threads than the node has cores share them (SMT, then oversubscription)
            factor = (
                hw.numa["bind"]
                * hw.bind_node.get(config.numa_node or 0, 1.0)
                * sat
                * max(0.35, 1 - 0.15 * over)
            )
            return max(factor, 0.02)
        sat = (1 - math.exp(-min(t, hw.cores) / hw.tau)) / (1 - math.exp(-hw.contention_from / hw.tau))
        sat = min(sat, 1.0)
        cont = hw.contention * max(0, min(t, hw.cores) - hw.contention_from) / hw.cores
        smt = hw.smt_penalty * max(0, t - hw.cores) / hw.cores
        return max(hw.numa[config.numa] * sat * (1 - cont) * (1 - smt), 0.02)

    @staticmethod
    def _bound_node(hw: Hardware, t: int, node: int) -> float:
        """Bind on one node of a ``node_scaled`` host: the whole-host curve with the node's share of the
        saturation and contention thresholds; more threads than the node's cores share them."""
        n, cores = len(hw.nodes), hw.node_cores
        sat = (1 - math.exp(-min(t, cores) / (hw.tau / n))) / (1 - math.exp(-hw.contention_from / hw.tau))
        cont = hw.contention * max(0, min(t, cores) - hw.contention_from / n) / cores
        over = max(0, t - cores) / cores
        return max(
            hw.numa["bind"] * hw.bind_node.get(node, 1.0) * min(sat, 1.0) * (1 - cont) * (1 - 0.5 * over),
            0.02,
        )

    def cores(self, config: TrialConfig) -> float:
        """The share of the box's arithmetic a configuration's threads use (SMT siblings add none; bind: one node)."""
        hw = self.land.hardware
        node = hw.node_cores if config.numa == "bind" else hw.cores
        return min(config.threads, node) / hw.cores

    def draft_rounds(
        self, d: Draft, content: str, k: np.ndarray, temperature: float, threads: int, rel: float
    ) -> Rounds:
        """A draft model's round of K drafts: per-position acceptance a0 * decay^(i-1), its cost growing with
        threads; a faster target (fewer experts, ``rel`` < 1) makes the same draft relatively dearer."""
        a0 = min(max(d.accept[content] + d.temp_slope.get(content, 0.0) * temperature, 0.0), 0.999)
        survive, accepted = 1.0, np.zeros(np.shape(k))
        for i in range(int(np.max(k))):
            survive *= a0 * self.land.decay**i
            accepted = accepted + np.where(i < k, survive, 0.0)
        time = 1 + self.land.verify_cost * k * rel + d.cost * self.coupling(threads) * rel * k
        return Rounds(1 + accepted, time, np.asarray(k, dtype=float), accepted)

    def coupling(self, threads: int) -> float:
        """A draft's cost grows with the target's threads (small models do not scale)."""
        hw = self.land.hardware
        return 1 + hw.draft_thread_coupling * (threads / hw.cores - 1)

    def lookup_rounds(
        self,
        lk: Lookup,
        g: Grounding,
        copied: bool,
        ints: dict[str, np.ndarray],
        length: np.ndarray,
        temperature: float,
        rel: float,
    ) -> tuple[np.ndarray, Rounds]:
        """(share of rounds where the lookup finds its key, its round then) in copied spans or novel text."""
        p = 1 - 1 / g.span
        key, hits = ints["ngram_key"], ints["ngram_min_hits"]
        if copied:
            found = p**key * g.repeated ** (hits - 1)
            a = min(max(p * lk.fidelity + lk.temp_slope * temperature, 0.0), 0.999)
        else:
            found = np.minimum(1.0, g.chance * lk.chance * CHANCE_DECAY ** (key - 1)) * SPURIOUS_REPEATED ** (
                hits - 1
            )
            a = SPURIOUS_ACCEPT
        accepted = a * (1 - a**length) / (1 - a)
        return found * (not lk.fails), Rounds(
            1 + accepted, 1 + self.land.verify_cost * length * rel, length, accepted
        )

    def speculation(
        self,
        spec_type: str,
        draft: str | None,
        lookup: str | None,
        content: str,
        ints: dict[str, np.ndarray],
        *,
        temperature: float,
        threads: int,
        rel: float,
    ):
        """(rate factor over the target alone, measured acceptance) for one content type, as arrays over the
        integer knobs ``ints``: the lookup (alone, or stacked first) where it finds a key, else the draft model."""
        land = self.land
        if spec_type == "none":
            return np.ones(np.shape(ints["draft_max"])), np.zeros(np.shape(ints["draft_max"]))
        fallback = TARGET_ALONE
        if spec_type == "draft-simple":
            assert draft is not None, "a draft-model configuration names its draft"
            fallback = self.draft_rounds(
                land.drafts[draft], content, ints["draft_max"], temperature, threads, rel
            )
        ngram = lookup or (spec_type if spec_type in land.lookups else None)
        if ngram is None:
            return fallback.tokens / fallback.time, fallback.accepted / fallback.drafted
        lk, g = land.lookups[ngram], land.grounding.get(content, NO_GROUNDING)
        length = ints["lookup_max"] if lookup else ints["draft_max"]
        per_token = drafted = accepted = 0.0
        for copied, share in ((True, g.copy), (False, 1 - g.copy)):
            found, r = self.lookup_rounds(lk, g, copied, ints, length, temperature, rel)
            tokens = found * r.tokens + (1 - found) * fallback.tokens
            per_token = per_token + share * (found * r.time + (1 - found) * fallback.time) / tokens
            drafted = drafted + share * (found * r.drafted + (1 - found) * fallback.drafted) / tokens
            accepted = accepted + share * (found * r.accepted + (1 - found) * fallback.accepted) / tokens
        return 1 / per_token, np.where(drafted > 0, accepted / np.maximum(drafted, 1e-12), 0.0)

    def ints(self, configs: list[TrialConfig]) -> dict[str, np.ndarray]:
        """The integer knobs of configurations as arrays; a size a study leaves out is llama.cpp's default."""
        lk = self.land.lookups.get(configs[0].ngram_type or "")
        defaults = {
            "draft_max": 8,
            "ngram_key": lk.key_default if lk else 1,
            "ngram_min_hits": 1,
            "lookup_max": lk.length_default if lk else 1,
        }
        return {
            knob: np.array(
                [default if getattr(c, knob) is None else getattr(c, knob) for c in configs], dtype=float
            )
            for knob, default in defaults.items()
        }

    def quality(self, temperature: float, experts: int | None) -> tuple[float, float]:
        """(quality, rate factor of the expert count)."""
        land = self.land
        quality, factor = 1.0 - land.quality_temp * temperature, 1.0
        if experts is not None and land.expert_speed:
            assert land.expert_quality is not None, "a landscape's expert count costs speed and quality both"
            factor = land.expert_speed(experts)
            quality -= 1.0 - land.expert_quality(experts)
        return round(quality, 6), factor

    def fails(self, config: TrialConfig) -> bool:
        """A speculative type with nothing to draft with here (no such draft, a lookup that finds nothing)."""
        source = (
            self.land.drafts.get(config.draft or "")
            if config.spec_type == "draft-simple"
            else self.land.lookups.get(config.spec_type)
        )
        return config.speculative and (source is None or getattr(source, "fails", False))

    def evaluate(self, config: TrialConfig) -> Outcome:
        land = self.land
        quality, experts_factor = self.quality(config.temperature, config.experts)
        if self.fails(config):
            return Outcome(False, FailureReason.SPECULATION_UNAVAILABLE.value, {}, 0.0, 0.0, False)
        if land.serving:
            return self.batched.evaluate(config, quality)
        hw = self.hardware_factor(config)
        rates, accept = {}, []
        ints = self.ints([config])
        for content in sorted(set(land.prompts)):  # a fixed order: sums repeat bit for bit
            ratio, acc = self.speculation(
                config.spec_type,
                config.draft,
                config.lookup if config.stacked else None,
                content,
                ints,
                temperature=config.temperature,
                threads=config.threads,
                rel=experts_factor,
            )
            rates[content] = land.base_rate[content] * experts_factor * hw * float(ratio[0])
            accept.append(float(acc[0]))
        return Outcome(True, None, rates, float(np.mean(accept)), quality, quality >= land.quality_floor)

    def true_rate(self, config: TrialConfig) -> float:
        """The objective without noise: tokens/s pooled over the workload (equal tokens per prompt: a harmonic
        mean), one request at a time, or with ``Serving`` the aggregate at its level."""
        out = self.evaluate(config)
        if not out.ok:
            return 0.0
        if self.land.serving:
            assert out.aggregate is not None, "a serving landscape's outcome has its aggregate"
            return out.aggregate
        return len(self.land.prompts) / sum(1.0 / out.rates[c] for c in self.land.prompts)


class ServingModel:
    """Several users on one server (``Serving``), as llama-server batches them: a round's one decode call
    takes every busy slot's tokens, bandwidth-bound until the batch's arithmetic is compute-bound."""

    def __init__(self, land: OperatorLandscape, speed: SpeedModel):
        assert land.serving is not None, "only a landscape with several users at once is served in batches"
        self.land, self.speed, self.serving = land, speed, land.serving

    def arrays(self, configs: list[TrialConfig]) -> dict[str, np.ndarray]:
        """The serving knobs as arrays: busy slots at the level (fewer slots than users queue the rest), the
        tokens one pass over the weights takes (the micro batch, within the batch), the bytes each context token
        costs a round (KV types; attention scores without flash attention) and the quality the KV types cost."""
        sv = self.serving

        def kv(c: TrialConfig) -> float:
            types = KV_BYTES[c.cache_type_k or "f16"] + KV_BYTES[c.cache_type_v or "f16"]
            return sv.kv_bytes * types / (2 * KV_BYTES["f16"]) + (
                sv.scores_bytes if c.flash_attn == "off" else 0.0
            )

        return {
            "slots": np.array([min(c.parallel or sv.users, sv.users) for c in configs], dtype=float),
            "ubatch": np.array([min(c.ubatch or 512, c.batch or 2048) for c in configs], dtype=float),
            "kv": np.array([kv(c) for c in configs]),
            "loss": np.array(
                [KV_LOSS[c.cache_type_k or "f16"][0] + KV_LOSS[c.cache_type_v or "f16"][1] for c in configs]
            ),
        }

    def step(
        self, tokens: np.ndarray, ubatch: np.ndarray, kv: np.ndarray | float, hw: float, cores: float
    ) -> np.ndarray:
        """One decode call over ``tokens`` (all slots' tokens), in single-user steps at the best hardware: each
        micro batch reads the weights once, each token adds a little (verification's cost) and the slots'
        KV caches are read, at the hardware's bandwidth; the arithmetic runs at the cores' batched rate."""
        passes = np.ceil(tokens / ubatch)
        bandwidth = (passes + self.land.verify_cost * (tokens - passes) + kv) / hw
        efficiency = np.minimum(1.0, 1 - UBATCH_SPILL * np.log2(np.maximum(ubatch, 1) / UBATCH_FIT))
        compute = tokens / (self.serving.ceiling * cores * efficiency)
        p = self.serving.sharpness
        return (bandwidth**p + compute**p) ** (1 / p)

    def served(
        self,
        spec_type: str,
        draft: str | None,
        content: str,
        ints: dict[str, np.ndarray],
        serv: dict[str, np.ndarray],
        slots: np.ndarray,
        *,
        temperature: float,
        threads: int,
        hw: float,
        cores: float,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(decode rate per request, aggregate rate with prompt processing) at ``slots`` busy slots, in
        single-user steps at the best hardware: one round batches every slot's token and K drafts; drafts run
        slot by slot; a closed loop processes each slot's prompt, then its answer."""
        k = ints["draft_max"] if spec_type != "none" else np.zeros(np.shape(ints["draft_max"]))
        accepted, draft_time = np.zeros(np.shape(k)), np.zeros(np.shape(k))
        if spec_type != "none":
            assert draft is not None, "a serving landscape speculates with draft models only"
            d = self.land.drafts[draft]
            accepted = self.speed.draft_rounds(d, content, k, temperature, threads, 1.0).accepted
            draft_time = d.cost * self.speed.coupling(threads) * k / hw
        kv = slots * self.serving.context[content] * serv["kv"]
        round_time = self.step(slots * (1 + k), serv["ubatch"], kv, hw, cores) + slots * draft_time
        prefill = self.step(
            np.full(np.shape(k), float(self.land.prompt_tokens[content])), serv["ubatch"], 0.0, hw, cores
        )
        cycle = slots * prefill + N_PREDICT / (1 + accepted) * round_time
        return (1 + accepted) / round_time, slots * N_PREDICT / cycle

    def evaluate(self, config: TrialConfig, quality: float) -> Outcome:
        """Per request one at a time (what ``run_workload`` measures), and the aggregate at the level."""
        land, speed = self.land, self.speed
        hw, cores = speed.hardware_factor(config), speed.cores(config)
        ints, serv = speed.ints([config]), self.arrays([config])
        quality = round(quality - float(serv["loss"][0]), 6)
        rates, accept, aggregate = {}, [], {}
        for content in sorted(set(land.prompts)):  # a fixed order: sums repeat bit for bit
            args = (config.spec_type, config.draft, content, ints, serv)
            alone, _ = self.served(
                *args, np.ones(1), temperature=config.temperature, threads=config.threads, hw=hw, cores=cores
            )
            _, level = self.served(
                *args,
                serv["slots"],
                temperature=config.temperature,
                threads=config.threads,
                hw=hw,
                cores=cores,
            )
            rates[content], aggregate[content] = (
                land.base_rate[content] * float(alone[0]),
                land.base_rate[content] * float(level[0]),
            )
            accept.append(
                float(
                    speed.speculation(
                        config.spec_type,
                        config.draft,
                        None,
                        content,
                        ints,
                        temperature=config.temperature,
                        threads=config.threads,
                        rel=1.0,
                    )[1][0]
                )
            )
        pooled_level = len(land.prompts) / sum(1.0 / aggregate[c] for c in land.prompts)
        return Outcome(
            True, None, rates, float(np.mean(accept)), quality, quality >= land.quality_floor, pooled_level
        )

    def inverse(
        self,
        spec: str,
        draft: str | None,
        configs: list[TrialConfig],
        ints: dict[str, np.ndarray],
        *,
        temperature: float,
        threads: int,
        hw: float,
        cores: float,
        quality: float,
    ) -> np.ndarray:
        """Seconds per pooled token at the level, as arrays over configurations (infinite below the floor)."""
        land = self.land
        serv = self.arrays(configs)
        inverse = sum(
            n
            / (
                land.base_rate[c]
                * self.served(
                    spec,
                    draft,
                    c,
                    ints,
                    serv,
                    serv["slots"],
                    temperature=temperature,
                    threads=threads,
                    hw=hw,
                    cores=cores,
                )[1]
            )
            for c, n in Counter(land.prompts).items()
        )
        return np.where(np.round(quality - serv["loss"], 6) >= land.quality_floor, inverse, np.inf)


class SpaceSurvey:
    """The whole space at once: every configuration the real ``suggest`` can return, how many there are, and
    the best feasible one with its true tokens/s (the target a replay's regret is measured against)."""

    def __init__(self, land: OperatorLandscape):
        self.land, self.speed = land, land.speed

    @cached_property
    def variants(self) -> dict[tuple, list[TrialConfig]]:
        """Every speculative configuration ``suggest`` can return, by (spec_type, draft, stacked lookup);
        the context knobs (hardware, temperature, experts) at their first value."""
        groups: dict[tuple, list[TrialConfig]] = {}
        for config in configurations(self.land.space, CONTEXT_KNOBS):
            groups.setdefault(
                (config.spec_type, config.draft, config.lookup if config.stacked else None), []
            ).append(config)
        return groups

    def contexts(self):
        """(temperature, experts, threads, NUMA policy, node) combinations a study can ask."""
        d = self.land.space.domains
        values = lambda name: _values(d[name]) if name in d else [None]  # noqa: E731
        numas = [(p, n) for p in values("numa") for n in (values("numa_node") if p == "bind" else [None])]
        return itertools.product(values("temperature"), values("experts"), values("threads"), numas)

    @cached_property
    def size(self) -> int:
        return sum(map(len, self.variants.values())) * sum(1 for _ in self.contexts())

    def best_hardware(self) -> dict[tuple, tuple[float, str, int | None]]:
        """Per (temperature, experts, threads): the NUMA policy and node with the best hardware factor; they
        only scale a context's rates, so the others cannot win."""
        hardware: dict[tuple, tuple[float, str, int | None]] = {}
        for temperature, experts, threads, (numa, node) in self.contexts():
            hw = self.speed.hardware_factor(TrialConfig(numa=numa, numa_node=node, threads=threads))
            key = (temperature or 0.0, experts, threads)
            if key not in hardware or hw > hardware[key][0]:
                hardware[key] = (hw, numa, node)
        return hardware

    @cached_property
    def optimum(self) -> tuple[float, TrialConfig]:
        """The best feasible configuration and its true tokens/s: every speculative configuration at once
        (arrays) in each context; NUMA policy and node only scale a context's rates."""
        land, speed = self.land, self.speed
        best, best_config = 0.0, None
        for (temperature, experts, threads), (hw, numa, node) in self.best_hardware().items():
            quality, factor = speed.quality(temperature, experts)
            if quality < land.quality_floor:
                continue
            cores = speed.cores(TrialConfig(numa=numa, threads=threads))
            for (spec, draft, lookup), configs in self.variants.items():
                if speed.fails(configs[0]):
                    continue
                ints = speed.ints(configs)
                if land.serving:
                    inverse = speed.batched.inverse(
                        spec,
                        draft,
                        configs,
                        ints,
                        temperature=temperature,
                        threads=threads,
                        hw=hw,
                        cores=cores,
                        quality=quality,
                    )
                else:
                    inverse = self.inverse(
                        spec,
                        draft,
                        lookup,
                        ints,
                        temperature=temperature,
                        threads=threads,
                        hw=hw,
                        factor=factor,
                    )
                i = int(np.argmin(inverse))
                if len(land.prompts) / inverse[i] > best:
                    best = len(land.prompts) / float(inverse[i])
                    best_config = replace(
                        configs[i],
                        temperature=temperature,
                        experts=experts,
                        numa=numa,
                        numa_node=node,
                        threads=threads,
                    )
        assert best_config is not None, "every landscape has a feasible configuration"
        # as every trial is scored (the same sums, one order)
        return speed.true_rate(best_config), best_config

    def inverse(
        self,
        spec: str,
        draft: str | None,
        lookup: str | None,
        ints: dict[str, np.ndarray],
        *,
        temperature: float,
        threads: int,
        hw: float,
        factor: float,
    ) -> np.ndarray:
        """Seconds per pooled token one request at a time, as arrays over configurations."""
        land = self.land
        return sum(
            n
            / (
                land.base_rate[c]
                * factor
                * hw
                * self.speed.speculation(
                    spec, draft, lookup, c, ints, temperature=temperature, threads=threads, rel=factor
                )[0]
            )
            for c, n in Counter(land.prompts).items()
        )


class TrialSimulator:
    """One simulated trial, the way ``run_workload`` runs one: launch, one warm-up request, repetitions over
    the prompts with noise per launch and per request, each request's seconds; with ``Serving``, the level."""

    def __init__(self, land: OperatorLandscape):
        self.land = land

    def measure(
        self, config: TrialConfig, rng: np.random.Generator, stop: Callable[[list[dict]], bool] | None = None
    ) -> tuple[Outcome, Measurement]:
        """Launch, warm up with one request of the first prompt, then repetitions over the prompts.

        ``stop(samples)`` is asked after every request but the last; True ends the trial there.
        """
        land = self.land
        out = land.evaluate(config)
        draft = land.drafts.get(config.draft or "")
        seconds = land.launch_s + (draft.load_s if draft and config.spec_type == "draft-simple" else 0.0)
        if not out.ok:  # the server starts, serves, drafts nothing: one request shows it
            return out, Measurement((), 0.0, 0.0, seconds + N_PREDICT / 20.0, False)
        hw = land.hardware_factor(config)
        launch = max(0.5, 1 + land.cv_launch * rng.standard_normal())
        requests = _Launch(land, out, hw, launch, rng, self.prompt_factor)
        _, secs = requests.send(land.prompts[0], 0)  # warm-up, discarded
        seconds += secs
        samples, seconds, stopped = self.repetitions(requests, seconds, stop)
        if stopped:
            return out, Measurement(tuple(samples), pooled_from_rates(samples), out.acceptance, seconds, True)
        per_rep = [
            pooled_from_rates([s for s in samples if s["repetition"] == r]) for r in range(REPETITIONS)
        ]
        aggregate = None
        if land.serving:  # then the level: every prompt once, its users at once (tuner.measurement.load)
            aggregate, seconds = self.level(out, launch, rng, seconds)
        return out, Measurement(
            tuple(samples), float(np.median(per_rep)), out.acceptance, seconds, False, aggregate
        )

    def repetitions(
        self, requests: _Launch, seconds: float, stop: Callable[[list[dict]], bool] | None
    ) -> tuple[list[dict], float, bool]:
        """(samples, seconds so far, stopped): every prompt ``REPETITIONS`` times, one sample per request,
        ``stop`` asked after each as a study asks its pruner (never after the last request)."""
        prompts = self.land.prompts
        samples: list[dict] = []
        for repetition in range(REPETITIONS):
            for i, content in enumerate(prompts):
                rate, secs = requests.send(content, i)
                seconds += secs
                samples.append(
                    {
                        "prompt_id": f"p{i}",
                        "suite": content,
                        "repetition": repetition,
                        "tokens_per_second": rate,
                    }
                )
                last = repetition + 1 == REPETITIONS and i + 1 == len(prompts)
                if stop and not last and stop(samples):  # as a study: never after the last request
                    return samples, seconds, True
        return samples, seconds, False

    def level(
        self, out: Outcome, launch: float, rng: np.random.Generator, seconds: float
    ) -> tuple[float, float]:
        """(aggregate tokens/s measured at the level, seconds after it): every prompt once, its users at once;
        the noise of one request averages over the prompts."""
        land = self.land
        assert out.aggregate is not None, "a serving landscape's outcome has its aggregate"
        aggregate = (
            out.aggregate
            * launch
            * max(0.5, 1 + land.cv_request / math.sqrt(len(land.prompts)) * rng.standard_normal())
        )
        seconds += len(land.prompts) * N_PREDICT / aggregate
        return aggregate, seconds

    @cached_property
    def prompt_factor(self) -> tuple[float, ...]:
        """Prompts differ in speed (length of the answer's easy parts); fixed per landscape."""
        rng = np.random.default_rng(sum(map(ord, self.land.name)))
        return tuple(float(v) for v in np.exp(0.06 * rng.standard_normal(len(self.land.prompts))))


@dataclass(frozen=True)
class _Launch:
    """One launch's requests: its true rates scaled by the launch's and each request's noise and the prompt's
    own speed; a request's seconds are its answer, its prompt at the prefill rate and the overhead."""

    land: OperatorLandscape
    out: Outcome
    hw: float
    launch: float
    rng: np.random.Generator
    prompt_factor: tuple[float, ...]

    def send(self, content: str, prompt: int) -> tuple[float, float]:
        """(tokens/s, seconds) of one request of ``prompt``, of content type ``content``."""
        land = self.land
        rate = (
            self.out.rates[content]
            * self.launch
            * self.prompt_factor[prompt]
            * max(0.5, 1 + land.cv_request * self.rng.standard_normal())
        )
        secs = (
            N_PREDICT / rate
            + land.prompt_tokens[content] / (land.prefill_rate * self.hw)
            + land.request_overhead_s
        )
        return rate, secs


class _Walk:
    """A trial for ``suggest`` that answers with ``path``'s choices and counts each question's choices;
    knobs in ``fixed`` get their first value and do not branch."""

    def __init__(self, path: list[int], fixed: tuple[str, ...]):
        self.path, self.fixed = path, fixed
        self.counts: list[int] = []

    def _pick(self, name: str, values: list):
        if name in self.fixed:
            return values[0]
        i = len(self.counts)
        self.counts.append(len(values))
        return values[self.path[i] if i < len(self.path) else 0]

    def suggest_categorical(self, name, choices):
        return self._pick(name, list(choices))

    def suggest_int(self, name, low, high, step=1, log=False):
        return self._pick(name, list(range(low, high + 1, step)))

    def suggest_float(self, name, low, high, step=None, log=False):
        return self._pick(name, _values(FloatRange(low, high, step, log)))


def configurations(space: ResolvedSpace, fixed: tuple[str, ...] = ()):
    """Every configuration the real ``suggest`` can return (conditional knobs only where it asks them),
    walking its questions like an odometer from the last one."""
    path: list[int] = []
    while True:
        walk = _Walk(path, fixed)
        yield suggest(walk, space)
        path = path + [0] * (len(walk.counts) - len(path))
        i = len(walk.counts) - 1
        while i >= 0 and path[i] + 1 >= walk.counts[i]:
            i -= 1
        if i < 0:
            return
        path = path[:i] + [path[i] + 1]


def _values(domain) -> list:
    if isinstance(domain, Choices):
        return list(domain.values)
    if isinstance(domain, IntRange):
        return list(range(domain.low, domain.high + 1, domain.step))
    assert isinstance(domain, FloatRange) and domain.step
    n = int(round((domain.high - domain.low) / domain.step))
    return [round(domain.low + i * domain.step, 10) for i in range(n + 1)]


def operator_space(
    spec_types: tuple[str, ...],
    drafts: tuple[str, ...],
    *,
    temperatures=(0.0, 0.3, 0.5, 0.7),
    experts: int | None = None,
    k_high: int = 48,
    threads_high: int = LOGICAL_CPUS,
    lookups: tuple[str, ...] = (),
    serving: dict | None = None,
    users: int = 1,
    hardware: Hardware | None = None,
) -> ResolvedSpace:
    """The space a study would resolve on the 96-core / 192-thread, 4-node box (SMT allowed); ``lookups``
    stack on the draft models. N-gram sizes are searched wherever a lookup type is in play (the research's
    keys were 3-4 tokens, llama.cpp's default 12 finds nothing in short answers: DESIGN.md).

    ``k_high`` and ``threads_high`` shrink it for tests; ``serving``: the serving knobs' domains, for ``users``
    at once (as a study's ``concurrent:`` section). With ``hardware``, the space a study resolves on that host
    by default: every thread count from 1 to its logical CPUs (SMT siblings above the physical cores), where
    the 96-core landscapes step by 24."""
    topology = hardware or EPYC
    domains: dict[str, Domain] = {
        "spec_type": Choices(spec_types),
        "draft_max": IntRange(1, k_high),
        "temperature": Choices(tuple(temperatures)),
        "numa": Choices(("none", "interleave", "bind", "distribute")),
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
        draft_names=drafts,
        expert_used_count=experts,
        expert_count=experts * 16 if experts else None,
        physical_cores=topology.cores,
        logical_cpus=topology.logical,
        numa_policies=("none", "interleave", "bind", "distribute"),
        numa_nodes=topology.nodes,
    )


# -- the variants ---------------------------------------------------------------------------

DENSE_DRAFTS = ("qwen2.5-0.5b-instruct-q8_0", "qwen2.5-coder-1.5b-q4_k_m", "qwen2.5-coder-32b-q2_k")

# seed 003, Track A (Qwen2.5-Coder-32B tg128): interleave -t 96 3.77 t/s = 1.0; membind=0 -t 96 2.05 (0.54);
# cpunodebind=0+membind=0 -t 48 2.10 (0.56); interleave -t 192 1.62 (0.43: SMT hurts). "none" (first touch,
# the weights on the node that read them) is set so the baseline decodes 2.9 t/s (seed 002, 3.1: 2.89 t/s).
EPYC = Hardware(
    numa={"interleave": 1.0, "distribute": 0.93, "none": 0.77, "bind": 0.62},
    tau=28.0,
    contention_from=96,
    contention=0.0,
    smt_penalty=0.57,
    draft_thread_coupling=0.25,
    bind_node={0: 0.97, 1: 1.0, 2: 1.0, 3: 0.99},
)


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
        base_rate={"code": 3.77, "prose": 3.77},  # seed 003, Track A: 3.77 t/s at interleave, 96 threads
        drafts=drafts,
        hardware=hardware,
        verify_cost=0.012,
        decay=0.9985,
        quality_temp=quality_temp,
        quality_floor=quality_floor,
    )


# Acceptance and cost per draft, Qwen2.5-Coder-32B target (seed 002, 3.2-3.3 and appendix D; seed 003, Track C):
# 0.5B Q8_0: code K=4 96.8%, K=24 83.3% -> a = 0.985; prose K=8 32.4% -> a = 0.74; speedup 10x at K=24 -> c = 0.046.
# Coder-1.5B Q4_K_M: same acceptance as the 0.5B (58% vs 58%) at 12.5 vs 22.5 t/s -> c = 0.13.
# 32B Q2_K self-draft: 60.7% at K=8, 0.63x -> a = 0.89, c = 1.0 (a 12 GB draft; never worth it).
# Temperature: Coder-32B 26.6 t/s at 0, 19.0 at 0.5, 19.4 at 0.7 (seed 003, Track 1) -> acceptance falls ~0.06/unit.
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
# *raises* acceptance as for Qwen2.5-VL-7B (28.3 -> 57.1 t/s at 0.7) and Qwen2.5-Math-72B (best at 0.5), seed 003.
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

# Qwen3-Coder-30B-A3B (seed 003, Tracks 2 and 8): 26.6 t/s alone, 22.8 at the study's baseline (first touch);
# 6 experts 30.1, 4 experts ~35, 3 experts ~38 (Qwen3-VL-30B: 37.7, "3 experts safe"); lookup alone 43.2
# (summarize) / 40.9 (code) with near-100% acceptance of what it drafts; MoE + lookup 47.5 t/s.
# A 0.6B draft does not help a 3B-active MoE (seed 000, 4.3): c ~ 0.45.
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
# drafts on the MoE targets (seed 003, Track 8); acceptance falls with temperature as a sample leaves the copy.
LOOKUPS = {
    "ngram-simple": Lookup(fidelity=0.93),
    "ngram-map-k": Lookup(fidelity=0.97, chance=0.8),
    "ngram-mod": Lookup(fidelity=0.95, chance=1.3, key_default=24, length_default=64),
}
MOE_LOOKUPS = {**LOOKUPS, "ngram-map-k4v": Lookup(fidelity=0.97, fails=True)}
# Qwen3-Coder-30B-A3B lookup alone: 43.2 t/s summarizing, 40.9 on code against 26.6 (x1.6, x1.5; seed 003, Track 8):
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
            experts=8,
            lookups=tuple(MOE_LOOKUPS),
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
        # 1/rate = fixed + per expert: 26.6 t/s at 8, 30.1 at 6, 35 at 4 (seed 003, Track 2)
        expert_speed=lambda e: (0.0196 + 0.00225 * 8) / (0.0196 + 0.00225 * e),
        expert_quality=lambda e: _MOE_QUALITY[e],
        prompt_tokens={"code": 60, "prose": 600},  # summarization prompts are long: that is why lookup works
        prefill_rate=150.0,
        launch_s=12.0,
        target="Qwen3-Coder-30B-A3B-Instruct Q4_K_M",
    )


# Qwen2.5-Coder-32B on grounded work: summaries copy nearly all of their document in long spans (lookup alone
# x12.7 on summarization, seed 000 4.4 and seed 004), code edits copy half (lookup x1.7-1.9 on code, seed 003,
# Track 8; "2-4x" in the literature), chat almost nothing. The drafts as on code and prose, and summaries as
# predictable for them as for the target. Stacked on the 0.5B draft at K=24, lookup added a fifth on code
# (39.44 t/s against 33.0: seed 004, seed 003 "Actual Combined Performance").
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
        space=operator_space(("none", "draft-simple", *lookups), tuple(STACK_DRAFTS), lookups=lookups),
        base_rate={"summarize": 3.77, "code": 3.77, "prose": 3.77},
        lookups=LOOKUPS,
        grounding=STACK_GROUNDING,
        prompt_tokens={"summarize": 800, "code": 200, "prose": 60},
    )


# Qwen2.5-Coder-32B served to 8 users (an editor plugin's team): code edits and chat. Batched decode: prompt
# processing runs 69.05 t/s where decode runs 2.89 (seed 002, 3.1), so a batch is compute-bound near 24 tokens per
# decode step; below that, a batch costs one pass over the weights plus verification's cost per token (the dense
# landscapes' verify_cost, fitted to the research's speedups at large K). The KV cache per context token: 64
# layers x 8 KV heads x 128 dims x (K, V) x 2 bytes = 256 KiB at f16 (the model's config.json) against 19 GB of
# weights (seed 002, 3.1); without flash attention the f32 scores of 40 query heads are written and read three
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
            temperatures=(0.0,),
            serving=SERVING_DOMAINS,
            users=SERVE.users,
        ),
        serving=SERVE,
        prompt_tokens={"code": 300, "prose": 100},
    )


# Hosts as they present threads: every integer from 1 to the logical CPUs. Decode is memory-bound: it gains
# threads until the memory bandwidth saturates, then loses to contention. llama.cpp users report a 96-core EPYC
# 9654 topping out near 60 threads (llama.cpp #6434); on a 16-core Xeon llama-bench put 10-14 threads level with
# 16 (seed material: DESIGN.md). The NUMA factors as on the EPYC (seed 003, Track A).
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


def _real_range(name: str) -> OperatorLandscape:
    """Qwen2.5-Coder-32B with three drafts on code, on a host whose ``threads`` is every integer."""
    hardware, what = REAL_RANGE[name]
    return replace(
        _dense(
            name,
            f"{what}; threads 1..{hardware.logical}, every integer",
            ("code",) * 9,
            CODER_DRAFTS,
            hardware,
        ),
        space=operator_space(
            ("none", "draft-simple"), tuple(CODER_DRAFTS), temperatures=(0.0,), hardware=hardware
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
    }


LANDSCAPES = (
    "dense-code",
    "dense-prose",
    "dense-moved",
    "moe-lookup",
    "dense-stack",
    "dense-serve",
    *REAL_RANGE,
)
