"""The GPUs the service reports (/v1/devices, and the GPU memory that sizes its checks), read off nvidia-smi, and
the lanes it gives them. A stand-in nvidia-smi on PATH answers as the driver's does, with and without units; no GPU
is needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelloop.contract import GpuInfo
from kernelloop.server import executor
from kernelloop.server.devices import gpu_inventory, gpu_lane_ids
from kernelloop.server.settings import ServiceSettings
from kernelloop.tools.sandbox.worker_pool import WorkerPool

NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *nounits*) echo "0, GPU-1a2b, NVIDIA H200, 143771, 512, [N/A]"; echo "1, GPU-3c4d, NVIDIA H200, 143771, 0, 7" ;;
  *) echo "0, GPU-1a2b, NVIDIA H200, 143771 MiB, 512 MiB, [N/A]"
     echo "1, GPU-3c4d, NVIDIA H200, 143771 MiB, 0 MiB, 7 %" ;;
esac
"""


def test_every_gpu_is_listed_with_its_memory_and_a_missing_figure_as_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "nvidia-smi").write_text(NVIDIA_SMI)
    (tmp_path / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")

    assert gpu_inventory() == [
        GpuInfo(index=0, uuid="GPU-1a2b", name="NVIDIA H200", memory_total_mib=143771, memory_used_mib=512,
                utilization_percent=None),
        GpuInfo(index=1, uuid="GPU-3c4d", name="NVIDIA H200", memory_total_mib=143771, memory_used_mib=0,
                utilization_percent=7),
    ]  # fmt: skip


def test_no_driver_is_no_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_inventory() == []


def test_lanes_per_gpu_gives_each_gpu_that_many_lanes_and_the_host_still_counts_its_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two lanes a GPU: every GPU's first lane before any GPU's second, so a service busy with one job a GPU
    spreads over all of them; /v1/health and /v1/devices still count two GPUs, not four lanes."""
    monkeypatch.setattr(executor, "start_host_helpers", lambda settings, has_gpu: WorkerPool(0))
    settings = ServiceSettings(gpus="0,1", lanes_per_gpu=2)
    lanes = gpu_lane_ids(settings)
    local = executor.LocalExecutor(settings.sandbox, lanes, cpu_workers=1)

    assert lanes == ["0", "1", "0", "1"]
    assert [(lane.name, lane.gpu) for lane in local.lanes() if lane.kind == "gpu"] == [
        ("gpu-0", "0"), ("gpu-1", "1"), ("gpu-2", "0"), ("gpu-3", "1"),
    ]  # fmt: skip
    assert (local.nodes()[0].gpus, local.nodes()[0].cpus) == (2, 1)
    assert gpu_lane_ids(ServiceSettings(gpus="0,1")) == ["0", "1"], "one lane a GPU unless asked"


def test_lanes_per_gpu_is_refused_outside_one_to_eight() -> None:
    with pytest.raises(ValueError, match="lanes_per_gpu"):
        ServiceSettings(lanes_per_gpu=0)
