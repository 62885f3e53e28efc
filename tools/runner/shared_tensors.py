"""Tensors the judge allocates for the runner to read (inputs, parameters) and write (outputs).

On the GPU they live in a memory pool of their own and travel as CUDA IPC handles: an IPC handle opens
the whole allocation it points into, so nothing the judge keeps to itself (the truth, the reference's
outputs, its own copy of the inputs) may share an allocation with a shared tensor. On the CPU each is a
memfd of its own, passed over the channel; a GPU runner given one (parameters and inputs staged in host memory
for a memory check) copies it onto its device, into memory of its own. The judge copies what it shares from
private tensors and reads back what the runner wrote into private ones, so whatever the runner does to a shared
tensor stays there.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from kernelloop.tools.runner.messages import SharedTensor

DTYPES = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool)
}


class SharedArena:
    """The judge's side: allocates shared tensors and describes them; keeps CPU mappings alive."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.MemPool() if device.type == "cuda" else None
        self._mappings: list[mmap.mmap] = []

    @contextmanager
    def _in_pool(self) -> Iterator[None]:
        if self.pool is None:
            yield
        else:
            with torch.cuda.use_mem_pool(self.pool):
                yield

    def new(
        self, shape: tuple[int, ...] | list[int], dtype: torch.dtype, fds: list[int]
    ) -> tuple[torch.Tensor, SharedTensor]:
        """A fresh shared tensor and its description; a CPU one's memfd is appended to `fds`."""
        name = str(dtype).removeprefix("torch.")
        if self.device.type == "cuda":
            with self._in_pool():
                tensor = torch.empty(tuple(shape), dtype=dtype, device=self.device)
            handle = tensor.untyped_storage()._share_cuda_()
            encoded = [v.hex() if isinstance(v, bytes) else v for v in handle]
            return tensor, SharedTensor(shape=list(shape), dtype=name, cuda_ipc=encoded)
        nbytes = max(1, _numel(shape) * torch.empty((), dtype=dtype).element_size())
        fd = os.memfd_create("kernelloop-shared", 0)
        os.ftruncate(fd, nbytes)
        mapping = mmap.mmap(fd, nbytes)
        self._mappings.append(mapping)
        fds.append(fd)
        tensor = torch.frombuffer(mapping, dtype=dtype, count=_numel(shape)).view(tuple(shape))
        return tensor, SharedTensor(shape=list(shape), dtype=name, fd_index=len(fds) - 1)

    def share(self, private: torch.Tensor, fds: list[int]) -> tuple[torch.Tensor, SharedTensor]:
        tensor, description = self.new(tuple(private.shape), private.dtype, fds)
        tensor.copy_(private)
        return tensor, description


def open_shared(description: SharedTensor, fds: list[int], device: torch.device) -> torch.Tensor:
    """The runner's side: a tensor over the judge's memory."""
    dtype = DTYPES[description.dtype]
    shape = tuple(description.shape)
    if description.cuda_ipc is not None:
        args: list[Any] = [bytes.fromhex(v) if isinstance(v, str) else v for v in description.cuda_ipc]
        storage = torch.UntypedStorage._new_shared_cuda(*args)
        flat = torch.empty(0, dtype=dtype, device=device)
        flat.set_(storage, 0, (_numel(shape),), (1,))
        return flat.view(shape)
    if description.fd_index is None:
        raise ValueError("a shared tensor with neither a CUDA handle nor a descriptor")
    fd = fds[description.fd_index]
    nbytes = max(1, _numel(shape) * torch.empty((), dtype=dtype).element_size())
    mapping = mmap.mmap(fd, nbytes)
    tensor = torch.frombuffer(mapping, dtype=dtype, count=_numel(shape)).view(shape)
    if device.type == "cuda":  # staged in host memory for a GPU runner (a memory check): copied into its own
        return tensor.to(device)
    return tensor


def _numel(shape: tuple[int, ...] | list[int]) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count
