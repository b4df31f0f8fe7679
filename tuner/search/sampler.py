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
   n-gram type at K=8 (the research's starting point), fit acceptance and cost ratio per
   option, then measure the predicted best K of the best options, fitting again with each
   new point. Options that fail for a permanent reason are dropped (blamed).
2. **hardware**: with the best speculation so far, the pair an earlier study found best on
   this host (if any; when it beats the baseline's, the policy probes are skipped), each NUMA
   policy at the baseline's threads, then a unimodal walk over thread counts on the best
   policy. Tuned on the speculative configuration rather than the target alone: the factor
   is about the same, the trial is several times shorter, and a draft's cost grows with
   threads, so the pair is right for the configuration that will be used.
3. **speculation** again: for a MoE target, the expert count walked down to the quality
   floor; then a unimodal walk over temperature from the best (acceptance changes with it;
   a temperature below the quality floor rules out the hotter ones), and the best K
   predicted for each.
4. **refinement**: unmeasured neighbours of the incumbent (K, threads, experts, the
   pair of hardware knobs again) and other options at their predicted best K.

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
go to the fallback.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.measurement.failures import PERMANENT
from tuner.storage import store
from tuner.search.model import DraftFit, Point, fit
from tuner.search.prior import HW_KNOBS, describe

PLAN_ATTR = "search:plan"  # a system attr: the running trial's planned configuration, for other workers
# What a pruned trial measured before it stopped, as the study loop stores it (user attr).
K_PROBE = 8  # the research's first K for any draft (seed 003, "K-Tuning Methodology": start with K=8)
PERMANENT_REASONS = frozenset(r.value for r in PERMANENT)


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
                return sorted({int(round(math.exp(i / 16 * math.log(d["high"] / d["low"])) * d["low"])) for i in range(17)})
            return list(range(d["low"], d["high"] + 1, d.get("step") or 1))
        step = d.get("step")
        if step:
            n = int(round((d["high"] - d["low"]) / step))
            return [round(d["low"] + i * step, 10) for i in range(n + 1)]
        return [round(d["low"] + i * (d["high"] - d["low"]) / 4, 10) for i in range(5)]


def nearest(values: Sequence, target: float):
    return min(values, key=lambda v: (abs(v - target), v))


class Planner:
    """Decides the next configuration from the history; stateless between calls."""

    def __init__(self, space: Space, recs: list[Rec], prior: dict | None = None):
        self.space, self.recs, self.prior = space, recs, prior or {}
        self.taken = [r.params for r in recs if r.state != "failed" or r.failure in PERMANENT_REASONS or r.failure is None]
        self.k_values = space.values("draft_max")
        self.base = next((r for r in recs if r.role == "baseline" and r.measured and r.feasible), None) or next(
            (r for r in recs if r.measured and r.params.get("spec_type", "none") == "none"), None)

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
        for knob in HW_KNOBS:
            if hw.get(knob) is not None and (knob != "numa_node" or hw.get("numa") == "bind"):
                p[knob] = hw[knob]
        return p

    def is_new(self, params: dict) -> bool:
        return not any(all(params.get(k) == v for k, v in t.items()) and len(t) == len(params) for t in self.taken)

    @staticmethod
    def option_of(params: dict) -> tuple | None:
        spec = params.get("spec_type", "none")
        return None if spec == "none" else (spec, params.get("draft") if spec == "draft-simple" else None)

    @staticmethod
    def hw_of(params: dict) -> dict:
        return {k: params.get(k) for k in HW_KNOBS if params.get(k) is not None}

    def options(self) -> list[tuple]:
        specs = self.space.values("spec_type")
        opts = []
        for spec in specs:
            if spec == "draft-simple":
                opts.extend(("draft-simple", d) for d in self.space.values("draft"))
            elif spec != "none":
                opts.append((spec, None))
        dead = {self.option_of(r.params) for r in self.recs if r.state == "failed" and r.failure in PERMANENT_REASONS}
        return [o for o in opts if o not in dead]

    def measured(self, **match) -> list[Rec]:
        return [r for r in self.recs if r.measured and all(r.params.get(k) == v for k, v in match.items())]

    def best(self, recs: list[Rec]) -> Rec | None:
        good = [r for r in recs if r.feasible and r.state == "complete"] or [r for r in recs if r.feasible]
        return max(good, key=lambda r: r.tps, default=None)

    def target_alone(self, hw: dict, experts: Any) -> float | None:
        recs = [r for r in self.measured(spec_type="none") if self.hw_of(r.params) == hw
                and r.params.get("experts") == experts and r.state == "complete"]
        return max((r.tps for r in recs), default=None)

    def fit_option(self, option: tuple, temperature: Any, experts: Any) -> DraftFit | None:
        points = []
        for r in self.recs:
            if not r.measured or self.option_of(r.params) != option or r.params.get("temperature") != temperature \
                    or r.params.get("experts") != experts or r.acceptance is None:
                continue
            base = self.target_alone(self.hw_of(r.params), experts)
            points.append(Point(r.params.get("draft_max") or K_PROBE, r.acceptance, r.tps / base if base else None))
        return fit(points)

    @staticmethod
    def name(option: tuple) -> str:
        return f"draft {option[1]}" if option[0] == "draft-simple" else option[0]

    # -- the plan -----------------------------------------------------------------------

    def next(self) -> Proposal | None:
        if self.base is None:
            return None
        for stage in (self.warm_start, self.speculation, self.hardware, self.experts, self.temperature,
                      self.refinement):
            proposal = stage()
            if proposal is not None:
                return proposal
        return None

    def _first_new(self, candidates) -> Proposal | None:
        for params, stage, reason in candidates:
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
        probes = [(self.config(o, k_probe, hw0, t0, e0), "speculation",
                   f"probe {self.name(o)} at K={k_probe}: fit its acceptance and draft cost")
                  for o in self.options() if not self.measured(**self.config(o, None, hw0, t0, e0))]
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
            mine = self.measured(**self.config(o, None, hw0, t0, e0))
            if len(mine) >= (3 if i == 0 else 2):
                continue
            if len(mine) >= 2 and max(mine, key=lambda r: r.tps).params.get("draft_max") == k_probe:
                continue  # the model's pick lost to the probe: the line search in refinement takes over
            candidates.append((self.config(o, k, hw0, t0, e0), "speculation",
                               f"predicted best K={k} for {self.name(o)} from {f.describe()}: x{pred:.2f}"))
        return self._first_new(candidates)

    def incumbent_spec(self) -> Rec | None:
        """Best measured configuration at the baseline's temperature and experts (any hardware)."""
        _, t0, e0 = self.context0()
        match = {k: v for k, v in (("temperature", t0), ("experts", e0)) if self.space.has(k)}
        return self.best(self.measured(**match))

    def family(self, params: dict, *free: str) -> list[Rec]:
        """Measured trials that agree with ``params`` except on K and the ``free`` knobs."""
        free_set = set(free) | {"draft_max"}
        fixed = {k: v for k, v in params.items() if k not in free_set}
        return [r for r in self.recs if r.measured and all(r.params.get(k) == v for k, v in fixed.items())
                and all(k in fixed or k in free_set for k in r.params)]

    def hardware(self) -> Proposal | None:
        """NUMA policies at the baseline's threads, then a unimodal walk over threads on the best policy."""
        inc = self.incumbent_spec()
        if inc is None:
            return None
        hw0, _, _ = self.context0()
        rest = {k: v for k, v in inc.params.items() if k not in HW_KNOBS}
        fam = self.family(inc.params, *HW_KNOBS)
        what = f"{self.name(self.option_of(inc.params))} K={inc.params.get('draft_max')}" \
            if self.option_of(inc.params) else "the target alone"
        nodes = self.space.values("numa_node")
        policies = {r.params.get("numa") for r in fam}
        prior_hw = self.prior.get("hardware")
        if prior_hw:  # an earlier study's pair on this host first; if it beats the baseline's, no policy probes
            found = self._first_new([({**rest, **self.hw_params(prior_hw)}, "hardware",
                                      f"NUMA {prior_hw.get('numa')}, {prior_hw.get('threads')} threads with {what}: "
                                      f"best on this host in {describe(self.prior)}")])
            if found:
                return found
        # the policy carries over (threads are walked below): no probes once the prior's policy leads
        trusted = prior_hw and self.best(fam) is not None and self.best(fam).params.get("numa") == prior_hw.get("numa")
        candidates = []
        for policy in self.space.values("numa"):
            if policy not in policies and not trusted:
                hw = {"numa": policy, "threads": hw0.get("threads"),
                      "numa_node": nodes[0] if policy == "bind" and nodes else None}
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
            candidates += [({**rest, **self.hw_params({**hw, "numa_node": n})}, "hardware",
                            f"bind is best: node {n}") for n in nodes if n not in bound]
        threads = self.space.values("threads")
        walked = {r.params.get("threads") for r in fam if r.params.get("numa") == hw.get("numa")
                  and r.params.get("numa_node") == hw.get("numa_node")}
        if hw.get("threads") in threads:
            i = threads.index(hw["threads"])
            for j in (i - 1, i + 1):
                if 0 <= j < len(threads) and threads[j] not in walked:
                    candidates.append(({**rest, **self.hw_params({**hw, "threads": threads[j]})}, "hardware",
                                       f"threads {threads[j]} next to the best so far ({hw['threads']}) "
                                       f"with NUMA {hw.get('numa')}, {what}"))
        return self._first_new(candidates)

    def hw_params(self, hw: dict) -> dict:
        return {k: hw[k] for k in HW_KNOBS if hw.get(k) is not None and (k != "numa_node" or hw.get("numa") == "bind")}

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
        hot = min((r.params.get("temperature") for r in walk if not r.feasible), default=math.inf)
        seen = {r.params.get("temperature") for r in walk}
        best_t = p.get("temperature")
        i = temps.index(best_t) if best_t in temps else 0
        candidates = [({**p, "temperature": t}, "speculation",
                       f"temperature {t} next to the best so far ({best_t}) with the best configuration "
                       f"(acceptance changes with it)")
                      for t in temps[max(0, i - 1):i + 2] if t < hot and t not in seen]
        found = self._first_new(candidates)
        if found or not self.k_values:
            return found
        fam = self.family(p, "temperature", "experts")
        _, t0, e0 = self.context0()
        f0 = self.fit_option(option, t0, e0)
        if f0 is None:
            return None
        candidates = []
        top = max((r.tps for r in fam if r.feasible), default=0.0)
        at_k = [r for r in fam if r.feasible and r.acceptance and r.params.get("experts") == p.get("experts")
                and r.params.get("temperature") != t0 and r.tps >= 0.95 * top]
        for r in sorted(at_k, key=lambda r: -r.tps):
            k_r = r.params.get("draft_max")
            f = DraftFit((Point(k_r, r.acceptance, None),), f0.c)
            k = f.best_k(self.k_values)
            gain = f.predict(k) / f.predict(k_r)
            if gain > 1.01 and r.tps * gain > inc.tps * 0.99:
                candidates.append(({**r.params, "draft_max": k}, "speculation",
                                   f"predicted best K={k} at temperature {r.params.get('temperature')} "
                                   f"from {f.describe()}: +{gain - 1:.0%}"))
        return self._first_new(candidates)

    def experts(self) -> Proposal | None:
        """For a MoE target: walk the expert count down to the quality floor (bisection)."""
        values = self.space.values("experts")
        inc = self.overall_best()
        if len(values) < 2 or inc is None or inc.params.get("experts") is None:
            return None
        fam = [r for r in self.family(inc.params, "experts")
               if r.params.get("spec_type") == inc.params.get("spec_type")]
        by_e: dict[Any, Rec] = {}
        for r in fam:
            if r.params.get("experts") not in by_e or r.tps > by_e[r.params["experts"]].tps:
                by_e[r.params.get("experts")] = r
        good = [e for e, r in by_e.items() if r.feasible]
        lo = min(good)
        floor = max((e for e, r in by_e.items() if not r.feasible and e < lo), default=min(values) - 1)
        candidates = []
        fastest = max(by_e[e].tps for e in good)
        if lo - floor > 1 and by_e[lo].tps >= 0.99 * fastest:
            e = nearest([v for v in values if floor < v < lo], (floor + lo) / 2)
            candidates.append(({**inc.params, "experts": e}, "speculation",
                               f"experts {e}: fewer is faster until quality falls below the floor "
                               f"(feasible down to {lo}{'' if floor < min(values) else f', not at {floor}'})"))
        if self.option_of(inc.params):
            alone = {k: v for k, v in inc.params.items() if k not in ("draft", "draft_max", "draft_min", "draft_p_min")}
            candidates.append(({**alone, "spec_type": "none"}, "speculation",
                               f"target alone at experts={inc.params['experts']}: does speculation still pay?"))
        return self._first_new(candidates)

    def k_step(self, p: dict) -> int | None:
        """Next K of a unimodal line search: extend past an edge by half, else halve the wider gap
        around the best, until the gaps are within 10% of K."""
        by_k: dict[int, float] = {}
        for r in self.family(p):
            if r.feasible and r.params.get("draft_max") is not None:
                by_k[r.params["draft_max"]] = max(by_k.get(r.params["draft_max"], 0.0), r.tps)
        ks = sorted(by_k)
        if not ks:
            return None
        best = max(ks, key=lambda k: by_k[k])
        i = ks.index(best)
        lo, hi = self.k_values[0], self.k_values[-1]
        tol = max(1, round(0.1 * best))
        left = ks[i - 1] if i > 0 else None
        right = ks[i + 1] if i + 1 < len(ks) else None
        options = []
        if right is None and best < hi:
            options.append((math.inf, min(hi, max(best + 1, round(best * 1.5)))))
        elif right is not None and right - best > tol:
            options.append((right - best, (best + right) // 2 if (best + right) // 2 != best else best + 1))
        if left is None and best > lo:
            options.append((math.inf, max(lo, min(best - 1, round(best / 1.5)))))
        elif left is not None and best - left > tol:
            options.append((best - left, (best + left + 1) // 2 if (best + left + 1) // 2 != best else best - 1))
        for _, k in sorted(options, key=lambda x: -x[0]):
            k = nearest(self.k_values, k)
            if k not in by_k:
                return k
        return None

    def refinement(self) -> Proposal | None:
        """Unmeasured neighbours of the incumbent; other options at their predicted best K."""
        inc = self.overall_best()
        if inc is None:
            return None
        p = inc.params
        candidates = []
        k = p.get("draft_max")
        if k is not None and self.k_values:
            kk = self.k_step(p)
            if kk is not None:
                candidates.append(({**p, "draft_max": kk}, "refinement",
                                   f"K={kk}: line search around the best K={k} (tokens/s is unimodal in K)"))
        threads = self.space.values("threads")
        if p.get("threads") in threads:
            i = threads.index(p["threads"])
            for j in (i - 1, i + 1):
                if 0 <= j < len(threads):
                    candidates.append(({**p, "threads": threads[j]}, "refinement",
                                       f"threads {threads[j]} with the final configuration (the pair checked again)"))
        experts = self.space.values("experts")
        if p.get("experts") in experts:
            for e in (p["experts"] - 1, p["experts"] + 1):
                if e in experts:
                    candidates.append(({**p, "experts": e}, "refinement", f"experts {e} next to the best"))
        option = self.option_of(p)
        _, t0, e0 = self.context0()
        inc_fit = self.fit_option(option, t0, e0) if option else None
        for o in self.options():
            f = self.fit_option(o, t0, e0)
            if o == option or f is None or inc_fit is None or k is None:
                continue
            kk = f.best_k(self.k_values)
            if f.predict(kk) >= 0.97 * inc_fit.predict(inc_fit.best_k(self.k_values)):
                rest = {x: v for x, v in p.items() if x not in ("spec_type", "draft", "draft_max")}
                candidates.append(({**rest, **self.config(o, kk, {}, None, None)}, "refinement",
                                   f"{self.name(o)} at its predicted best K={kk}: predicted within 3%"))
        return self._first_new(candidates)


def records(study: optuna.Study) -> list[Rec]:
    """The stored trials, with what each measured (pruned ones: what they measured before stopping)."""
    recs = []
    for t in study.get_trials(deepcopy=False):
        state = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed",
                 TrialState.RUNNING: "running"}.get(t.state)
        if state is None:
            continue
        params = dict(t.params)
        if state == "running":
            planned = t.system_attrs.get(PLAN_ATTR)
            params = json.loads(planned) if planned else params
        record = store.read_trial(t)
        m = record.metrics
        feasible = all(v <= 0 for v in (t.constraints or {}).values())
        recs.append(Rec(params, state, m.tokens_per_second if m else None, m.acceptance if m else None, feasible,
                        record.failure.reason if record.failure else None, record.role))
    return recs


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
            proposal = Planner(Space(context[0]), records(study), store.read_prior(study)).next()
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

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if self._plans.get(trial.number) is not None:
            return {}
        return self.fallback.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if self._plans.get(trial.number) is not None or not search_space:
            return {}
        return self.fallback.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        plan = self._plans.get(trial.number)
        if plan and param_name in plan:
            value = plan[param_name]
            try:
                if param_distribution._contains(param_distribution.to_internal_repr(value)):
                    return value
            except (ValueError, TypeError):
                pass
        return self.fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
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
            rows.append({"option": planner.name(option), "k": p.k, "acceptance": p.acceptance,
                         "model_acceptance": measured_acceptance(f.a_at(p.k), p.k), "speedup": p.speedup,
                         "model_speedup": f.predict(p.k), "a": f.a_at(p.k), "cost_ratio": f.c,
                         "predicted_best_k": best_k, "predicted_best_speedup": f.predict(best_k) if best_k else None})
    return rows
