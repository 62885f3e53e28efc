"""Mamba's depthwise causal conv1d for the cuda backend in training mode: the forward and its backward, naive.

The sums of `cpu_train.py`, on the GPU: the forward one thread per output (it keeps z, the SiLU's input, for the
backward); the input gradient one thread per input element, recomputing the SiLU's derivative of the K upstream
gradients it reads; the weight and bias gradients one block per channel, each thread summing gz * x over a
stride of batch and time for the K taps and the bias, then halved in shared memory. Every gradient is written
whole (nothing accumulated across calls). A `torch.autograd.Function` binds them. float32; MODES lists only
train, so a forward search does not visit it; a training search on cuda starts from it. Builds
fast: the .cu part includes only the CUDA runtime and the binding is plain pybind11 (no torch headers,
`no_implicit_headers=True`). PARAMS is rewritten textually by a search; PARAM_SPACE lists the choices.
"""

import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

PARAMS = {"THREADS": 256}
PARAM_SPACE = {
    "THREADS": [128, 256, 512],  # threads per block (a power of two: the reductions halve it)
}
MODES = ["train"]

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <stdint.h>

#define KL_MAX_K 16

__device__ __forceinline__ float silu_grad(float gy, float z) {
    const float s = 1.0f / (1.0f + expf(-z));
    return gy * s * (1.0f + z * (1.0f - s));
}

// z and y at (b, d, t): rows of length L, channel d's K taps
__global__ void forward_kernel(const float* __restrict__ x, const float* __restrict__ w,
                               const float* __restrict__ bias, float* __restrict__ z, float* __restrict__ y,
                               long long n, int D, int K, int L, int silu) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int t = (int)(i % L);
    const int d = (int)((i / L) % D);
    const float* xr = x + (i - t);
    float acc = bias ? bias[d] : 0.0f;
    for (int k = 0; k < K; ++k) {
        const int pos = t - (K - 1) + k;
        if (pos >= 0) acc += w[d * K + k] * xr[pos];
    }
    z[i] = acc;
    y[i] = silu ? acc / (1.0f + expf(-acc)) : acc;
}

// grad_x at (b, d, s) = sum over k of w[d, k] * gz[b, d, s + (K-1) - k], positions past L read 0
__global__ void grad_input_kernel(const float* __restrict__ gy, const float* __restrict__ z,
                                  const float* __restrict__ w, float* __restrict__ gx, long long n, int D, int K,
                                  int L, int silu) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int s = (int)(i % L);
    const int d = (int)((i / L) % D);
    const long long row = i - s;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) {
        const int t = s + (K - 1) - k;
        if (t < L) {
            const float g = silu ? silu_grad(gy[row + t], z[row + t]) : gy[row + t];
            acc += w[d * K + k] * g;
        }
    }
    gx[i] = acc;
}

// the block's THREADS partial sums, halved in shared memory down to one
__device__ float block_sum(float value, float* shared) {
    __syncthreads();
    shared[threadIdx.x] = value;
    __syncthreads();
    for (int half = KL_THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
        __syncthreads();
    }
    return shared[0];
}

// one block per channel d: grad_w[d, k] = sum over b, t of gz * x[t - (K-1) + k]; grad_bias[d] = sum of gz
__global__ void grad_weight_bias_kernel(const float* __restrict__ gy, const float* __restrict__ z,
                                        const float* __restrict__ x, float* __restrict__ gw, float* __restrict__ gb,
                                        int B, int D, int K, int L, int silu) {
    __shared__ float shared[KL_THREADS];
    const int d = blockIdx.x;
    float acc_w[KL_MAX_K];
    for (int k = 0; k < KL_MAX_K; ++k) acc_w[k] = 0.0f;
    float acc_b = 0.0f;
    for (int b = 0; b < B; ++b) {
        const long long row = ((long long)b * D + d) * L;
        for (int t = threadIdx.x; t < L; t += KL_THREADS) {
            const float g = silu ? silu_grad(gy[row + t], z[row + t]) : gy[row + t];
            acc_b += g;
            for (int k = 0; k < K; ++k) {
                const int pos = t - (K - 1) + k;
                if (pos >= 0) acc_w[k] += g * x[row + pos];
            }
        }
    }
    for (int k = 0; k < K; ++k) {
        const float total = block_sum(acc_w[k], shared);
        if (threadIdx.x == 0) gw[d * K + k] = total;
    }
    const float total_b = block_sum(acc_b, shared);
    if (gb && threadIdx.x == 0) gb[d] = total_b;
}

static int blocks_for(long long n) { return (int)((n + KL_THREADS - 1) / KL_THREADS); }

int launch_forward(long long x, long long w, long long bias, long long z, long long y, int B, int D, int K, int L,
                   int silu, long long stream) {
    const long long n = (long long)B * D * L;
    if (n == 0) return 0;
    forward_kernel<<<blocks_for(n), KL_THREADS, 0, (cudaStream_t)stream>>>(
        (const float*)x, (const float*)w, (const float*)bias, (float*)z, (float*)y, n, D, K, L, silu);
    return (int)cudaGetLastError();
}

int launch_backward(long long gy, long long z, long long x, long long w, long long gx, long long gw, long long gb,
                    int B, int D, int K, int L, int silu, long long stream) {
    if (K < 1 || K > KL_MAX_K) return (int)cudaErrorInvalidValue;
    const long long n = (long long)B * D * L;
    if (n > 0) {
        grad_input_kernel<<<blocks_for(n), KL_THREADS, 0, (cudaStream_t)stream>>>(
            (const float*)gy, (const float*)z, (const float*)w, (float*)gx, n, D, K, L, silu);
    }
    if (D > 0) {
        grad_weight_bias_kernel<<<D, KL_THREADS, 0, (cudaStream_t)stream>>>(
            (const float*)gy, (const float*)z, (const float*)x, (float*)gw, (float*)gb, B, D, K, L, silu);
    }
    return (int)cudaGetLastError();
}
"""

CPP_SRC = r"""
#include <pybind11/pybind11.h>
#include <stdexcept>
#include <string>
int launch_forward(long long x, long long w, long long bias, long long z, long long y, int B, int D, int K, int L,
                   int silu, long long stream);
int launch_backward(long long gy, long long z, long long x, long long w, long long gx, long long gw, long long gb,
                    int B, int D, int K, int L, int silu, long long stream);

static void checked(const char* what, int error) {
    if (error != 0) throw std::runtime_error(std::string(what) + " launch failed: CUDA error " + std::to_string(error));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("forward", [](long long x, long long w, long long bias, long long z, long long y, int B, int D, int K,
                        int L, bool silu, long long stream) {
        checked("forward", launch_forward(x, w, bias, z, y, B, D, K, L, silu ? 1 : 0, stream));
    });
    m.def("backward", [](long long gy, long long z, long long x, long long w, long long gx, long long gw,
                         long long gb, int B, int D, int K, int L, bool silu, long long stream) {
        checked("backward", launch_backward(gy, z, x, w, gx, gw, gb, B, D, K, L, silu ? 1 : 0, stream));
    });
}
"""


def _extension_name() -> str:
    tag = "_".join(f"{k}{v}" for k, v in sorted(PARAMS.items()))
    return f"kl_mamba_cuda_train_naive_{tag}".lower()


_ext = load_inline(
    name=_extension_name(),
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    no_implicit_headers=True,
    with_cuda=True,
    extra_cuda_cflags=["-O3", f"-DKL_THREADS={PARAMS['THREADS']}"],
    extra_cflags=["-O2"],
    verbose=False,
)


def _checked(name: str, tensor: torch.Tensor, dims: int) -> torch.Tensor:
    if tensor.dtype != torch.float32 or not tensor.is_cuda or tensor.dim() != dims:
        raise ValueError(
            f"{name}: expected a float32 CUDA tensor of {dims} dimensions, got {tensor.dtype} "
            f"{tuple(tensor.shape)} on {tensor.device}"
        )
    return tensor.detach().contiguous()


def _stream(tensor: torch.Tensor) -> int:
    return torch.cuda.current_stream(tensor.device).cuda_stream


class DepthwiseCausalConv1d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, silu):  # type: ignore[override]
        x, w = _checked("x", x, 3), _checked("weight", weight, 3)
        b = _checked("bias", bias, 1) if bias is not None else None
        batch, channels, length = x.shape
        z, y = torch.empty_like(x), torch.empty_like(x)
        _ext.forward(x.data_ptr(), w.data_ptr(), b.data_ptr() if b is not None else 0, z.data_ptr(), y.data_ptr(),
                     batch, channels, w.shape[2], length, silu, _stream(x))
        ctx.save_for_backward(x, z, w)
        ctx.silu, ctx.has_bias = silu, bias is not None
        return y

    @staticmethod
    def backward(ctx, grad_y):  # type: ignore[override]
        x, z, w = ctx.saved_tensors
        gy = _checked("grad_y", grad_y, 3)
        batch, channels, length = x.shape
        gx, gw = torch.empty_like(x), torch.empty_like(w)
        gb = torch.empty(channels, dtype=torch.float32, device=x.device) if ctx.has_bias else None
        _ext.backward(gy.data_ptr(), z.data_ptr(), x.data_ptr(), w.data_ptr(), gx.data_ptr(), gw.data_ptr(),
                      gb.data_ptr() if gb is not None else 0, batch, channels, w.shape[2], length, ctx.silu,
                      _stream(gy))
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
