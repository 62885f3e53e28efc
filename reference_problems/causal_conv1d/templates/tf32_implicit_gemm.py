"""Causal conv1d (NCW, float32) as an implicit GEMM on TF32 tensor cores, mma.sync.m16n8k8.

GEMM view: M = time (per batch), N = Cout, K = Cin * taps.  The A operand (M x K) is read straight
from one NCW input tile staged in shared memory (rows = channels, time contiguous); tap j is the same
tile read at a column offset of j*dilation, so each input element is loaded from DRAM once and reused
for every tap.  Causal padding / tails are zero-filled by predicated cp.async (src-size 0), never
a padded copy.  The weights are re-laid once (lazily, keyed on the parameter's data_ptr/_version)
into the exact shared-memory image of each (cout-tile, channel-chunk), rounded to TF32, so their
stage loads are straight 16-byte cp.async copies and their fragments single LDS.128s.

Persistent grid: each block walks its output tiles; the cp.async ring of STAGES stages runs across
tile boundaries (the next tile's input is in flight during this tile's epilogue).  When all of Cout
fits one tile and the whole weight fits shared memory, the weight is loaded once per block and stays
resident (WRES path), and only input chunks stream.  Epilogue: bias fused, stores straight from the
accumulators (each warp store writes whole 32-byte sectors).

Measured on an H200 (runs 1-2): 1.4-1.5x cuDNN TF32 geomean; mma.sync tops out well below wgmma on
Hopper, see tf32_wgmma.py (2.6x) for the fast version of the same design.

PARAMS is rewritten textually by a search; PARAM_SPACE lists the choices.  The .cu part includes
only <cuda_runtime.h>-level headers (builds in ~2 s); the binding is plain pybind11 (no torch headers).
"""
import hashlib
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

PARAMS = {"BN": 128, "TM": 256, "BC": 16, "STAGES": 3, "WM": 4, "WN": 2, "MINB": 1, "ROUND_X": 2, "WRES": 1}
PARAM_SPACE = {
    "BN": [64, 128, 256],        # couts per block tile (a BN/2 instantiation is also built for narrow Cout)
    "TM": [64, 128, 256],        # output times per block tile
    "BC": [16, 32],              # input channels per pipeline stage
    "STAGES": [2, 3, 4, 5, 6],   # cp.async ring depth
    "WM": [1, 2, 4],             # warps along time
    "WN": [1, 2, 4],             # warps along cout
    "MINB": [1, 2],              # __launch_bounds__ min blocks per SM
    "ROUND_X": [0, 1, 2],        # input to tf32: 0 truncation (by the tensor core), 1 cvt.rna, 2 +0x1000 (one IADD)
    "WRES": [0, 1],              # 1: allow the weight-resident path when Cout fits one tile
}

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <stdint.h>

#define NT (WM * WN * 32)

struct ConvParams {
  const float* x; const float* wp; const float* bias; float* y;
  int B, Cin, Cout, L, KT, dil, halo;
  int XW, XS;            // staged input row: XW useful floats (multiple of 4), XS row stride
  int nCT, nTT, nch, ntiles;
  int wstage;            // floats of weight image per chunk = KT*BC*BNT
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp_async16(uint32_t s, const void* g, int n) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(s), "l"(g), "r"(n));
}
__device__ __forceinline__ void cp_async4(uint32_t s, const void* g, int n) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(s), "l"(g), "r"(n));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

__device__ __forceinline__ uint32_t to_tf32(float f) {
#if ROUND_X == 2
  return __float_as_uint(f) + 0x1000u;   // the tensor core drops the low 13 bits: round half away from zero
#elif ROUND_X
  uint32_t r; asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(f)); return r;
#else
  return __float_as_uint(f);
#endif
}

__device__ __forceinline__ void mma_tf32(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct TileCoord { int b, t0, n0, ts, off; };
__device__ __forceinline__ TileCoord tile_coord(const ConvParams& p, int tile, int TMv, int BNv) {
  TileCoord c;
  int ct = tile % p.nCT; int r = tile / p.nCT;
  int tt = r % p.nTT; c.b = r / p.nTT;
  c.t0 = tt * TMv; c.n0 = ct * BNv;
  int tstart = c.t0 - p.halo;
  c.ts = tstart & ~3;            // floor to a multiple of 4 (two's complement)
  c.off = tstart - c.ts;
  return c;
}

// One pipeline stage: the input chunk [BC channels][XW times from ts] (+ the weight chunk unless resident).
template <int BNT, bool VEC, bool WRESv>
__device__ __forceinline__ void load_stage(const ConvParams& p, float* xs, float* ws, const TileCoord& tc, int ch, int tid) {
  const int c0 = ch * BC;
  const float* xb = p.x + ((size_t)tc.b * p.Cin + c0) * (size_t)p.L;
  if (VEC) {
    const int NV = p.XW >> 2;
    const int total = BC * NV;
    int r = tid / NV, v = tid - r * NV;
    const int dr = NT / NV, dv = NT - dr * NV;
    for (int i = tid; i < total; i += NT) {
      const int t = tc.ts + 4 * v;
      const bool ok = (c0 + r < p.Cin) && (t >= 0) && (t < p.L);
      const float* g = ok ? (xb + (size_t)r * p.L + t) : p.x;
      cp_async16(smem_u32(xs + r * p.XS + 4 * v), g, ok ? 16 : 0);
      v += dv; r += dr; if (v >= NV) { v -= NV; ++r; }
    }
  } else {
    const int NV = p.XW;
    const int total = BC * NV;
    int r = tid / NV, v = tid - r * NV;
    const int dr = NT / NV, dv = NT - dr * NV;
    for (int i = tid; i < total; i += NT) {
      const int t = tc.ts + v;
      const bool ok = (c0 + r < p.Cin) && (t >= 0) && (t < p.L);
      const float* g = ok ? (xb + (size_t)r * p.L + t) : p.x;
      cp_async4(smem_u32(xs + r * p.XS + v), g, ok ? 4 : 0);
      v += dv; r += dr; if (v >= NV) { v -= NV; ++r; }
    }
  }
  if (!WRESv) {
    const int ct = tc.n0 / BNT;
    const float* wsrc = p.wp + ((size_t)ct * p.nch + ch) * (size_t)p.wstage;
    const int nv = p.wstage >> 2;
    for (int i = tid; i < nv; i += NT) cp_async16(smem_u32(ws + 4 * i), wsrc + 4 * i, 16);
  }
}

template <int BNT, bool VEC, bool WRESv>
__global__ void __launch_bounds__(NT, MINB) cc1d_mma_kernel(const ConvParams p) {
  constexpr int WTM = TM / WM, WTN = BNT / WN;
  constexpr int MI = WTM / 16, NI = WTN / 8, NQ2 = BC / 16;
  static_assert(WTM % 16 == 0 && WTN % 8 == 0 && BC % 16 == 0, "tile shape");
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int wm0 = (warp / WN) * WTM, wn0 = (warp % WN) * WTN;

  const int xstage = BC * p.XS;
  const int stage_f = xstage + (WRESv ? 0 : p.wstage);
  float* wres = smem + STAGES * stage_f;   // resident weights (WRES) live after the ring

  const int my_tiles = (p.ntiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
  if (my_tiles <= 0) return;
  const int total = my_tiles * p.nch;

  if (WRESv) {
    const int nv = (p.nch * p.wstage) >> 2;
    for (int i = tid; i < nv; i += NT) cp_async16(smem_u32(wres + 4 * i), p.wp + 4 * i, 16);
  }
  // prologue
  int ld_it = 0, ld_tile = blockIdx.x, ld_ch = 0, ld_slot = 0;
  TileCoord ld_tc = tile_coord(p, ld_tile, TM, BNT);
#pragma unroll 1
  for (int s = 0; s < STAGES - 1; ++s) {
    if (ld_it < total) {
      float* xs = smem + ld_slot * stage_f;
      load_stage<BNT, VEC, WRESv>(p, xs, xs + xstage, ld_tc, ld_ch, tid);
      ++ld_it; ++ld_slot; if (++ld_ch == p.nch) { ld_ch = 0; ld_tile += gridDim.x; ld_tc = tile_coord(p, ld_tile, TM, BNT); }
    }
    cp_commit();
  }

  float acc[MI][NI][4];
  int cur_tile = blockIdx.x, ch = 0, slot = 0;
  TileCoord tc = tile_coord(p, cur_tile, TM, BNT);

#pragma unroll 1
  for (int it = 0; it < total; ++it) {
    cp_wait<STAGES - 2>();
    __syncthreads();
    // refill the slot consumed in the previous iteration
    if (ld_it < total) {
      if (ld_slot == STAGES) ld_slot = 0;
      float* xs = smem + ld_slot * stage_f;
      load_stage<BNT, VEC, WRESv>(p, xs, xs + xstage, ld_tc, ld_ch, tid);
      ++ld_it; ++ld_slot; if (++ld_ch == p.nch) { ld_ch = 0; ld_tile += gridDim.x; ld_tc = tile_coord(p, ld_tile, TM, BNT); }
    }
    cp_commit();

    if (ch == 0) {
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
          for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.f;
    }

    const float* xs = smem + slot * stage_f;
    const float* ws = WRESv ? (wres + (size_t)ch * p.wstage) : (xs + xstage);
    const float* xa0 = xs + tq * p.XS + tc.off + wm0 + g;
    const float* wb0 = ws + (wn0 + g) * 16 + tq * 4;
    const int XS4 = 4 * p.XS, XS8 = 8 * p.XS;
#pragma unroll 1
    for (int j = 0; j < p.KT; ++j) {
      const float* xa = xa0 + j * p.dil;
      const float* wb = wb0 + j * (NQ2 * BNT * 16);
#pragma unroll
      for (int qp = 0; qp < NQ2; ++qp) {
        float4 bq[NI];
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) bq[ni] = *reinterpret_cast<const float4*>(wb + qp * BNT * 16 + ni * 128);
#pragma unroll
        for (int qq = 0; qq < 2; ++qq) {
          const float* xq = xa + (2 * qp + qq) * XS8;
          uint32_t a[MI][4];
#pragma unroll
          for (int mi = 0; mi < MI; ++mi) {
            a[mi][0] = to_tf32(xq[mi * 16]);
            a[mi][1] = to_tf32(xq[mi * 16 + 8]);
            a[mi][2] = to_tf32(xq[XS4 + mi * 16]);
            a[mi][3] = to_tf32(xq[XS4 + mi * 16 + 8]);
          }
#pragma unroll
          for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
              const uint32_t b0 = __float_as_uint(qq ? bq[ni].z : bq[ni].x);
              const uint32_t b1 = __float_as_uint(qq ? bq[ni].w : bq[ni].y);
              mma_tf32(acc[mi][ni], a[mi], b0, b1);
            }
        }
      }
    }

    if (ch == p.nch - 1) {
      // epilogue: bias + direct stores (8 consecutive times per 4 lanes-group -> full 32B sectors)
      float* yb = p.y + (size_t)tc.b * p.Cout * (size_t)p.L;
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int n = tc.n0 + wn0 + ni * 8 + 2 * tq;
        const bool okn0 = n < p.Cout, okn1 = (n + 1) < p.Cout;
        const float bv0 = (p.bias && okn0) ? __ldg(p.bias + n) : 0.f;
        const float bv1 = (p.bias && okn1) ? __ldg(p.bias + n + 1) : 0.f;
        float* y0 = yb + (size_t)n * p.L;
        float* y1 = y0 + p.L;
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          const int m = tc.t0 + wm0 + mi * 16 + g;
          if (m < p.L) {
            if (okn0) __stcs(y0 + m, acc[mi][ni][0] + bv0);
            if (okn1) __stcs(y1 + m, acc[mi][ni][1] + bv1);
          }
          if (m + 8 < p.L) {
            if (okn0) __stcs(y0 + m + 8, acc[mi][ni][2] + bv0);
            if (okn1) __stcs(y1 + m + 8, acc[mi][ni][3] + bv1);
          }
        }
      }
      cur_tile += gridDim.x;
      tc = tile_coord(p, cur_tile, TM, BNT);
      ch = 0;
    } else {
      ++ch;
    }
    if (++slot == STAGES) slot = 0;
  }
  cp_wait<0>();
}

// Plain fallback for shapes whose staged tile would not fit shared memory (huge dilation).
__global__ void cc1d_direct_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                   const float* __restrict__ bias, float* __restrict__ y,
                                   int B, int Cin, int Cout, int L, int KT, int dil) {
  const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long total = (long long)B * Cout * L;
  if (idx >= total) return;
  const int t = (int)(idx % L); const long long r = idx / L;
  const int o = (int)(r % Cout); const int b = (int)(r / Cout);
  const int halo = (KT - 1) * dil;
  float s = bias ? bias[o] : 0.f;
  for (int c = 0; c < Cin; ++c) {
    const float* xr = x + ((size_t)b * Cin + c) * L;
    const float* wr = w + ((size_t)o * Cin + c) * KT;
    for (int k = 0; k < KT; ++k) { const int ti = t - halo + k * dil; if (ti >= 0) s += wr[k] * xr[ti]; }
  }
  y[idx] = s;
}

template <int BNT, bool VEC, bool WRESv>
static int launch_t(ConvParams p, size_t smem, cudaStream_t st) {
  auto kern = cc1d_mma_kernel<BNT, VEC, WRESv>;
  static size_t attr_set = 0;
  static size_t occ_smem = (size_t)-1; static int occ_nb = 1;
  static int nsm = 0;
  cudaError_t e;
  if (smem > attr_set) {
    e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return (int)e;
    attr_set = smem;
  }
  if (nsm == 0) {
    int dev = 0; cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
  }
  if (occ_smem != smem) {
    int nb = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kern, NT, smem);
    if (e != cudaSuccess) return (int)e;
    occ_nb = nb > 0 ? nb : 1; occ_smem = smem;
  }
  long long grid = (long long)occ_nb * nsm;
  if (grid > p.ntiles) grid = p.ntiles;
  kern<<<(int)grid, NT, smem, st>>>(p);
  return (int)cudaGetLastError();
}

// Returns 0 on success, else a cudaError_t value; -2 if there was nothing to launch with.
int cc1d_launch(const float* x, const float* wp, const float* w_orig, const float* bias, float* y,
                int B, int Cin, int Cout, int L, int KT, int dil, int bnt, int wres_ok, long long stream) {
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  if (B <= 0 || Cout <= 0 || L <= 0) return 0;
  ConvParams p;
  p.x = x; p.wp = wp; p.bias = bias; p.y = y;
  p.B = B; p.Cin = Cin; p.Cout = Cout; p.L = L; p.KT = KT; p.dil = dil; p.halo = (KT - 1) * dil;
  const int span = TM + p.halo + 3;
  p.XW = (span + 3) & ~3;
  p.XS = p.XW + ((8 - (p.XW % 32)) + 32) % 32;          // stride = 8 (mod 32): conflict-free A loads
  p.nCT = (Cout + bnt - 1) / bnt;
  p.nTT = (L + TM - 1) / TM;
  p.nch = (Cin + BC - 1) / BC;
  long long nt = (long long)p.nCT * p.nTT * B;
  p.ntiles = (int)nt;
  p.wstage = KT * BC * bnt;
  const bool vec = (L % 4 == 0) && ((reinterpret_cast<uintptr_t>(x) & 15) == 0);
  const bool wres = wres_ok && WRES && p.nCT == 1;
  const size_t ring = (size_t)STAGES * (BC * p.XS + (wres ? 0 : p.wstage));
  const size_t smem = 4 * (ring + (wres ? (size_t)p.nch * p.wstage : 0));
  const size_t SMEM_MAX = 227 * 1024;
  if (nt < (1LL << 31) && smem <= SMEM_MAX && !(wres && smem > SMEM_MAX)) {
#define DISPATCH(BNV)                                                              \
    if (bnt == BNV) {                                                              \
      if (vec) return wres ? launch_t<BNV, true, true>(p, smem, st) : launch_t<BNV, true, false>(p, smem, st); \
      else     return wres ? launch_t<BNV, false, true>(p, smem, st) : launch_t<BNV, false, false>(p, smem, st); \
    }
    DISPATCH(BN)
#if (BN / 2) % (8 * WN) == 0
    DISPATCH(BN / 2)
#endif
#undef DISPATCH
  }
  if (wres) {  // weight would not fit: retry streamed
    return cc1d_launch(x, wp, w_orig, bias, y, B, Cin, Cout, L, KT, dil, bnt, 0, stream);
  }
  const long long total = (long long)B * Cout * L;
  cc1d_direct_kernel<<<(unsigned)((total + 255) / 256), 256, 0, st>>>(x, w_orig, bias, y, B, Cin, Cout, L, KT, dil);
  return (int)cudaGetLastError();
}
"""

CPP_SRC = r"""
#include <pybind11/pybind11.h>
#include <stdexcept>
#include <string>
int cc1d_launch(const float* x, const float* wp, const float* w_orig, const float* bias, float* y,
                int B, int Cin, int Cout, int L, int KT, int dil, int bnt, int wres_ok, long long stream);
void cc1d_forward(long long x, long long wp, long long w, long long bias, long long y, int B, int Cin, int Cout,
                  int L, int KT, int dil, int bnt, int wres_ok, long long stream) {
  int e = cc1d_launch(reinterpret_cast<const float*>(x), reinterpret_cast<const float*>(wp),
                      reinterpret_cast<const float*>(w), reinterpret_cast<const float*>(bias),
                      reinterpret_cast<float*>(y), B, Cin, Cout, L, KT, dil, bnt, wres_ok, stream);
  if (e != 0) throw std::runtime_error("cc1d_launch failed: CUDA error " + std::to_string(e));
}
"""

_EXT = {}


def _build(params):
    key = hashlib.sha1((CUDA_SRC + CPP_SRC + repr(sorted(params.items()))).encode()).hexdigest()[:12]
    if key in _EXT:
        return _EXT[key]
    from torch.utils.cpp_extension import load_inline
    flags = ["-O3", "-gencode=arch=compute_90,code=sm_90", "-std=c++17", "--use_fast_math"]
    flags += [f"-D{k}={int(v)}" for k, v in params.items()]
    ext = load_inline(name=f"cc1d_mma_{key}", cpp_sources=[CPP_SRC], cuda_sources=[CUDA_SRC],
                      functions=["cc1d_forward"], extra_cuda_cflags=flags, extra_cflags=["-O2"],
                      with_cuda=True, no_implicit_headers=True, with_pytorch_error_handling=False,
                      verbose=os.environ.get("CC1D_VERBOSE") == "1")
    _EXT[key] = ext
    return ext


def _round_tf32(w):
    """Round-to-nearest (ties away) to TF32, like cvt.rna.tf32.f32, keeping float32 storage."""
    i = w.contiguous().view(torch.int32)
    i = (i + 0x1000) & ~0x1FFF
    return i.view(torch.float32)


def pack_weight(w, bnt, bc):
    """(Cout, Cin, K) -> per (cout-tile, chunk) shared-memory images, layout [j][qp][n][t][qq][kh]
    for W[n][c = qp*16 + qq*8 + kh*4 + t][j]."""
    cout, cin, k = w.shape
    nct, nch = -(-cout // bnt), -(-cin // bc)
    wpad = torch.zeros(nct * bnt, nch * bc, k, device=w.device, dtype=torch.float32)
    wpad[:cout, :cin] = w.float()
    wpad = _round_tf32(wpad)
    v = wpad.view(nct, bnt, nch, bc // 16, 2, 2, 4, k)       # ct, n, ch, qp, qq, kh, t, j
    return v.permute(0, 2, 7, 3, 1, 6, 4, 5).contiguous()    # ct, ch, j, qp, n, t, qq, kh


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, dilation=1, bias=False):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.dilation = kernel_size, dilation
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
            bound = 1 / math.sqrt(in_channels * kernel_size)
            nn.init.uniform_(self.bias, -bound, bound)
        else:
            self.register_parameter("bias", None)
        self.params = dict(PARAMS)
        self._cache_key = None
        self._ext = None  # the built extension, looked up once: hashing the sources per call cost ~0.07 ms
        self._packed = None

    def _bnt(self):
        bn = self.params["BN"]
        half = bn // 2
        if half % (8 * self.params["WN"]) == 0 and self.out_channels <= half:
            return half
        return bn

    def _packed_weight(self, bnt):
        w = self.weight
        key = (w.data_ptr(), w._version, w.device, bnt)
        if key != self._cache_key:
            with torch.no_grad():
                self._packed = pack_weight(w.detach(), bnt, self.params["BC"])
                self._wc = w.detach().float().contiguous()
            self._cache_key = key
        return self._packed

    def forward(self, x):
        if not x.is_cuda or x.dtype != torch.float32:
            # CPU / other dtypes: matmul per tap (no convolution op)
            pad = (self.kernel_size - 1) * self.dilation
            xp = F.pad(x, (pad, 0))
            L = x.shape[-1]
            y = sum(torch.matmul(self.weight[:, :, j].to(x.dtype), xp[:, :, j * self.dilation: j * self.dilation + L])
                    for j in range(self.kernel_size))
            if self.bias is not None:
                y = y + self.bias.to(x.dtype)[:, None]
            return y
        ext = self._ext = self._ext or _build(self.params)
        x = x.contiguous()
        B, Cin, L = x.shape
        bnt = self._bnt()
        wp = self._packed_weight(bnt)
        y = torch.empty(B, self.out_channels, L, device=x.device, dtype=torch.float32)
        b = self.bias
        bptr = b.data_ptr() if b is not None else 0
        ext.cc1d_forward(x.data_ptr(), wp.data_ptr(), self._wc.data_ptr(), bptr, y.data_ptr(), B, Cin,
                         self.out_channels, L, self.kernel_size, self.dilation, bnt, 1,
                         torch.cuda.current_stream(x.device).cuda_stream)
        return y


# Built at import, GPU or not (nvcc needs none): compile_kernel then really compiles it on a build lane and
# reports a build error there, with its diagnostics, rather than in the first test on the GPU.
_build(PARAMS)
