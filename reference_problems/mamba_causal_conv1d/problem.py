"""Depthwise causal conv1d of Mamba: groups = channels, K = 4, optional bias and SiLU. float32, NCW.

The same operation as the `causal_conv1d` package's `causal_conv1d_fn(x, weight, bias, activation)`.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernelloop.reference_problems.causal_conv1d.problem import FORBIDDEN_OPS as CONVOLUTION_FAMILY


class Model(nn.Module):
    def __init__(self, channels: int, kernel_size: int = 4, bias: bool = True, silu: bool = True):
        super().__init__()
        self.causal_padding = kernel_size - 1
        self.silu = silu
        self.conv = nn.Conv1d(channels, channels, kernel_size, groups=channels, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(F.pad(x, (self.causal_padding, 0)))
        return F.silu(y) if self.silu else y


def get_inputs():
    return [torch.randn(8, 2048, 4096)]


def get_init_inputs():
    return [2048, 4, True, True]


# ---- kernelloop metadata (KernelBench ignores it) ----
DTYPE = "float32"
ALLOW_TF32 = False  # a depthwise conv has no matrix product: strict fp32
# patterns (fnmatch) over operator names: the whole convolution family, whatever namespace or overload (the
# dense problem's list, one list for the family)
FORBIDDEN_OPS = CONVOLUTION_FAMILY
# cuDNN's files are unreadable to the candidate's process: a binding cannot call it below the dispatcher either
FORBIDDEN_LIBRARIES = ["cudnn"]


def _shape(name, B, D, L, K=4, bias=True, silu=True, correctness=True, benchmark=False, backends=("cuda", "cpu")):
    return {"name": name, "init_inputs": [D, K, bias, silu], "input_shapes": [[B, D, L]],
            "correctness": correctness, "benchmark": benchmark, "backends": list(backends)}


SHAPES = [
    _shape("small", 2, 64, 1000),
    _shape("no_bias_no_silu", 2, 48, 513, bias=False, silu=False),
    _shape("odd", 3, 37, 10007),
    _shape("short_l", 1, 16, 2),  # L < K-1
    _shape("k2", 2, 32, 300, K=2),
    _shape("k1", 2, 24, 257, K=1, silu=False),  # no tap reaches the padding; bias without the SiLU
    _shape("batch1", 1, 33, 4099, K=3, bias=False),  # one row per channel, odd channels, the SiLU without a bias
    _shape("b8_d2048_l4096", 8, 2048, 4096, correctness=True, benchmark=True, backends=("cuda",)),
    _shape("b4_d4096_l8192", 4, 4096, 8192, correctness=True, benchmark=True, backends=("cuda",)),
    _shape("cpu_b2_d256_l4096", 2, 256, 4096, correctness=False, benchmark=True, backends=("cpu",)),
]


def flops(init_inputs, input_shapes):
    k = init_inputs[1]
    b, d, length = input_shapes[0]
    return 2 * b * d * length * k


def bytes_moved(init_inputs, input_shapes):
    d, k, bias = init_inputs[0], init_inputs[1], init_inputs[2]
    b, _, length = input_shapes[0]
    return 4 * (2 * b * d * length + d * k + (d if bias else 0))
