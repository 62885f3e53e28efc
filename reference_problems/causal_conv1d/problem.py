"""Dense causal conv1d: left-pad by (K-1)*dilation, then nn.Conv1d. float32, NCW layout.

A KernelBench-format file (Model, get_inputs, get_init_inputs) with kernelloop's metadata below.
Benchmark shapes are five sizes of a long-sequence conv1d layer (docs/performance.md times them on the H200).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, bias: bool = False):
        super().__init__()
        self.causal_padding = (kernel_size - 1) * dilation
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.causal_padding, 0)))


def get_inputs():
    return [torch.randn(16, 64, 65536)]


def get_init_inputs():
    return [64, 128, 3, 1]


# ---- kernelloop metadata (KernelBench ignores it) ----
DTYPE = "float32"
ALLOW_TF32 = True  # PyTorch's default for cuDNN convolutions
# patterns (fnmatch) over operator names: the whole convolution family, whatever namespace or overload
# (every registered schema naming `conv` is matched here or allowed with its reason: tests/exploits, the family test)
FORBIDDEN_OPS = ["*::*convolution*", "*::conv1d*", "*::conv2d*", "*::conv3d*", "*::conv_*", "*::_conv_*",
                 "*::slow_conv*", "*::_slow_conv*", "*::thnn_conv*", "*::cudnn_conv*", "*::miopen_conv*",
                 "*::mkldnn_conv*", "*::qconv*"]
# cuDNN's files are unreadable to the candidate's process: a binding cannot call it below the dispatcher either
FORBIDDEN_LIBRARIES = ["cudnn"]


def _shape(name, B, Cin, Cout, K, d, L, bias=False, correctness=True, benchmark=False, backends=("cuda", "cpu")):
    return {"name": name, "init_inputs": [Cin, Cout, K, d, bias], "input_shapes": [[B, Cin, L]],
            "correctness": correctness, "benchmark": benchmark, "backends": list(backends)}


SHAPES = [
    # correctness: the awkward corners
    _shape("small", 2, 16, 32, 3, 1, 1000),
    _shape("bias", 2, 16, 32, 4, 2, 777, bias=True),
    _shape("odd", 3, 37, 53, 5, 3, 10007, bias=True),
    _shape("k1", 2, 24, 40, 1, 1, 513),
    _shape("short_l", 2, 8, 12, 7, 4, 10),  # L=10 < (K-1)*d=24: every output sees padding
    _shape("batch1", 1, 64, 64, 3, 2, 4099),
    _shape("wide", 1, 256, 256, 4, 1, 2048, backends=("cuda",)),
    # benchmark (the five of docs/performance.md), checked too on the GPU
    _shape("b16_c64_o128_k3_d1_l65536", 16, 64, 128, 3, 1, 65536, correctness=True, benchmark=True, backends=("cuda",)),
    _shape("b16_c64_o64_k3_d4_l32768", 16, 64, 64, 3, 4, 32768, correctness=True, benchmark=True, backends=("cuda",)),
    _shape("b8_c256_o256_k4_d1_l8192", 8, 256, 256, 4, 1, 8192, correctness=True, benchmark=True, backends=("cuda",)),
    _shape("b4_c512_o512_k3_d1_l16384", 4, 512, 512, 3, 1, 16384, correctness=True, benchmark=True, backends=("cuda",)),
    _shape("b32_c64_o128_k3_d1_l131072", 32, 64, 128, 3, 1, 131072, correctness=True, benchmark=True, backends=("cuda",)),
    # benchmark on the CPU backend: big enough to time, small enough for 2 cores
    _shape("cpu_b4_c64_o64_k3_d1_l8192", 4, 64, 64, 3, 1, 8192, correctness=False, benchmark=True, backends=("cpu",)),
]


def flops(init_inputs, input_shapes):
    cin, cout, k = init_inputs[0], init_inputs[1], init_inputs[2]
    b, _, length = input_shapes[0]
    return 2 * b * cout * cin * k * length


def bytes_moved(init_inputs, input_shapes):
    cin, cout, k = init_inputs[0], init_inputs[1], init_inputs[2]
    bias = len(init_inputs) > 4 and init_inputs[4]
    b, _, length = input_shapes[0]
    return 4 * (b * cin * length + cout * cin * k + (cout if bias else 0) + b * cout * length)
