"""Configurations as the stages build, complete and name them.

A plan is a dict of knob values; an *option* is what a configuration speculates with
(``("draft-simple", draft)``, ``("ngram-mod", None)``; ``None`` for the target alone). ``KnobValues``
lists the values a stage walks for each knob of the study's space; ``PlannedAnswers`` plays a trial
for the real ``suggest`` so a plan holds exactly the knobs a trial of it asks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from tuner.knobs.config import Choices, Domain, FloatRange, IntRange
from tuner.knobs.registry import SERVING_KNOBS
from tuner.search.prior import HW_KNOBS
from tuner.search.space import FOLLOWS, ResolvedSpace

# A middle K, where the research's K tuning starts: speed and acceptance there show which way K should move.
K_PROBE = 8
# What a plan leaves open starts here: no lookup stacked; a 4-token n-gram key, the research's prompt lookup's
# (llama.cpp's 12 finds nothing in short answers), llama.cpp's minimum hits, a stacked lookup's length at K=8.
PROBES = {"lookup": "none", "ngram_key": 4, "ngram_min_hits": 1, "lookup_max": K_PROBE, "lookup_min": 1}
SIZE_KNOBS = ("lookup", "lookup_max", "lookup_min", "ngram_key", "ngram_min_hits")
# What every plan carries from the configuration it starts from: the target file it runs (a quantized variant
# is another target, with its own rate alone), the hardware and the serving knobs.
CARRIED = ("target_quant", *HW_KNOBS, *SERVING_KNOBS)


class KnobValues:
    """The values a stage walks per knob, from the ``space`` study attr (``ResolvedSpace.as_dict``): a
    choice's values, an integer range's steps (17 log-spaced points for a wide log range), five points of a
    float range without a step."""

    def __init__(self, space: dict[str, list]):
        self.kinds = {name: kind for name, (kind, _) in space.items()}
        self.raw = {name: d for name, (_, d) in space.items()}

    def has(self, name: str) -> bool:
        return name in self.raw

    def values(self, name: str) -> list:
        kind, domain = self.kinds.get(name), self.raw.get(name)
        if domain is None:
            return []
        if kind == "Choices":
            return list(domain["values"])
        if kind == "IntRange":
            if domain.get("log") and domain["high"] > 64:
                return sorted(
                    {
                        int(
                            round(math.exp(i / 16 * math.log(domain["high"] / domain["low"])) * domain["low"])
                        )
                        for i in range(17)
                    }
                )
            return list(range(domain["low"], domain["high"] + 1, domain.get("step") or 1))
        step = domain.get("step")
        if step:
            count = int(round((domain["high"] - domain["low"]) / step))
            return [round(domain["low"] + i * step, 10) for i in range(count + 1)]
        return [round(domain["low"] + i * (domain["high"] - domain["low"]) / 4, 10) for i in range(5)]

    def resolved(self) -> ResolvedSpace:
        """The domains as ``suggest`` reads them."""
        kinds: dict[str, Callable[[dict], Domain]] = {
            "Choices": lambda d: Choices(tuple(d["values"])),
            "IntRange": lambda d: IntRange(**d),
            "FloatRange": lambda d: FloatRange(**d),
        }
        return ResolvedSpace(
            {name: kinds[self.kinds[name]](d) for name, d in self.raw.items()}, None, 0, False
        )


class PlannedAnswers:
    """A trial for the real ``suggest``: the plan's value where the domain admits it, else the knob's probe
    value; ``asked`` keeps both (a knob with neither is left to the fallback sampler, as Optuna would)."""

    def __init__(self, plan: dict):
        self.plan = plan
        self.asked: dict[str, Any] = {}

    def _answer(self, name: str, values: list | None, first: Any) -> Any:
        value = self.plan.get(name)
        if value is None and name in FOLLOWS:
            value = self.asked.get(FOLLOWS[name], self.plan.get(FOLLOWS[name]))
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


def option_of(params: dict) -> tuple | None:
    """What a configuration speculates with: (type, draft or None); None for the target alone."""
    spec = params.get("spec_type", "none")
    return None if spec == "none" else (spec, params.get("draft") if spec == "draft-simple" else None)


def is_stacked(params: dict) -> bool:
    """A lookup stacked on a draft model."""
    return params.get("lookup") not in (None, "none")


def option_name(option: tuple) -> str:
    return f"draft {option[1]}" if option[0] == "draft-simple" else option[0]


def describe_speculation(params: dict) -> str:
    """What a configuration speculates with, for reasons: 'draft X K=24 + ngram-mod (key 4, 32)'."""
    option = option_of(params)
    if option is None:
        return "the target alone"
    what = f"{option_name(option)} K={params.get('draft_max')}"
    if is_stacked(params):
        what += f" + {params['lookup']}"
    sizes = [
        f"{k.replace('ngram_', '').replace('_', ' ')} {params[k]}"
        for k in ("ngram_key", "lookup_max")
        if params.get(k) is not None
    ]
    return what + (f" ({', '.join(sizes)})" if sizes else "")


def hardware_of(params: dict) -> dict:
    """The hardware and serving knobs: a target alone compares with a trial only at the same ones."""
    return {k: params.get(k) for k in CARRIED if params.get(k) is not None}


def hardware_params(hardware: dict) -> dict:
    """The hardware and serving knobs a plan sets (a NUMA node only under bind)."""
    return {
        k: hardware[k]
        for k in CARRIED
        if hardware.get(k) is not None and (k != "numa_node" or hardware.get("numa") == "bind")
    }
