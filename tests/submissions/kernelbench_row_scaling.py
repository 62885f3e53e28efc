"""A short memory-bound problem in KernelBench's level-1 format: each row of B scaled by one entry of A (a diagonal
matrix times B, without the matrix). 64 MB in and out, some 40 us on an H200: a call this short shows any
difference in how the judge times the reference and the runner the candidate."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return A.unsqueeze(1) * B


rows = 4096
columns = 4096


def get_inputs():
    return [torch.rand(rows), torch.rand(rows, columns)]


def get_init_inputs():
    return []
