"""Mamba's depthwise causal conv1d on the GPU: VEC outputs per thread, taps in registers, fused bias + SiLU.

Each thread loads the window x[t0-(K-1) .. t0+VEC-1] of its row once (float4 loads where the row is
16-byte aligned, predicated scalars for the causal halo and the tail), keeps the K taps of its channel in
registers (K = 2, 3, 4 are compile-time instantiations, others up to 8 run generic), and writes VEC
outputs (float4 stores where aligned). The grid is (time chunks, rows), so a block never straddles two
channels. FAST_EXP uses __expf for the SiLU (within 2 ulp; the strict tolerance is 1e-5 of max|truth|).

Builds fast: the .cu part includes only <cuda_runtime.h>, the binding is plain pybind11 (no torch
headers, no_implicit_headers=True). PARAMS is rewritten textually by a search; PARAM_SPACE lists the choices.
"""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

PARAMS = {"VEC": 4, "THREADS": 256, "FAST_EXP": 1}
PARAM_SPACE = {
    "VEC": [1, 2, 4, 8],  # outputs per thread
    "THREADS": [64, 128, 256, 512],  # threads per block
    "FAST_EXP": [0, 1],  # __expf instead of expf in the SiLU
}

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <stdint.h>

#define VEC KL_VEC
#define KMAX 8

__device__ __forceinline__ float kl_silu(float a) {
#if KL_FAST_EXP
    return a / (1.0f + __expf(-a));
#else
    return a / (1.0f + expf(-a));
#endif
}

template <int KC>
__global__ void __launch_bounds__(KL_THREADS) dwconv_vec(const float* __restrict__ x, const float* __restrict__ w,
                                                         const float* __restrict__ bias, float* __restrict__ y,
                                                         int D, int K_runtime, int L, int silu) {
    const int K = KC > 0 ? KC : K_runtime;
    const long long row = blockIdx.y;
    const int d = (int)(row % D);
    const int t0 = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (t0 >= L) return;
    const float* xr = x + row * L;
    float* yr = y + row * L;
    float wk[KC > 0 ? KC : KMAX];
#pragma unroll
    for (int k = 0; k < (KC > 0 ? KC : KMAX); ++k) wk[k] = k < K ? __ldg(w + d * K + k) : 0.0f;
    const float b0 = bias ? __ldg(bias + d) : 0.0f;

    float win[VEC + (KC > 0 ? KC : KMAX) - 1];
    const bool full = t0 + VEC <= L;
    const bool aligned = (VEC % 4 == 0) && ((L & 3) == 0) && ((reinterpret_cast<uintptr_t>(xr) & 15) == 0) &&
                         ((reinterpret_cast<uintptr_t>(yr) & 15) == 0);
#pragma unroll
    for (int i = 0; i < (KC > 0 ? KC : KMAX) - 1; ++i) {  // the halo before t0 (causal padding where < 0)
        const int pos = t0 - (K - 1) + i;
        win[i] = (i < K - 1 && pos >= 0) ? __ldg(xr + pos) : 0.0f;
    }
    if (full && aligned) {
#pragma unroll
        for (int j = 0; j < VEC; j += 4) {
            const float4 v = __ldg(reinterpret_cast<const float4*>(xr + t0 + j));
            win[K - 1 + j] = v.x; win[K - 1 + j + 1] = v.y; win[K - 1 + j + 2] = v.z; win[K - 1 + j + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) win[K - 1 + j] = (t0 + j < L) ? __ldg(xr + t0 + j) : 0.0f;
    }
    float out[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        float acc = b0;
#pragma unroll
        for (int k = 0; k < (KC > 0 ? KC : KMAX); ++k)
            if (k < K) acc += wk[k] * win[j + k];
        out[j] = silu ? kl_silu(acc) : acc;
    }
    if (full && aligned) {
#pragma unroll
        for (int j = 0; j < VEC; j += 4)
            *reinterpret_cast<float4*>(yr + t0 + j) = make_float4(out[j], out[j + 1], out[j + 2], out[j + 3]);
    } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j)
            if (t0 + j < L) yr[t0 + j] = out[j];
    }
}

int dwconv_vec_launch(long long x, long long w, long long bias, long long y, int B, int D, int K, int L, int silu,
                      long long stream) {
    if (K < 1 || K > KMAX) return -1;
    if ((long long)B * D == 0 || L == 0) return 0;
    const int per_block = KL_THREADS * VEC;
    dim3 grid((L + per_block - 1) / per_block, (unsigned)((long long)B * D));
    cudaStream_t s = (cudaStream_t)stream;
    const float *xp = (const float*)x, *wp = (const float*)w, *bp = (const float*)bias;
    float* yp = (float*)y;
    if (K == 4) dwconv_vec<4><<<grid, KL_THREADS, 0, s>>>(xp, wp, bp, yp, D, K, L, silu);
    else if (K == 3) dwconv_vec<3><<<grid, KL_THREADS, 0, s>>>(xp, wp, bp, yp, D, K, L, silu);
    else if (K == 2) dwconv_vec<2><<<grid, KL_THREADS, 0, s>>>(xp, wp, bp, yp, D, K, L, silu);
    else dwconv_vec<0><<<grid, KL_THREADS, 0, s>>>(xp, wp, bp, yp, D, K, L, silu);
    return (int)cudaGetLastError();
}
"""

CPP_SRC = r"""
#include <pybind11/pybind11.h>
#include <stdexcept>
#include <string>
int dwconv_vec_launch(long long x, long long w, long long bias, long long y, int B, int D, int K, int L, int silu,
                      long long stream);
static void dwconv_vec_forward(long long x, long long w, long long bias, long long y, int B, int D, int K, int L,
                               int silu, long long stream) {
    const int error = dwconv_vec_launch(x, w, bias, y, B, D, K, L, silu, stream);
    if (error == -1) throw std::invalid_argument("kernel_size must be 1..8 for this template");
    if (error != 0) throw std::runtime_error("dwconv_vec launch failed: CUDA error " + std::to_string(error));
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &dwconv_vec_forward); }
"""


def _extension_name() -> str:
    tag = "_".join(f"{k}{v}" for k, v in sorted(PARAMS.items()))
    return f"kl_mamba_cuda_vec_{tag}".lower()


_ext = load_inline(name=_extension_name(), cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC, no_implicit_headers=True,
                   with_cuda=True, extra_cflags=["-O2"],
                   extra_cuda_cflags=["-O3", f"-DKL_VEC={PARAMS['VEC']}", f"-DKL_THREADS={PARAMS['THREADS']}",
                                      f"-DKL_FAST_EXP={PARAMS['FAST_EXP']}"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, channels, kernel_size=4, bias=True, silu=True):
        super().__init__()
        self.silu = silu
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))  # nn.Conv1d(groups=channels)'s shape
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or not x.is_cuda or x.dim() != 3:
            raise ValueError(f"expected a float32 (B, D, L) CUDA tensor, got {x.dtype} {tuple(x.shape)} on {x.device}")
        x = x.contiguous()
        w = self.weight.detach().contiguous()
        b = self.bias.detach().contiguous() if self.bias is not None else None
        batch, channels, length = x.shape
        y = torch.empty_like(x)
        _ext.forward(x.data_ptr(), w.data_ptr(), b.data_ptr() if b is not None else 0, y.data_ptr(), batch, channels,
                     w.shape[2], length, int(self.silu), torch.cuda.current_stream(x.device).cuda_stream)
        return y
