"""Inside the worker: honest timings of several callables, interleaved, on the GPU or the CPU.

Every GPU sample starts the same way: redraw that subject's input set in place, flush L2 (a write of
twice its size). Then it is timed one of two ways:

- strict, for the candidate: synchronize the device, record a start event, call, synchronize the
  device again, record the end event. Nothing the call launched can run before the start or after the
  end, on any stream: work hidden on a side stream is counted in full. The fixed cost this adds (host
  launch of a first kernel, wake-up from the synchronize, one event record) is measured on a one-element
  kernel and subtracted.
- as do_bench times, for the trusted reference: a short GPU spin lets the host launch ahead as it would
  in a loop, then start event, call, end event on the current stream. Without the spin, host-side setup
  (cuDNN's reaches 0.1 ms) would count as kernel time; a candidate gets no such spin, because its side
  streams could run under it.

Subjects alternate sample by sample, so clock and thermal drift hit them alike. Sampling stops when
every subject's standard error is under `target_rel_se` of its mean, or the time budget is spent.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelloop.tools.results import Timing

Subject = Callable[[int], Any]  # called with the index of the input set to use; returns the output

SLEEP_CYCLES = 1_000_000  # about 0.5 ms at Hopper's clocks


@dataclass
class Measurement:
    samples_ms: dict[str, list[float]]
    last_outputs: dict[str, dict[int, Any]] = field(default_factory=dict)
    overhead_ms: float = 0.0


def summarize(samples_ms: list[float]) -> Timing:
    return Timing(
        median_ms=statistics.median(samples_ms),
        mean_ms=statistics.fmean(samples_ms),
        std_ms=statistics.stdev(samples_ms) if len(samples_ms) > 1 else 0.0,
        min_ms=min(samples_ms),
        max_ms=max(samples_ms),
        n=len(samples_ms),
    )


class _GpuClock:
    def __init__(self, device: torch.device):
        l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20)
        self.flush_buffer = torch.empty(max(2 * l2_bytes, 256 << 20) // 4, dtype=torch.float32, device=device)
        self.overhead_ms = 0.0
        one_element = self.flush_buffer[:1]
        self.overhead_ms = statistics.median(self.time(lambda: one_element.add_(1.0), strict=True) for _ in range(30))

    def time(self, call: Callable[[], Any], strict: bool) -> float:
        self.flush_buffer.zero_()
        if strict:
            torch.cuda.synchronize()
        elif hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(SLEEP_CYCLES)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.last = call()
        if strict:
            torch.cuda.synchronize()
        end.record()
        end.synchronize()
        elapsed = start.elapsed_time(end)
        return max(elapsed - self.overhead_ms, 0.0) if strict else elapsed


class _CpuClock:
    overhead_ms = 0.0

    def time(self, call: Callable[[], Any], strict: bool) -> float:
        start = time.perf_counter()
        self.last = call()
        return (time.perf_counter() - start) * 1e3


def measure(
    subjects: dict[str, Subject],
    refresh: Callable[[str, int], None],
    n_sets: int,
    device: torch.device,
    *,
    budget_s: float,
    min_samples: int,
    max_samples: int,
    suspects: tuple[str, ...] = (),
    target_rel_se: float = 0.01,
    warmup_calls: int = 3,
) -> Measurement:
    """Time each subject, rotating through `n_sets` input sets that `refresh(name, i)` redraws in place
    before every call. Keeps each subject's last output per set for the caller to check. The subjects
    named in `suspects` are timed strictly (every stream counted)."""
    clock: _GpuClock | _CpuClock = _GpuClock(device) if device.type == "cuda" else _CpuClock()
    samples: dict[str, list[float]] = {name: [] for name in subjects}
    last_outputs: dict[str, dict[int, Any]] = {name: {} for name in subjects}

    def one_call(name: str, set_index: int) -> float:
        refresh(name, set_index)
        last_outputs[name].pop(set_index, None)  # free the old output before the call allocates a new one
        elapsed = clock.time(lambda: subjects[name](set_index), strict=name in suspects)
        last_outputs[name][set_index] = clock.last
        return elapsed

    for i in range(warmup_calls):
        for name in subjects:
            one_call(name, i % n_sets)
    deadline = time.monotonic() + budget_s
    round_index = 0
    while True:
        names = list(subjects) if round_index % 2 == 0 else list(reversed(subjects))
        for name in names:
            samples[name].append(one_call(name, round_index % n_sets))
        round_index += 1
        if round_index < min_samples:
            continue
        if round_index >= max_samples or time.monotonic() > deadline:
            break
        if all(_relative_standard_error(s) < target_rel_se for s in samples.values()):
            break
    return Measurement(samples, last_outputs, clock.overhead_ms)


def _relative_standard_error(samples_ms: list[float]) -> float:
    mean = statistics.fmean(samples_ms)
    if mean <= 0 or len(samples_ms) < 2:
        return float("inf")
    return statistics.stdev(samples_ms) / len(samples_ms) ** 0.5 / mean
