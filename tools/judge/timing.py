"""In the judge: the sampling loop of a benchmark, and the judge's own clocks.

Subjects alternate sample by sample (the order reversed every other round), so clock and thermal drift
hit them alike; `before_round(i)` redraws input set `i` before each round and `after_round(i)` checks its
outputs. Sampling stops when every subject's standard error is under `target_rel_se` of its mean (after
`min_samples`), at `max_samples`, or when the time budget is spent: the budget is a cap, so no caller can
hold a lane longer by asking for many samples (three samples are taken whatever the budget).

The judge times what it trusts (the reference, torch.compile of it) itself, and the candidate is timed by its
runner, both on the GPU by `gpu_clock` (the same flush, bracket and subtracted floor on both sides). Before every
sample of any subject, L2 is flushed and persisting L2 lines are reset, by the judge. The runner's time is only
believed within what the judge's own wall clock around the call (the envelope) can account for. On the CPU, the
judge also counts what the host's other work cost its own timed calls (`HostLoad`), by which the envelope's margin
is widened.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from kernelloop.tools.judge import l2_cache
from kernelloop.tools.judge.run_queue import longest_wait_s, thread_times_ns
from kernelloop.tools.results import Timing
from kernelloop.tools.runner import gpu_clock

MIN_SAMPLES_UNDER_CAP = 3  # a median needs a few samples, even when one call outlasts the time budget


def summarize(samples_ms: list[float]) -> Timing:
    return Timing(
        median_ms=statistics.median(samples_ms),
        mean_ms=statistics.fmean(samples_ms),
        std_ms=statistics.stdev(samples_ms) if len(samples_ms) > 1 else 0.0,
        min_ms=min(samples_ms),
        max_ms=max(samples_ms),
        n=len(samples_ms),
    )


@dataclass
class HostLoad:
    """What the host's other work cost the judge's own timed calls on the CPU: the CPU time its threads got and
    how long they waited, runnable, for a core (the kernel's counters in /proc/self/task/*/schedstat). The judge
    times trusted code with every process of the candidate's stopped, so nothing the candidate runs can add to
    either: the wait is the host's, and it stretches the candidate's calls alike."""

    run_ms: float = 0.0
    wait_ms: float = 0.0
    timed_ms: float = 0.0
    """the wall time of the calls measured"""
    longest_wait_ms: float = 0.0
    """over the calls measured, the longest run-queue wait of any one thread in each call"""

    @property
    def slowdown(self) -> float | None:
        """(run + wait) / run: how many times longer the judge's threads took to get the CPU time they used than
        on an idle host; None when nothing was measured (no such counters, or no call timed on the CPU)."""
        return (self.run_ms + self.wait_ms) / self.run_ms if self.run_ms > 0 else None

    @property
    def wait_share(self) -> float | None:
        """The share of the calls' wall time a thread of the judge's spent waiting for a core (the longest wait in
        each call: a parallel operator's threads meet at barriers, so one thread held off a core holds up the call,
        while the others spin and add CPU time, which hides the wait from `slowdown`); None when nothing was
        measured. About zero on a quiet host; 0.45 with 8 busy processes on 2 cores."""
        return self.longest_wait_ms / self.timed_ms if self.timed_ms > 0 else None

    @contextmanager
    def measuring(self) -> Iterator[None]:
        """Add this process's threads' CPU time and run-queue wait over the block, and its wall time (a thread
        that started or ended meanwhile is left out)."""
        before = thread_times_ns()
        started = time.perf_counter()
        yield
        self.timed_ms += (time.perf_counter() - started) * 1e3
        after = thread_times_ns()
        for thread, (run, wait) in after.items():
            if thread in before:
                self.run_ms += (run - before[thread][0]) / 1e6
                self.wait_ms += (wait - before[thread][1]) / 1e6
        self.longest_wait_ms += longest_wait_s(before, after) * 1e3


class Clock:
    """The judge's clock on one device: `time` for trusted callables, `clear` before a runner's call."""

    def __init__(self, device: torch.device):
        self.device = device
        self.flush_buffer: torch.Tensor | None = None
        self.reset_l2: Callable[[], None] = lambda: None
        self.bracket_floor_ms = 0.0
        if device.type == "cuda":
            self.flush_buffer = gpu_clock.flush_buffer(device)
            self.reset_l2 = l2_cache.persisting_reset()
            self.bracket_floor_ms = gpu_clock.bracket_floor_ms(self.flush_buffer)

    def clear(self) -> None:
        """Flush L2 and reset persisting lines, and wait for it: the device is idle and cold afterwards."""
        if self.flush_buffer is not None:
            self.reset_l2()
            gpu_clock.flush(self.flush_buffer)

    def time(self, call: Callable[[], Any], load: HostLoad | None = None) -> tuple[float, Any]:
        """Milliseconds of one call of trusted code, and what it returned; on the CPU, what the host's load cost
        the call is added to `load`. On the GPU, as the runner times the candidate (`gpu_clock`)."""
        if self.flush_buffer is None:
            with load.measuring() if load is not None else nullcontext():
                started = time.perf_counter()
                out = call()
                elapsed = (time.perf_counter() - started) * 1e3
            return elapsed, out
        self.clear()
        elapsed, out = gpu_clock.bracketed_ms(call)
        return max(elapsed - self.bracket_floor_ms, 0.0), out


@dataclass(frozen=True)
class SamplingPlan:
    """How long `measure` samples: rounds over `n_sets` input sets, `warmup_rounds` of them untimed, then at least
    `min_samples` and at most `max_samples` of each subject, until every subject's relative standard error is under
    `target_rel_se`, or `budget_s` is spent (a cap, once there are MIN_SAMPLES_UNDER_CAP)."""

    n_sets: int
    budget_s: float
    min_samples: int
    max_samples: int
    target_rel_se: float = 0.01
    warmup_rounds: int = 3


def measure(
    subjects: dict[str, Callable[[int], float]],
    plan: SamplingPlan,
    *,
    before_round: Callable[[int], None],
    after_round: Callable[[int], None],
) -> dict[str, list[float]]:
    """Samples of each subject (a callable taking the input set's index and returning milliseconds), interleaved:
    `before_round` and `after_round` bracket each round with the index of its input set."""
    samples: dict[str, list[float]] = {name: [] for name in subjects}

    def one_round(index: int, keep: bool) -> None:
        set_index = index % plan.n_sets
        before_round(set_index)
        names = list(subjects) if index % 2 == 0 else list(reversed(subjects))
        for name in names:
            elapsed = subjects[name](set_index)
            if keep:
                samples[name].append(elapsed)
        after_round(set_index)

    for index in range(plan.warmup_rounds):
        one_round(index, keep=False)
    deadline = time.monotonic() + plan.budget_s
    rounds = 0
    while True:
        one_round(rounds, keep=True)
        rounds += 1
        if rounds >= plan.max_samples:
            break
        if time.monotonic() > deadline and rounds >= MIN_SAMPLES_UNDER_CAP:  # the budget is a cap
            break
        if rounds < plan.min_samples:
            continue
        if all(_relative_standard_error(s) < plan.target_rel_se for s in samples.values()):
            break
    return samples


def _relative_standard_error(samples_ms: list[float]) -> float:
    mean = statistics.fmean(samples_ms)
    if mean <= 0 or len(samples_ms) < 2:
        return float("inf")
    return float(statistics.stdev(samples_ms) / len(samples_ms) ** 0.5 / mean)
