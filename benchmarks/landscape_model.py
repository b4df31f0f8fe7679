"""The operator landscapes' model: how a configuration decodes on a modelled box, without noise.

Why a module of its own: the landscapes' tables (``benchmarks/operator_landscapes``) only set figures; this is
what those figures mean. ``LandscapeModel`` holds one box, target and workload; ``SpeedModel`` gives a
configuration's true per-content rates, acceptance, quality and feasibility (hardware, experts and
speculation as factors over the target alone), ``ServingModel`` the same for several users in one batch.
The shape of the speculative curve is deliberately not the sampler's own model (acceptance decays along
the draft, verification of K tokens costs a little more than one step, the draft's cost grows with the
thread count): a search must find optima, not recompute them.

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

import math
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import numpy as np

from benchmarks.replay import replay_record
from tuner.knobs.config import TrialConfig
from tuner.machine.bandwidth import FINGERPRINT_KEY, probe_counts
from tuner.machine.fingerprint import Fingerprint
from tuner.measurement.failures import FailureReason
from tuner.models.memory_fit import CACHE_TYPE_BYTES
from tuner.search.space import ResolvedSpace
from tuner.storage.records import StudyRecord, digest

N_PREDICT = 128  # tokens per request, as the research measured (so its rates apply as they stand)
PHYSICAL_CORES, LOGICAL_CPUS, NODES = 96, 192, (0, 1, 2, 3)  # the research's EPYC 9655, NPS4


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
    """How a content type's answers copy their context (summaries copy most, then code edits, then chat)."""

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


KV_BYTES = CACHE_TYPE_BYTES  # bytes per KV element of each cache type, as the memory-fit check counts them
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


@dataclass(frozen=True)
class Hardware:
    """How NUMA policy and thread count scale decode (factors as the research measured them on its EPYC)."""

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
class Source:
    """What a configuration speculates with: its type, its draft model, the lookup stacked before it."""

    spec_type: str
    draft: str | None = None
    lookup: str | None = None  # the lookup stacked first on the draft, else None


@dataclass(frozen=True)
class Point:
    """Where a configuration decodes: its temperature and threads, the hardware factor of its NUMA policy and
    threads, and the cores it computes on (only batched serving reads them)."""

    temperature: float
    threads: int
    hw: float = 1.0
    cores: float = 1.0


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
class LandscapeModel:
    """One modelled box, target and workload: its parameters (every figure cited where it is set) and its true
    speed, answered by ``SpeedModel`` (true rates, acceptance, quality) and ``ServingModel`` (several users in
    one batch). ``OperatorLandscape`` adds what a replay asks besides (the whole space, a noisy trial)."""

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
    prefill_rate: float = 69.0  # prompt tokens/s at the best hardware (a 32B target: 69.05 t/s)
    launch_s: float = 13.0  # server start and model load from the page cache (19 GB)
    request_overhead_s: float = 0.3
    cv_request: float = 0.03  # spread of one request's rate
    cv_launch: float = 0.012  # spread of a whole launch (placement, clocks)
    host: str = "AMD EPYC 9655 (NPS4)"  # the machine (warm starts match on it: tuner.search.prior)
    target: str = "Qwen2.5-Coder-32B-Instruct Q4_K_M"  # the target model's identity
    serving: Serving | None = None  # several users at once: the objective is their aggregate tokens/s
    probed: bool = False  # the study record carries a bandwidth-by-threads probe of the host
    # weight bytes of the GGUF files, by model name (the target's under ``target``): the record carries them
    weights_bytes: dict[str, float] = field(default_factory=dict)

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
        sized = {name: {"weights_bytes": self.weights_bytes[name]} for name in self.weights_bytes}
        return replay_record(
            self.name,
            self.space.as_dict(),
            objectives,
            fingerprint=fingerprint,
            target={"name": self.target, **sized.get(self.target, {})},
            workload={"digest": digest(self.prompts)},
            drafts={name: sized[name] for name in self.drafts if name in sized},
        )

    # -- its pieces, made once per landscape (a ``replace``d landscape makes its own) -----

    @cached_property
    def speed(self) -> SpeedModel:
        return SpeedModel(self)

    # -- the true landscape -------------------------------------------------------------

    def hardware_factor(self, config: TrialConfig) -> float:
        return self.speed.hardware_factor(config)

    def cores(self, config: TrialConfig) -> float:
        return self.speed.cores(config)

    def evaluate(self, config: TrialConfig) -> Outcome:
        return self.speed.evaluate(config)

    def true_rate(self, config: TrialConfig) -> float:
        return self.speed.true_rate(config)


class SpeedModel:
    """The landscape's true speed, without noise: what a configuration decodes per content type (hardware,
    experts and speculation as factors over the target alone), its acceptance, quality and feasibility.
    Rounds are arrays over configurations, so ``SpaceSurvey`` weighs thousands at once."""

    def __init__(self, land: LandscapeModel):
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
        source: Source,
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
        spec_type, draft, lookup = source.spec_type, source.draft, source.lookup
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
                Source(config.spec_type, config.draft, config.lookup if config.stacked else None),
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

    def __init__(self, land: LandscapeModel, speed: SpeedModel):
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
        source: Source,
        content: str,
        ints: dict[str, np.ndarray],
        serv: dict[str, np.ndarray],
        slots: np.ndarray,
        at: Point,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(decode rate per request, aggregate rate with prompt processing) at ``slots`` busy slots, in
        single-user steps at the best hardware: one round batches every slot's token and K drafts; drafts run
        slot by slot; a closed loop processes each slot's prompt, then its answer."""
        spec_type, draft = source.spec_type, source.draft
        temperature, threads, hw, cores = at.temperature, at.threads, at.hw, at.cores
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
            source = Source(config.spec_type, config.draft)
            at = Point(config.temperature, config.threads, hw, cores)
            alone, _ = self.served(source, content, ints, serv, np.ones(1), at)
            _, level = self.served(source, content, ints, serv, serv["slots"], at)
            rates[content], aggregate[content] = (
                land.base_rate[content] * float(alone[0]),
                land.base_rate[content] * float(level[0]),
            )
            accept.append(
                float(
                    speed.speculation(
                        source, content, ints, temperature=config.temperature, threads=config.threads, rel=1.0
                    )[1][0]
                )
            )
        pooled_level = len(land.prompts) / sum(1.0 / aggregate[c] for c in land.prompts)
        return Outcome(
            True, None, rates, float(np.mean(accept)), quality, quality >= land.quality_floor, pooled_level
        )

    def inverse(
        self,
        source: Source,
        configs: list[TrialConfig],
        ints: dict[str, np.ndarray],
        at: Point,
        quality: float,
    ) -> np.ndarray:
        """Seconds per pooled token at the level, as arrays over configurations (infinite below the floor)."""
        land = self.land
        serv = self.arrays(configs)
        inverse = sum(
            n / (land.base_rate[c] * self.served(source, c, ints, serv, serv["slots"], at)[1])
            for c, n in Counter(land.prompts).items()
        )
        return np.where(np.round(quality - serv["loss"], 6) >= land.quality_floor, inverse, np.inf)
