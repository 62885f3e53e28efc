"""Causal conv1d (NCW, float32) with float32 accuracy on Hopper tensor cores: 3xTF32 on wgmma (sm_90a).

For problems that forbid TF32 (max|y - truth| / max|truth| <= 1e-5 against a float64 truth).
Every operand is split into a TF32 "big" part and a TF32 "small" remainder, x = xb + xs, w = wb + ws,
and y accumulates xs*wb + xb*ws + xb*wb (three wgmmas per k8-step; xs*ws, about 2^-22 relative, is
dropped).  The weight's big and small images are re-laid once on the host (per chunk: [big][small]);
the input is split in registers after its LDS.  The tensor core's fp32 accumulation truncates, which
biases long sums (1.2e-5 at K = 1536 when accumulated in one register set), so each chunk (BC
channels x taps) accumulates into a fresh register set that is then added into an IEEE fp32 master sum.
Pipeline, layouts and tiling are tf32_wgmma.py's (bulk copies + mbarriers + producer warp).  Data the
bulk-copy path cannot take (L % 4 != 0) goes to the exact fp32 direct kernel (slow, exact).
"""
import hashlib
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

PARAMS = {"BN": 128, "NWG": 2, "MT": 1, "BC": 16, "STAGES": 4, "G": 1, "MINB": 1, "ROUND_X": 2, "WRES": 1, "TMA": 1}
PARAM_SPACE = {
    "BN": [64, 128, 256],        # couts per block tile = wgmma N (a BN/2 instantiation is also built)
    "NWG": [1, 2],               # consumer warpgroups per block (all threads also load)
    "MT": [1, 2],                # m64 subtiles per warpgroup: block tile time TM = 64*NWG*MT
    "BC": [8, 16, 32],           # input channels per pipeline stage
    "STAGES": [2, 3, 4, 5, 6],   # cp.async ring depth
    "G": [1, 2, 4],              # k8-steps per wgmma commit group (must divide BC/8)
    "MINB": [1, 2],              # __launch_bounds__ min blocks per SM
    "ROUND_X": [2],              # unused here (the split rounds exactly)
    "WRES": [0, 1],              # 1: allow the weight-resident path when Cout fits one tile
    "TMA": [0, 1],               # 1: bulk copies + mbarriers + producer warp (v2 pipeline) when aligned; 0: cp.async ring
}
PARAM_CONSTRAINTS = [
    "(BC // 8) % G == 0",        # the kernel's static_assert: G divides the k8-steps of a stage
    "BN < 256 or NWG * MINB < 4",  # an n256 wgmma needs ~158 registers a thread; two warpgroups at two
]                                  # blocks per SM leave 128 (ptxas C7602)

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <stdint.h>

#define NT (NWG * 128)
#define TM (64 * NWG * MT)
//@WGMMA_FUNCS@

struct ConvParams {
  const float* x; const float* wp; const float* bias; float* y;
  int B, Cin, Cout, L, KT, dil, halo;
  int XW, XS;            // staged input row: XW useful floats (multiple of 4), XS row stride
  int nCT, nTT, nch, ntiles;
  int wstage;            // floats of weight image per chunk = KT*BC*BNT
  int nst;               // v2: ring stages actually used (<= STAGES, as many as fit)
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

__device__ __forceinline__ void split_tf32(float f, uint32_t& big, uint32_t& small) {
  const uint32_t b = (__float_as_uint(f) + 0x1000u) & 0xFFFFE000u;     // round half away, exact tf32
  big = b;
  small = __float_as_uint(f - __uint_as_float(b)) + 0x1000u;         // remainder, rounded by the tensor core's truncation
}
__device__ __forceinline__ uint32_t to_tf32(float f) {
#if ROUND_X == 2
  return __float_as_uint(f) + 0x1000u;   // the tensor core drops the low 13 bits: round half away from zero
#elif ROUND_X
  uint32_t r; asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(f)); return r;
#else
  return __float_as_uint(f);
#endif
}


// ---- mbarrier / bulk-copy helpers (v2 pipeline)
__device__ __forceinline__ void mbar_init(uint32_t a, int n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(a), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t a, uint32_t tx) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(a), "r"(tx) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t a) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(a) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t a, uint32_t parity) {
  asm volatile("{\n"
               ".reg .pred P1;\n"
               "LAB_WAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
               "@P1 bra DONE;\n"
               "bra LAB_WAIT;\n"
               "DONE:\n"
               "}\n" :: "r"(a), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t mbar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(mbar) : "memory");
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

// What both kernels do per chunk and per finished tile, written once. Macros rather than functions so that
// each kernel compiles to the very code it had when it spelled these out (same SASS; as inline functions the
// scheduling changed). They read the kernel's own names: BNT, NQ, ND, ch, acc, xa0, wbase, desc_hi, lbo_field,
// ngrp, XS4, XS8, p, tc, wrow, g, tq, and the fp32 master sums mst.
#define ZERO_ACC_AT_TILE_START()                                                        \
  if (ch == 0) {                                                                        \
    _Pragma("unroll")                                                                   \
    for (int i = 0; i < MT; ++i)                                                        \
      _Pragma("unroll")                                                                 \
      for (int j = 0; j < ND; ++j) { acc[i][j] = 0.f; mst[i][j] = 0.f; }                \
  }
// load A fragments of group gi into buffer hb; issue its wgmmas; pin buffer hb's registers
#define LOAD_A(hb, gi)                                                                  \
  {                                                                                     \
    const int s0_ = (gi) * G; const int j_ = s0_ / NQ; const int q0_ = s0_ - j_ * NQ;   \
    const float* xj_ = xa0 + j_ * p.dil + q0_ * XS8;                                    \
    _Pragma("unroll") for (int gg = 0; gg < G; ++gg)                                    \
    _Pragma("unroll") for (int mt = 0; mt < MT; ++mt) {                                 \
      const float* xq_ = xj_ + gg * XS8 + mt * 64;                                      \
      split_tf32(xq_[0], af[hb][gg][mt][0], as_[hb][gg][mt][0]);                        \
      split_tf32(xq_[8], af[hb][gg][mt][1], as_[hb][gg][mt][1]);                        \
      split_tf32(xq_[XS4], af[hb][gg][mt][2], as_[hb][gg][mt][2]);                      \
      split_tf32(xq_[XS4 + 8], af[hb][gg][mt][3], as_[hb][gg][mt][3]);                  \
    }                                                                                   \
  }
#define ISSUE(hb, gi)                                                                   \
  {                                                                                     \
    const int s0_ = (gi) * G;                                                           \
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");                           \
    _Pragma("unroll") for (int gg = 0; gg < G; ++gg) {                                  \
      const uint32_t addr_ = wbase + (uint32_t)((s0_ + gg) * (2 * BNT * 16));           \
      const uint64_t desc_ = desc_hi | (uint64_t)(lbo_field | ((addr_ >> 4) & 0x3FFF)); \
      _Pragma("unroll") for (int mt = 0; mt < MT; ++mt) { wgmma_tf32<BNT>(acc[mt], as_[hb][gg][mt], desc_); wgmma_tf32<BNT>(acc[mt], af[hb][gg][mt], desc_ + wimg16); wgmma_tf32<BNT>(acc[mt], af[hb][gg][mt], desc_); }\
    }                                                                                   \
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");                    \
  }
#define FENCE_A(hb)                                                                     \
  _Pragma("unroll") for (int gg = 0; gg < G; ++gg)                                      \
  _Pragma("unroll") for (int mt = 0; mt < MT; ++mt)                                     \
  _Pragma("unroll") for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(af[hb][gg][mt][e]), "+r"(as_[hb][gg][mt][e]) :: "memory");
// one channel chunk: A double-buffered across groups of G k8-steps, one wgmma commit group per group
#define MMA_CHUNK()                                                                                                       \
  uint32_t af[2][G][MT][4], as_[2][G][MT][4];                                                                             \
  const uint64_t wimg16 = (uint64_t)(p.wstage >> 3);  /* small image offset, 16-byte units */                             \
  LOAD_A(0, 0)                                                                                                            \
  _Pragma("unroll 1")                                                                                                     \
  for (int gi = 0; gi < ngrp; gi += 2) {                                                                                  \
    ISSUE(0, gi)                                                                                                          \
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");                                                      \
    FENCE_A(1)                                                                                                            \
    if (gi + 1 < ngrp) {                                                                                                  \
      LOAD_A(1, gi + 1)                                                                                                   \
      ISSUE(1, gi + 1)                                                                                                    \
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");                                                    \
      FENCE_A(0)                                                                                                          \
      if (gi + 2 < ngrp) LOAD_A(0, gi + 2)                                                                                \
    }                                                                                                                     \
  }                                                                                                                       \
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");                                                        \
  FENCE_A(0)                                                                                                              \
  FENCE_A(1)                                                                                                              \
  _Pragma("unroll")                                                                                                       \
  for (int mt = 0; mt < MT; ++mt)                                                                                         \
    _Pragma("unroll")                                                                                                     \
    for (int j = 0; j < ND; ++j) asm volatile("" : "+f"(acc[mt][j]) :: "memory");                                         \
  _Pragma("unroll")                                                                                                       \
  for (int mt = 0; mt < MT; ++mt)                                                                                         \
    _Pragma("unroll")                                                                                                     \
    for (int j = 0; j < ND; ++j) { mst[mt][j] += acc[mt][j]; acc[mt][j] = 0.f; }   /* IEEE fp32 sum of chunk partials */
// bias fused, streaming stores straight from the accumulators
#define STORE_TILE()                                                                    \
  float* yb = p.y + (size_t)tc.b * p.Cout * (size_t)p.L;                                \
  _Pragma("unroll")                                                                     \
  for (int jn = 0; jn < BNT / 8; ++jn) {                                                \
    const int n = tc.n0 + jn * 8 + 2 * tq;                                              \
    const bool okn0 = n < p.Cout, okn1 = (n + 1) < p.Cout;                              \
    const float bv0 = (p.bias && okn0) ? __ldg(p.bias + n) : 0.f;                       \
    const float bv1 = (p.bias && okn1) ? __ldg(p.bias + n + 1) : 0.f;                   \
    float* y0 = yb + (size_t)n * p.L;                                                   \
    float* y1 = y0 + p.L;                                                               \
    _Pragma("unroll")                                                                   \
    for (int mt = 0; mt < MT; ++mt) {                                                   \
      const int m = tc.t0 + wrow + mt * 64 + g;                                         \
      if (m < p.L) {                                                                    \
        if (okn0) __stcs(y0 + m, mst[mt][4 * jn + 0] + bv0);                            \
        if (okn1) __stcs(y1 + m, mst[mt][4 * jn + 1] + bv1);                            \
      }                                                                                 \
      if (m + 8 < p.L) {                                                                \
        if (okn0) __stcs(y0 + m + 8, mst[mt][4 * jn + 2] + bv0);                        \
        if (okn1) __stcs(y1 + m + 8, mst[mt][4 * jn + 3] + bv1);                        \
      }                                                                                 \
    }                                                                                   \
  }

template <int BNT, bool VEC, bool WRESv>
__global__ void __launch_bounds__(NT, MINB) cc1d_mma_kernel(const ConvParams p) {
  constexpr int NQ = BC / 8, ND = BNT / 2;
  static_assert(NQ % G == 0, "G must divide BC/8");
  static_assert(BNT % 8 == 0 && BNT <= 256, "wgmma N");
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int wrow = (warp >> 2) * (MT * 64) + (warp & 3) * 16;   // this warp's first time row

  const int xstage = BC * p.XS;
  const int stage_f = xstage + (WRESv ? 0 : p.wstage);
  float* wres = smem + STAGES * stage_f;

  const int my_tiles = (p.ntiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
  if (my_tiles <= 0) return;
  const int total = my_tiles * p.nch;

  if (WRESv) {
    const int nv = (p.nch * p.wstage) >> 2;
    for (int i = tid; i < nv; i += NT) cp_async16(smem_u32(wres + 4 * i), p.wp + 4 * i, 16);
  }
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

  float acc[MT][ND], mst[MT][ND];
  int cur_tile = blockIdx.x, ch = 0, slot = 0;
  TileCoord tc = tile_coord(p, cur_tile, TM, BNT);
  // descriptor constant part: LBO = BNT*16 bytes (K-direction core matrices), SBO = 128 bytes (8-cout groups)
  const uint64_t desc_hi = (uint64_t)(128 >> 4) << 32;
  const uint32_t lbo_field = (uint32_t)((BNT * 16) >> 4) << 16;
  const int ngrp = p.KT * (NQ / G);
  const int XS4 = 4 * p.XS, XS8 = 8 * p.XS;

#pragma unroll 1
  for (int it = 0; it < total; ++it) {
    cp_wait<STAGES - 2>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (ld_it < total) {
      if (ld_slot == STAGES) ld_slot = 0;
      float* xs = smem + ld_slot * stage_f;
      load_stage<BNT, VEC, WRESv>(p, xs, xs + xstage, ld_tc, ld_ch, tid);
      ++ld_it; ++ld_slot; if (++ld_ch == p.nch) { ld_ch = 0; ld_tile += gridDim.x; ld_tc = tile_coord(p, ld_tile, TM, BNT); }
    }
    cp_commit();

    ZERO_ACC_AT_TILE_START()

    const float* xs = smem + slot * stage_f;
    const float* ws = WRESv ? (wres + (size_t)ch * p.wstage) : (xs + xstage);
    const float* xa0 = xs + tq * p.XS + tc.off + wrow + g;
    const uint32_t wbase = smem_u32(ws);

    MMA_CHUNK()

    if (ch == p.nch - 1) {
      STORE_TILE()
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

// v2: TMA bulk copies + mbarriers; warp NWG*4 is the producer, the NWG warpgroups consume.
// No block-wide barrier in the main loop: a consumer warp releases a stage (empty mbarrier) once
// its wgmmas reading it have completed, so one warpgroup's drain overlaps the other's math.
template <int BNT, bool WRESv>
__global__ void __launch_bounds__(NT + 128, 1) cc1d_tma_kernel(const ConvParams p) {
  constexpr int NQ = BC / 8, ND = BNT / 2;
  static_assert(NQ % G == 0, "G must divide BC/8");
  static_assert(BC <= 32, "one producer lane per input row");
  extern __shared__ float4 smem4[];
  const uint32_t bar0 = smem_u32(smem4);
#define FULLB(s) (bar0 + 8u * (uint32_t)(s))
#define EMPTYB(s) (bar0 + 8u * (uint32_t)(STAGES + (s)))
#define WBAR (bar0 + 8u * (uint32_t)(2 * STAGES))
  float* ring = reinterpret_cast<float*>(smem4) + 64;      // barriers take the first 256 bytes
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int xstage = BC * p.XS;
  const int stage_f = xstage + (WRESv ? 0 : p.wstage);
  float* wres = ring + p.nst * stage_f;

  const int my_tiles = (p.ntiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
  if (my_tiles <= 0) return;
  const int total = my_tiles * p.nch;

  if (tid == 0) {
    for (int s = 0; s < p.nst; ++s) { mbar_init(FULLB(s), 1); mbar_init(EMPTYB(s), NWG * 4); }
    mbar_init(WBAR, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp >= NWG * 4) {
    // ------------------------------ producer warpgroup (only its first warp works)
#if NWG >= 2
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
#endif
    if (warp != NWG * 4) return;
    if (WRESv && lane == 0) {
      mbar_expect_tx(WBAR, (uint32_t)(p.nch * p.wstage * 4));
      for (int c = 0; c < p.nch; ++c)
        bulk_g2s(smem_u32(wres + (size_t)c * p.wstage), p.wp + (size_t)c * p.wstage, (uint32_t)(p.wstage * 4), WBAR);
    }
    int tile = blockIdx.x, ch = 0, slot = 0;
    uint32_t use = 0;
    TileCoord tc = tile_coord(p, tile, TM, BNT);
    const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 1
    for (int it = 0; it < total; ++it) {
      if (it >= p.nst) mbar_wait(EMPTYB(slot), (use - 1) & 1);
      float* xs = ring + slot * stage_f;
      const int c0 = ch * BC;
      int lo = 0, hi = 0;
      bool valid = false;
      if (lane < BC) {
        lo = max(0, -tc.ts);
        hi = min(p.XW, p.L - tc.ts);
        valid = (c0 + lane < p.Cin) && (hi > lo);
        float* row = xs + lane * p.XS;
        if (!valid) {
          for (int i = 0; i < p.XW; i += 4) *reinterpret_cast<float4*>(row + i) = z4;
        } else {
          for (int i = 0; i < lo; i += 4) *reinterpret_cast<float4*>(row + i) = z4;
          for (int i = hi; i < p.XW; i += 4) *reinterpret_cast<float4*>(row + i) = z4;
        }
      }
      uint32_t bytes = valid ? (uint32_t)(hi - lo) * 4u : 0u;
      bytes = __reduce_add_sync(0xffffffffu, bytes);
      if (!WRESv) bytes += (uint32_t)p.wstage * 4u;
      __syncwarp();
      if (lane == 0) mbar_expect_tx(FULLB(slot), bytes);
      __syncwarp();
      if (valid) {
        const float* src = p.x + ((size_t)tc.b * p.Cin + c0 + lane) * (size_t)p.L + (tc.ts + lo);
        bulk_g2s(smem_u32(xs + lane * p.XS + lo), src, (uint32_t)(hi - lo) * 4u, FULLB(slot));
      }
      if (!WRESv && lane == 0) {
        const int ct = tc.n0 / BNT;
        bulk_g2s(smem_u32(xs + xstage), p.wp + ((size_t)ct * p.nch + ch) * (size_t)p.wstage,
                 (uint32_t)p.wstage * 4u, FULLB(slot));
      }
      if (++slot == p.nst) { slot = 0; ++use; }
      if (++ch == p.nch) { ch = 0; tile += gridDim.x; tc = tile_coord(p, tile, TM, BNT); }
    }
  } else {

  // ------------------------------ consumer warpgroups
#if NWG >= 2
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
#endif
  const int g = lane >> 2, tq = lane & 3;
  const int wrow = (warp >> 2) * (MT * 64) + (warp & 3) * 16;
  float acc[MT][ND], mst[MT][ND];
  int cur_tile = blockIdx.x, ch = 0, slot = 0;
  uint32_t use = 0;
  TileCoord tc = tile_coord(p, cur_tile, TM, BNT);
  const uint64_t desc_hi = (uint64_t)(128 >> 4) << 32;
  const uint32_t lbo_field = (uint32_t)((BNT * 16) >> 4) << 16;
  const int ngrp = p.KT * (NQ / G);
  const int XS4 = 4 * p.XS, XS8 = 8 * p.XS;
  if (WRESv) mbar_wait(WBAR, 0);

#pragma unroll 1
  for (int it = 0; it < total; ++it) {
    ZERO_ACC_AT_TILE_START()
    mbar_wait(FULLB(slot), use & 1);
    const float* xs = ring + slot * stage_f;
    const float* ws = WRESv ? (wres + (size_t)ch * p.wstage) : (xs + xstage);
    const float* xa0 = xs + tq * p.XS + tc.off + wrow + g;
    const uint32_t wbase = smem_u32(ws);

    MMA_CHUNK()
    __syncwarp();
    if (lane == 0) mbar_arrive(EMPTYB(slot));
    if (++slot == p.nst) { slot = 0; ++use; }

    if (ch == p.nch - 1) {
      STORE_TILE()
      cur_tile += gridDim.x;
      tc = tile_coord(p, cur_tile, TM, BNT);
      ch = 0;
    } else {
      ++ch;
    }
  }
  }  // consumer branch
#undef FULLB
#undef EMPTYB
#undef WBAR
}
#undef ZERO_ACC_AT_TILE_START
#undef LOAD_A
#undef ISSUE
#undef FENCE_A
#undef MMA_CHUNK
#undef STORE_TILE

template <int BNT, bool WRESv>
static int launch_tma_t(ConvParams p, size_t smem, cudaStream_t st) {
  auto kern = cc1d_tma_kernel<BNT, WRESv>;
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
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kern, NT + 128, smem);
    if (e != cudaSuccess) return (int)e;
    occ_nb = nb > 0 ? nb : 1; occ_smem = smem;
  }
  long long grid = (long long)occ_nb * nsm;
  if (grid > p.ntiles) grid = p.ntiles;
  kern<<<(int)grid, NT + 128, smem, st>>>(p);
  return (int)cudaGetLastError();
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
  p.wstage = 2 * KT * BC * bnt;   // [big image][small image] per chunk
  const bool vec = (L % 4 == 0) && ((reinterpret_cast<uintptr_t>(x) & 15) == 0);
  const bool wres = wres_ok && WRES && p.nCT == 1;
  const size_t SMEM_MAX = 227 * 1024;
  const size_t wres_b = wres ? 4 * (size_t)p.nch * p.wstage : 0;
  const size_t stage_b = 4 * ((size_t)BC * p.XS + (wres ? 0 : p.wstage));
  if (nt < (1LL << 31) && (bnt == BN || bnt == BN / 2)) {
    if (vec && TMA && 256 + wres_b + 2 * stage_b <= SMEM_MAX) {     // v2: as many stages as fit
      size_t nst = (SMEM_MAX - 256 - wres_b) / stage_b;
      if (nst > STAGES) nst = STAGES;
      p.nst = (int)nst;
      const size_t smem = 256 + wres_b + nst * stage_b;
      if (bnt == BN) return wres ? launch_tma_t<BN, true>(p, smem, st) : launch_tma_t<BN, false>(p, smem, st);
#if (BN / 2) % 8 == 0
      if (bnt == BN / 2) return wres ? launch_tma_t<BN / 2, true>(p, smem, st) : launch_tma_t<BN / 2, false>(p, smem, st);
#endif
    }
    const size_t smem = wres_b + STAGES * stage_b;
    p.nst = STAGES;
    if (smem <= SMEM_MAX && vec) {
#define DISPATCH(BNV)                                                              \
      if (bnt == BNV) {                                                            \
        if (vec) return wres ? launch_t<BNV, true, true>(p, smem, st) : launch_t<BNV, true, false>(p, smem, st); \
        else     return wres ? launch_t<BNV, false, true>(p, smem, st) : launch_t<BNV, false, false>(p, smem, st); \
      }
      DISPATCH(BN)
#if (BN / 2) % 8 == 0
      DISPATCH(BN / 2)
#endif
#undef DISPATCH
    }
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


def wgmma_funcs(ns):
    """wgmma_tf32<N>(acc, a[4], descB): m64nNk8 tf32 with A from registers, generated per N."""
    out = ["template <int N> __device__ __forceinline__ void wgmma_tf32(float* d, const uint32_t* a, uint64_t desc);"]
    for n in ns:
        if n < 8 or n % 8 or n > 256:
            continue
        nd = n // 2
        dl = ",".join(f"%{i}" for i in range(nd))
        outs = ", ".join(f'"+f"(d[{i}])' for i in range(nd))
        out.append(
            f"template <> __device__ __forceinline__ void wgmma_tf32<{n}>(float* d, const uint32_t* a, uint64_t desc) {{\n"
            f'  asm volatile("wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 {{{dl}}}, '
            f'{{%{nd},%{nd + 1},%{nd + 2},%{nd + 3}}}, %{nd + 4}, 1, 1, 1;\\n"\n'
            f"    : {outs}\n"
            f'    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc) : "memory");\n}}')
    return "\n".join(out)


def _build(params):
    key = hashlib.sha1((CUDA_SRC + CPP_SRC + repr(sorted(params.items()))).encode()).hexdigest()[:12]
    if key in _EXT:
        return _EXT[key]
    from torch.utils.cpp_extension import load_inline
    flags = ["-O3", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "--use_fast_math"]
    flags += [f"-D{k}={int(v)}" for k, v in params.items()]
    cuda = CUDA_SRC.replace("//@WGMMA_FUNCS@", wgmma_funcs(sorted({params["BN"], params["BN"] // 2})))
    ext = load_inline(name=f"cc1d_strict_{key}", cpp_sources=[CPP_SRC], cuda_sources=[cuda],
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
    """(Cout, Cin, K) -> per (cout-tile, chunk): [big image][small image], each the K-major no-swizzle
    wgmma B layout [j][q][kh][n][i] for W[n][c = q*8 + kh*4 + i][j]; big = tf32(w), small = tf32(w - big)."""
    cout, cin, k = w.shape
    nct, nch = -(-cout // bnt), -(-cin // bc)
    wpad = torch.zeros(nct * bnt, nch * bc, k, device=w.device, dtype=torch.float32)
    wpad[:cout, :cin] = w.float()
    big = _round_tf32(wpad)
    small = _round_tf32(wpad - big)

    def img(t):
        v = t.view(nct, bnt, nch, bc // 8, 2, 4, k)              # ct, n, ch, q, kh, i, j
        return v.permute(0, 2, 6, 3, 4, 1, 5)                    # ct, ch, j, q, kh, n, i
    return torch.stack([img(big), img(small)], dim=2).contiguous()


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
        if half % 8 == 0 and self.out_channels <= half:
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
