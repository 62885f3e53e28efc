"""Mamba's depthwise causal conv1d on the GPU, the search's naive baseline for the cuda backend.

One thread per output element, the causal padding by predication, bias and SiLU fused; weights read
from global memory every time. float32, float16 and bfloat16 inputs (KernelBench's precision option), each
element converted to float32 as it is read, the sum and the SiLU in float32. Builds fast: the .cu part includes
only the CUDA runtime and its half-type headers and the binding is plain pybind11 (no torch headers, no_implicit_headers=True); ModelNew passes raw pointers and the
current stream. PARAMS is rewritten textually by a search; PARAM_SPACE lists the choices.
"""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

PARAMS = {"THREADS": 256}
PARAM_SPACE = {
    "THREADS": [256],  # threads per block; the baseline stays naive on purpose
}
PRECISIONS = ["fp32", "fp16", "bf16"]  # KernelBench's precision option: ModelNew takes each
BASELINE = True  # the search starts here

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename T>
__global__ void dwconv_naive(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                             T* __restrict__ y, long long n, int D, int K, int L, int silu) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int t = (int)(i % L);
    const long long row = i / L;
    const int d = (int)(row % D);
    float acc = bias ? to_float(bias[d]) : 0.0f;
    for (int k = 0; k < K; ++k) {
        const int pos = t - (K - 1) + k;
        if (pos >= 0) acc += to_float(w[d * K + k]) * to_float(x[row * L + pos]);
    }
    store(y + i, silu ? acc / (1.0f + expf(-acc)) : acc);
}

template <typename T>
static int launch_typed(long long x, long long w, long long bias, long long y, long long n, int D, int K, int L,
                        int silu, cudaStream_t stream) {
    const int threads = KL_THREADS;
    const long long blocks = (n + threads - 1) / threads;
    dwconv_naive<T><<<(unsigned)blocks, threads, 0, stream>>>((const T*)x, (const T*)w, (const T*)bias, (T*)y, n, D,
                                                              K, L, silu);
    return (int)cudaGetLastError();
}

// dtype: 0 float32, 1 float16, 2 bfloat16
int dwconv_naive_launch(long long x, long long w, long long bias, long long y, int B, int D, int K, int L, int silu,
                        int dtype, long long stream) {
    const long long n = (long long)B * D * L;
    if (n == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (dtype == 0) return launch_typed<float>(x, w, bias, y, n, D, K, L, silu, s);
    if (dtype == 1) return launch_typed<__half>(x, w, bias, y, n, D, K, L, silu, s);
    if (dtype == 2) return launch_typed<__nv_bfloat16>(x, w, bias, y, n, D, K, L, silu, s);
    return -2;
}
"""

CPP_SRC = r"""
#include <pybind11/pybind11.h>
#include <stdexcept>
#include <string>
int dwconv_naive_launch(long long x, long long w, long long bias, long long y, int B, int D, int K, int L, int silu,
                        int dtype, long long stream);
static void dwconv_naive_forward(long long x, long long w, long long bias, long long y, int B, int D, int K, int L,
                                 int silu, int dtype, long long stream) {
    const int error = dwconv_naive_launch(x, w, bias, y, B, D, K, L, silu, dtype, stream);
    if (error == -2) throw std::invalid_argument("unknown dtype code " + std::to_string(dtype));
    if (error != 0) throw std::runtime_error("dwconv_naive launch failed: CUDA error " + std::to_string(error));
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &dwconv_naive_forward); }
"""
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _extension_name() -> str:
    tag = "_".join(f"{k}{v}" for k, v in sorted(PARAMS.items()))
    return f"kl_mamba_cuda_naive_{tag}".lower()


_ext = load_inline(name=_extension_name(), cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC, no_implicit_headers=True,
                   with_cuda=True, extra_cuda_cflags=["-O3", f"-DKL_THREADS={PARAMS['THREADS']}"],
                   extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, channels, kernel_size=4, bias=True, silu=True):
        super().__init__()
        self.silu = silu
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))  # nn.Conv1d(groups=channels)'s shape
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in DTYPE_CODES or not x.is_cuda or x.dim() != 3:
            raise ValueError(
                f"expected a float32, float16 or bfloat16 (B, D, L) CUDA tensor, got {x.dtype} {tuple(x.shape)} "
                f"on {x.device}"
            )
        x = x.contiguous()
        w = self.weight.detach().to(x.dtype).contiguous()
        b = self.bias.detach().to(x.dtype).contiguous() if self.bias is not None else None
        batch, channels, length = x.shape
        y = torch.empty_like(x)
        _ext.forward(x.data_ptr(), w.data_ptr(), b.data_ptr() if b is not None else 0, y.data_ptr(), batch, channels,
                     w.shape[2], length, int(self.silu), DTYPE_CODES[x.dtype],
                     torch.cuda.current_stream(x.device).cuda_stream)
        return y
