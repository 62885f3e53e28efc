"""The GPUs this host has, read with nvidia-smi (the service itself never opens a CUDA context)."""

from __future__ import annotations

import os
import shutil
import subprocess

from kernelloop.contract import GpuInfo
from kernelloop.server.settings import ServiceSettings

QUERY = "index,uuid,name,memory.total,memory.used,utilization.gpu"


def _number(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None  # "[N/A]"


def gpu_inventory() -> list[GpuInfo]:
    """Every GPU nvidia-smi reports, with memory and utilization now; [] without a GPU or a driver."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    gpus = []
    for line in out.stdout.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 6:
            continue
        gpus.append(
            GpuInfo(
                index=int(fields[0]),
                uuid=fields[1],
                name=fields[2],
                memory_total_mib=_number(fields[3]),
                memory_used_mib=_number(fields[4]),
                utilization_percent=_number(fields[5]),
            )
        )
    return gpus


def gpu_lane_ids(settings: ServiceSettings) -> list[str]:
    """What each GPU lane's workers get as CUDA_VISIBLE_DEVICES, one lane per entry.

    KERNELLOOP_GPUS if set; else the service's own CUDA_VISIBLE_DEVICES (so a restricted service stays
    restricted); else every GPU nvidia-smi lists.
    """
    if settings.gpus is not None:
        return [g.strip() for g in settings.gpus.split(",") if g.strip()]
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
    if inherited is not None:
        return [g.strip() for g in inherited.split(",") if g.strip() and not g.strip().startswith("-")]
    return [str(gpu.index) for gpu in gpu_inventory()]
