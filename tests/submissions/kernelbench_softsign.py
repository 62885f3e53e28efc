"""An elementwise problem in KernelBench's level-1 format (a Model without init arguments, module-level sizes,
get_inputs and get_init_inputs, no kernelloop metadata), so it is judged under KernelBench's policy."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / (1 + torch.abs(x))


batch_size = 2048
dim = 131072


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
