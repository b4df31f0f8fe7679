"""Figures as an operator reads them: the one place a number from a race, a forecast or an interval is formatted.

Why: a figure from too few launches can be infinite or NaN (a bound with fewer paired rounds than a t-interval
needs, a speedup over a rate of zero, a forecast with no spread yet). Such a figure is said in words, never
printed as ``inf`` and never a crash (``math.ceil(inf)`` raises).
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard, overload

NO_FIGURE = "no figure"


def finite(value: float | None) -> TypeGuard[float]:
    """A number that can be printed and stored as one (not None, not infinite, not NaN)."""
    return value is not None and math.isfinite(value)


def figure(value: float | None, spec: str = ".2f", *, missing: str = NO_FIGURE) -> str:
    """``value`` in ``spec`` (a format spec), or ``missing`` when it is None, infinite or NaN."""
    return format(value, spec) if finite(value) else missing


def percent_up(fraction: float | None, *, missing: str = NO_FIGURE) -> str:
    """An upper bound as a percentage with one decimal, rounded up (0.04% reads 0.1%, never 0.0%)."""
    if not finite(fraction):
        return missing
    return f"{math.ceil(round(1000 * fraction, 6)) / 10:.1f}%"


def or_none(value: float | None) -> float | None:
    """``value`` for JSON and YAML: None (null) where it is not a finite number."""
    return value if finite(value) else None


@overload
def json_safe(data: dict) -> dict[str, Any]: ...
@overload
def json_safe(data: object) -> object: ...
def json_safe(data: object) -> object:
    """``data`` with every non-finite float as None: JSON has no infinity (``json.dumps`` writes ``Infinity``,
    which strict readers refuse) and YAML's ``.inf`` reads as a number where there is none."""
    if isinstance(data, float):
        return or_none(data)
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_safe(v) for v in data]
    return data
