"""Softsign, x / (1 + |x|), as a Triton kernel over the flattened tensor: a solution in KernelBench's Triton format
for any problem whose Model takes no init arguments and maps one tensor elementwise this way (the level-1 file
30_Softsign.py among them)."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softsign_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    x = tl.load(x_ptr + offsets, mask=inside)
    tl.store(y_ptr + offsets, x / (1 + tl.abs(x)), mask=inside)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        block = 1024
        softsign_kernel[(triton.cdiv(x.numel(), block),)](x, y, x.numel(), BLOCK=block)
        return y
