"""The operator landscapes' simulation: a landscape's whole space surveyed, and its trials run with noise.

Why a module of its own: a replay asks a landscape two things besides its true speed (``benchmarks/landscape_model``),
and these are how a study would see it, not how it decodes. ``OperatorLandscape`` is the landscape a replay
holds. A configuration is a ``tuner.knobs.config.TrialConfig`` from the real ``suggest`` on the landscape's
``ResolvedSpace``; ``SpaceSurvey`` walks every configuration ``suggest`` can return and finds the best feasible
one; ``TrialSimulator`` (``measure``) simulates a trial the way ``tuner.measurement.measure.run_workload`` runs
one (launch, one warm-up request, repetitions over the prompts, one sample per request) with noise, and its
seconds; a ``stop`` callback sees every sample, so pruning shows up in the seconds.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Callable

import numpy as np

from benchmarks.landscape_model import N_PREDICT, LandscapeModel, Outcome, Point, Source
from tuner.knobs.config import Choices, FloatRange, IntRange, TrialConfig
from tuner.measurement.measure import pooled_from_rates
from tuner.search.space import ResolvedSpace, suggest

REPETITIONS = 3  # passes over the prompts, as the research's protocol runs each configuration (3 or more)
# Knobs that do not change what speculation does (they scale it, or are sent per request): not enumerated.
CONTEXT_KNOBS = ("temperature", "experts", "numa", "numa_node", "threads", "threads_batch")


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
class OperatorLandscape(LandscapeModel):
    """A modelled landscape as a replay holds it: the model's parameters and true speed, and what a replay asks
    besides, each answered by the piece that owns it: ``SpaceSurvey`` (every configuration and the best of
    them), ``TrialSimulator`` (one noisy trial, request by request, and its seconds)."""

    # -- its pieces, made once per landscape (a ``replace``d landscape makes its own) -----

    @cached_property
    def survey(self) -> SpaceSurvey:
        return SpaceSurvey(self)

    @cached_property
    def simulator(self) -> TrialSimulator:
        return TrialSimulator(self)

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
                        Source(spec, draft), configs, ints, Point(temperature, threads, hw, cores), quality
                    )
                else:
                    inverse = self.inverse(
                        Source(spec, draft, lookup), ints, Point(temperature, threads, hw), factor
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

    def inverse(self, source: Source, ints: dict[str, np.ndarray], at: Point, factor: float) -> np.ndarray:
        """Seconds per pooled token one request at a time, as arrays over configurations (``at``: temperature,
        threads and the hardware factor)."""
        land = self.land
        return sum(
            n
            / (
                land.base_rate[c]
                * factor
                * at.hw
                * self.speed.speculation(
                    source, c, ints, temperature=at.temperature, threads=at.threads, rel=factor
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
