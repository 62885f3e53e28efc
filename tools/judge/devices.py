"""Peak rates of the devices we time on, for roofline floors and the too-fast check.

The vendors' datasheet figures (`kernelloop.tools.datasheet`). A GPU not in the table gets its bandwidth measured
with a device-to-device copy and no compute peak, so floors stay conservative rather than invented.
"""

from __future__ import annotations

from kernelloop.tools.datasheet import DevicePeaks, datasheet_peaks


def gpu_peaks(device_name: str) -> DevicePeaks:
    peaks = datasheet_peaks(device_name)
    if peaks is not None:
        return peaks
    return DevicePeaks(name=device_name, bandwidth_bytes_s=_measured_copy_bandwidth(), source="measured copy x1.25")


def _measured_copy_bandwidth() -> float:
    """Bytes read plus written per second by a 1 GiB device copy, with 25% headroom for the floor."""
    import torch

    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        dst.copy_(src)
    end.record()
    end.synchronize()
    seconds: float = start.elapsed_time(end) / 1e3 / 5
    return 2 * src.numel() * 4 / seconds * 1.25


def floors(
    peaks: DevicePeaks | None, flops: int | None, bytes_moved: int | None, allow_tf32: bool
) -> tuple[float | None, float | None]:
    """(memory floor, roofline floor) in milliseconds; None where a count or a peak is unknown."""
    if peaks is None or bytes_moved is None:
        return None, None
    memory_ms = bytes_moved / peaks.bandwidth_bytes_s * 1e3
    # Strict fp32 is fastest as 3xTF32 on the tensor cores (three products per multiply-add), which
    # beats the SIMT fp32 rate; the floor must be the faster of the two legal ways.
    strict_rates = [r for r in (peaks.fp32_flops_s, peaks.tf32_flops_s and peaks.tf32_flops_s / 3) if r]
    rate = peaks.tf32_flops_s if allow_tf32 else (max(strict_rates) if strict_rates else None)
    compute_ms = flops / rate * 1e3 if flops is not None and rate else 0.0
    return memory_ms, max(memory_ms, compute_ms)
