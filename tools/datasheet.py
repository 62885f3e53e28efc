"""Peak rates of the devices we time on, from the vendors' datasheets (dense, no sparsity).

The judge's roofline floors and too-fast check use them (`kernelloop.tools.judge.devices`, which measures a GPU
not in the table), and the agent's prompt describes the service's GPU with them; both read this one table.
"""

from __future__ import annotations

from pydantic import BaseModel


class DevicePeaks(BaseModel):
    name: str
    bandwidth_bytes_s: float
    tf32_flops_s: float | None = None
    fp32_flops_s: float | None = None
    source: str = "datasheet"


# Substring of torch.cuda.get_device_name() -> peaks. Order matters: the first match wins.
DATASHEET = [
    ("H200", DevicePeaks(name="H200", bandwidth_bytes_s=4.8e12, tf32_flops_s=495e12, fp32_flops_s=67e12)),
    ("H100 PCIe", DevicePeaks(name="H100 PCIe", bandwidth_bytes_s=2.0e12, tf32_flops_s=378e12, fp32_flops_s=51e12)),
    ("H100", DevicePeaks(name="H100 SXM", bandwidth_bytes_s=3.35e12, tf32_flops_s=495e12, fp32_flops_s=67e12)),
    ("A100", DevicePeaks(name="A100", bandwidth_bytes_s=2.04e12, tf32_flops_s=156e12, fp32_flops_s=19.5e12)),
    ("L40S", DevicePeaks(name="L40S", bandwidth_bytes_s=0.864e12, tf32_flops_s=183e12, fp32_flops_s=91.6e12)),
]


def datasheet_peaks(device_name: str) -> DevicePeaks | None:
    """The datasheet's peaks of the GPU named so (by torch or nvidia-smi); None for a GPU not in the table."""
    return next((peaks for key, peaks in DATASHEET if key in device_name), None)
