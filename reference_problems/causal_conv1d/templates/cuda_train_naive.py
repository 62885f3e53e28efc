"""Causal conv1d for the cuda backend in training mode: the forward and its three backward kernels, naive.

The sums of `cpu_train_naive.py`, one GPU thread per element: the forward one per output, the input gradient one
per input element (sum over output channels and taps of w * gy, shifted back), the weight gradient one block per
(o, c, k) reducing gy * x over batch and time in shared memory, the bias gradient one block per output channel;
every gradient written whole (nothing accumulated across calls). A `torch.autograd.Function` binds them. float32;
MODES lists only train, so a forward search does not visit it. Builds fast: the .cu part includes only the CUDA
runtime and the binding is plain pybind11 (no torch headers, `no_implicit_headers=True`). PARAMS is rewritten
textually by a search; PARAM_SPACE lists the choices.
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

__global__ void forward_kernel(const float* __restrict__ x, const float* __restrict__ w,
                               const float* __restrict__ bias, float* __restrict__ y,
                               long long n, int Cin, int Cout, int K, int dil, int L) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int t = (int)(i % L);
    const int o = (int)((i / L) % Cout);
    const long long b = i / ((long long)L * Cout);
    float acc = bias ? bias[o] : 0.0f;
    for (int c = 0; c < Cin; ++c) {
        const float* xr = x + (b * Cin + c) * L;
        for (int k = 0; k < K; ++k) {
            const int pos = t - (K - 1 - k) * dil;
            if (pos >= 0) acc += w[((long long)o * Cin + c) * K + k] * xr[pos];
        }
    }
    y[i] = acc;
}

__global__ void grad_input_kernel(const float* __restrict__ gy, const float* __restrict__ w,
                                  float* __restrict__ gx, long long n, int Cin, int Cout, int K, int dil, int L) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int s = (int)(i % L);
    const int c = (int)((i / L) % Cin);
    const long long b = i / ((long long)L * Cin);
    float acc = 0.0f;
    for (int o = 0; o < Cout; ++o) {
        const float* gyr = gy + (b * Cout + o) * L;
        for (int k = 0; k < K; ++k) {
            const int t = s + (K - 1 - k) * dil;
            if (t < L) acc += w[((long long)o * Cin + c) * K + k] * gyr[t];
        }
    }
    gx[i] = acc;
}

// the block's THREADS partial sums, halved in shared memory down to one
__device__ float block_sum(float value, float* shared) {
    shared[threadIdx.x] = value;
    __syncthreads();
    for (int half = KL_THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
        __syncthreads();
    }
    return shared[0];
}

// one block per (o, c, k): sum over b and t of gy[b, o, t] * x[b, c, t - shift]
__global__ void grad_weight_kernel(const float* __restrict__ gy, const float* __restrict__ x,
                                   float* __restrict__ gw, int B, int Cin, int Cout, int K, int dil, int L) {
    __shared__ float shared[KL_THREADS];
    const int k = blockIdx.x % K;
    const int c = (blockIdx.x / K) % Cin;
    const int o = blockIdx.x / (K * Cin);
    const int shift = (K - 1 - k) * dil;
    float acc = 0.0f;
    for (int b = 0; b < B; ++b) {
        const float* gyr = gy + ((long long)b * Cout + o) * L;
        const float* xr = x + ((long long)b * Cin + c) * L;
        for (int t = shift + threadIdx.x; t < L; t += KL_THREADS) acc += gyr[t] * xr[t - shift];
    }
    const float total = block_sum(acc, shared);
    if (threadIdx.x == 0) gw[blockIdx.x] = total;
}

// one block per output channel: sum over b and t of gy[b, o, t]
__global__ void grad_bias_kernel(const float* __restrict__ gy, float* __restrict__ gb, int B, int Cout, int L) {
    __shared__ float shared[KL_THREADS];
    const int o = blockIdx.x;
    float acc = 0.0f;
    for (int b = 0; b < B; ++b) {
        const float* gyr = gy + ((long long)b * Cout + o) * L;
        for (int t = threadIdx.x; t < L; t += KL_THREADS) acc += gyr[t];
    }
    const float total = block_sum(acc, shared);
    if (threadIdx.x == 0) gb[o] = total;
}

static int blocks_for(long long n) { return (int)((n + KL_THREADS - 1) / KL_THREADS); }

int launch_forward(long long x, long long w, long long bias, long long y, int B, int Cin, int Cout, int K, int dil,
                   int L, long long stream) {
    const long long n = (long long)B * Cout * L;
    if (n == 0) return 0;
    forward_kernel<<<blocks_for(n), KL_THREADS, 0, (cudaStream_t)stream>>>(
        (const float*)x, (const float*)w, (const float*)bias, (float*)y, n, Cin, Cout, K, dil, L);
    return (int)cudaGetLastError();
}

int launch_grad_input(long long gy, long long w, long long gx, int B, int Cin, int Cout, int K, int dil, int L,
                      long long stream) {
    const long long n = (long long)B * Cin * L;
    if (n == 0) return 0;
    grad_input_kernel<<<blocks_for(n), KL_THREADS, 0, (cudaStream_t)stream>>>(
        (const float*)gy, (const float*)w, (float*)gx, n, Cin, Cout, K, dil, L);
    return (int)cudaGetLastError();
}

int launch_grad_weight(long long gy, long long x, long long gw, int B, int Cin, int Cout, int K, int dil, int L,
                       long long stream) {
    if ((long long)Cout * Cin * K == 0) return 0;
    grad_weight_kernel<<<Cout * Cin * K, KL_THREADS, 0, (cudaStream_t)stream>>>(
        (const float*)gy, (const float*)x, (float*)gw, B, Cin, Cout, K, dil, L);
    return (int)cudaGetLastError();
}

int launch_grad_bias(long long gy, long long gb, int B, int Cout, int L, long long stream) {
    if (Cout == 0) return 0;
    grad_bias_kernel<<<Cout, KL_THREADS, 0, (cudaStream_t)stream>>>((const float*)gy, (float*)gb, B, Cout, L);
    return (int)cudaGetLastError();
}
"""

CPP_SRC = r"""
#include <pybind11/pybind11.h>
#include <stdexcept>
#include <string>
int launch_forward(long long x, long long w, long long bias, long long y, int B, int Cin, int Cout, int K, int dil,
                   int L, long long stream);
int launch_grad_input(long long gy, long long w, long long gx, int B, int Cin, int Cout, int K, int dil, int L,
                      long long stream);
int launch_grad_weight(long long gy, long long x, long long gw, int B, int Cin, int Cout, int K, int dil, int L,
                       long long stream);
int launch_grad_bias(long long gy, long long gb, int B, int Cout, int L, long long stream);

static void checked(const char* what, int error) {
    if (error != 0) throw std::runtime_error(std::string(what) + " launch failed: CUDA error " + std::to_string(error));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("forward", [](long long x, long long w, long long bias, long long y, int B, int Cin, int Cout, int K,
                        int dil, int L, long long stream) {
        checked("forward", launch_forward(x, w, bias, y, B, Cin, Cout, K, dil, L, stream));
    });
    m.def("grad_input", [](long long gy, long long w, long long gx, int B, int Cin, int Cout, int K, int dil, int L,
                           long long stream) {
        checked("grad_input", launch_grad_input(gy, w, gx, B, Cin, Cout, K, dil, L, stream));
    });
    m.def("grad_weight", [](long long gy, long long x, long long gw, int B, int Cin, int Cout, int K, int dil, int L,
                            long long stream) {
        checked("grad_weight", launch_grad_weight(gy, x, gw, B, Cin, Cout, K, dil, L, stream));
    });
    m.def("grad_bias", [](long long gy, long long gb, int B, int Cout, int L, long long stream) {
        checked("grad_bias", launch_grad_bias(gy, gb, B, Cout, L, stream));
    });
}
"""


def _extension_name() -> str:
    tag = "_".join(f"{k}{v}" for k, v in sorted(PARAMS.items()))
    return f"kl_cuda_train_naive_{tag}".lower()


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


class CausalConv1d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, dilation):  # type: ignore[override]
        x, w = _checked("x", x, 3), _checked("weight", weight, 3)
        b = _checked("bias", bias, 1) if bias is not None else None
        batch, cin, length = x.shape
        cout, _, k = w.shape
        y = torch.empty(batch, cout, length, dtype=torch.float32, device=x.device)
        _ext.forward(x.data_ptr(), w.data_ptr(), b.data_ptr() if b is not None else 0, y.data_ptr(),
                     batch, cin, cout, k, dilation, length, _stream(x))
        ctx.save_for_backward(x, w)
        ctx.dilation, ctx.has_bias = dilation, bias is not None
        return y

    @staticmethod
    def backward(ctx, grad_y):  # type: ignore[override]
        x, w = ctx.saved_tensors
        gy = _checked("grad_y", grad_y, 3)
        batch, cin, length = x.shape
        cout, _, k = w.shape
        stream = _stream(gy)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = torch.empty_like(x)
            _ext.grad_input(gy.data_ptr(), w.data_ptr(), gx.data_ptr(), batch, cin, cout, k, ctx.dilation, length,
                            stream)
        if ctx.needs_input_grad[1]:
            gw = torch.empty_like(w)
            _ext.grad_weight(gy.data_ptr(), x.data_ptr(), gw.data_ptr(), batch, cin, cout, k, ctx.dilation, length,
                             stream)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = torch.empty(cout, dtype=torch.float32, device=gy.device)
            _ext.grad_bias(gy.data_ptr(), gb.data_ptr(), batch, cout, length, stream)
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
