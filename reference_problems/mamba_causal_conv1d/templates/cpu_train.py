"""Mamba's depthwise causal conv1d for the cpu backend in training mode: the forward and its backward in C++.

With z[b, d, t] = bias[d] + sum over k of w[d, k] * x[b, d, t - (K-1) + k] (a position below 0 reads 0) and
y = silu(z) (or y = z without the SiLU), given the upstream gradient gy of y's shape:

    gz[b, d, t]     = gy[b, d, t] * sigmoid(z) * (1 + z * (1 - sigmoid(z)))     (gy itself without the SiLU)
    grad_bias[d]    = sum over b, t of gz[b, d, t]
    grad_w[d, k]    = sum over b, t of gz[b, d, t] * x[b, d, t - (K-1) + k]
    grad_x[b, d, s] = sum over k of w[d, k] * gz[b, d, s + (K-1) - k]            (an index past L reads 0)

Each channel is independent (groups = channels), so both passes split the channels over OpenMP threads, each
thread walking every batch row of its channels: the weight and bias gradients are a channel's own sums (in
double per channel, float per row), never shared between threads. Within a row, time is walked in chunks of TB:
the edges that meet the causal padding (the first K-1 outputs, the last K-1 input gradients) are predicated, the
rest is an unpredicated `#pragma omp simd` loop with the K taps in registers. With KSPEC the common kernel sizes
(2, 3, 4) are compiled with K known, so the taps unroll. The forward keeps z (the SiLU's input) for the
backward; the backward writes every gradient whole into fresh tensors (nothing kept across calls).

MODES lists only train, so a forward search does not visit it; a training search starts from it at its defaults
(one thread, K at run time) and tunes it. Builds fast: pybind11 and <omp.h> only (no torch headers),
raw pointers; Python allocates every result and checks dtypes and layouts. PARAMS is rewritten textually by a
search; PARAM_SPACE lists the choices.
"""

import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

PARAMS = {"THREADS": 1, "TB": 1024, "KSPEC": 0, "ARCH": "generic"}
PARAM_SPACE = {
    "THREADS": [1, 0],  # OpenMP threads; 0: every core OpenMP sees
    "TB": [256, 1024, 4096],  # times per inner chunk
    "KSPEC": [0, 1],  # compile-time kernel sizes 2, 3, 4 (else K at run time)
    "ARCH": ["generic", "native"],  # the compiler's baseline ISA or -march=native
}
MODES = ["train"]

CPP_SRC = r"""
#include <pybind11/pybind11.h>
#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

using ptr = std::uintptr_t;

static inline float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// One row: z[t] = b0 + sum_k w[k] * x[t - (K-1) + k], y = silu(z) or z; KC > 0 fixes K at compile time.
template <int KC>
static void forward_row(const float* __restrict__ x, const float* __restrict__ w_row, float b0,
                        float* __restrict__ z, float* __restrict__ y, int64_t K_runtime, int64_t L, bool silu) {
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
        z[t] = acc;
    }
    for (int64_t t0 = head; t0 < L; t0 += KL_TB) {
        const int64_t n = std::min<int64_t>(t0 + KL_TB, L) - t0;
        const float* xs = x + t0 - (K - 1);
        float* zs = z + t0;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
            float acc = b0;
            for (int64_t k = 0; k < K; ++k) acc += w[k] * xs[j + k];
            zs[j] = acc;
        }
    }
    if (silu) {
        for (int64_t t = 0; t < L; ++t) y[t] = z[t] * sigmoid(z[t]);
    } else {
        for (int64_t t = 0; t < L; ++t) y[t] = z[t];
    }
}

// One row's backward: gz into `gz` (scratch), gx written whole, the row's sums added to gw (K of them) and gb.
template <int KC>
static void backward_row(const float* __restrict__ x, const float* __restrict__ z, const float* __restrict__ gy,
                         const float* __restrict__ w_row, float* __restrict__ gz, float* __restrict__ gx,
                         double* __restrict__ gw, double* __restrict__ gb, int64_t K_runtime, int64_t L, bool silu) {
    const int64_t K = KC > 0 ? KC : K_runtime;
    float w[16];
    for (int64_t k = 0; k < K; ++k) w[k] = w_row[k];
    float bias_sum = 0.0f;
    if (silu) {
        for (int64_t t = 0; t < L; ++t) {
            const float s = sigmoid(z[t]);
            gz[t] = gy[t] * s * (1.0f + z[t] * (1.0f - s));
        }
    } else {
        for (int64_t t = 0; t < L; ++t) gz[t] = gy[t];
    }
    for (int64_t t = 0; t < L; ++t) bias_sum += gz[t];
    *gb += bias_sum;
    // grad_w[k]: gz[t] * x[t - (K-1) + k] over the t where that position is inside the row
    for (int64_t k = 0; k < K; ++k) {
        const int64_t shift = K - 1 - k;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t t = shift; t < L; ++t) acc += gz[t] * x[t - shift];
        gw[k] += acc;
    }
    // grad_x[s] = sum_k w[k] * gz[s + (K-1) - k]; the last K-1 positions see the end of the row
    const int64_t body = std::max<int64_t>(L - (K - 1), 0);
    for (int64_t s0 = 0; s0 < body; s0 += KL_TB) {
        const int64_t n = std::min<int64_t>(s0 + KL_TB, body) - s0;
        const float* gzs = gz + s0;
        float* gxs = gx + s0;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; ++k) acc += w[k] * gzs[j + (K - 1) - k];
            gxs[j] = acc;
        }
    }
    for (int64_t s = body; s < L; ++s) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k) {
            const int64_t t = s + (K - 1) - k;
            if (t < L) acc += w[k] * gz[t];
        }
        gx[s] = acc;
    }
}

static int threads() { return KL_THREADS > 0 ? KL_THREADS : omp_get_max_threads(); }

static void check_k(int64_t K) {
    if (K < 1 || K > 16) throw std::invalid_argument("kernel_size must be 1 to 16 for this template");
}

static void forward(ptr x_ptr, ptr w_ptr, ptr bias_ptr, ptr z_ptr, ptr y_ptr, int64_t B, int64_t D, int64_t K,
                    int64_t L, bool silu) {
    check_k(K);
    const float* x = reinterpret_cast<const float*>(x_ptr);
    const float* w = reinterpret_cast<const float*>(w_ptr);
    const float* bias = reinterpret_cast<const float*>(bias_ptr);
    float* z = reinterpret_cast<float*>(z_ptr);
    float* y = reinterpret_cast<float*>(y_ptr);
#pragma omp parallel for num_threads(threads()) schedule(static)
    for (int64_t r = 0; r < B * D; ++r) {
        const int64_t d = r % D;
        const float b0 = bias ? bias[d] : 0.0f;
        const int64_t off = r * L;
#if KL_KSPEC
        if (K == 4) forward_row<4>(x + off, w + d * K, b0, z + off, y + off, K, L, silu);
        else if (K == 3) forward_row<3>(x + off, w + d * K, b0, z + off, y + off, K, L, silu);
        else if (K == 2) forward_row<2>(x + off, w + d * K, b0, z + off, y + off, K, L, silu);
        else forward_row<0>(x + off, w + d * K, b0, z + off, y + off, K, L, silu);
#else
        forward_row<0>(x + off, w + d * K, b0, z + off, y + off, K, L, silu);
#endif
    }
}

// gw (D x K) and gb (D, or 0 without a bias) are written whole; gx likewise
static void backward(ptr x_ptr, ptr z_ptr, ptr gy_ptr, ptr w_ptr, ptr gx_ptr, ptr gw_ptr, ptr gb_ptr, int64_t B,
                     int64_t D, int64_t K, int64_t L, bool silu) {
    check_k(K);
    const float* x = reinterpret_cast<const float*>(x_ptr);
    const float* z = reinterpret_cast<const float*>(z_ptr);
    const float* gy = reinterpret_cast<const float*>(gy_ptr);
    const float* w = reinterpret_cast<const float*>(w_ptr);
    float* gx = reinterpret_cast<float*>(gx_ptr);
    float* gw = reinterpret_cast<float*>(gw_ptr);
    float* gb = reinterpret_cast<float*>(gb_ptr);
#pragma omp parallel num_threads(threads())
    {
        float* gz = new float[L > 0 ? L : 1];  // this thread's scratch row
#pragma omp for schedule(static)
        for (int64_t d = 0; d < D; ++d) {
            double gw_d[16] = {0.0};
            double gb_d = 0.0;
            for (int64_t b = 0; b < B; ++b) {
                const int64_t off = (b * D + d) * L;
#if KL_KSPEC
                if (K == 4) backward_row<4>(x + off, z + off, gy + off, w + d * K, gz, gx + off, gw_d, &gb_d, K, L,
                                            silu);
                else if (K == 3) backward_row<3>(x + off, z + off, gy + off, w + d * K, gz, gx + off, gw_d, &gb_d, K,
                                                 L, silu);
                else if (K == 2) backward_row<2>(x + off, z + off, gy + off, w + d * K, gz, gx + off, gw_d, &gb_d, K,
                                                 L, silu);
                else backward_row<0>(x + off, z + off, gy + off, w + d * K, gz, gx + off, gw_d, &gb_d, K, L, silu);
#else
                backward_row<0>(x + off, z + off, gy + off, w + d * K, gz, gx + off, gw_d, &gb_d, K, L, silu);
#endif
            }
            for (int64_t k = 0; k < K; ++k) gw[d * K + k] = static_cast<float>(gw_d[k]);
            if (gb) gb[d] = static_cast<float>(gb_d);
        }
        delete[] gz;
    }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    auto unlocked = pybind11::call_guard<pybind11::gil_scoped_release>();
    m.def("forward", &forward, unlocked);
    m.def("backward", &backward, unlocked);
}
"""


def _extension_name() -> str:
    tag = "_".join(f"{k}{v}" for k, v in sorted(PARAMS.items()))
    return f"kl_mamba_cpu_train_{tag}".lower()


_cflags = ["-O3", "-fopenmp", f"-DKL_TB={PARAMS['TB']}", f"-DKL_THREADS={PARAMS['THREADS']}",
           f"-DKL_KSPEC={PARAMS['KSPEC']}"]
if PARAMS["ARCH"] == "native":
    _cflags.append("-march=native")
_ext = load_inline(
    name=_extension_name(),
    cpp_sources=CPP_SRC,
    no_implicit_headers=True,
    extra_cflags=_cflags,
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


def _checked(name: str, tensor: torch.Tensor, dims: int) -> torch.Tensor:
    if tensor.dtype != torch.float32 or tensor.device.type != "cpu" or tensor.dim() != dims:
        raise ValueError(
            f"{name}: expected a float32 CPU tensor of {dims} dimensions, got {tensor.dtype} "
            f"{tuple(tensor.shape)} on {tensor.device}"
        )
    return tensor.detach().contiguous()


class DepthwiseCausalConv1d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, silu):  # type: ignore[override]
        x, w = _checked("x", x, 3), _checked("weight", weight, 3)
        b = _checked("bias", bias, 1) if bias is not None else None
        batch, channels, length = x.shape
        z, y = torch.empty_like(x), torch.empty_like(x)
        _ext.forward(x.data_ptr(), w.data_ptr(), b.data_ptr() if b is not None else 0, z.data_ptr(), y.data_ptr(),
                     batch, channels, w.shape[2], length, silu)
        ctx.save_for_backward(x, z, w)
        ctx.silu, ctx.has_bias = silu, bias is not None
        return y

    @staticmethod
    def backward(ctx, grad_y):  # type: ignore[override]
        x, z, w = ctx.saved_tensors
        gy = _checked("grad_y", grad_y, 3)
        batch, channels, length = x.shape
        gx, gw = torch.empty_like(x), torch.empty_like(w)
        gb = torch.empty(channels, dtype=torch.float32) if ctx.has_bias else None
        _ext.backward(x.data_ptr(), z.data_ptr(), gy.data_ptr(), w.data_ptr(), gx.data_ptr(), gw.data_ptr(),
                      gb.data_ptr() if gb is not None else 0, batch, channels, w.shape[2], length, ctx.silu)
        return (gx if ctx.needs_input_grad[0] else None, gw if ctx.needs_input_grad[1] else None,
                gb if ctx.has_bias and ctx.needs_input_grad[2] else None, None)


class ModelNew(nn.Module):
    def __init__(self, channels, kernel_size=4, bias=True, silu=True):
        super().__init__()
        self.silu = silu
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))  # nn.Conv1d(groups=channels)'s shape
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return DepthwiseCausalConv1d.apply(x, self.weight, self.bias, self.silu)
