"""The judge's device: which one a job runs on, its precision (the dtypes a problem may name, TF32 for the
reference), waiting for it, and its memory (room made before a large check, the cache emptied)."""

from __future__ import annotations

import gc

import torch

from kernelloop.tools.jobs import WorkerJob
from kernelloop.tools.results import TolerancePolicy

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
LARGE_CHECK_BYTES = 4 << 30
"""a check of a shape this large starts with the allocator's cache emptied when the device is short of free memory
for it: on the H200 a 6.4 GB KernelBench input ran out of memory with 96 GiB cached in blocks the next copies could
not reuse (CUDA's growable segments, which would reuse them, cannot be shared with the runner: their IPC needs
pidfd_getfd, which the sandbox refuses)"""
FREE_MEMORY_MARGIN = 2
"""a large check empties the cache when the device has less free than this many times what the check holds (the
judge's new copies, and the candidate's own memory beside them)"""


def device_of(job: WorkerJob) -> torch.device:
    return torch.device("cuda" if job.step.backend == "cuda" and torch.cuda.is_available() else "cpu")


def set_precision_policy(policy: TolerancePolicy) -> None:
    """TF32 on or off for the judge's reference; the kernelbench policy keeps PyTorch's defaults, as KernelBench
    does (TF32 off for matmuls, on for cuDNN convolutions)."""
    kernelbench = policy.name == "kernelbench"
    torch.backends.cuda.matmul.allow_tf32 = policy.allow_tf32
    torch.backends.cudnn.allow_tf32 = True if kernelbench else policy.allow_tf32


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def make_room(device: torch.device, check_bytes: int | None) -> None:
    """Before a large check, empty the allocator's cache (the last check's copies, cached in blocks of other
    sizes) if the device has too little free for this one. Not before every large check: a causal conv1d test
    has six, and each emptying begins with a garbage collection of the judge (0.1 s on a 2-core machine)."""
    needed = check_bytes or 0
    if device.type != "cuda" or needed <= LARGE_CHECK_BYTES:
        return
    free, _ = torch.cuda.mem_get_info(device)
    if free < FREE_MEMORY_MARGIN * needed:
        free_device_memory(device)


def free_device_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
