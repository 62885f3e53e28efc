"""Causal conv1d for the cpu backend, the search's naive baseline: one output element at a time.

The plain loop nest of the definition (batch, output channel, time, input channel, tap) with the causal
padding done by predication; correct on every shape, and the point the search starts from.

Builds fast: the C++ part includes only pybind11 (no torch headers, `no_implicit_headers=True`), and
takes raw pointers; ModelNew allocates the output and checks dtypes and layouts in Python.
PARAMS is rewritten textually by a search; PARAM_SPACE lists the choices.
"""

import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

PARAMS = {"OPT": 2}
PARAM_SPACE = {
    "OPT": [2],  # -O level; the baseline stays naive on purpose
}
BASELINE = True  # the search starts here

CPP_SRC = r"""
#include <pybind11/pybind11.h>
#include <cstdint>

static void causal_conv1d_naive(std::uintptr_t x_ptr, std::uintptr_t w_ptr, std::uintptr_t bias_ptr,
                                std::uintptr_t y_ptr,
                                int64_t B, int64_t Cin, int64_t Cout, int64_t K, int64_t dil, int64_t L) {
    const float* x = reinterpret_cast<const float*>(x_ptr);
    const float* w = reinterpret_cast<const float*>(w_ptr);
    const float* bias = reinterpret_cast<const float*>(bias_ptr);
    float* y = reinterpret_cast<float*>(y_ptr);
    const int64_t pad = (K - 1) * dil;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t o = 0; o < Cout; ++o)
            for (int64_t t = 0; t < L; ++t) {
                float acc = bias ? bias[o] : 0.0f;
                for (int64_t c = 0; c < Cin; ++c)
                    for (int64_t k = 0; k < K; ++k) {
                        const int64_t pos = t + k * dil - pad;
                        if (pos >= 0) acc += w[(o * Cin + c) * K + k] * x[(b * Cin + c) * L + pos];
                    }
                y[(b * Cout + o) * L + t] = acc;
            }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("causal_conv1d_naive", &causal_conv1d_naive, pybind11::call_guard<pybind11::gil_scoped_release>());
}
"""


def _extension_name() -> str:
    tag = "_".join(f"{k}{v}" for k, v in sorted(PARAMS.items()))
    return f"kl_cpu_naive_{tag}".lower()


_ext = load_inline(
    name=_extension_name(),
    cpp_sources=CPP_SRC,
    no_implicit_headers=True,
    extra_cflags=[f"-O{PARAMS['OPT']}"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dilation=1, bias=False):
        super().__init__()
        self.dilation = dilation
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 3:
            raise ValueError(f"expected a float32 (B, Cin, L) CPU tensor, got {x.dtype} {tuple(x.shape)} on {x.device}")
        x = x.contiguous()
        w = self.weight.detach().contiguous()
        b = self.bias.detach().contiguous() if self.bias is not None else None
        batch, cin, length = x.shape
        cout, _, k = w.shape
        y = torch.empty(batch, cout, length, dtype=x.dtype)
        _ext.causal_conv1d_naive(
            x.data_ptr(),
            w.data_ptr(),
            b.data_ptr() if b is not None else 0,
            y.data_ptr(),
            batch,
            cin,
            cout,
            k,
            self.dilation,
            length,
        )
        return y
