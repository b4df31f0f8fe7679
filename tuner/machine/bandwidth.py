"""Memory bandwidth: a copy probe, and how it grows with the threads copying.

Decode of a memory-bound model reads every weight once per token, so it stops gaining from
more threads where the memory bandwidth saturates. One probe at a ladder of thread counts
(``probe_bandwidth_curve``, a few seconds) says where; its value at all physical cores is
the fingerprint's ``bandwidth_bytes_per_s``, the roofline's bandwidth. Provenance, never a
comparability key: the curve differs a little from run to run.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from tuner.errors import UserError

BANDWIDTH_ENV = "TUNER_MEMORY_BANDWIDTH"
FINGERPRINT_KEY: Final = "bandwidth_by_threads"
SATURATION_SHARE = 0.9  # "saturated": this share of the peak
# the thread search starts where the bandwidth is this near its peak: decode still gains a little past 90%
PLANNER_SHARE = 0.95
PROBE_SECONDS = 3.0
PROBE_BYTES = 256 * 2**20
DENSE_UP_TO = 8  # every power of two up to here; above it, 3/4 of each power of two too


@dataclass(frozen=True)
class BandwidthCurve:
    """Copy bandwidth (bytes/s, STREAM-counted read + write) by the number of threads copying."""

    points: dict[int, float]

    def __post_init__(self) -> None:
        if not self.points or any(t < 1 or not v > 0 for t, v in self.points.items()):
            raise ValueError(f"a bandwidth curve needs positive figures at 1 or more threads: {self.points}")

    @property
    def peak(self) -> float:
        return max(self.points.values())

    @property
    def all_cores(self) -> float:
        """The figure at the most threads probed (all physical cores): the roofline's bandwidth."""
        return self.points[max(self.points)]

    def shares(self) -> dict[int, float]:
        """Each count's figure as a share of the peak, by threads: the curve's shape, machine aside."""
        return {t: v / self.peak for t, v in sorted(self.points.items())}

    def saturation(self, share: float = SATURATION_SHARE) -> int:
        """The fewest probed threads reaching ``share`` of the peak: more threads gain decode little."""
        return min(t for t, v in self.points.items() if v >= share * self.peak)

    def text(self, share: float = SATURATION_SHARE) -> str:
        """One line for `tuner doctor`, `tuner run --check` and the report."""
        counts = sorted(self.points)
        if len(counts) == 1:
            return (
                f"memory bandwidth: {self.peak / 1e9:.1f} GB/s at {threads_text(counts[0])} "
                "(copy probe at one thread count: where it saturates is not known)"
            )
        return (
            f"memory bandwidth: {share:.0%} of its peak ({self.peak / 1e9:.1f} GB/s) from "
            f"{threads_text(self.saturation(share))} (copy probe at {', '.join(map(str, counts))} threads)"
        )

    def to_json(self) -> dict[str, float]:
        """String keys: JSON objects have no integer keys."""
        return {str(t): v for t, v in sorted(self.points.items())}

    @classmethod
    def from_json(cls, data: Any) -> BandwidthCurve | None:
        """The curve a fingerprint stored; None for none (an older study, a figure given) or a damaged one."""
        if not isinstance(data, Mapping) or not data:
            return None
        try:
            points = {int(t): float(v) for t, v in data.items() if not isinstance(v, bool)}
        except (TypeError, ValueError):
            return None
        if len(points) != len(data) or not all(map(math.isfinite, points.values())):
            return None
        try:
            return cls(dict(sorted(points.items())))
        except ValueError:
            return None


def threads_text(count: int) -> str:
    """A thread count as the lines say it: "1 thread", "24 threads"."""
    return f"{count} thread" + ("" if count == 1 else "s")


def curve_of(fingerprint: Mapping) -> BandwidthCurve | None:
    """A study's bandwidth curve, from its fingerprint."""
    return BandwidthCurve.from_json(fingerprint.get(FINGERPRINT_KEY))


def bandwidth_saturation(fingerprint: Mapping, share: float = SATURATION_SHARE) -> int | None:
    """The fewest threads reaching ``share`` of the peak bandwidth on a study's machine; None without a curve."""
    curve = curve_of(fingerprint)
    return curve.saturation(share) if curve else None


def probe_counts(physical_cores: int) -> tuple[int, ...]:
    """Thread counts to probe, geometric from 1 to all cores: 1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96 ...
    (where it saturates is found to within a factor of 1.5, in about ten counts for a large server)."""
    cores = max(1, physical_cores)
    powers = [2**i for i in range(cores.bit_length() + 1)]  # up to the first power of two >= cores
    counts = {p for p in powers if p < cores} | {cores}
    counts |= {3 * p // 4 for p in powers if p > DENSE_UP_TO and 3 * p // 4 < cores}
    return tuple(sorted(counts))


def _copy_arrays(size_bytes: int, threads: int) -> tuple[Any, Any]:
    import numpy as np  # lazy: keeps `tuner --help` fast

    src = np.ones(max(size_bytes // 8, threads), dtype=np.float64)
    return src, np.zeros_like(src)  # dst untouched: the first round faults it in, best-of drops it


def copy_bandwidth(
    src: Any, dst: Any, threads: int, seconds: float, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Bytes/s of ``threads`` threads copying their slices of ``src`` into ``dst`` at once, best of at
    least three rounds and as many as ``seconds`` allows. numpy releases the GIL while copying; a round
    lasts until the slowest thread finishes."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    slices = [slice(i * len(src) // threads, (i + 1) * len(src) // threads) for i in range(threads)]
    best = float("inf")
    deadline = clock() + seconds
    runs = 0
    with ThreadPoolExecutor(threads) as pool:
        while runs < 3 or clock() < deadline:
            start = clock()
            list(pool.map(lambda part: np.copyto(dst[part], src[part]), slices))
            best = min(best, clock() - start)
            runs += 1
    return 2 * src.nbytes / best


def measure_memory_bandwidth(
    seconds: float = 0.5,
    size_bytes: int = PROBE_BYTES,
    threads: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Memory copy bandwidth in bytes/s with one copy thread per CPU (best of several rounds).

    Bytes are counted STREAM-style (read + write of the array). Decode without
    speculation reads every weight once per token, so bandwidth / weight bytes is its
    ceiling (the roofline). ``clock`` is for tests.
    """
    threads = threads or os.cpu_count() or 1
    src, dst = _copy_arrays(size_bytes, threads)
    return copy_bandwidth(src, dst, threads, seconds, clock)


def probe_bandwidth_curve(
    physical_cores: int,
    seconds: float = PROBE_SECONDS,
    size_bytes: int = PROBE_BYTES,
    clock: Callable[[], float] = time.perf_counter,
) -> BandwidthCurve:
    """The copy bandwidth at each count of ``probe_counts``: the arrays made once, then what is left of
    ``seconds`` shared among the counts (each at least three rounds), so the whole probe costs about
    ``seconds`` even where faulting the pages in is slow (some VMs)."""
    ladder = probe_counts(physical_cores)
    start = clock()
    src, dst = _copy_arrays(size_bytes, ladder[-1])
    share = max(seconds - (clock() - start), 0.0) / len(ladder)
    return BandwidthCurve({t: copy_bandwidth(src, dst, t, share, clock) for t in ladder})


def given_bandwidth() -> float | None:
    """The bytes/s in TUNER_MEMORY_BANDWIDTH, None when unset: a figure known already stands in for the
    probe (the tests start many studies); a figure that is not one is a one-line error."""
    text = os.environ.get(BANDWIDTH_ENV)
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:  # NaN included
        raise UserError(f"{BANDWIDTH_ENV}={text!r}: expected bytes per second, e.g. 20e9")
    return value


def fingerprint_bandwidth(physical_cores: int) -> tuple[float, BandwidthCurve | None]:
    """The bandwidth a fingerprint records and its curve: one probe (its figure at all cores is the
    roofline's), or the figure in TUNER_MEMORY_BANDWIDTH and no curve."""
    given = given_bandwidth()
    if given is not None:
        return given, None
    curve = probe_bandwidth_curve(physical_cores)
    return curve.all_cores, curve
