"""Mamba's depthwise causal conv1d on the GPU, the search's naive baseline for the cuda backend.

One thread per output element, the causal padding by predication, bias and SiLU fused; weights read
from global memory every time. Builds fast: the .cu part includes only <cuda_runtime.h> and the binding
is plain pybind11 (no torch headers, no_implicit_headers=True); ModelNew passes raw pointers and the
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
BASELINE = True  # the search starts here

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void dwconv_naive(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                             float* __restrict__ y, long long n, int D, int K, int L, int silu) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int t = (int)(i % L);
    const long long row = i / L;
    const int d = (int)(row % D);
    float acc = bias ? bias[d] : 0.0f;
    for (int k = 0; k < K; ++k) {
        const int pos = t - (K - 1) + k;
        if (pos >= 0) acc += w[d * K + k] * x[row * L + pos];
    }
    y[i] = silu ? acc / (1.0f + expf(-acc)) : acc;
}

int dwconv_naive_launch(long long x, long long w, long long bias, long long y, int B, int D, int K, int L, int silu,
                        long long stream) {
    const long long n = (long long)B * D * L;
    if (n == 0) return 0;
    const int threads = KL_THREADS;
    const long long blocks = (n + threads - 1) / threads;
    dwconv_naive<<<(unsigned)blocks, threads, 0, (cudaStream_t)stream>>>(
        (const float*)x, (const float*)w, (const float*)bias, (float*)y, n, D, K, L, silu);
    return (int)cudaGetLastError();
}
"""

CPP_SRC = r"""
#include <pybind11/pybind11.h>
#include <stdexcept>
#include <string>
int dwconv_naive_launch(long long x, long long w, long long bias, long long y, int B, int D, int K, int L, int silu,
                        long long stream);
static void dwconv_naive_forward(long long x, long long w, long long bias, long long y, int B, int D, int K, int L,
                                 int silu, long long stream) {
    const int error = dwconv_naive_launch(x, w, bias, y, B, D, K, L, silu, stream);
    if (error != 0) throw std::runtime_error("dwconv_naive launch failed: CUDA error " + std::to_string(error));
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &dwconv_naive_forward); }
"""


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
