"""A sampler that knows llama.cpp: stages, an analytic model of speculation, local refinement.

Why: an operator's space has thousands of configurations and a trial costs minutes, but
it is not a black box. Threads and NUMA scale every configuration's decode rate by about
the same factor; tokens/s against K is unimodal per draft; speculation has an analytic
model (``tuner.search.model``) whose two numbers one trial measures. TPE ignores all of
it and needs 60-75 trials on such a space; this sampler plans each trial from the study's
history instead, in stages:

0. **warm start** (``tuner.search.prior``): the winner of an earlier study of the same target
   and workload on this host, when the storage has one.
1. **speculation** (at the baseline's hardware and temperature): probe every draft and
   n-gram type at K=8 (the research's starting point; an n-gram key of 4 tokens), fit
   acceptance and cost ratio per option, then measure the predicted best K of the best
   options, fitting again with each new point. Options that fail for a permanent reason are
   dropped (blamed).
1b. **stacks**: on the best draft-model configuration (when it beats the target alone), the
   lookup types that paid alone on some suite, closest to the best on those suites (a type
   never tried alone too), with the sizes that type did best with alone; then the best
   stack's lookup length doubled until bracketed, and the other types at that length.
   llama.cpp drafts from the lookup where it finds a key and from the draft model elsewhere,
   so a stack pays where lookup pays on some content and the draft on the rest.
2. **hardware**: with the best speculation so far, the pair an earlier study found best on
   this host (if any; when it beats the baseline's, the policy probes are skipped), each NUMA
   policy at the baseline's threads, then a unimodal walk over thread counts on the best
   policy. Tuned on the speculative configuration rather than the target alone: the factor
   is about the same, the trial is several times shorter, and a draft's cost grows with
   threads, so the pair is right for the configuration that will be used.
2b. **serving** (a study with several users: the space has serving knobs): with the best configuration so
   far, the slots at the objective's level first (fewer queue users, more only hold memory), then a unimodal
   walk over each serving knob in turn (micro batch, batch, flash attention, K and V cache types by their
   bits, polling), a knob left once its best value's neighbours are measured. Serving knobs scale with the
   load, not like threads: a batch of users' tokens reads the weights once, so their best values are the
   load's. Until then every trial runs the baseline's serving settings, so speculation is fitted on them.
3. **speculation** again: for a MoE target, the expert count walked down to the quality
   floor; then a unimodal walk over temperature from the best (acceptance changes with it;
   a temperature below the quality floor rules out the hotter ones), and the best K
   predicted for each.
4. **refinement**: the other options within 3% at their best K (predicted, or measured
   where the model's pick lost, as for lookup types, whose missed keys the model does not
   know), then unmeasured neighbours of the incumbent (threads and experts again; line
   searches over K, a stacked lookup's length, the n-gram key and minimum hits).

The value maximised is the study's first objective (tokens/s per request, or with several users e.g.
``aggregate_tokens_per_second_c8``; a latency objective as its inverse): where speculation does not pay at the
load, the speculation stage measures that (its probes) and plans no K for it.

Speculative decoding keeps the target's output distribution, so a temperature or expert count
below the quality floor with one option rules it out for all (``Planner.lossless``).

When nothing is left to plan, or the space lacks the expected shape, proposals come from
the project's ``NoRepeatSampler(TPE)``. The plan is a pure function of the stored trials
(and the prior stored with the study), so any worker, or a resumed study, computes the
same next step; each planned trial records ``search_stage`` and ``search_reason`` user
attrs ("predicted best K=24 for draft X from acceptance 0.83 ...") for the study output
and the dashboard.

Lifecycle (Optuna's sampler interface): ``before_trial`` plans the whole configuration
(enqueued trials, such as the baseline, are left alone); ``sample_independent`` returns
the planned value for each parameter ``tuner.search.space.suggest`` asks, so K and threads
stay ``IntDistribution`` as in any study; the relative methods and everything unplanned
go to the fallback. A plan is completed by the real ``suggest`` (``Planner.complete``), so
it holds exactly the knobs a trial of it asks (no n-gram key without a lookup in play).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.knobs.config import Choices, FloatRange, IntRange
from tuner.knobs.registry import DRAFT_MODEL_TYPES, SERVING_KNOBS
from tuner.measurement.failures import PERMANENT
from tuner.measurement.load import split_metric_name
from tuner.measurement.measure import pooled_from_rates
from tuner.search.model import DraftFit, Point, fit
from tuner.search.prior import HW_KNOBS, describe
from tuner.search.space import ResolvedSpace, suggest
from tuner.storage import store

PLAN_ATTR = "search:plan"  # a system attr: the running trial's planned configuration, for other workers
# What a pruned trial measured before it stopped, as the study loop stores it (user attr).
K_PROBE = 8  # the research's first K for any draft (seed 003, "K-Tuning Methodology": start with K=8)
PERMANENT_REASONS = frozenset(r.value for r in PERMANENT)
# What a plan leaves open starts here: no lookup stacked; the research's n-gram key (seed 003, Track 8: 4 tokens;
# llama.cpp's 12 finds nothing in short answers), llama.cpp's minimum hits, a stacked lookup's length at K=8.
PROBES = {"lookup": "none", "ngram_key": 4, "ngram_min_hits": 1, "lookup_max": K_PROBE, "lookup_min": 1}
SIZE_KNOBS = ("lookup", "lookup_max", "lookup_min", "ngram_key", "ngram_min_hits")
LOOKUP_PAYS = 1.05  # a lookup pays on a suite where alone it is this much faster than the target alone
CONTEXT = (*HW_KNOBS, *SERVING_KNOBS)  # what every plan carries from the configuration it starts from
# KV cache types from the most bits to the fewest: a walk over them trades bandwidth for quality.
KV_ORDER = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "iq4_nl", "q4_0")


@dataclass(frozen=True)
class Rec:
    """One stored trial as the planner sees it."""

    params: dict[str, Any]
    state: str  # complete, pruned, failed, running
    tps: float | None
    acceptance: float | None
    feasible: bool
    failure: str | None
    role: str
    suites: dict[str, float] = field(default_factory=dict)  # tokens/s per suite (content type), pooled

    @property
    def measured(self) -> bool:
        return self.state in ("complete", "pruned") and self.tps is not None


@dataclass(frozen=True)
class Proposal:
    params: dict[str, Any]
    stage: str
    reason: str


class Space:
    """The study's domains, from the ``space`` study attr (``ResolvedSpace.describe``)."""

    def __init__(self, described: dict[str, list]):
        self.kinds = {name: kind for name, (kind, _) in described.items()}
        self.raw = {name: d for name, (_, d) in described.items()}

    def has(self, name: str) -> bool:
        return name in self.raw

    def values(self, name: str) -> list:
        kind, d = self.kinds.get(name), self.raw.get(name)
        if d is None:
            return []
        if kind == "Choices":
            return list(d["values"])
        if kind == "IntRange":
            if d.get("log") and d["high"] > 64:
                return sorted(
                    {
                        int(round(math.exp(i / 16 * math.log(d["high"] / d["low"])) * d["low"]))
                        for i in range(17)
                    }
                )
            return list(range(d["low"], d["high"] + 1, d.get("step") or 1))
        step = d.get("step")
        if step:
            n = int(round((d["high"] - d["low"]) / step))
            return [round(d["low"] + i * step, 10) for i in range(n + 1)]
        return [round(d["low"] + i * (d["high"] - d["low"]) / 4, 10) for i in range(5)]

    def resolved(self) -> ResolvedSpace:
        """The domains as ``suggest`` reads them."""
        kinds = {
            "Choices": lambda d: Choices(tuple(d["values"])),
            "IntRange": lambda d: IntRange(**d),
            "FloatRange": lambda d: FloatRange(**d),
        }
        return ResolvedSpace(
            {name: kinds[self.kinds[name]](d) for name, d in self.raw.items()}, None, 0, False
        )


class _Answers:
    """A trial for the real ``suggest``: the plan's value where the domain admits it, else the knob's probe
    value; ``asked`` keeps both (a knob with neither is left to the fallback sampler, as Optuna would)."""

    def __init__(self, plan: dict):
        self.plan, self.asked = plan, {}

    def _answer(self, name: str, values: list | None, first: Any) -> Any:
        value = self.plan.get(name)
        if value is None or (values is not None and value not in values):
            probe = PROBES.get(name)
            if probe is None or values is None:
                return first
            value = (
                probe if probe in values else nearest(values, probe) if isinstance(probe, int) else values[0]
            )
        self.asked[name] = value
        return value

    def suggest_categorical(self, name, choices):
        return self._answer(name, list(choices), choices[0])

    def suggest_int(self, name, low, high, step=1, log=False):
        return self._answer(name, list(range(low, high + 1, step)), low)

    def suggest_float(self, name, low, high, step=None, log=False):
        return self._answer(name, None, low)


def nearest(values: Sequence, target: float):
    return min(values, key=lambda v: (abs(v - target), v))


class Planner:
    """Decides the next configuration from the history; stateless between calls."""

    def __init__(self, space: Space, recs: list[Rec], prior: dict | None = None, users: int | None = None):
        """``users``: the level the objective measures (``aggregate_tokens_per_second_c8``: 8), if any."""
        self.space, self.recs, self.prior, self.users = space, recs, prior or {}, users
        self.resolved = space.resolved()
        self.taken = [
            r.params
            for r in recs
            if r.state != "failed" or r.failure in PERMANENT_REASONS or r.failure is None
        ]
        self.k_values = space.values("draft_max")
        self.base = next(
            (r for r in recs if r.role == "baseline" and r.measured and r.feasible), None
        ) or next((r for r in recs if r.measured and r.params.get("spec_type", "none") == "none"), None)

    # -- helpers ------------------------------------------------------------------------

    def config(self, option: tuple | None, k: int | None, hw: dict, temperature: Any, experts: Any) -> dict:
        p: dict[str, Any] = {}
        spec, draft = option or ("none", None)
        if self.space.has("spec_type"):
            p["spec_type"] = spec
        if spec == "draft-simple":
            p["draft"] = draft
        if spec != "none" and self.k_values and k is not None:
            p["draft_max"] = k
        if self.space.has("temperature") and temperature is not None:
            p["temperature"] = temperature
        if self.space.has("experts") and experts is not None:
            p["experts"] = experts
        for knob in CONTEXT:
            if hw.get(knob) is not None and (knob != "numa_node" or hw.get("numa") == "bind"):
                p[knob] = hw[knob]
        return p

    def is_new(self, params: dict) -> bool:
        return not any(
            all(params.get(k) == v for k, v in t.items()) and len(t) == len(params) for t in self.taken
        )

    def complete(self, params: dict) -> dict:
        """The knobs a trial of this plan is asked (the real ``suggest``), at the planned or probe values."""
        answers = _Answers(params)
        suggest(answers, self.resolved)
        return answers.asked

    @staticmethod
    def option_of(params: dict) -> tuple | None:
        spec = params.get("spec_type", "none")
        return None if spec == "none" else (spec, params.get("draft") if spec == "draft-simple" else None)

    @staticmethod
    def stacked(params: dict) -> bool:
        return params.get("lookup") not in (None, "none")

    def sizes(self, option: tuple) -> dict:
        """The n-gram sizes an option's probe runs at (none for a draft model without a lookup)."""
        probe = self.complete(
            self.config(option, nearest(self.k_values, K_PROBE) if self.k_values else None, {}, None, None)
        )
        return {k: v for k, v in probe.items() if k in SIZE_KNOBS}

    @staticmethod
    def hw_of(params: dict) -> dict:
        """The hardware and serving knobs: a target alone compares with a trial only at the same ones."""
        return {k: params.get(k) for k in CONTEXT if params.get(k) is not None}

    def options(self) -> list[tuple]:
        specs = self.space.values("spec_type")
        opts = []
        for spec in specs:
            if spec == "draft-simple":
                opts.extend(("draft-simple", d) for d in self.space.values("draft"))
            elif spec != "none":
                opts.append((spec, None))
        dead = {
            self.option_of(r.params)
            for r in self.recs
            if r.state == "failed" and r.failure in PERMANENT_REASONS
        }
        return [o for o in opts if o not in dead]

    def measured(self, **match) -> list[Rec]:
        return [r for r in self.recs if r.measured and all(r.params.get(k) == v for k, v in match.items())]

    def best(self, recs: list[Rec]) -> Rec | None:
        good = [r for r in recs if r.feasible and r.state == "complete"] or [r for r in recs if r.feasible]
        return max(good, key=lambda r: r.tps, default=None)

    def at_start(self, option: tuple) -> list[Rec]:
        """Measured trials of an option alone (no lookup stacked) at its probe sizes, the baseline's hardware,
        temperature and experts."""
        hw0, t0, e0 = self.context0()
        sizes = self.sizes(option)
        return [
            r
            for r in self.measured(**self.config(option, None, hw0, t0, e0))
            if not self.stacked(r.params) and all(r.params.get(k) == v for k, v in sizes.items())
        ]

    def target_alone(self, hw: dict, experts: Any) -> float | None:
        recs = [
            r
            for r in self.measured(spec_type="none")
            if self.hw_of(r.params) == hw and r.params.get("experts") == experts and r.state == "complete"
        ]
        return max((r.tps for r in recs), default=None)

    def fit_option(self, option: tuple, temperature: Any, experts: Any) -> DraftFit | None:
        """The option alone at its probe sizes: a stacked lookup's drafts, or other n-gram sizes, are other curves."""
        points = []
        sizes = self.sizes(option)
        for r in self.recs:
            if (
                not r.measured
                or self.option_of(r.params) != option
                or r.params.get("temperature") != temperature
                or r.params.get("experts") != experts
                or r.acceptance is None
                or self.stacked(r.params)
                or any(r.params.get(k) != v for k, v in sizes.items())
            ):
                continue
            base = self.target_alone(self.hw_of(r.params), experts)
            points.append(
                Point(r.params.get("draft_max") or K_PROBE, r.acceptance, r.tps / base if base else None)
            )
        return fit(points)

    @staticmethod
    def name(option: tuple) -> str:
        return f"draft {option[1]}" if option[0] == "draft-simple" else option[0]

    def describe(self, params: dict) -> str:
        """What a configuration speculates with, for reasons: 'draft X K=24 + ngram-mod (key 4, 32)'."""
        option = self.option_of(params)
        if option is None:
            return "the target alone"
        what = f"{self.name(option)} K={params.get('draft_max')}"
        if self.stacked(params):
            what += f" + {params['lookup']}"
        sizes = [
            f"{k.replace('ngram_', '').replace('_', ' ')} {params[k]}"
            for k in ("ngram_key", "lookup_max")
            if params.get(k) is not None
        ]
        return what + (f" ({', '.join(sizes)})" if sizes else "")

    # -- the plan -----------------------------------------------------------------------

    def next(self) -> Proposal | None:
        if self.base is None:
            return None
        for stage in (
            self.warm_start,
            self.speculation,
            self.stacks,
            self.hardware,
            self.serving,
            self.experts,
            self.temperature,
            self.refinement,
        ):
            proposal = stage()
            if proposal is not None:
                return proposal
        return None

    def _first_new(self, candidates) -> Proposal | None:
        for params, stage, reason in candidates:
            params = self.complete(params) if params is not None else None
            if params is not None and self.is_new(params):
                return Proposal(params, stage, reason)
        return None

    def context0(self) -> tuple[dict, Any, Any]:
        p = self.base.params
        return self.hw_of(p), p.get("temperature"), p.get("experts")

    def warm_start(self) -> Proposal | None:
        """The winner of an earlier study of the same target and workload on this host, right after the baseline."""
        params = self.prior.get("params")
        if not params:
            return None
        return self._first_new([(params, "warm start", f"the winner of {describe(self.prior)}")])

    def speculation(self) -> Proposal | None:
        """Probe each option at K=8, then measure the predicted best K (fitting again each time)."""
        if not self.options():
            return None
        hw0, t0, e0 = self.context0()
        k_probe = nearest(self.k_values, K_PROBE) if self.k_values else None
        probes = [
            (
                self.config(o, k_probe, hw0, t0, e0),
                "speculation",
                f"probe {self.name(o)} at K={k_probe}: fit its acceptance and draft cost",
            )
            for o in self.options()
            if not self.at_start(o)
        ]
        found = self._first_new(probes)
        if found or not self.k_values:
            return found
        ranked = []
        for o in self.options():
            f = self.fit_option(o, t0, e0)
            if f is not None:
                k = f.best_k(self.k_values)
                ranked.append((f.predict(k), o, f, k))
        ranked.sort(key=lambda x: -x[0])
        candidates = []
        for i, (pred, o, f, k) in enumerate(ranked):
            # the leader gets a few model-guided steps, a close runner-up one look at its predicted best
            if pred <= 1.0 or (i > 0 and pred < 0.97 * ranked[0][0]):
                continue
            mine = self.at_start(o)
            if len(mine) >= (3 if i == 0 else 2):
                continue
            if len(mine) >= 2 and max(mine, key=lambda r: r.tps).params.get("draft_max") == k_probe:
                continue  # the model's pick lost to the probe: the line search in refinement takes over
            candidates.append(
                (
                    self.config(o, k, hw0, t0, e0),
                    "speculation",
                    f"predicted best K={k} for {self.name(o)} from {f.describe()}: x{pred:.2f}",
                )
            )
        return self._first_new(candidates)

    def stacks(self) -> Proposal | None:
        """The lookup types stacked on the best draft-model configuration (at the baseline's hardware, temperature
        and experts), where the draft pays and the lookup paid alone on some suite (untried types too)."""
        lookups = [v for v in self.space.values("lookup") if v != "none"]
        hw0, t0, e0 = self.context0()
        start = {
            **self.hw_params(hw0),
            **{k: v for k, v in (("temperature", t0), ("experts", e0)) if self.space.has(k)},
        }
        drafts = [
            r
            for r in self.measured(**start)
            if r.feasible and not self.stacked(r.params) and r.params.get("spec_type") in DRAFT_MODEL_TYPES
        ]
        best = max(drafts, key=lambda r: r.tps, default=None)
        if not lookups or best is None or best.tps <= self.base.tps:
            return None
        alone = {
            t: max(recs, key=lambda r: r.tps)
            for t in lookups
            if (recs := [r for r in self.measured(spec_type=t, **start) if r.feasible])
        }
        tried = {o[0] for o in self.options()} - set(
            alone
        )  # in the space, not measured alone (failed, or to come)
        paying = {t: self.pays_on(r) for t, r in alone.items()}
        # ranked on the suites where lookup pays: elsewhere it drafts little, and the draft model takes over
        suites = sorted({s for v in paying.values() for s in v})
        gain = {t: self.gain_on(alone[t], suites) for t, v in paying.items() if v}
        chosen = sorted((t for t in gain if gain[t] >= 0.97 * max(gain.values())), key=lambda t: -gain[t])
        chosen += [t for t in lookups if t not in alone and t not in tried]
        candidates = []
        for t in chosen:
            sizes, why = {}, "not measured alone"
            if t in alone:
                p = alone[t].params
                sizes = {k: p[k] for k in ("ngram_key", "ngram_min_hits") if k in p}
                if p.get("draft_max") is not None and self.space.has(
                    "lookup_max"
                ):  # its K alone: the stacked length
                    sizes["lookup_max"] = nearest(self.space.values("lookup_max"), p["draft_max"])
                if p.get("draft_min") is not None and self.space.has("lookup_min"):
                    sizes["lookup_min"] = nearest(self.space.values("lookup_min"), p["draft_min"])
                why = f"alone x{alone[t].tps / self.base.tps:.2f}, faster on {', '.join(paying[t])}"
            candidates.append(
                (
                    {**best.params, "lookup": t, **sizes},
                    "stacks",
                    f"{t} stacked on {self.describe(best.params)} ({why}): lookup drafts where it finds "
                    f"a key, the draft model elsewhere",
                )
            )
        return self._first_new(candidates) or self.stack_length(best, chosen)

    def stack_length(self, draft: Rec, chosen: list[str]) -> Proposal | None:
        """The best stack's lookup length, doubled until the best is bracketed (its drafts cost only
        verification, so where copies are long its best length is far above the K it had alone); then the
        other stacked types at that length (their first trial, at a short length, may have hidden them)."""
        hw0, t0, e0 = self.context0()
        stacks = [
            r
            for r in self.measured(**self.config(self.option_of(draft.params), None, hw0, t0, e0))
            if self.stacked(r.params) and r.feasible
        ]
        best = max(stacks, key=lambda r: r.tps, default=None)
        if best is None or best.tps < 0.95 * draft.tps or best.params.get("lookup_max") is None:
            return None
        step = self.line_step(best.params, "lookup_max", grow=2.0)
        lengths = [r.params["lookup_max"] for r in stacks if r.params.get("lookup") == best.params["lookup"]]
        if step is not None and not min(lengths) < step < max(
            lengths
        ):  # once bracketed, refinement narrows it
            return self._first_new(
                [
                    (
                        {**best.params, "lookup_max": step},
                        "stacks",
                        f"lookup length {step}: line search around {best.params['lookup_max']} "
                        f"with {self.describe(best.params)}",
                    )
                ]
            )
        return self._first_new(
            [
                (
                    {**best.params, "lookup": t},
                    "stacks",
                    f"{t} in place of {best.params['lookup']} at the length found for it",
                )
                for t in chosen
                if t != best.params["lookup"]
            ]
        )

    def gain_on(self, r: Rec, suites: list[str]) -> float:
        """A trial's geometric-mean speedup over the target alone on ``suites`` (pooled without suites)."""
        if not suites or not r.suites or not self.base.suites:
            return r.tps / self.base.tps
        return math.exp(sum(math.log(r.suites[s] / self.base.suites[s]) for s in suites) / len(suites))

    def pays_on(self, r: Rec) -> list[str]:
        """The suites where a trial beat the target alone by LOOKUP_PAYS (the pooled rate without suites)."""
        if not r.suites or not self.base.suites:
            return ["the workload"] if r.tps > LOOKUP_PAYS * self.base.tps else []
        return [
            s
            for s, rate in sorted(r.suites.items())
            if rate > LOOKUP_PAYS * self.base.suites.get(s, math.inf)
        ]

    def incumbent_spec(self) -> Rec | None:
        """Best measured configuration at the baseline's temperature, experts and serving settings (any hardware):
        the hardware stage walks on it, and does not start again when the serving stage moves a knob."""
        _, t0, e0 = self.context0()
        match = {k: v for k, v in (("temperature", t0), ("experts", e0)) if self.space.has(k)}
        match.update({k: v for k, v in self.base.params.items() if k in SERVING_KNOBS})
        return self.best(self.measured(**match))

    def family(self, params: dict, *free: str) -> list[Rec]:
        """Measured trials that agree with ``params`` except on K, the n-gram sizes and the ``free`` knobs."""
        free_set = set(free) | {"draft_max"} | (set(SIZE_KNOBS) - {"lookup"})
        fixed = {k: v for k, v in params.items() if k not in free_set}
        return [
            r
            for r in self.recs
            if r.measured
            and all(r.params.get(k) == v for k, v in fixed.items())
            and all(k in fixed or k in free_set for k in r.params)
        ]

    def hardware(self) -> Proposal | None:
        """NUMA policies at the baseline's threads, then a unimodal walk over threads on the best policy."""
        inc = self.incumbent_spec()
        if inc is None:
            return None
        hw0, _, _ = self.context0()
        rest = {k: v for k, v in inc.params.items() if k not in HW_KNOBS}
        fam = self.family(inc.params, *HW_KNOBS)
        what = self.describe(inc.params)
        nodes = self.space.values("numa_node")
        policies = {r.params.get("numa") for r in fam}
        prior_hw = self.prior.get("hardware")
        if (
            prior_hw
        ):  # an earlier study's pair on this host first; if it beats the baseline's, no policy probes
            found = self._first_new(
                [
                    (
                        {**rest, **self.hw_params(prior_hw)},
                        "hardware",
                        f"NUMA {prior_hw.get('numa')}, {prior_hw.get('threads')} threads with {what}: "
                        f"best on this host in {describe(self.prior)}",
                    )
                ]
            )
            if found:
                return found
        # the policy carries over (threads are walked below): no probes once the prior's policy leads
        trusted = (
            prior_hw
            and self.best(fam) is not None
            and self.best(fam).params.get("numa") == prior_hw.get("numa")
        )
        candidates = []
        for policy in self.space.values("numa"):
            if policy not in policies and not trusted:
                hw = {
                    "numa": policy,
                    "threads": hw0.get("threads"),
                    "numa_node": nodes[0] if policy == "bind" and nodes else None,
                }
                candidates.append(({**rest, **self.hw_params(hw)}, "hardware", f"NUMA {policy} with {what}"))
        found = self._first_new(candidates)
        if found:
            return found
        best = self.best(fam)
        if best is None:
            return None
        hw = self.hw_of(best.params)
        candidates = []
        if hw.get("numa") == "bind":
            bound = {r.params.get("numa_node") for r in fam if r.params.get("numa") == "bind"}
            candidates += [
                ({**rest, **self.hw_params({**hw, "numa_node": n})}, "hardware", f"bind is best: node {n}")
                for n in nodes
                if n not in bound
            ]
        threads = self.space.values("threads")
        walked = {
            r.params.get("threads")
            for r in fam
            if r.params.get("numa") == hw.get("numa") and r.params.get("numa_node") == hw.get("numa_node")
        }
        if hw.get("threads") in threads:
            i = threads.index(hw["threads"])
            for j in (i - 1, i + 1):
                if 0 <= j < len(threads) and threads[j] not in walked:
                    candidates.append(
                        (
                            {**rest, **self.hw_params({**hw, "threads": threads[j]})},
                            "hardware",
                            f"threads {threads[j]} next to the best so far ({hw['threads']}) "
                            f"with NUMA {hw.get('numa')}, {what}",
                        )
                    )
        return self._first_new(candidates)

    def serving(self) -> Proposal | None:
        """The serving knobs in turn with the best configuration: slots at the objective's level first, then a
        unimodal walk over each knob's ordered values (KV cache types by their bits) until its best is bracketed."""
        inc = self.overall_best()
        if inc is None:
            return None
        for knob in (k for k in SERVING_KNOBS if len(self.space.values(k)) > 1):
            found = self._first_new(self.serving_steps(inc, knob))
            if found:
                return found
        return None

    def serving_steps(self, inc: Rec, knob: str) -> list[tuple]:
        """Candidates for one serving knob around the incumbent: none once some walk bracketed the incumbent's value."""
        values = self.space.values(knob)
        if knob in ("cache_type_k", "cache_type_v"):
            values = sorted(values, key=lambda v: KV_ORDER.index(v) if v in KV_ORDER else len(KV_ORDER))
        mine = inc.params.get(knob)
        if mine not in values or self.bracketed(inc.params, knob, values):
            return []
        by_value = self.walk(inc.params, knob)
        best = max(
            (v for v, r in by_value.items() if r.feasible), key=lambda v: by_value[v].tps, default=mine
        )
        steps = []
        if knob == "parallel" and self.users and self.users not in by_value:
            level = nearest(values, self.users)
            steps.append(
                (
                    {**inc.params, knob: level},
                    "serving",
                    f"{level} slots for {self.users} users at once (fewer queue them) with {self.describe(inc.params)}",
                )
            )
        i = values.index(best)
        for j in (i - 1, i + 1):
            if 0 <= j < len(values) and values[j] not in by_value:
                steps.append(
                    (
                        {**inc.params, knob: values[j]},
                        "serving",
                        f"{knob} {values[j]} next to the best so far ({best}) with {self.describe(inc.params)}",
                    )
                )
        return steps

    def walk(self, params: dict, knob: str) -> dict[Any, Rec]:
        """The measured trials that differ from ``params`` only in ``knob`` (and a V cache type flash attention
        drops), best per value."""
        free = {knob, "cache_type_v"} if knob == "flash_attn" else {knob}
        fixed = {k: v for k, v in params.items() if k not in free}
        by_value: dict[Any, Rec] = {}
        for r in self.recs:
            if (
                r.measured
                and r.params.get(knob) is not None
                and set(r.params) - free <= set(fixed)
                and all(r.params.get(k) == v for k, v in fixed.items())
            ):
                v = r.params[knob]
                if v not in by_value or r.tps > by_value[v].tps:
                    by_value[v] = r
        return by_value

    def bracketed(self, params: dict, knob: str, values: list) -> bool:
        """Some walk over ``knob`` (around any configuration) found ``params``' value best with its neighbours
        measured: serving knobs scale the rate about alike whatever the others are, so it is not walked again."""
        mine = params.get(knob)
        i = values.index(mine)
        neighbours = [values[j] for j in (i - 1, i + 1) if 0 <= j < len(values)]
        for r in self.recs:
            if r.measured and r.params.get(knob) == mine:
                by_value = self.walk(r.params, knob)
                best = max(
                    (v for v, x in by_value.items() if x.feasible),
                    key=lambda v: by_value[v].tps,
                    default=None,
                )
                if best == mine and all(n in by_value for n in neighbours):
                    return True
        return False

    def lossless(self, params: dict, knob: str) -> list[Rec]:
        """Measured trials with any speculation at ``params``' temperature and experts but ``knob``: speculative
        decoding keeps the target's output distribution, so their quality tells where ``knob`` falls below the floor."""
        same = {k: params.get(k) for k in ("temperature", "experts") if k != knob}
        return [
            r
            for r in self.recs
            if r.measured
            and r.params.get(knob) is not None
            and all(r.params.get(k) == v for k, v in same.items())
        ]

    def hw_params(self, hw: dict) -> dict:
        return {
            k: hw[k]
            for k in CONTEXT
            if hw.get(k) is not None and (k != "numa_node" or hw.get("numa") == "bind")
        }

    def overall_best(self) -> Rec | None:
        return self.best([r for r in self.recs if r.measured])

    def temperature(self) -> Proposal | None:
        """A unimodal walk over temperature with the best configuration (its neighbours, until the
        rate falls or quality does), then the best K predicted for each temperature."""
        temps = sorted(self.space.values("temperature"))
        inc = self.overall_best()
        if len(temps) < 2 or inc is None or not self.option_of(inc.params):
            return None
        option, p = self.option_of(inc.params), inc.params
        walk = self.family(p, "temperature")
        hot = min(
            (r.params.get("temperature") for r in walk + self.lossless(p, "temperature") if not r.feasible),
            default=math.inf,
        )
        seen = {r.params.get("temperature") for r in walk}
        best_t = p.get("temperature")
        i = temps.index(best_t) if best_t in temps else 0
        candidates = [
            (
                {**p, "temperature": t},
                "speculation",
                f"temperature {t} next to the best so far ({best_t}) with the best configuration "
                f"(acceptance changes with it)",
            )
            for t in temps[max(0, i - 1) : i + 2]
            if t < hot and t not in seen
        ]
        found = self._first_new(candidates)
        if (
            found or not self.k_values or self.stacked(p)
        ):  # a stack's acceptance mixes two sources: no K model
            return found
        fam = self.family(p, "temperature", "experts")
        _, t0, e0 = self.context0()
        f0 = self.fit_option(option, t0, e0)
        if f0 is None:
            return None
        candidates = []
        top = max((r.tps for r in fam if r.feasible), default=0.0)
        at_k = [
            r
            for r in fam
            if r.feasible
            and r.acceptance
            and r.params.get("experts") == p.get("experts")
            and r.params.get("temperature") != t0
            and r.tps >= 0.95 * top
        ]
        for r in sorted(at_k, key=lambda r: -r.tps):
            k_r = r.params.get("draft_max")
            f = DraftFit((Point(k_r, r.acceptance, None),), f0.c)
            k = f.best_k(self.k_values)
            gain = f.predict(k) / f.predict(k_r)
            if gain > 1.01 and r.tps * gain > inc.tps * 0.99:
                candidates.append(
                    (
                        {**r.params, "draft_max": k},
                        "speculation",
                        f"predicted best K={k} at temperature {r.params.get('temperature')} "
                        f"from {f.describe()}: +{gain - 1:.0%}",
                    )
                )
        return self._first_new(candidates)

    def experts(self) -> Proposal | None:
        """For a MoE target: walk the expert count down to the quality floor (bisection)."""
        values = self.space.values("experts")
        inc = self.overall_best()
        if len(values) < 2 or inc is None or inc.params.get("experts") is None:
            return None
        fam = [
            r
            for r in self.family(inc.params, "experts")
            if r.params.get("spec_type") == inc.params.get("spec_type")
        ]
        by_e: dict[Any, Rec] = {}
        for r in fam:
            if r.params.get("experts") not in by_e or r.tps > by_e[r.params["experts"]].tps:
                by_e[r.params.get("experts")] = r
        good = [e for e, r in by_e.items() if r.feasible]
        lo = min(good)
        floor = max(
            (
                r.params.get("experts")
                for r in list(by_e.values()) + self.lossless(inc.params, "experts")
                if not r.feasible and r.params.get("experts") < lo
            ),
            default=min(values) - 1,
        )
        candidates = []
        fastest = max(by_e[e].tps for e in good)
        if lo - floor > 1 and by_e[lo].tps >= 0.99 * fastest:
            e = nearest([v for v in values if floor < v < lo], (floor + lo) / 2)
            candidates.append(
                (
                    {**inc.params, "experts": e},
                    "speculation",
                    f"experts {e}: fewer is faster until quality falls below the floor "
                    f"(feasible down to {lo}{'' if floor < min(values) else f', not at {floor}'})",
                )
            )
        if self.option_of(inc.params):
            alone = {
                k: v
                for k, v in inc.params.items()
                if k not in ("draft", "draft_max", "draft_min", "draft_p_min")
            }
            candidates.append(
                (
                    {**alone, "spec_type": "none"},
                    "speculation",
                    f"target alone at experts={inc.params['experts']}: does speculation still pay?",
                )
            )
        return self._first_new(candidates)

    def line_step(self, p: dict, knob: str = "draft_max", grow: float = 1.5) -> int | None:
        """Next value of a unimodal line search over an integer knob (K, a lookup's length, the n-gram key):
        extend past an edge by ``grow``, else halve the wider gap around the best, until the gaps are within 10%."""
        values = self.space.values(knob)
        fixed = {k: v for k, v in p.items() if k != knob}
        by_k: dict[int, float] = {}
        for r in self.recs:
            if (
                r.measured
                and r.feasible
                and r.params.get(knob) is not None
                and all(r.params.get(k) == v for k, v in fixed.items())
                and set(r.params) <= set(p)
            ):
                by_k[r.params[knob]] = max(by_k.get(r.params[knob], 0.0), r.tps)
        ks = sorted(by_k)
        if not ks or not values:
            return None
        best = max(ks, key=lambda k: by_k[k])
        i = ks.index(best)
        lo, hi = values[0], values[-1]
        tol = max(1, round(0.1 * best))
        left = ks[i - 1] if i > 0 else None
        right = ks[i + 1] if i + 1 < len(ks) else None
        options = []
        if right is None and best < hi:
            options.append((math.inf, min(hi, max(best + 1, round(best * grow)))))
        elif right is not None and right - best > tol:
            options.append((right - best, (best + right) // 2 if (best + right) // 2 != best else best + 1))
        if left is None and best > lo:
            options.append((math.inf, max(lo, min(best - 1, round(best / grow)))))
        elif left is not None and best - left > tol:
            options.append(
                (best - left, (best + left + 1) // 2 if (best + left + 1) // 2 != best else best - 1)
            )
        for _, k in sorted(options, key=lambda x: -x[0]):
            k = nearest(values, k)
            if k not in by_k:
                return k
        return None

    def refinement(self) -> Proposal | None:
        """Unmeasured neighbours of the incumbent; other options at their best K (predicted, or measured
        where the model's pick lost), before the hardware pair is checked again."""
        inc = self.overall_best()
        if inc is None:
            return None
        p = inc.params
        k = p.get("draft_max")
        candidates = self.other_options(p) if k is not None else []
        threads = self.space.values("threads")
        if p.get("threads") in threads:
            i = threads.index(p["threads"])
            for j in (i - 1, i + 1):
                if 0 <= j < len(threads):
                    candidates.append(
                        (
                            {**p, "threads": threads[j]},
                            "refinement",
                            f"threads {threads[j]} with the final configuration (the pair checked again)",
                        )
                    )
        experts = self.space.values("experts")
        if p.get("experts") in experts:
            for e in (p["experts"] - 1, p["experts"] + 1):
                if e in experts:
                    candidates.append(({**p, "experts": e}, "refinement", f"experts {e} next to the best"))
        if k is not None and self.k_values:
            kk = self.line_step(p)
            if kk is not None:
                candidates.append(
                    (
                        {**p, "draft_max": kk},
                        "refinement",
                        f"K={kk}: line search around the best K={k} (tokens/s is unimodal in K)",
                    )
                )
        return self._first_new(candidates + self.size_steps(p))

    def other_options(self, p: dict) -> list[tuple]:
        """The other options within 3% of the incumbent's at the start, with the incumbent's other knobs."""
        option = self.option_of(p)
        _, t0, e0 = self.context0()
        inc_fit = self.fit_option(option, t0, e0) if option else None
        candidates = []
        for o in self.options():
            f = self.fit_option(o, t0, e0)
            if o == option or f is None or inc_fit is None:
                continue
            kk, why = f.best_k(self.k_values), "predicted"
            mine, ours = self.at_start(o), self.at_start(option)
            top = max(mine, key=lambda r: r.tps)
            if len({r.params.get("draft_max") for r in mine}) > 1 and top.params.get("draft_max") != kk:
                kk, why = (
                    top.params.get("draft_max"),
                    "measured",
                )  # the model's pick lost (a lookup misses some keys)
            if f.predict(kk) >= 0.97 * inc_fit.predict(inc_fit.best_k(self.k_values)) or (
                why == "measured" and ours and top.tps >= 0.97 * max(r.tps for r in ours)
            ):
                rest = {x: v for x, v in p.items() if x not in ("spec_type", "draft", "draft_max")}
                candidates.append(
                    (
                        {**rest, **self.config(o, kk, {}, None, None)},
                        "refinement",
                        f"{self.name(o)} at its {why} best K={kk}: {why} within 3%",
                    )
                )
        return candidates

    def size_steps(self, p: dict) -> list[tuple]:
        """Line searches over the n-gram sizes of the incumbent's lookup (alone or stacked)."""
        steps = []
        for knob, what in (
            ("lookup_max", "the stacked lookup's draft length"),
            ("ngram_key", "the n-gram key length"),
            ("ngram_min_hits", "the n-gram minimum hits"),
        ):
            step = self.line_step(p, knob) if p.get(knob) is not None else None
            if step is not None:
                steps.append(
                    (
                        {**p, knob: step},
                        "refinement",
                        f"{what} {step}: line search around the best {p[knob]} with {self.describe(p)}",
                    )
                )
        return steps


def records(study: optuna.Study) -> list[Rec]:
    """The stored trials, with what each measured (pruned ones: what they measured before stopping); the
    value maximised is the study's first objective (a minimised one inverted)."""
    context = store.search_context(study)
    objective = context[1][0] if context and context[1] else "tokens_per_second"
    minimise = study.directions[0] == optuna.study.StudyDirection.MINIMIZE
    recs = []
    for t in study.get_trials(deepcopy=False):
        state = {
            TrialState.COMPLETE: "complete",
            TrialState.PRUNED: "pruned",
            TrialState.FAIL: "failed",
            TrialState.RUNNING: "running",
        }.get(t.state)
        if state is None:
            continue
        params = dict(t.params)
        if state == "running":
            planned = t.system_attrs.get(PLAN_ATTR)
            params = json.loads(planned) if planned else params
        record = store.read_trial(t)
        m = record.metrics
        feasible = all(v <= 0 for v in (t.constraints or {}).values())
        recs.append(
            Rec(
                params,
                state,
                value(record, objective, minimise),
                m.acceptance if m else None,
                feasible,
                record.failure.reason if record.failure else None,
                record.role,
                suite_rates(record.samples),
            )
        )
    return recs


def value(record, objective: str, minimise: bool) -> float | None:
    """A trial's figure to maximise; None where it has none (a pruned trial never reached the load levels)."""
    if record.metrics is None:
        return None
    try:
        figure = record.objective(objective)
    except KeyError:
        return None
    return (1.0 / figure if figure > 0 else None) if minimise else figure


def level_of(objectives: Sequence[str]) -> int | None:
    """The users the first objective measures at (``p95_ttft_ms_c4``: 4), if it is a load metric."""
    split = split_metric_name(objectives[0]) if objectives else None
    return split[1] if split else None


def suite_rates(samples: Sequence[dict]) -> dict[str, float]:
    """Tokens/s per suite over a trial's requests, pooled; from the requests, so a pruned trial (and a
    simulated replay's) has them too."""
    suites = {s["suite"] for s in samples if s.get("suite") and s.get("tokens_per_second")}
    return {
        suite: pooled_from_rates(s for s in samples if s.get("suite") == suite) for suite in sorted(suites)
    }


class StructuredSampler(optuna.samplers.BaseSampler):
    def __init__(self, fallback: optuna.samplers.BaseSampler, seed: int | None = None):
        self.fallback = fallback
        self.seed = seed
        self._plans: dict[int, dict | None] = {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.fallback.before_trial(study, trial)
        if "fixed_params" in trial.system_attrs:  # enqueued: the baseline or a warm start
            return
        proposal = None
        context = store.search_context(study)
        if context:
            proposal = Planner(
                Space(context[0]), records(study), store.read_prior(study), level_of(context[1])
            ).next()
        if proposal is None:
            self._plans[trial.number] = None
            self._note(study, trial, "refinement", "no structured step left: TPE proposes")
            return
        self._plans[trial.number] = proposal.params
        study._storage.set_trial_system_attr(trial._trial_id, PLAN_ATTR, json.dumps(proposal.params))
        self._note(study, trial, proposal.stage, proposal.reason)

    @staticmethod
    def _note(study: optuna.Study, trial: FrozenTrial, stage: str, reason: str) -> None:
        store.note_search(study, trial, stage, reason)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        if self._plans.get(trial.number) is not None:
            return {}
        return self.fallback.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if self._plans.get(trial.number) is not None or not search_space:
            return {}
        return self.fallback.sample_relative(study, trial, search_space)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        plan = self._plans.get(trial.number)
        if plan and param_name in plan:
            value = plan[param_name]
            try:
                if param_distribution._contains(param_distribution.to_internal_repr(value)):
                    return value
            except (ValueError, TypeError):
                pass
        return self.fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self._plans.pop(trial.number, None)
        self.fallback.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.fallback.reseed_rng()


def fitted_models(study: optuna.Study) -> list[dict]:
    """For the report: each option's fitted model against its measured points, at the baseline's
    temperature and experts (the points the sampler fitted). One row per measured point, with the
    model's acceptance and speedup at that K, and the predicted best K."""
    context = store.search_context(study)
    if not context:
        return []
    planner = Planner(Space(context[0]), records(study))
    if planner.base is None:
        return []
    hw0, t0, e0 = planner.context0()
    from tuner.search.model import measured_acceptance

    rows = []
    for option in planner.options():
        f = planner.fit_option(option, t0, e0)
        if f is None:
            continue
        best_k = f.best_k(planner.k_values) if planner.k_values else None
        for p in sorted(f.points, key=lambda p: p.k):
            rows.append(
                {
                    "option": planner.name(option),
                    "k": p.k,
                    "acceptance": p.acceptance,
                    "model_acceptance": measured_acceptance(f.a_at(p.k), p.k),
                    "speedup": p.speedup,
                    "model_speedup": f.predict(p.k),
                    "a": f.a_at(p.k),
                    "cost_ratio": f.c,
                    "predicted_best_k": best_k,
                    "predicted_best_speedup": f.predict(best_k) if best_k else None,
                }
            )
    return rows
