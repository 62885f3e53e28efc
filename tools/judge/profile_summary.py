"""A profile's kernels placed on the roofline of the device's datasheet peaks, and the few lines a reader (a model
or a person) gets: the dominant kernel, which bound it is near, and its largest loss.

Never imports torch: the service, the agent and the tests read profiles on machines without a GPU.
"""

from __future__ import annotations

from kernelloop.tools.datasheet import DevicePeaks
from kernelloop.tools.results import KernelProfile

LOW_OCCUPANCY_PCT = 50.0
"""an achieved occupancy under this is named as a loss"""
KERNELS_LISTED = 8
"""the per-kernel lines a summary shows at most (the dominant kernels, by duration)"""


def place_on_roofline(kernel: KernelProfile, peaks: DevicePeaks | None) -> KernelProfile:
    """The kernel with its arithmetic intensity, the ridge point of the peaks (the tensor-core peak when it ran
    tensor-core ops, else FP32's), which bound it is under and how near that bound's peak it ran."""
    flops = (kernel.fp32_flops or 0.0) + (kernel.tensor_flops or 0.0)
    placed = kernel.model_copy()
    if kernel.dram_bytes:
        placed.arithmetic_intensity = flops / kernel.dram_bytes
    if peaks is None:
        return placed
    compute_peak = peaks.tf32_flops_s if kernel.tensor_flops else peaks.fp32_flops_s
    if not compute_peak:
        return placed
    placed.ridge_point = compute_peak / peaks.bandwidth_bytes_s
    if placed.arithmetic_intensity is None:
        placed.bound = "compute" if flops else None
    else:
        placed.bound = "memory" if placed.arithmetic_intensity < placed.ridge_point else "compute"
    seconds = (kernel.duration_us or 0.0) / 1e6
    if seconds > 0 and placed.bound == "memory" and kernel.dram_bytes is not None:
        placed.pct_of_bound_peak = 100 * kernel.dram_bytes / seconds / peaks.bandwidth_bytes_s
    elif seconds > 0 and placed.bound == "compute":
        placed.pct_of_bound_peak = 100 * flops / seconds / compute_peak
    return placed


def summarize(kernels: list[KernelProfile], shape: str) -> str:
    """The dominant kernel's line (its share of the time, its bound and its largest losses), then one line per
    kernel, longest first."""
    if not kernels:
        return f"shape {shape}: no kernel ran in the profiled forward"
    total_us = sum(k.duration_us or 0.0 for k in kernels)
    ranked = sorted(kernels, key=lambda k: k.duration_us or 0.0, reverse=True)
    top = ranked[0]
    share = f"{100 * (top.duration_us or 0.0) / total_us:.0f}% of" if total_us else "in"
    lines = [
        f"shape {shape}: {len(kernels)} kernel{'s' if len(kernels) != 1 else ''}, {total_us:.1f} us in all; "
        f"{_short(top.name)} takes {share} the time",
        f"{_short(top.name)} {_bound_words(top)}" + "".join(f"; {loss}" for loss in _losses(top)),
    ]
    lines += [kernel_line(k) for k in ranked[:KERNELS_LISTED]]
    if len(ranked) > KERNELS_LISTED:
        lines.append(f"... {len(ranked) - KERNELS_LISTED} shorter kernels")
    return "\n".join(lines)


def kernel_line(k: KernelProfile) -> str:
    """One kernel in one line: its time, launch, occupancy, throughputs, hit rates and stalls."""
    parts = [f"  {_short(k.name)}: {_num(k.duration_us, '.1f')} us"]
    if k.grid and k.block:
        parts.append(f"grid {'x'.join(map(str, k.grid))} block {'x'.join(map(str, k.block))}")
    parts.append(f"{_num(k.registers_per_thread, 'd')} regs, {_num(k.shared_memory_bytes, 'd')} B smem")
    parts.append(f"occupancy {_num(k.achieved_occupancy_pct, '.0f')}% of {_num(k.theoretical_occupancy_pct, '.0f')}%")
    parts.append(f"DRAM {_num(k.dram_throughput_pct, '.0f')}% SM {_num(k.sm_throughput_pct, '.0f')}%")
    parts.append(f"L1 hit {_num(k.l1_hit_rate_pct, '.0f')}% L2 hit {_num(k.l2_hit_rate_pct, '.0f')}%")
    if k.arithmetic_intensity is not None:
        parts.append(f"AI {k.arithmetic_intensity:.3g} FLOP/B")
    if k.top_stalls:
        parts.append("stalls " + ", ".join(f"{s.reason} {s.cycles_per_issue:.1f}" for s in k.top_stalls))
    return ", ".join(parts)


def _bound_words(k: KernelProfile) -> str:
    ai = f"AI {k.arithmetic_intensity:.3g}" if k.arithmetic_intensity is not None else "AI unknown"
    ridge = (
        f"ridge {k.ridge_point:.3g}" if k.ridge_point is not None else "no ridge point (device not in the datasheet)"
    )
    if k.bound is None:
        return f"has no roofline place ({ai}, {ridge})"
    side = "<" if k.bound == "memory" else ">="
    what = "DRAM" if k.bound == "memory" else ("tensor-core FLOP rate" if k.tensor_flops else "FP32 FLOP rate")
    at = f"{what} at {k.pct_of_bound_peak:.0f}% of peak" if k.pct_of_bound_peak is not None else f"{what} unmeasured"
    return f"is {k.bound}-bound ({ai} {side} {ridge}): {at}"


def _losses(k: KernelProfile) -> list[str]:
    """The largest losses in words: the top stall, and an occupancy under LOW_OCCUPANCY_PCT with its limiter."""
    losses = []
    if k.top_stalls:
        stall = k.top_stalls[0]
        losses.append(f"top stall {stall.reason} {stall.cycles_per_issue:.1f} cycles/issue")
    if k.achieved_occupancy_pct is not None and k.achieved_occupancy_pct < LOW_OCCUPANCY_PCT:
        limit = f" (limit: {_limit_words(k)})" if k.occupancy_limiter else ""
        losses.append(f"occupancy {k.achieved_occupancy_pct:.0f}%{limit}")
    return losses


def _limit_words(k: KernelProfile) -> str:
    if k.occupancy_limiter == "registers" and k.registers_per_thread is not None:
        return f"registers {k.registers_per_thread}/thread"
    if k.occupancy_limiter == "shared_memory" and k.shared_memory_bytes is not None:
        return f"shared memory {k.shared_memory_bytes} B/block"
    return str(k.occupancy_limiter)


def _short(name: str, most: int = 60) -> str:
    """A kernel's name cut to `most` characters (ncu gives the function's name alone: `--print-kernel-base`)."""
    return name if len(name) <= most else name[: most - 3] + "..."


def _num(value: float | int | None, spec: str) -> str:
    return "?" if value is None else format(value, spec)
