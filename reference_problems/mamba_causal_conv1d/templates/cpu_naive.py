"""Mamba's depthwise causal conv1d for the cpu backend, the search's naive baseline.

y[b, d, t] = silu(bias[d] + sum_k w[d, k] * x[b, d, t - (K-1) + k]), one output element at a time, the
causal padding by predication. Builds fast: pybind11 only (no torch headers), raw pointers.
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
PRECISIONS = ["fp32", "fp16", "bf16"]  # KernelBench's precision option: ModelNew takes each
BASELINE = True  # the search starts here

CPP_SRC = r"""
#include <pybind11/pybind11.h>
#include <cmath>
#include <cstdint>

static void depthwise_causal_conv1d_naive(std::uintptr_t x_ptr, std::uintptr_t w_ptr, std::uintptr_t bias_ptr,
                                          std::uintptr_t y_ptr, int64_t B, int64_t D, int64_t K, int64_t L, bool silu) {
    const float* x = reinterpret_cast<const float*>(x_ptr);
    const float* w = reinterpret_cast<const float*>(w_ptr);
    const float* bias = reinterpret_cast<const float*>(bias_ptr);
    float* y = reinterpret_cast<float*>(y_ptr);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t d = 0; d < D; ++d)
            for (int64_t t = 0; t < L; ++t) {
                float acc = bias ? bias[d] : 0.0f;
                for (int64_t k = 0; k < K; ++k) {
                    const int64_t pos = t - (K - 1) + k;
                    if (pos >= 0) acc += w[d * K + k] * x[(b * D + d) * L + pos];
                }
                y[(b * D + d) * L + t] = silu ? acc / (1.0f + std::exp(-acc)) : acc;
            }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("depthwise_causal_conv1d_naive", &depthwise_causal_conv1d_naive,
          pybind11::call_guard<pybind11::gil_scoped_release>());
}
"""


def _extension_name() -> str:
    tag = "_".join(f"{k}{v}" for k, v in sorted(PARAMS.items()))
    return f"kl_mamba_cpu_naive_{tag}".lower()


_ext = load_inline(
    name=_extension_name(),
    cpp_sources=CPP_SRC,
    no_implicit_headers=True,
    extra_cflags=[f"-O{PARAMS['OPT']}"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, channels, kernel_size=4, bias=True, silu=True):
        super().__init__()
        self.silu = silu
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))  # nn.Conv1d(groups=channels)'s shape
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in (torch.float32, torch.float16, torch.bfloat16) or x.device.type != "cpu" or x.dim() != 3:
            raise ValueError(
                f"expected a float32, float16 or bfloat16 (B, D, L) CPU tensor, got {x.dtype} {tuple(x.shape)} "
                f"on {x.device}"
            )
        # the half precisions (KernelBench's precision option) are computed in float32 and rounded once at the end
        x32 = x.contiguous().float()
        w = self.weight.detach().float().contiguous()
        b = self.bias.detach().float().contiguous() if self.bias is not None else None
        batch, channels, length = x32.shape
        y = torch.empty_like(x32)
        _ext.depthwise_causal_conv1d_naive(x32.data_ptr(), w.data_ptr(), b.data_ptr() if b is not None else 0,
                                           y.data_ptr(), batch, channels, w.shape[2], length, self.silu)
        return y if x.dtype == torch.float32 else y.to(x.dtype)
