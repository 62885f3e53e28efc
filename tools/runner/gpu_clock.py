"""The one way a call is timed on a GPU: by the judge for what it trusts (the reference, torch.compile of it) and by
the runner for the candidate, so both sides of a speedup are measured alike.

Before the call, the device is left idle with nothing of the call's data in L2 and no dirty line there (`flush`):
a read of a buffer twice the L2's size (at least 256 MB) evicts every line, and a read leaves none dirty. Then
start event, the call, a device-wide synchronize (work the call left on any stream is inside the interval), end
event (`bracketed_ms`). The host's part of that bracket (the call's first launch, the synchronize's return, the
end event) is in the interval on both sides; each side subtracts its floor, measured the same way around a
one-element kernel (`bracket_floor_ms`): the least of many samples, which no call's own bracket undercuts, so
neither side is credited time it did not save.

Before, the two sides were timed two ways, and the null solution of a short kernel (KernelBench's diagonal
scaling, `A.unsqueeze(1) * B`, tens of microseconds on the H200) measured 1.5x against itself. Either difference
can make that: the judge timed the reference behind a spin kernel (its launches out of the interval) right after
a write flush (the L2 left dirty, its write-back inside the reference's interval), while the runner subtracted
from the candidate the median of 30 brackets calibrated once at its start, which the H200's GPU checks measured
anywhere from 0.022 to 0.050 ms a call: tens of microseconds of a short call taken off one side only.

Each side's call follows a flush from its own process's CUDA context: the judge flushes before every sample of any
subject (out of the candidate's reach), and the runner flushes again just before the candidate's call, as the
judge's own flush precedes the reference's. With the judge's flush alone, the candidate's call followed a flush
from another context and the reference's one from its own, and the null solution of the row scaling measured
1.5-1.8x against itself on an H100 (its reference 0.085-0.12 ms, itself 0.045-0.06 ms); the runner's own flush
brought its call to the reference's time. A candidate that skips the runner's flush gains only what every
candidate had before it, never a warm L2 (the judge's flush comes first).

What the runner calls here is bound when this module is imported, before the candidate is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_synchronize = torch.cuda.synchronize
_Event = torch.cuda.Event
_sum = torch.sum

FLUSH_MIN_BYTES = 256 << 20
FLOOR_SAMPLES = 50
FLOOR_WARMUP = 5


def flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer twice the device's L2 (at least FLUSH_MIN_BYTES), whose read evicts every line of it."""
    l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20)
    return torch.ones(max(2 * l2_bytes, FLUSH_MIN_BYTES) // 4, dtype=torch.float32, device=device)


def flush(buffer: torch.Tensor) -> None:
    """Read `buffer` through L2 and wait: the device is idle, and its L2 holds only clean lines of the buffer."""
    _sum(buffer)
    _synchronize()


def bracketed_ms(call: Callable[[], Any]) -> tuple[float, Any]:
    """Milliseconds from a start event on the idle device to an end event after the call and a device-wide
    synchronize, and what the call returned."""
    _synchronize()
    start, end = _Event(enable_timing=True), _Event(enable_timing=True)
    start.record()
    out = call()
    _synchronize()
    end.record()
    end.synchronize()
    return start.elapsed_time(end), out


def bracket_floor_ms(buffer: torch.Tensor) -> float:
    """The least a bracket adds to what it times: `bracketed_ms` of a one-element kernel, each sample after a
    flush as a timed call has, the least of FLOOR_SAMPLES after FLOOR_WARMUP."""
    one = torch.zeros(1, device=buffer.device)
    samples = []
    for _ in range(FLOOR_WARMUP + FLOOR_SAMPLES):
        flush(buffer)
        samples.append(bracketed_ms(lambda: one.add_(1.0))[0])
    return min(samples[FLOOR_WARMUP:])
