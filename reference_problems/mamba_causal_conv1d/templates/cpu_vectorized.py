"""Mamba's depthwise causal conv1d for the cpu backend: OpenMP over (batch, channel) rows, vectorized in time.

Each row is independent (groups = channels). A task takes one row and walks it in chunks of TB times:
the first K-1 outputs (which see the causal padding) are computed with predication, the rest by an
unpredicated `#pragma omp simd` loop over the chunk with the K taps held in registers, fused with the
bias and SiLU. With KSPEC the common kernel sizes (2, 3, 4) are instantiated with K known at compile
time, so the taps unroll fully. FAST_MATH compiles (does not link) with -ffast-math, which lets the
compiler call glibc's vector expf for the SiLU (libmvec, linked explicitly); strict fp32 still holds
(vector expf is within 4 ulp, the tolerance is 1e-5 of max|truth|).

Builds fast: pybind11 and <omp.h> only (no torch headers), raw pointers. -march=native makes the build
specific to this machine's CPU, which the build cache (keyed per machine) allows.
PARAMS is rewritten textually by a search; PARAM_SPACE lists the choices.
"""

import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

PARAMS = {"THREADS": 0, "TB": 1024, "KSPEC": 1, "FAST_MATH": 0, "ARCH": "native"}
PARAM_SPACE = {
    "THREADS": [0, 1],  # OpenMP threads; 0: every core OpenMP sees
    "TB": [256, 1024, 4096],  # times per inner chunk
    "KSPEC": [0, 1],  # compile-time kernel sizes 2, 3, 4 (else K at run time)
    "FAST_MATH": [0, 1],  # vector expf for the SiLU
    "ARCH": ["native", "generic"],  # -march=native or the compiler's baseline ISA
}
PRECISIONS = ["fp32", "fp16", "bf16"]  # KernelBench's precision option: ModelNew takes each

CPP_SRC = r"""
#include <pybind11/pybind11.h>
#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

static inline float finish(float acc, bool silu) { return silu ? acc / (1.0f + std::exp(-acc)) : acc; }

// One row: y[t] = finish(b0 + sum_k w[k] * x[t - (K-1) + k]); KC > 0 fixes K at compile time.
template <int KC>
static void row(const float* __restrict__ x, const float* __restrict__ w_row, float b0, float* __restrict__ y,
                int64_t K_runtime, int64_t L, bool silu) {
    const int64_t K = KC > 0 ? KC : K_runtime;
    float w[16];
    for (int64_t k = 0; k < K; ++k) w[k] = w_row[k];
    const int64_t head = std::min<int64_t>(K - 1, L);
    for (int64_t t = 0; t < head; ++t) {  // outputs that see the causal padding
        float acc = b0;
        for (int64_t k = 0; k < K; ++k) {
            const int64_t pos = t - (K - 1) + k;
            if (pos >= 0) acc += w[k] * x[pos];
        }
        y[t] = finish(acc, silu);
    }
    for (int64_t t0 = head; t0 < L; t0 += KL_TB) {
        const int64_t t1 = std::min<int64_t>(t0 + KL_TB, L);
        const float* xs = x + t0 - (K - 1);
        float* ys = y + t0;
        const int64_t n = t1 - t0;
        if (silu) {
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) {
                float acc = b0;
                for (int64_t k = 0; k < K; ++k) acc += w[k] * xs[j + k];
                ys[j] = acc / (1.0f + std::exp(-acc));
            }
        } else {
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) {
                float acc = b0;
                for (int64_t k = 0; k < K; ++k) acc += w[k] * xs[j + k];
                ys[j] = acc;
            }
        }
    }
}

static void depthwise_causal_conv1d(std::uintptr_t x_ptr, std::uintptr_t w_ptr, std::uintptr_t bias_ptr,
                                    std::uintptr_t y_ptr, int64_t B, int64_t D, int64_t K, int64_t L, bool silu) {
    if (K > 16) throw std::invalid_argument("kernel_size above 16 is not supported by this template");
    const float* x = reinterpret_cast<const float*>(x_ptr);
    const float* w = reinterpret_cast<const float*>(w_ptr);
    const float* bias = reinterpret_cast<const float*>(bias_ptr);
    float* y = reinterpret_cast<float*>(y_ptr);
    const int threads = KL_THREADS > 0 ? KL_THREADS : omp_get_max_threads();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < B * D; ++r) {
        const int64_t d = r % D;
        const float b0 = bias ? bias[d] : 0.0f;
        const float* xr = x + r * L;
        float* yr = y + r * L;
#if KL_KSPEC
        if (K == 4) row<4>(xr, w + d * K, b0, yr, K, L, silu);
        else if (K == 3) row<3>(xr, w + d * K, b0, yr, K, L, silu);
        else if (K == 2) row<2>(xr, w + d * K, b0, yr, K, L, silu);
        else row<0>(xr, w + d * K, b0, yr, K, L, silu);
#else
        row<0>(xr, w + d * K, b0, yr, K, L, silu);
#endif
    }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("depthwise_causal_conv1d", &depthwise_causal_conv1d, pybind11::call_guard<pybind11::gil_scoped_release>());
}
"""


def _extension_name() -> str:
    tag = "_".join(f"{k}{v}" for k, v in sorted(PARAMS.items()))
    return f"kl_mamba_cpu_vec_{tag}".lower()


_cflags = [
    "-O3",
    "-fopenmp",
    f"-DKL_TB={PARAMS['TB']}",
    f"-DKL_THREADS={PARAMS['THREADS']}",
    f"-DKL_KSPEC={PARAMS['KSPEC']}",
]
_ldflags = ["-fopenmp"]
if PARAMS["ARCH"] == "native":
    _cflags.append("-march=native")
if PARAMS["FAST_MATH"]:
    _cflags.append("-ffast-math")
    _ldflags.append("-lmvec")
_ext = load_inline(
    name=_extension_name(),
    cpp_sources=CPP_SRC,
    no_implicit_headers=True,
    extra_cflags=_cflags,
    extra_ldflags=_ldflags,
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
        _ext.depthwise_causal_conv1d(
            x32.data_ptr(),
            w.data_ptr(),
            b.data_ptr() if b is not None else 0,
            y.data_ptr(),
            batch,
            channels,
            w.shape[2],
            length,
            self.silu,
        )
        return y if x.dtype == torch.float32 else y.to(x.dtype)
