"""Causal conv1d for the cpu backend in training mode: the forward and its three backward kernels in C++.

y[b, o, t] = bias[o] + sum over c, k of w[o, c, k] * x[b, c, t + k*d - (K-1)*d] (a position below 0 reads 0).
The backward of that sum, given the upstream gradient gy of y's shape:

    grad_bias[o]       = sum over b, t of gy[b, o, t]
    grad_w[o, c, k]    = sum over b, t of gy[b, o, t] * x[b, c, t + k*d - (K-1)*d]
    grad_x[b, c, s]    = sum over o, k of gy[b, o, s - k*d + (K-1)*d] * w[o, c, k]   (an index past L reads 0)

Every loop nest keeps time innermost, over contiguous rows, with the causal bounds hoisted out of it, so the
compiler vectorizes it (at -O3, for the baseline ISA or with -march=native). Each kernel splits its outer rows over
OpenMP threads (THREADS): the forward its (batch, output channel) rows, the input gradient its (batch, input
channel) rows, the weight gradient its (output, input channel) pairs, the bias gradient its output channels;
no two threads write one element, so no sum is shared. The weight and bias gradients' sums over time are
reductions the compiler vectorizes only when told their order may change (SIMD_SUMS: `omp simd reduction`).
A `torch.autograd.Function` binds them: the forward saves x and w, the backward returns fresh tensors (nothing
kept across calls) for the inputs that need one. MODES lists only train, so a forward search does not visit
it; a training search starts from it at its defaults (one thread, -O2, the baseline ISA, sums in order) and
tunes it. PARAMS is rewritten textually by a search; PARAM_SPACE lists
the choices.

Builds fast: the C++ part includes only pybind11 and <omp.h> (no torch headers, `no_implicit_headers=True`), and
takes raw pointers; Python allocates every result and checks dtypes and layouts.
"""

import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

PARAMS = {"OPT": 2, "THREADS": 1, "ARCH": "generic", "SIMD_SUMS": 0}
PARAM_SPACE = {
    "OPT": [1, 2, 3],  # -O level: -O3 vectorizes the time loops
    "THREADS": [1, 0],  # OpenMP threads; 0: every core OpenMP sees
    "ARCH": ["generic", "native"],  # the compiler's baseline ISA or -march=native
    "SIMD_SUMS": [0, 1],  # the weight and bias gradients' sums over time as `omp simd` reductions (reordered)
}
MODES = ["train"]

CPP_SRC = r"""
#include <pybind11/pybind11.h>
#include <omp.h>
#include <algorithm>
#include <cstdint>

using ptr = std::uintptr_t;

static int threads() { return KL_THREADS > 0 ? KL_THREADS : omp_get_max_threads(); }

// a float sum over time is not vectorized unless its order may change: SIMD_SUMS lets it, per row
#if KL_SIMD_SUMS
#define KL_SUM_LOOP _Pragma("omp simd reduction(+ : partial)")
#else
#define KL_SUM_LOOP
#endif

// y[b, o, t] for t in [0, L): rows of x shifted right by (K-1-k)*dil
static void forward(ptr x_ptr, ptr w_ptr, ptr bias_ptr, ptr y_ptr,
                    int64_t B, int64_t Cin, int64_t Cout, int64_t K, int64_t dil, int64_t L) {
    const float* x = reinterpret_cast<const float*>(x_ptr);
    const float* w = reinterpret_cast<const float*>(w_ptr);
    const float* bias = reinterpret_cast<const float*>(bias_ptr);
    float* y = reinterpret_cast<float*>(y_ptr);
#pragma omp parallel for num_threads(threads()) schedule(static)
    for (int64_t row = 0; row < B * Cout; ++row) {
        const int64_t b = row / Cout, o = row % Cout;
        float* yr = y + (b * Cout + o) * L;
        const float start = bias ? bias[o] : 0.0f;
        for (int64_t t = 0; t < L; ++t) yr[t] = start;
        for (int64_t c = 0; c < Cin; ++c) {
            const float* xr = x + (b * Cin + c) * L;
            for (int64_t k = 0; k < K; ++k) {
                const int64_t shift = (K - 1 - k) * dil;  // y[t] reads x[t - shift]
                const float wk = w[(o * Cin + c) * K + k];
                for (int64_t t = shift; t < L; ++t) yr[t] += wk * xr[t - shift];
            }
        }
    }
}

// grad_x[b, c, s] = sum over o, k of w[o, c, k] * gy[b, o, s + shift], s + shift < L
static void grad_input(ptr gy_ptr, ptr w_ptr, ptr gx_ptr,
                       int64_t B, int64_t Cin, int64_t Cout, int64_t K, int64_t dil, int64_t L) {
    const float* gy = reinterpret_cast<const float*>(gy_ptr);
    const float* w = reinterpret_cast<const float*>(w_ptr);
    float* gx = reinterpret_cast<float*>(gx_ptr);
#pragma omp parallel for num_threads(threads()) schedule(static)
    for (int64_t row = 0; row < B * Cin; ++row) {
        const int64_t b = row / Cin, c = row % Cin;
        float* gxr = gx + (b * Cin + c) * L;
        for (int64_t s = 0; s < L; ++s) gxr[s] = 0.0f;
        for (int64_t o = 0; o < Cout; ++o) {
            const float* gyr = gy + (b * Cout + o) * L;
            for (int64_t k = 0; k < K; ++k) {
                const int64_t shift = (K - 1 - k) * dil;
                const float wk = w[(o * Cin + c) * K + k];
                for (int64_t s = 0; s + shift < L; ++s) gxr[s] += wk * gyr[s + shift];
            }
        }
    }
}

// grad_w[o, c, k] = sum over b, t of gy[b, o, t] * x[b, c, t - shift], accumulated in double per tap
static void grad_weight(ptr gy_ptr, ptr x_ptr, ptr gw_ptr,
                        int64_t B, int64_t Cin, int64_t Cout, int64_t K, int64_t dil, int64_t L) {
    const float* gy = reinterpret_cast<const float*>(gy_ptr);
    const float* x = reinterpret_cast<const float*>(x_ptr);
    float* gw = reinterpret_cast<float*>(gw_ptr);
#pragma omp parallel for num_threads(threads()) schedule(static)
    for (int64_t pair = 0; pair < Cout * Cin; ++pair) {
        const int64_t o = pair / Cin, c = pair % Cin;
        for (int64_t k = 0; k < K; ++k) {
            const int64_t shift = (K - 1 - k) * dil;
            double acc = 0.0;
            for (int64_t b = 0; b < B; ++b) {
                const float* gyr = gy + (b * Cout + o) * L;
                const float* xr = x + (b * Cin + c) * L;
                float partial = 0.0f;
                KL_SUM_LOOP
                for (int64_t t = shift; t < L; ++t) partial += gyr[t] * xr[t - shift];
                acc += partial;
            }
            gw[(o * Cin + c) * K + k] = static_cast<float>(acc);
        }
    }
}

// grad_bias[o] = sum over b, t of gy[b, o, t]
static void grad_bias(ptr gy_ptr, ptr gb_ptr, int64_t B, int64_t Cout, int64_t L) {
    const float* gy = reinterpret_cast<const float*>(gy_ptr);
    float* gb = reinterpret_cast<float*>(gb_ptr);
#pragma omp parallel for num_threads(threads()) schedule(static)
    for (int64_t o = 0; o < Cout; ++o) {
        double acc = 0.0;
        for (int64_t b = 0; b < B; ++b) {
            const float* gyr = gy + (b * Cout + o) * L;
            float partial = 0.0f;
            KL_SUM_LOOP
            for (int64_t t = 0; t < L; ++t) partial += gyr[t];
            acc += partial;
        }
        gb[o] = static_cast<float>(acc);
    }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    auto unlocked = pybind11::call_guard<pybind11::gil_scoped_release>();
    m.def("forward", &forward, unlocked);
    m.def("grad_input", &grad_input, unlocked);
    m.def("grad_weight", &grad_weight, unlocked);
    m.def("grad_bias", &grad_bias, unlocked);
}
"""


def _extension_name() -> str:
    tag = "_".join(f"{k}{v}" for k, v in sorted(PARAMS.items()))
    return f"kl_cpu_train_naive_{tag}".lower()


_cflags = [
    f"-O{PARAMS['OPT']}",
    "-fopenmp",
    f"-DKL_THREADS={PARAMS['THREADS']}",
    f"-DKL_SIMD_SUMS={PARAMS['SIMD_SUMS']}",
]
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


class CausalConv1d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, dilation):  # type: ignore[override]
        x, w = _checked("x", x, 3), _checked("weight", weight, 3)
        b = _checked("bias", bias, 1) if bias is not None else None
        batch, cin, length = x.shape
        cout, _, k = w.shape
        y = torch.empty(batch, cout, length, dtype=torch.float32)
        _ext.forward(x.data_ptr(), w.data_ptr(), b.data_ptr() if b is not None else 0, y.data_ptr(),
                     batch, cin, cout, k, dilation, length)
        ctx.save_for_backward(x, w)
        ctx.dilation, ctx.has_bias = dilation, bias is not None
        return y

    @staticmethod
    def backward(ctx, grad_y):  # type: ignore[override]
        x, w = ctx.saved_tensors
        gy = _checked("grad_y", grad_y, 3)
        batch, cin, length = x.shape
        cout, _, k = w.shape
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = torch.empty_like(x)
            _ext.grad_input(gy.data_ptr(), w.data_ptr(), gx.data_ptr(), batch, cin, cout, k, ctx.dilation, length)
        if ctx.needs_input_grad[1]:
            gw = torch.empty_like(w)
            _ext.grad_weight(gy.data_ptr(), x.data_ptr(), gw.data_ptr(), batch, cin, cout, k, ctx.dilation, length)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = torch.empty(cout, dtype=torch.float32)
            _ext.grad_bias(gy.data_ptr(), gb.data_ptr(), batch, cout, length)
        return gx, gw, gb, None


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dilation=1, bias=False):
        super().__init__()
        self.dilation = dilation
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return CausalConv1d.apply(x, self.weight, self.bias, self.dilation)
