"""Inside the worker: honest timings of several callables, interleaved, on the GPU or the CPU.

On the GPU each sample is: refresh that subject's input set in place, flush L2 (a write of twice its
size), queue a short spin so the host can launch ahead as it would in a real loop, record a start event, call, record an end event on the current stream, synchronize the whole
device, record a second end event. The first interval is the stream's time, as triton's do_bench
measures it. The second also holds work the call left on other streams (and host time after its
launches); its fixed cost, host wake-up plus one event record, is measured on an empty call and
subtracted. For subjects under suspicion (the candidate), a median device-wide time clearly above the
stream's means work escaped the timed stream, and the device-wide samples are the ones reported.
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

from tools.results import Timing

Subject = Callable[[int], Any]  # called with the index of the input set to use; returns the output


SLEEP_CYCLES = 1_000_000  # about 0.5 ms at Hopper's clocks

# A call whose device-wide time exceeds its stream time by both margins did work the stream missed.
ESCAPE_RATIO, ESCAPE_MS = 1.10, 0.02


@dataclass
class Measurement:
    samples_ms: dict[str, list[float]]
    last_outputs: dict[str, dict[int, Any]] = field(default_factory=dict)
    overhead_ms: float = 0.0
    notes: dict[str, str] = field(default_factory=dict)


def summarize(samples_ms: list[float]) -> Timing:
    return Timing(
        median_ms=statistics.median(samples_ms), mean_ms=statistics.fmean(samples_ms),
        std_ms=statistics.stdev(samples_ms) if len(samples_ms) > 1 else 0.0,
        min_ms=min(samples_ms), max_ms=max(samples_ms), n=len(samples_ms),
    )


class _GpuClock:
    def __init__(self, device: torch.device):
        l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20)
        self.flush_buffer = torch.empty(max(2 * l2_bytes, 256 << 20) // 4, dtype=torch.float32, device=device)
        self.overhead_ms = 0.0
        self.overhead_ms = statistics.median(self.time(lambda: None)[1] for _ in range(30))

    def time(self, call: Callable[[], Any]) -> tuple[float, float]:
        """(stream time, device-wide time) of one call, in ms."""
        self.flush_buffer.zero_()
        if hasattr(torch.cuda, "_sleep"):
            # Keep the GPU busy while the host prepares the call, as back-to-back launches would: without
            # it, host-side setup (cuDNN's runs to 0.1 ms) shows up as idle time inside the interval.
            torch.cuda._sleep(SLEEP_CYCLES)
        start, end, end_all = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record()
        self.last = call()
        end.record()
        torch.cuda.synchronize()
        end_all.record()
        end_all.synchronize()
        return start.elapsed_time(end), max(start.elapsed_time(end_all) - self.overhead_ms, 0.0)


class _CpuClock:
    overhead_ms = 0.0

    def time(self, call: Callable[[], Any]) -> tuple[float, float]:
        start = time.perf_counter()
        self.last = call()
        elapsed = (time.perf_counter() - start) * 1e3
        return elapsed, elapsed


def measure(subjects: dict[str, Subject], refresh: Callable[[str, int], None], n_sets: int, device: torch.device,
            *, budget_s: float, min_samples: int, max_samples: int, suspects: tuple[str, ...] = (),
            target_rel_se: float = 0.01, warmup_calls: int = 3) -> Measurement:
    """Time each subject, rotating through `n_sets` input sets that `refresh(name, i)` redraws in place
    before every call. Keeps each subject's last output per set for the caller to check. For the
    subjects named in `suspects`, work that escapes the current stream is detected and counted."""
    clock: _GpuClock | _CpuClock = _GpuClock(device) if device.type == "cuda" else _CpuClock()
    samples: dict[str, list[float]] = {name: [] for name in subjects}
    device_wide: dict[str, list[float]] = {name: [] for name in subjects}
    last_outputs: dict[str, dict[int, Any]] = {name: {} for name in subjects}

    def one_call(name: str, set_index: int) -> float:
        refresh(name, set_index)
        last_outputs[name].pop(set_index, None)  # free the old output before the call allocates a new one
        stream_ms, device_ms = clock.time(lambda: subjects[name](set_index))
        last_outputs[name][set_index] = clock.last
        device_wide[name].append(device_ms)
        return stream_ms

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
    notes = {}
    for name in suspects:
        stream_ms = statistics.median(samples[name])
        wide_ms = statistics.median(device_wide[name][warmup_calls:])
        if wide_ms > stream_ms * ESCAPE_RATIO and wide_ms - stream_ms > ESCAPE_MS:
            samples[name] = device_wide[name][warmup_calls:]
            notes[name] = (f"work outside the timed stream: stream time {stream_ms:.4f} ms, device-wide "
                           f"{wide_ms:.4f} ms; the device-wide time is reported")
    return Measurement(samples, last_outputs, clock.overhead_ms, notes)


def _relative_standard_error(samples_ms: list[float]) -> float:
    mean = statistics.fmean(samples_ms)
    if mean <= 0 or len(samples_ms) < 2:
        return float("inf")
    return statistics.stdev(samples_ms) / len(samples_ms) ** 0.5 / mean
