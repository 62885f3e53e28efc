"""An attempt's speedup as a stated statistic over its measurements, and the rule that calls one kernel better.

Every benchmark of an attempt that timed every benchmark shape and passed is a measurement (kept, never replaced);
one timed on an overloaded host (`BenchmarkResult.host_too_loaded`) is kept and marked but does not count here.

**The statistic.** The attempt's speedup is the median of its counted measurements' geometric-mean speedups (taken
on the log scale: of an even count, the geometric mean of the middle two), with an interval around it:

- one measurement: its own spread, the geomean times exp(+-h), h = 2 standard errors of the log geomean from each
  shape's candidate and reference medians (std and n of each: 1.2533 std / median / sqrt(n) per median), and never
  less than MIN_LOG_HALF_WIDTH (timings of one kernel on a quiet host move that much between benchmarks);
- several: the order-statistic interval of the median at about 95% (the k-th smallest and the k-th largest; the
  smallest and the largest for fewer than six), never narrower than the median +- the median of the measurements'
  own half-widths.

**Better beyond the noise.** A challenger is better than the incumbent only when its interval clears the
incumbent's: its low end above the incumbent's high end (`clears`), or a duel confirmed it: the two re-timed back to
back in the same conditions, the challenger faster in every round (tools.duel states that rule). The best of several
(`best_in_order`) is the first one, replaced in the order they came (attempt ids) only by one that clears it or that
a duel found better than it (the (winner, loser) pairs of `tools.duel.wins`). The search's best, a run's best, the
run page's best so far and the leaderboard all use these functions, with the same duels.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from typing import TypeVar

from pydantic import BaseModel, Field

from kernelloop.tools.results import BenchmarkResult, ShapeBenchmark, Timing

MIN_LOG_HALF_WIDTH = math.log(1.05)
"""the narrowest interval one benchmark gets: +-5%"""
MEDIAN_SE_FACTOR = 1.2533
"""the standard error of a median of n normal samples is about this times std / sqrt(n)"""
CONFIDENCE = 0.95


class Sample(BaseModel):
    """What one measurement contributes: its geomean speedup and the half-width of its own interval, in log units."""

    speedup: float = Field(gt=0)
    log_half_width: float = Field(ge=0)


class SpeedupEstimate(BaseModel):
    """An attempt's speedup: the median of its counted measurements, and the interval the ranking rule reads."""

    speedup: float = Field(description="the median of the counted measurements' geometric-mean speedups")
    low: float = Field(description="the interval's low end (see tools.speedup_estimate)")
    high: float = Field(description="the interval's high end")
    n: int = Field(description="the measurements counted: passed, every benchmark shape, the host not overloaded")


def _relative_se(timing: Timing) -> float:
    if timing.median_ms <= 0 or timing.n <= 0:
        return math.inf
    return MEDIAN_SE_FACTOR * timing.std_ms / timing.median_ms / math.sqrt(timing.n)


def _shape_log_se(shape: ShapeBenchmark) -> float:
    if shape.candidate is None or shape.reference is None:
        return math.inf
    return math.hypot(_relative_se(shape.candidate), _relative_se(shape.reference))


def sample_of(result: BenchmarkResult) -> Sample | None:
    """The sample a benchmark contributes, from its geomean and each shape's spread; None when it has no speedup."""
    if result.geomean_speedup is None or result.geomean_speedup <= 0 or not result.shapes:
        return None
    errors = [_shape_log_se(shape) for shape in result.shapes]
    log_se = math.sqrt(sum(e * e for e in errors)) / len(errors)  # the log geomean is the mean of the shapes' logs
    half_width = max(MIN_LOG_HALF_WIDTH, 2 * log_se) if math.isfinite(log_se) else MIN_LOG_HALF_WIDTH * 4
    return Sample(speedup=result.geomean_speedup, log_half_width=half_width)


def _order_rank(n: int) -> int:
    """k: [x_(k), x_(n+1-k)] holds the median with probability >= CONFIDENCE (1 when no k does)."""
    k = 1
    while k + 1 <= n // 2:
        below = sum(math.comb(n, i) for i in range(k + 1)) / 2**n  # P(Binomial(n, 1/2) <= k)
        if 2 * below > 1 - CONFIDENCE:
            break
        k += 1
    return k


def estimate(samples: Sequence[Sample]) -> SpeedupEstimate | None:
    """The stated statistic over an attempt's counted samples (module docstring); None without one."""
    if not samples:
        return None
    logs = sorted(math.log(s.speedup) for s in samples)
    n = len(logs)
    median = (logs[(n - 1) // 2] + logs[n // 2]) / 2
    widths = sorted(s.log_half_width for s in samples)
    own = (widths[(n - 1) // 2] + widths[n // 2]) / 2
    k = _order_rank(n) if n > 1 else 1
    low = min(logs[k - 1], median - own) if n > 1 else median - own
    high = max(logs[n - k], median + own) if n > 1 else median + own
    return SpeedupEstimate(speedup=math.exp(median), low=math.exp(low), high=math.exp(high), n=n)


def stated(speedup: float | None, low: float | None, high: float | None, n: int) -> SpeedupEstimate | None:
    """An estimate as an attempt's summary columns hold it (speedup, speedup_low, speedup_high, measurements); None
    without a speedup."""
    if speedup is None:
        return None
    return SpeedupEstimate(
        speedup=speedup, low=speedup if low is None else low, high=speedup if high is None else high, n=n
    )


def clears(challenger: SpeedupEstimate, incumbent: SpeedupEstimate) -> bool:
    """Whether the challenger is better beyond the noise: its interval lies wholly above the incumbent's."""
    return challenger.low > incumbent.high


K = TypeVar("K")


def best_in_order(
    candidates: Iterable[tuple[K, SpeedupEstimate]], beats: Collection[tuple[K, K]] = ()
) -> tuple[K, SpeedupEstimate] | None:
    """The best of (key, estimate) pairs taken in the order they came: the first, replaced only by one that clears
    the one kept, or that beat it in a duel ((challenger, kept) in `beats`: tools.duel.wins)."""
    best: tuple[K, SpeedupEstimate] | None = None
    for key, candidate in candidates:
        if best is None or clears(candidate, best[1]) or (key, best[0]) in beats:
            best = (key, candidate)
    return best


def ranked(
    candidates: Sequence[tuple[K, SpeedupEstimate]], limit: int, beats: Collection[tuple[K, K]] = ()
) -> list[tuple[K, SpeedupEstimate]]:
    """The first `limit` places: the best in order (best_in_order, with the duels' `beats`), then the best of the
    rest, and so on."""
    left = list(candidates)
    places: list[tuple[K, SpeedupEstimate]] = []
    while left and len(places) < limit:
        best = best_in_order(left, beats)
        assert best is not None
        places.append(best)
        left = [pair for pair in left if pair[0] != best[0]]
    return places


def deviation(new: float, recorded: Sequence[Sample]) -> float | None:
    """How far a speedup lies from the recorded samples, in units of their spread (log scale): from their median,
    over their standard deviation (two or more; never under half their median own half-width), or over half of the
    one sample's own half-width. None without recorded samples or a positive speedup."""
    before = estimate(recorded)
    if before is None or new <= 0:
        return None
    logs = [math.log(s.speedup) for s in recorded]
    own = sorted(s.log_half_width for s in recorded)[len(recorded) // 2] / 2
    spread = own
    if len(logs) > 1:
        mean = sum(logs) / len(logs)
        spread = max(own, math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)))
    return (math.log(new) - math.log(before.speedup)) / spread
