"""The operator's progress lines: what a long command is doing now, one line at a time.

Why: a study, its race and an export run for minutes to an hour, and the operator reads where they stand from
these lines (and the study's dashboard from the sink). A timed ``Progress`` ends each line with the time
elapsed and left from its ``TimePlan`` (``tuner.eta``); an untimed one prints lines as they are (a benchmark's
simulated race, a lock wait before a command starts); a quiet one prints nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypedDict

from tuner.eta import TimePlan


class ProgressFigures(TypedDict):
    """One line and where the command stands at it, as the sink receives them."""

    line: str
    elapsed_s: float
    remaining_s: float | None  # None while the time plan has no estimate
    summary: str  # the line's time suffix (``TimePlan.suffix``)
    updated_at: float  # seconds since the epoch


class StoredProgress(ProgressFigures):
    """The figures as a study stores them for its dashboard, with the command that reported them."""

    command: str  # "tuner run", "tuner export"


class Progress:
    """Lines to ``out``, each with ``time.suffix()`` when ``timed``; ``sink`` (optional) receives each line
    with its figures (the study's dashboard attribute)."""

    def __init__(
        self,
        out: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic,
        *,
        timed: bool = True,
    ):
        self.out, self.timed = out, timed
        self.time = TimePlan(clock)
        self.sink: Callable[[ProgressFigures], None] | None = None

    @classmethod
    def untimed(cls, out: Callable[[str], None] = print) -> Progress:
        """Lines as they are: a command that plans no time (a benchmark's own lines, a lock wait)."""
        return cls(out, timed=False)

    @classmethod
    def quiet(cls) -> Progress:
        """Prints nothing (a test's or a benchmark's run, whose lines nobody reads)."""
        return cls.untimed(lambda _: None)

    def __call__(self, line: str) -> None:
        self.out(f"{line} | {self.time.suffix()}" if self.timed else line)
        self.record(line)

    def record(self, line: str) -> None:
        """The line and its figures to the sink only (where a command stands, once it ends too)."""
        if self.sink is not None:
            left = self.time.remaining()
            self.sink(
                {
                    "line": line,
                    "elapsed_s": round(self.time.elapsed(), 1),
                    "remaining_s": None if left is None else round(left, 1),
                    "summary": self.time.suffix(),
                    "updated_at": time.time(),
                }
            )
