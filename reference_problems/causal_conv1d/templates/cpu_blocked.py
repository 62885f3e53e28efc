"""Causal conv1d for the cpu backend: OpenMP over output tiles, register-blocked and vectorized.

Each task computes one output tile of OB output channels x TB time steps of one batch row, keeping the
OB x TB accumulators in registers (or L1 for large tiles) while it walks the input channels; for each
input channel the TB + (K-1)*dilation input samples the tile needs are read once and reused for every
tap and every one of the OB output channels. Tiles that touch the causal padding (or the end of the
row) stage their input window into a zero-filled buffer, so the hot loop never branches. The innermost
loop runs over TB consecutive times with `#pragma omp simd`, so the compiler emits FMA vectors
(AVX2 / AVX-512 under -march=native) without intrinsics. Tiles are handed to OpenMP threads with
consecutive output-channel blocks of one time tile on the same thread, so the input tile stays in
cache across them.

Builds fast: the C++ part includes only pybind11 and <omp.h> (no torch headers, no_implicit_headers);
ModelNew allocates the output and passes raw pointers. -march=native makes the build specific to this
machine's CPU, which the build cache (keyed per machine) allows.

PARAMS is rewritten textually by a search; PARAM_SPACE lists the choices.
"""

import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

PARAMS = {"THREADS": 0, "OB": 4, "TB": 64, "ARCH": "native"}
PARAM_SPACE = {
    "THREADS": [0, 1],  # OpenMP threads; 0: every core OpenMP sees
    "OB": [1, 2, 4, 8],  # output channels per register tile
    "TB": [16, 32, 64, 128, 256],  # time steps per register tile (a multiple of the vector width)
    "ARCH": ["native", "generic"],  # -march=native (FMA vectors of this CPU) or the compiler's baseline ISA
}

CPP_SRC = r"""
#include <pybind11/pybind11.h>
#include <omp.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

template <int OB, int TB>
static void tile(const float* __restrict__ x_row0, const float* __restrict__ w, const float* __restrict__ bias,
                 float* __restrict__ y, int64_t Cin, int64_t Cout, int64_t K, int64_t dil, int64_t L,
                 int64_t o0, int64_t t0, float* __restrict__ stage) {
    const int64_t pad = (K - 1) * dil;
    const int64_t span = TB + pad;            // input samples the tile reads per channel
    const int64_t start = t0 - pad;           // first of them (may be negative: causal padding)
    const bool inside = start >= 0 && start + span <= L;
    alignas(64) float acc[OB][TB];
    for (int oo = 0; oo < OB; ++oo) {
        const float b0 = (bias && o0 + oo < Cout) ? bias[o0 + oo] : 0.0f;
#pragma omp simd
        for (int j = 0; j < TB; ++j) acc[oo][j] = b0;
    }
    for (int64_t c = 0; c < Cin; ++c) {
        const float* xr = x_row0 + c * L;
        const float* xs;
        if (inside) {
            xs = xr + start;
        } else {  // stage the window with zeros for the padding and past the end of the row
            for (int64_t i = 0; i < span; ++i) {
                const int64_t pos = start + i;
                stage[i] = (pos >= 0 && pos < L) ? xr[pos] : 0.0f;
            }
            xs = stage;
        }
        for (int64_t k = 0; k < K; ++k) {
            const float* xk = xs + k * dil;
            float wv[OB];
            for (int oo = 0; oo < OB; ++oo)
                wv[oo] = (o0 + oo < Cout) ? w[((o0 + oo) * Cin + c) * K + k] : 0.0f;
            for (int oo = 0; oo < OB; ++oo) {
                const float wk = wv[oo];
#pragma omp simd
                for (int j = 0; j < TB; ++j) acc[oo][j] += wk * xk[j];
            }
        }
    }
    const int64_t nt = std::min<int64_t>(TB, L - t0);
    for (int oo = 0; oo < OB && o0 + oo < Cout; ++oo) {
        float* yr = y + (o0 + oo) * L + t0;
        if (nt == TB) {
#pragma omp simd
            for (int j = 0; j < TB; ++j) yr[j] = acc[oo][j];
        } else {
            for (int64_t j = 0; j < nt; ++j) yr[j] = acc[oo][j];
        }
    }
}

static void causal_conv1d_blocked(std::uintptr_t x_ptr, std::uintptr_t w_ptr, std::uintptr_t bias_ptr,
                                  std::uintptr_t y_ptr,
                                  int64_t B, int64_t Cin, int64_t Cout, int64_t K, int64_t dil, int64_t L) {
    const float* x = reinterpret_cast<const float*>(x_ptr);
    const float* w = reinterpret_cast<const float*>(w_ptr);
    const float* bias = reinterpret_cast<const float*>(bias_ptr);
    float* y = reinterpret_cast<float*>(y_ptr);
    constexpr int OB_ = KL_OB, TB_ = KL_TB;
    const int64_t n_o = (Cout + OB_ - 1) / OB_, n_t = (L + TB_ - 1) / TB_;
    const int64_t span = TB_ + (K - 1) * dil;
    const int threads = KL_THREADS > 0 ? KL_THREADS : omp_get_max_threads();
#pragma omp parallel num_threads(threads)
    {
        std::vector<float> stage(span);
#pragma omp for collapse(3) schedule(static)
        for (int64_t b = 0; b < B; ++b)
            for (int64_t tt = 0; tt < n_t; ++tt)
                for (int64_t ob = 0; ob < n_o; ++ob)
                    tile<OB_, TB_>(x + b * Cin * L, w, bias, y + b * Cout * L, Cin, Cout, K, dil, L,
                                   ob * OB_, tt * TB_, stage.data());
    }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("causal_conv1d_blocked", &causal_conv1d_blocked, pybind11::call_guard<pybind11::gil_scoped_release>());
}
"""


def _extension_name() -> str:
    tag = "_".join(f"{k}{v}" for k, v in sorted(PARAMS.items()))
    return f"kl_cpu_blocked_{tag}".lower()


_flags = ["-O3", "-fopenmp", f"-DKL_OB={PARAMS['OB']}", f"-DKL_TB={PARAMS['TB']}", f"-DKL_THREADS={PARAMS['THREADS']}"]
if PARAMS["ARCH"] == "native":
    _flags.append("-march=native")
_ext = load_inline(
    name=_extension_name(),
    cpp_sources=CPP_SRC,
    no_implicit_headers=True,
    extra_cflags=_flags,
    extra_ldflags=["-fopenmp"],
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
        _ext.causal_conv1d_blocked(
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
