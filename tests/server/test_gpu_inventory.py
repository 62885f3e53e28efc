"""The GPUs the service reports (/v1/devices, and the GPU memory that sizes its checks), read off nvidia-smi. A
stand-in nvidia-smi on PATH answers as the driver's does, with and without units; no GPU is needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelloop.contract import GpuInfo
from kernelloop.server.devices import gpu_inventory

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
