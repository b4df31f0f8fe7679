"""How a race writes its figures: a loss the operator set, a loss bound, a user count, a race's title, rates.

Why apart: every other module of the race words its lines with these, so they sit below all of them."""

from __future__ import annotations

import math

from tuner import figure_text


def loss_text(fraction: float) -> str:
    """A loss the operator set, as written: 2%, 0.5% (never rounded to 0%)."""
    return f"{100 * fraction:.3g}%"


def bound_text(log_bound: float) -> str:
    """A bound on a log ratio as the percentage faster it allows."""
    return figure_text.percent_up(math.expm1(log_bound))


def users_text(users: int) -> str:
    return f"{users} user{'s' if users > 1 else ''}"


def race_title(users: int | None) -> str:
    """How a race's lines begin: ``race``, or ``race c4`` for a load class's (aggregate tokens/s at 4 users)."""
    return "race" if users is None else f"race c{users}"


def rates_text(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)
