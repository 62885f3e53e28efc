"""Mamba's depthwise causal conv1d on the GPU: VEC outputs per thread, taps in registers, fused bias + SiLU.

Each thread loads the window x[t0-(K-1) .. t0+VEC-1] of its row once (16-byte loads where the row is aligned,
predicated scalars for the causal halo and the tail), keeps the K taps of its channel in registers (K = 2, 3, 4
are compile-time instantiations, others up to 8 run generic), and writes VEC outputs (16-byte stores where
aligned). With HALO a thread takes the K-1 inputs before its outputs from the lane to its left by a warp
shuffle (that lane's window ends where this one's begins), and only lane 0 reads them. The grid is (time
chunks, rows), so a block never straddles two channels; more rows than a grid's y-dimension holds go out in
slabs. FAST_EXP uses __expf for the SiLU (within 2 ulp; the strict tolerance is 1e-5 of max|truth|).

float32, float16 and bfloat16 inputs (KernelBench's precision option casts the inputs and the weights): the
kernel is a template over the element type, converts each element to float32 as it is loaded, accumulates and
applies the SiLU in float32, and rounds once on the store. A 16-byte load holds 4 floats or 8 halves, so VEC
8 and 16 are the widths that fill it for the half types.

Builds fast: the .cu part includes only the CUDA runtime and its half-type headers, the binding is plain
pybind11 (no torch headers, no_implicit_headers=True). PARAMS is rewritten textually by a search; PARAM_SPACE
lists the choices.
"""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

PARAMS = {"VEC": 4, "THREADS": 256, "FAST_EXP": 1, "HALO": 0}
PARAM_SPACE = {
    "VEC": [1, 2, 4, 8, 16],  # outputs per thread
    "THREADS": [64, 128, 256, 512],  # threads per block
    "FAST_EXP": [0, 1],  # __expf instead of expf in the SiLU
    "HALO": [0, 1],  # the K-1 inputs before a thread's outputs: 0 read by each thread, 1 from the lane to its left
}
PARAM_CONSTRAINTS = ["HALO == 0 or VEC >= 4"]  # a shuffle needs the left lane's outputs to cover the halo
PRECISIONS = ["fp32", "fp16", "bf16"]  # KernelBench's precision option: ModelNew takes each

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#define VEC KL_VEC
#define KMAX 8
#define MAX_GRID_Y 65535

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

// N elements of T moved as one access of N * sizeof(T) bytes (at most 16).
template <int BYTES> struct Word;
template <> struct Word<16> { using type = uint4; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<4> { using type = unsigned int; };
template <> struct Word<2> { using type = unsigned short; };
template <typename T, int N> union Pack {
    typename Word<N * sizeof(T)>::type word;
    T elem[N];
};

__device__ __forceinline__ float kl_silu(float a) {
#if KL_FAST_EXP
    return a / (1.0f + __expf(-a));
#else
    return a / (1.0f + expf(-a));
#endif
}

template <typename T, int KC>
__global__ void __launch_bounds__(KL_THREADS) dwconv_vec(const T* __restrict__ x, const T* __restrict__ w,
                                                         const T* __restrict__ bias, T* __restrict__ y,
                                                         long long row0, int D, int K_runtime, int L, int silu) {
    constexpr int KM = KC > 0 ? KC : KMAX;
    constexpr int CHUNK = VEC * sizeof(T) < 16 ? VEC : 16 / sizeof(T);  // elements per wide access
    using P = Pack<T, CHUNK>;
    const int K = KC > 0 ? KC : K_runtime;
    const long long row = row0 + blockIdx.y;
    const int d = (int)(row % D);
    const int t0 = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    // the halo before t0 (causal padding where < 0) is read by each thread, or with HALO taken from the left
    // lane, whose window ends where this one's begins (it covers the K-1 inputs when VEC >= K-1)
    constexpr bool SHUFFLE = KL_HALO && VEC >= KM - 1;
    if (!SHUFFLE && t0 >= L) return;  // with the shuffle every lane takes part; past the end it reads nothing
    const T* xr = x + row * L;
    T* yr = y + row * L;
    float wk[KM];
#pragma unroll
    for (int k = 0; k < KM; ++k) wk[k] = k < K ? to_float(__ldg(w + d * K + k)) : 0.0f;
    const float b0 = bias ? to_float(__ldg(bias + d)) : 0.0f;

    float win[VEC + KM - 1];
    const bool full = t0 + VEC <= L;
    const bool aligned = (L % CHUNK == 0) && ((reinterpret_cast<uintptr_t>(xr) % sizeof(P)) == 0) &&
                         ((reinterpret_cast<uintptr_t>(yr) % sizeof(P)) == 0);
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < KM - 1; ++i) {
        const int pos = t0 - (K - 1) + i;
        const bool read = i < K - 1 && pos >= 0 && (!SHUFFLE || (lane == 0 && pos < L));  // a lane 0 past the end
        win[i] = read ? to_float(__ldg(xr + pos)) : 0.0f;
    }
    if (full && aligned) {
#pragma unroll
        for (int j = 0; j < VEC; j += CHUNK) {
            P p;
            p.word = __ldg(reinterpret_cast<const decltype(p.word)*>(xr + t0 + j));
#pragma unroll
            for (int e = 0; e < CHUNK; ++e) win[K - 1 + j + e] = to_float(p.elem[e]);
        }
    } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) win[K - 1 + j] = (t0 + j < L) ? to_float(__ldg(xr + t0 + j)) : 0.0f;
    }
    if (SHUFFLE) {
#pragma unroll
        for (int i = 0; i < KM - 1; ++i) {  // the left lane's win[VEC + i] is x[t0 - (K-1) + i]
            const float left = __shfl_up_sync(0xffffffffu, win[VEC + i], 1);
            if (lane != 0 && i < K - 1) win[i] = left;  // i >= K-1 (a run-time K below KMAX) is loaded already
        }
    }
    float out[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        float acc = b0;
#pragma unroll
        for (int k = 0; k < KM; ++k)
            if (k < K) acc += wk[k] * win[j + k];
        out[j] = silu ? kl_silu(acc) : acc;
    }
    if (full && aligned) {
#pragma unroll
        for (int j = 0; j < VEC; j += CHUNK) {
            P p;
#pragma unroll
            for (int e = 0; e < CHUNK; ++e) p.elem[e] = from_float<T>(out[j + e]);
            *reinterpret_cast<decltype(p.word)*>(yr + t0 + j) = p.word;
        }
    } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j)
            if (t0 + j < L) yr[t0 + j] = from_float<T>(out[j]);
    }
}

template <typename T>
static int launch_typed(long long x, long long w, long long bias, long long y, long long rows, int D, int K, int L,
                        int silu, cudaStream_t s) {
    const int per_block = KL_THREADS * VEC;
    const T *xp = (const T*)x, *wp = (const T*)w, *bp = (const T*)bias;
    T* yp = (T*)y;
    for (long long row0 = 0; row0 < rows; row0 += MAX_GRID_Y) {
        const long long slab = rows - row0 < MAX_GRID_Y ? rows - row0 : MAX_GRID_Y;
        dim3 grid((L + per_block - 1) / per_block, (unsigned)slab);
        if (K == 4) dwconv_vec<T, 4><<<grid, KL_THREADS, 0, s>>>(xp, wp, bp, yp, row0, D, K, L, silu);
        else if (K == 3) dwconv_vec<T, 3><<<grid, KL_THREADS, 0, s>>>(xp, wp, bp, yp, row0, D, K, L, silu);
        else if (K == 2) dwconv_vec<T, 2><<<grid, KL_THREADS, 0, s>>>(xp, wp, bp, yp, row0, D, K, L, silu);
        else dwconv_vec<T, 0><<<grid, KL_THREADS, 0, s>>>(xp, wp, bp, yp, row0, D, K, L, silu);
    }
    return (int)cudaGetLastError();
}

// dtype: 0 float32, 1 float16, 2 bfloat16
int dwconv_vec_launch(long long x, long long w, long long bias, long long y, int B, int D, int K, int L, int silu,
                      int dtype, long long stream) {
    if (K < 1 || K > KMAX) return -1;
    const long long rows = (long long)B * D;
    if (rows == 0 || L == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (dtype == 0) return launch_typed<float>(x, w, bias, y, rows, D, K, L, silu, s);
    if (dtype == 1) return launch_typed<__half>(x, w, bias, y, rows, D, K, L, silu, s);
    if (dtype == 2) return launch_typed<__nv_bfloat16>(x, w, bias, y, rows, D, K, L, silu, s);
    return -2;
}
"""

CPP_SRC = r"""
#include <pybind11/pybind11.h>
#include <stdexcept>
#include <string>
int dwconv_vec_launch(long long x, long long w, long long bias, long long y, int B, int D, int K, int L, int silu,
                      int dtype, long long stream);
static void dwconv_vec_forward(long long x, long long w, long long bias, long long y, int B, int D, int K, int L,
                               int silu, int dtype, long long stream) {
    const int error = dwconv_vec_launch(x, w, bias, y, B, D, K, L, silu, dtype, stream);
    if (error == -1) throw std::invalid_argument("kernel_size must be 1..8 for this template");
    if (error == -2) throw std::invalid_argument("unknown dtype code " + std::to_string(dtype));
    if (error != 0) throw std::runtime_error("dwconv_vec launch failed: CUDA error " + std::to_string(error));
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &dwconv_vec_forward); }
"""
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _extension_name() -> str:
    tag = "_".join(f"{k}{v}" for k, v in sorted(PARAMS.items()))
    return f"kl_mamba_cuda_vec_{tag}".lower()


_ext = load_inline(name=_extension_name(), cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC, no_implicit_headers=True,
                   with_cuda=True, extra_cflags=["-O2"],
                   extra_cuda_cflags=["-O3", f"-DKL_VEC={PARAMS['VEC']}", f"-DKL_THREADS={PARAMS['THREADS']}",
                                      f"-DKL_FAST_EXP={PARAMS['FAST_EXP']}", f"-DKL_HALO={PARAMS['HALO']}"],
                   verbose=False)


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
