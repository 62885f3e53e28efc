"""The GPUs this host has, read with nvidia-smi (the service itself never opens a CUDA context)."""

from __future__ import annotations

import os

from kernelloop.contract import GpuInfo
from kernelloop.server.settings import ServiceSettings
from kernelloop.tools.compilation.toolchain import query_gpus

QUERY = "index,uuid,name,memory.total,memory.used,utilization.gpu"


def _number(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None  # "[N/A]"


def gpu_inventory() -> list[GpuInfo]:
    """Every GPU nvidia-smi reports, with memory and utilization now; [] without a GPU or a driver."""
    return [
        GpuInfo(
            index=int(row[0]),
            uuid=row[1],
            name=row[2],
            memory_total_mib=_number(row[3]),
            memory_used_mib=_number(row[4]),
            utilization_percent=_number(row[5]),
        )
        for row in query_gpus(QUERY)
        if len(row) == 6
    ]


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
