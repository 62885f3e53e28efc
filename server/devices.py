"""The GPUs this host has, read with nvidia-smi (the service itself never opens a CUDA context)."""

from __future__ import annotations

import os

from kernelloop.contract import GpuInfo
from kernelloop.server.settings import ServiceSettings
from kernelloop.tools.compilation import toolchain

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
            index=int(index),
            uuid=uuid,
            name=name,
            memory_total_mib=_number(total),
            memory_used_mib=_number(used),
            utilization_percent=_number(utilization),
        )
        for index, uuid, name, total, used, utilization in (r for r in toolchain.query_gpus(QUERY) if len(r) == 6)
    ]


def gpu_lane_ids(settings: ServiceSettings) -> list[str]:
    """What each GPU lane's workers get as CUDA_VISIBLE_DEVICES, one lane per entry: each GPU `lanes_per_gpu`
    times, every GPU's first lane before any GPU's second.

    The GPUs: KERNELLOOP_GPUS if set; else the service's own CUDA_VISIBLE_DEVICES (so a restricted service stays
    restricted); else every GPU nvidia-smi lists.
    """
    if settings.gpus is not None:
        gpus = [g.strip() for g in settings.gpus.split(",") if g.strip()]
    elif (inherited := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        gpus = [g.strip() for g in inherited.split(",") if g.strip() and not g.strip().startswith("-")]
    else:
        gpus = [str(gpu.index) for gpu in gpu_inventory()]
    return gpus * settings.lanes_per_gpu
