// CUDA kernels of W4A16 matmul: y[M, N] = epilogue(gs * (x[M, K] @ dequantize(w, scales)[N, K]^T)).
// w is NVFP4: [N, w_row_bytes] packed E2M1 (low nibble = even k), scales [N, ceil(K/16)] E4M3 bytes.
// Three kernels, chosen by plan_w4a16 (bottom of this file):
//  - tc:      tensor cores (mma.sync m16n8k16, bf16 or fp16) for bf16/fp16 x; W is the 16-row A
//             operand decoded in registers, x the 8-column B operand; 16-byte streaming loads;
//             the warps of a block split K and reduce through shared memory; fused epilogue.
//  - simt:    fp32 FMA, one warp per weight row; float32 x and any shape.
//  - dequant: exact decode of W to a transient 16/32-bit buffer for the cuBLAS GEMM (large M),
//             followed by the epilogue kernel when cuBLAS cannot write the output directly.
// No MLX header here (nvcc rejects MLX's fmt-based headers); w4a16_matmul.cpp does the MLX glue.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <string>

#include "../shared/tiling_cuda.h"
#include "w4a16_kernels.h"

namespace mlx_fp4 {
namespace cuda {
namespace {

using namespace fp4::cuda_tiling;

// ------------------------------------------------------------------------------------------
// Element access

__device__ __forceinline__ float load_as_float(const void* base, int dtype, int64_t i) {
  if (dtype == fp4::kDtypeF32) return static_cast<const float*>(base)[i];
  if (dtype == fp4::kDtypeF16) return __half2float(static_cast<const __half*>(base)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}

__device__ __forceinline__ void store_from_float(void* base, int dtype, int64_t i, float v) {
  if (dtype == fp4::kDtypeF32) {
    static_cast<float*>(base)[i] = v;
  } else if (dtype == fp4::kDtypeF16) {
    static_cast<__half*>(base)[i] = __float2half_rn(v);
  } else {
    static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
  }
}

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

// Global scale (once, in fp32), then the epilogue chain, in the order given.
__device__ __forceinline__ float finish(const W4A16Args& a, float acc, int64_t row, int64_t col, float gs) {
  float v = acc * gs;
  for (int i = 0; i < a.p.num_ops; ++i) {
    const fp4::EpilogueOp op = a.p.ops[i];
    // Ops without a tensor operand take the constant p0 (e.g. ("add", 0.5)).
    float operand = op.p0;
    if (op.operand >= 0) {
      const int kind = a.p.operand_kind[op.operand];
      operand = load_as_float(a.operands[op.operand], a.p.operand_dtype[op.operand],
                              fp4::operand_offset(kind, row, col, a.p.n));
    }
    v = fp4::epilogue_apply(op.code, v, operand, op.p0, op.p1);
  }
  return v;
}

__device__ __forceinline__ float global_scale_of(const W4A16Args& a) {
  return a.p.has_global_scale ? *a.global_scale : 1.0f;
}

// Weights are read once: keep them out of L1 (x lives there), and have L2 fetch 256 bytes around
// each access (the next steps of the same weight row), which keeps more DRAM traffic in flight.
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint4 load_cached16(const void* p) {
  return __ldg(static_cast<const uint4*>(p));
}

// ------------------------------------------------------------------------------------------
// FP4 -> 16-bit float pairs in registers.
//
// A 32-bit word holds 8 nibbles (k offsets 0..7). fp4_pair<T, i> builds the register pair
// (value at k offset i, value at k offset i + 4) by moving the 3 magnitude bits of each nibble
// to the low exponent / high mantissa bits of a bf16 (bits 6..8) or fp16 (bits 9..11) and the
// sign to bit 15. That gives value * 2^-126 (bf16) or value * 2^-14 (fp16), subnormals included.
// One multiply by the block scale pre-multiplied by 2^119 (bf16) or 2^7 (fp16) then gives
// value * scale * 2^-7 exactly (at most 6 significant bits, normal or exact subnormal range); the
// fp32 accumulator is multiplied by 2^7 at the end. The B operand (x) is permuted the same way.

template <int kShift>
__device__ __forceinline__ uint32_t shift_signed(uint32_t w) {
  if constexpr (kShift >= 0) {
    return w << kShift;
  } else {
    return w >> (-kShift);
  }
}

template <typename T>
struct Mma16;

template <>
struct Mma16<__nv_bfloat16> {
  static constexpr int kMagShift = 6;
  __device__ static __forceinline__ uint32_t scale_pair(float s) {
    const __nv_bfloat16 b = __float2bfloat16_rn(s * 0x1p119f);
    const uint32_t u = __bfloat16_as_ushort(b);
    return u | (u << 16);
  }
  // a * b + (-0): exact product, sign of zero kept.
  __device__ static __forceinline__ uint32_t mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
  }
  __device__ static __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};

template <>
struct Mma16<__half> {
  static constexpr int kMagShift = 9;
  __device__ static __forceinline__ uint32_t scale_pair(float s) {
    const __half h = __float2half_rn(s * 128.0f);
    const uint32_t u = __half_as_ushort(h);
    return u | (u << 16);
  }
  __device__ static __forceinline__ uint32_t mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
  }
  __device__ static __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};

template <typename T, int kNib>
__device__ __forceinline__ uint32_t fp4_pair(uint32_t w) {
  constexpr int kS = Mma16<T>::kMagShift;
  constexpr uint32_t kMagMask = (0x7u << kS) * 0x00010001u;
  return (shift_signed<kS - 4 * kNib>(w) & kMagMask) | (shift_signed<12 - 4 * kNib>(w) & 0x80008000u);
}

// The four pairs of one word. For bf16 one multiply places magnitude and sign at once: a nibble
// at bits 0..3 times (2^6 + 2^12) puts its magnitude at bits 6..8 and its sign at bit 15 (the two
// shifted copies do not overlap, so no carry); fp16's shifts (9 and 12) would overlap.
template <typename T>
__device__ __forceinline__ void fp4_word(uint32_t w, uint32_t (&p)[4]) {
  if constexpr (Mma16<T>::kMagShift == 6) {
    constexpr uint32_t kKeep = 0x81C081C0u;
    const uint32_t hi = w >> 8;
    p[0] = ((w & 0x000F000Fu) * 0x1040u) & kKeep;
    p[1] = ((w & 0x00F000F0u) * 0x0104u) & kKeep;
    p[2] = ((hi & 0x000F000Fu) * 0x1040u) & kKeep;
    p[3] = ((hi & 0x00F000F0u) * 0x0104u) & kKeep;
  } else {
    p[0] = fp4_pair<T, 0>(w);
    p[1] = fp4_pair<T, 1>(w);
    p[2] = fp4_pair<T, 2>(w);
    p[3] = fp4_pair<T, 3>(w);
  }
}

// Accumulator correction for the 2^-7 folded into the decoded weights.
constexpr float kTcAccScale = 128.0f;

// ------------------------------------------------------------------------------------------
// Tensor-core kernel.
//
// Block = kw warps on one tile of 16*RT weight rows and 8*MT x rows; warp w takes a contiguous
// range of 128-wide K steps. In a step, lane (g = lane/4, t = lane%4) loads 16 bytes (32 values)
// of weight rows g and g+8 at k = step*128 + 32t, and x rows g (+8j) at the same k. Each of the
// 4 words makes two mma k-slices. Rows past N or M are clamped to the last row: their loads stay
// in bounds and their results are never stored. The last, partial step uses guarded loads.

// One 128-wide K step on registers: W words of rows (g, g+8) of each row tile, their block-scale
// pairs, and x as four 16-byte groups (k = 32t + 8q .. +7) per x tile.
template <typename T, int MT, int RT>
__device__ __forceinline__ void tc_step(float (&acc)[RT][MT][4], const uint32_t (&w)[RT][2][4],
                                        const uint32_t (&sp)[RT][2][2], const uint4 (&X)[MT][4]) {
  using Mma = Mma16<T>;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t bx[MT][2][2];  // [x tile][k-slice][register]
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      // (x0, x4), (x1, x5) | (x2, x6), (x3, x7): the pairs fp4_pair<0..3> produce.
      bx[j][0][0] = __byte_perm(X[j][q].x, X[j][q].z, 0x5410);
      bx[j][0][1] = __byte_perm(X[j][q].x, X[j][q].z, 0x7632);
      bx[j][1][0] = __byte_perm(X[j][q].y, X[j][q].w, 0x5410);
      bx[j][1][1] = __byte_perm(X[j][q].y, X[j][q].w, 0x7632);
    }
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      const uint32_t s0 = sp[rt][0][q >> 1];
      const uint32_t s1 = sp[rt][1][q >> 1];
      uint32_t p0[4], p1[4];
      fp4_word<T>(w[rt][0][q], p0);
      fp4_word<T>(w[rt][1][q], p1);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t a0 = Mma::mul(p0[2 * h], s0);
        const uint32_t a1 = Mma::mul(p1[2 * h], s1);
        const uint32_t a2 = Mma::mul(p0[2 * h + 1], s0);
        const uint32_t a3 = Mma::mul(p1[2 * h + 1], s1);
#pragma unroll
        for (int j = 0; j < MT; ++j) Mma::mma(acc[rt][j], a0, a1, a2, a3, bx[j][h][0], bx[j][h][1]);
      }
    }
  }
}

// Block scales as ready-made 16-bit pairs (scale * 2^119 for bf16, * 2^7 for fp16): one shared
// memory load per 16 weights instead of an E4M3 decode.
template <typename T>
__device__ __forceinline__ void fill_scale_table(uint32_t* s_scale) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) s_scale[i] = Mma16<T>::scale_pair(fp4::e4m3_to_float(i));
  __syncthreads();
}

// Cross-warp reduction of the accumulators in a fixed order (deterministic), then global scale,
// epilogue and store. `red` holds nwarps * RT * MT * 4 * 32 floats of shared memory.
template <int MT, int RT>
__device__ __forceinline__ void tc_reduce_store(const W4A16Args& a, const float (&acc)[RT][MT][4], float* red,
                                                int64_t m_base, int64_t n_base) {
  constexpr int kSlots = RT * MT * 4;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[(warp * kSlots + (rt * MT + j) * 4 + c) * 32 + lane] = acc[rt][j][c];
  __syncthreads();
  const float gs = global_scale_of(a);
  for (int idx = threadIdx.x; idx < kSlots * 32; idx += blockDim.x) {
    const int slot = idx >> 5;
    const int ln = idx & 31;
    float sum = 0.0f;
    for (int w = 0; w < nwarps; ++w) sum += red[(w * kSlots + slot) * 32 + ln];
    const int c = slot & 3;
    const int j = (slot >> 2) % MT;
    const int rt = (slot >> 2) / MT;
    const int64_t n = n_base + rt * kMmaRows + (ln >> 2) + (c >= 2 ? 8 : 0);
    const int64_t m = m_base + j * kMmaCols + 2 * (ln & 3) + (c & 1);
    if (n < a.p.n && m < a.p.m) {
      store_from_float(a.out, a.p.out_dtype, m * a.p.n + n, finish(a, sum * kTcAccScale, m, n, gs));
    }
  }
}

template <typename T, int MT, int RT>
struct TcFrag {
  uint32_t w[RT][2][4];   // [row tile][row g / g+8][word]
  uint32_t sc[RT][2][2];  // scale bytes [row tile][row][block of 16]
};

template <typename T, int MT, int RT, bool kVec>
__global__ void __launch_bounds__(kMaxWarpsPerBlock * 32) w4a16_tc_kernel(const W4A16Args a) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t M = a.p.m, N = a.p.n, K = a.p.k;
  const int64_t wrb = a.p.w_row_bytes, srb = a.p.scale_row_bytes;
  const int64_t kbytes = (K + 1) / 2;
  const int64_t m_base = int64_t(blockIdx.x) * (kMmaCols * MT);
  const int64_t n_base = int64_t(blockIdx.y) * (kMmaRows * RT);

  const uint8_t* wrow[RT][2];
  const uint8_t* srow[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int64_t n = n_base + rt * kMmaRows + g + 8 * h;
      n = n < N ? n : N - 1;
      wrow[rt][h] = a.w + n * wrb;
      srow[rt][h] = a.scales + n * srb;
    }
  }
  const T* xrow[MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    int64_t m = m_base + j * kMmaCols + g;
    m = m < M ? m : M - 1;
    xrow[j] = static_cast<const T*>(a.x) + m * K;
  }

  __shared__ uint32_t s_scale[256];
  fill_scale_table<T>(s_scale);

  const int64_t nsteps = (K + kStepK - 1) / kStepK;
  const int64_t per = (nsteps + nwarps - 1) / nwarps;
  const int64_t s_begin = int64_t(warp) * per;
  const int64_t s_end = (s_begin + per < nsteps) ? s_begin + per : nsteps;

  float acc[RT][MT][4];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[rt][j][c] = 0.0f;

  auto load_frag = [&](int64_t s, TcFrag<T, MT, RT>& f) {
    const int64_t kb = s * kStepK + t * kLaneK;  // first k of this lane
    const int64_t b0 = kb / 2;                   // first byte
    const int64_t blk0 = kb / fp4::kBlockSize;   // first scale block
    const bool full = kVec && (s * kStepK + kStepK <= K);
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (full) {
          const uint4 v = load_stream16(wrow[rt][h] + b0);
          f.w[rt][h][0] = v.x;
          f.w[rt][h][1] = v.y;
          f.w[rt][h][2] = v.z;
          f.w[rt][h][3] = v.w;
          f.sc[rt][h][0] = __ldg(srow[rt][h] + blk0);
          f.sc[rt][h][1] = __ldg(srow[rt][h] + blk0 + 1);
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            uint32_t word = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int64_t b = b0 + 4 * q + i;
              const uint32_t byte = b < kbytes ? uint32_t(__ldg(wrow[rt][h] + b)) : 0u;
              word |= byte << (8 * i);
            }
            f.w[rt][h][q] = word;
          }
          f.sc[rt][h][0] = blk0 < srb ? uint32_t(__ldg(srow[rt][h] + blk0)) : 0u;
          f.sc[rt][h][1] = blk0 + 1 < srb ? uint32_t(__ldg(srow[rt][h] + blk0 + 1)) : 0u;
        }
      }
    }
  };

  auto compute = [&](int64_t s, const TcFrag<T, MT, RT>& f) {
    const int64_t kb = s * kStepK + t * kLaneK;
    const bool full = kVec && (s * kStepK + kStepK <= K);
    uint32_t sp[RT][2][2];  // bf16x2 / f16x2 block scales [row tile][row][block]
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int b = 0; b < 2; ++b)
          sp[rt][h][b] = s_scale[f.sc[rt][h][b]];
    uint4 X[MT][4];
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (full) {
          X[j][q] = load_cached16(xrow[j] + kb + 8 * q);
        } else {
          uint32_t r[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int64_t k0 = kb + 8 * q + 2 * e;
            const uint16_t* xp = reinterpret_cast<const uint16_t*>(xrow[j]);
            const uint32_t lo = k0 < K ? uint32_t(xp[k0]) : 0u;
            const uint32_t hi = k0 + 1 < K ? uint32_t(xp[k0 + 1]) : 0u;
            r[e] = lo | (hi << 16);
          }
          X[j][q] = make_uint4(r[0], r[1], r[2], r[3]);
        }
      }
    tc_step<T, MT, RT>(acc, f.w, sp, X);
  };

  // Weights of step s+1 are loaded while step s is computed; the L2::256B hint of the loads
  // already brings the next steps of each row into L2. The step loop stays rolled: the unrolled
  // body is large and instruction-cache misses were the main stall (ncu) with three copies of it.
  if (s_begin < s_end) {
    TcFrag<T, MT, RT> cur;
    load_frag(s_begin, cur);
#pragma unroll 1
    for (int64_t s = s_begin; s < s_end; ++s) {
      TcFrag<T, MT, RT> nxt;
      if (s + 1 < s_end) load_frag(s + 1, nxt);
      compute(s, cur);
      cur = nxt;
    }
  }

  __shared__ float red[kMaxWarpsPerBlock * RT * MT * 4 * 32];
  tc_reduce_store<MT, RT>(a, acc, red, m_base, n_base);
}

// ------------------------------------------------------------------------------------------
// Staged tensor-core kernel: the same math and lane layout as w4a16_tc_kernel, for K % kStepK == 0
// with 16-byte aligned weight rows and 4-byte aligned scale rows (every step is full, no guards).
// The register prefetch of the kernel above keeps one step (2 KB per warp) in flight, too little
// to cover DRAM latency (ncu: 27% of DRAM bandwidth at M=1). Here each lane copies the bytes it
// will read itself (cp.async, so no barrier is needed) into a warp-private ring of kStages steps,
// kStages - 1 steps ahead, without holding registers; x (L2-resident) is prefetched one step ahead
// in registers.

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Bytes of one ring slot (one step of one warp): the weight bytes, then the scale bytes.
template <int RT>
__host__ __device__ constexpr int staged_slot_bytes() {
  return RT * 2 * 32 * (kLaneBytes + kStageScaleBytes);
}

template <typename T, int MT, int RT>
__global__ void __launch_bounds__(kMaxWarpsPerBlock * 32) w4a16_tc_staged_kernel(const W4A16Args a) {
  extern __shared__ __align__(16) uint8_t ring[];
  constexpr int kSlot = staged_slot_bytes<RT>();
  constexpr int kScaleOff = RT * 2 * 32 * kLaneBytes;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t M = a.p.m, N = a.p.n, K = a.p.k;
  const int64_t m_base = int64_t(blockIdx.x) * (kMmaCols * MT);
  const int64_t n_base = int64_t(blockIdx.y) * (kMmaRows * RT);

  const int64_t nsteps = K / kStepK;
  const int64_t per = (nsteps + nwarps - 1) / nwarps;
  const int64_t s_begin = int64_t(warp) * per;
  const int64_t s_end = (s_begin + per < nsteps) ? s_begin + per : nsteps;

  // Next bytes to copy: 16 weight bytes at k = 32t of each step; the 4 scale bytes holding this
  // lane's two (blocks 2t, 2t + 1 of the step's 8). Rows past N are clamped (never stored).
  const uint8_t* wsrc[RT][2];
  const uint8_t* ssrc[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int64_t n = n_base + rt * kMmaRows + g + 8 * h;
      n = n < N ? n : N - 1;
      wsrc[rt][h] = a.w + n * a.p.w_row_bytes + s_begin * (kStepK / 2) + t * kLaneBytes;
      ssrc[rt][h] = a.scales + n * a.p.scale_row_bytes + s_begin * (kStepK / fp4::kBlockSize) +
                    (t >> 1) * kStageScaleBytes;
    }
  const T* xsrc[MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    int64_t m = m_base + j * kMmaCols + g;
    m = m < M ? m : M - 1;
    xsrc[j] = static_cast<const T*>(a.x) + m * K + s_begin * kStepK + t * kLaneK;
  }

  __shared__ uint32_t s_scale[256];
  fill_scale_table<T>(s_scale);

  uint8_t* mine = ring + warp * (kStages * kSlot);
  const uint32_t mine_s = static_cast<uint32_t>(__cvta_generic_to_shared(mine));
  auto issue = [&](int slot) {
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = (rt * 2 + h) * 32 + lane;
        cp_async16(mine_s + slot * kSlot + i * kLaneBytes, wsrc[rt][h]);
        cp_async4(mine_s + slot * kSlot + kScaleOff + i * kStageScaleBytes, ssrc[rt][h]);
        wsrc[rt][h] += kStepK / 2;
        ssrc[rt][h] += kStepK / fp4::kBlockSize;
      }
  };
  auto load_x = [&](uint4 (&X)[MT][4]) {
#pragma unroll
    for (int j = 0; j < MT; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q) X[j][q] = load_cached16(xsrc[j] + 8 * q);
      xsrc[j] += kStepK;
    }
  };

  float acc[RT][MT][4];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[rt][j][c] = 0.0f;

  const int steps = static_cast<int>(s_end > s_begin ? s_end - s_begin : 0);
  // One commit group per step, empty past the end, so that "all but the newest kStages - 1
  // groups complete" always means "step i has landed".
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < steps) issue(i);
    cp_async_commit();
  }
  // x one step ahead in registers while that fits (MT <= 2); wider x tiles load at the step.
  constexpr bool kPrefetchX = MT <= 2;
  uint4 X[MT][4];
  if (kPrefetchX && steps > 0) load_x(X);
#pragma unroll 1
  for (int i = 0; i < steps; ++i) {
    const int slot = i % kStages;
    if (i + kStages - 1 < steps) issue((i + kStages - 1) % kStages);
    cp_async_commit();
    uint4 Xn[MT][4];
    if (!kPrefetchX) {
      load_x(X);
    } else if (i + 1 < steps) {
      load_x(Xn);
    }
    cp_async_wait<kStages - 1>();
    uint32_t w[RT][2][4];
    uint32_t sp[RT][2][2];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int idx = (rt * 2 + h) * 32 + lane;
        const uint4 v = *reinterpret_cast<const uint4*>(mine + slot * kSlot + idx * kLaneBytes);
        w[rt][h][0] = v.x;
        w[rt][h][1] = v.y;
        w[rt][h][2] = v.z;
        w[rt][h][3] = v.w;
        const uint32_t sc = *reinterpret_cast<const uint16_t*>(mine + slot * kSlot + kScaleOff +
                                                                idx * kStageScaleBytes + 2 * (t & 1));
        sp[rt][h][0] = s_scale[sc & 0xFFu];
        sp[rt][h][1] = s_scale[sc >> 8];
      }
    tc_step<T, MT, RT>(acc, w, sp, X);
    if (kPrefetchX) {
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) X[j][q] = Xn[j][q];
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with its ring: reuse it for the reduction
  static_assert(MT * 4 * 32 * sizeof(float) <= kStages * kSlot, "reduction must fit in the ring");
  tc_reduce_store<MT, RT>(a, acc, reinterpret_cast<float*>(ring), m_base, n_base);
}

// ------------------------------------------------------------------------------------------
// SIMT kernel: one warp per weight row n and kSimtRows rows of x per pass; fp32 FMA.
// kVec: lanes take 16-byte chunks (32 values); else single bytes. Exact decode through the shared
// format functions.

// Eight consecutive x values as float (16- or 32-byte aligned).
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
  v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ float half_bits_to_float(uint32_t b, __half*) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
}
__device__ __forceinline__ float half_bits_to_float(uint32_t b, __nv_bfloat16*) {
  return __uint_as_float(b << 16);
}
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&v)[8]) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = half_bits_to_float(w[i] & 0xFFFFu, static_cast<T*>(nullptr));
    v[2 * i + 1] = half_bits_to_float(w[i] >> 16, static_cast<T*>(nullptr));
  }
}

// Exact E2M1 value of a code: the magnitude bits as a float's low exponent / high mantissa bits
// give value * 2^-126 (subnormal for the codes 0 and 1), times 2^126.
__device__ __forceinline__ float e2m1_fast(uint32_t code) {
  return __uint_as_float(((code & 7u) << 22) | ((code & 8u) << 28)) * 0x1p126f;
}

template <typename XT, bool kVec, int R>
__global__ void __launch_bounds__(kSimtWarps * 32) w4a16_simt_kernel(const W4A16Args a) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t M = a.p.m, N = a.p.n, K = a.p.k;
  const int64_t n = int64_t(blockIdx.x) * kSimtWarps + warp;
  if (n >= N) return;
  const uint8_t* wrow = a.w + n * a.p.w_row_bytes;
  const uint8_t* srow = a.scales + n * a.p.scale_row_bytes;
  const int64_t srb = a.p.scale_row_bytes;
  const int64_t kbytes = (K + 1) / 2;
  const XT* x = static_cast<const XT*>(a.x);
  const float gs = global_scale_of(a);

  for (int64_t m0 = int64_t(blockIdx.y) * R; m0 < M; m0 += int64_t(gridDim.y) * R) {
    const XT* xr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t m = m0 + r < M ? m0 + r : M - 1;
      xr[r] = x + m * K;
    }
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;

    if constexpr (kVec) {
      const int64_t nchunks = (K + 31) / 32;
      for (int64_t c = lane; c < nchunks; c += 32) {
        const int64_t k0 = c * 32;
        const bool full = k0 + 32 <= K;
        uint32_t wv[4];
        if (full) {
          const uint4 v = load_stream16(wrow + c * 16);
          wv[0] = v.x;
          wv[1] = v.y;
          wv[2] = v.z;
          wv[3] = v.w;
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            uint32_t word = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int64_t b = c * 16 + 4 * q + i;
              word |= (b < kbytes ? uint32_t(wrow[b]) : 0u) << (8 * i);
            }
            wv[q] = word;
          }
        }
        const float s0 = fp4::e4m3_to_float(srow[2 * c]);
        const float s1 = 2 * c + 1 < srb ? fp4::e4m3_to_float(srow[2 * c + 1]) : 0.0f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float sc = q < 2 ? s0 : s1;
          float wq[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) wq[i] = e2m1_fast(wv[q] >> (4 * i)) * sc;
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float xv[8];
            if (full) {
              load8(xr[r] + k0 + 8 * q, xv);
            } else {
#pragma unroll
              for (int i = 0; i < 8; ++i) xv[i] = k0 + 8 * q + i < K ? to_float(xr[r][k0 + 8 * q + i]) : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[r] = fmaf(wq[i], xv[i], acc[r]);
          }
        }
      }
    } else {
      for (int64_t b = lane; b < kbytes; b += 32) {
        const uint32_t byte = wrow[b];
        const float sc = fp4::e4m3_to_float(srow[b / 8]);
        const int64_t k = 2 * b;
        const float lo = fp4::e2m1_to_float(byte & 0xFu) * sc;
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = fmaf(lo, to_float(xr[r][k]), acc[r]);
        if (k + 1 < K) {
          const float hi = fp4::e2m1_to_float(byte >> 4) * sc;
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r] = fmaf(hi, to_float(xr[r][k + 1]), acc[r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xFFFFFFFFu, acc[r], off);
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t m = m0 + r;
        if (m < M) store_from_float(a.out, a.p.out_dtype, m * N + n, finish(a, acc[r], m, n, gs));
      }
    }
  }
}

// ------------------------------------------------------------------------------------------
// Dequantize W to [N, K] in OT (exact: at most 6 significant bits, in range for bf16/fp16/fp32).

template <typename OT>
__device__ __forceinline__ OT from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Grid: x = groups of kDequantThreads * kDequantWords words (8 values) along a row, y = rows
// (looping past 65535). Lane l of a block handles words base + u * kDequantThreads + l, so each
// load instruction reads 4 contiguous bytes per lane and each store writes 16 contiguous bytes per
// lane (ncu: with 64 bytes per thread, the strided 16-byte stores made L2 the bottleneck).
// kVec (K % 8 == 0, aligned rows) with 16-bit outputs: the register decode of the tensor-core
// kernel; otherwise the float decode with guarded accesses.
template <typename OT, bool kVec>
__global__ void __launch_bounds__(kDequantThreads) w4a16_dequant_kernel(const DequantArgs d) {
  constexpr bool kHalf = !std::is_same_v<OT, float>;
  const int64_t wpr = (d.k + 7) / 8;  // words of 8 values per row
  __shared__ uint32_t s_scale[256];
  uint32_t unscale = 0;
  if constexpr (kHalf) {
    // Scale pairs as in the tensor-core kernel (value * scale * 2^-7), and the pair 2^7.
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s_scale[i] = Mma16<OT>::scale_pair(fp4::e4m3_to_float(i));
    unscale = std::is_same_v<OT, __half> ? Mma16<OT>::scale_pair(1.0f) : Mma16<OT>::scale_pair(0x1p-112f);
    __syncthreads();
  }
  constexpr int U = kDequantWords;
  for (int64_t n = blockIdx.y; n < d.n; n += gridDim.y) {
    const uint8_t* wrow = d.w + n * d.w_row_bytes;
    const uint8_t* srow = d.scales + n * d.scale_row_bytes;
    OT* orow = static_cast<OT*>(d.out) + n * d.k;
    for (int64_t base = int64_t(blockIdx.x) * (kDequantThreads * U); base < wpr;
         base += int64_t(gridDim.x) * (kDequantThreads * U)) {
      if constexpr (kVec && kHalf) {
        using Mma = Mma16<OT>;
        uint32_t wv[U], sv[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t j = base + u * kDequantThreads + threadIdx.x;
          if (j < wpr) {
            wv[u] = __ldg(reinterpret_cast<const uint32_t*>(wrow) + j);
            sv[u] = __ldg(srow + (j >> 1));
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t j = base + u * kDequantThreads + threadIdx.x;
          if (j >= wpr) continue;
          uint32_t pr[4];
          fp4_word<OT>(wv[u], pr);
          const uint32_t sp = s_scale[sv[u]];
#pragma unroll
          for (int i = 0; i < 4; ++i) pr[i] = Mma::mul(Mma::mul(pr[i], sp), unscale);
          // (k, k+4) pairs -> (k, k+1) pairs.
          reinterpret_cast<uint4*>(orow)[j] =
              make_uint4(__byte_perm(pr[0], pr[1], 0x5410), __byte_perm(pr[2], pr[3], 0x5410),
                         __byte_perm(pr[0], pr[1], 0x7632), __byte_perm(pr[2], pr[3], 0x7632));
        }
      } else {
        const int64_t kbytes = (d.k + 1) / 2;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t j = base + u * kDequantThreads + threadIdx.x;
          if (j >= wpr) continue;
          for (int i = 0; i < 8; ++i) {
            const int64_t k = 8 * j + i;
            if (k >= d.k) break;
            const uint32_t byte = k / 2 < kbytes ? uint32_t(wrow[k / 2]) : 0u;
            const uint32_t code = (k & 1) ? (byte >> 4) : (byte & 0xFu);
            orow[k] = from_float<OT>(fp4::e2m1_to_float(code) * fp4::e4m3_to_float(srow[k / fp4::kBlockSize]));
          }
        }
      }
    }
  }
}

// fp32 products [M, N] (from cuBLAS) -> global scale (unless applied) -> epilogue -> out dtype.
__global__ void __launch_bounds__(kElementwiseThreads) w4a16_epilogue_kernel(const EpilogueArgs e) {
  const int64_t total = e.a.p.m * e.a.p.n;
  const float gs = e.scaled ? 1.0f : global_scale_of(e.a);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t row = idx / e.a.p.n;
    const int64_t col = idx - row * e.a.p.n;
    store_from_float(e.a.out, e.a.p.out_dtype, idx, finish(e.a, e.acc[idx], row, col, gs));
  }
}

__device__ float g_const_zero = 0.0f;
__device__ float g_const_one = 1.0f;

// ------------------------------------------------------------------------------------------
// Host side

void throw_cuda(cudaError_t e, const char* what) {
  throw std::runtime_error(std::string("[W4A16Matmul] CUDA backend: ") + what + " failed: " +
                           cudaGetErrorString(e));
}

template <typename Kernel>
CUfunction func_of(Kernel kernel) {
  cudaFunction_t f = nullptr;
  const cudaError_t e = cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(kernel));
  if (e != cudaSuccess) throw_cuda(e, "cudaGetFuncBySymbol");
  return reinterpret_cast<CUfunction>(f);
}

template <typename T, int MT, int RT>
CUfunction tc_func_rt(bool vec) {
  if (vec) return func_of(w4a16_tc_kernel<T, MT, RT, true>);
  return func_of(w4a16_tc_kernel<T, MT, 1, false>);  // guarded loads: one variant per MT is enough
}

template <typename T>
CUfunction staged_func_t(int mt, int rt) {
  switch (mt) {
    case 1: return rt == 1 ? func_of(w4a16_tc_staged_kernel<T, 1, 1>) : func_of(w4a16_tc_staged_kernel<T, 1, 2>);
    case 2: return rt == 1 ? func_of(w4a16_tc_staged_kernel<T, 2, 1>) : func_of(w4a16_tc_staged_kernel<T, 2, 2>);
    default: return rt == 1 ? func_of(w4a16_tc_staged_kernel<T, 4, 1>) : func_of(w4a16_tc_staged_kernel<T, 4, 2>);
  }
}

unsigned staged_smem_bytes(int rt, int kw) {
  return static_cast<unsigned>(kw * kStages * (rt == 1 ? staged_slot_bytes<1>() : staged_slot_bytes<2>()));
}

template <typename T>
CUfunction tc_func_t(int mt, int rt, bool vec) {
  switch (mt) {
    case 1: return rt == 1 ? tc_func_rt<T, 1, 1>(vec) : tc_func_rt<T, 1, 2>(vec);
    case 2: return rt == 1 ? tc_func_rt<T, 2, 1>(vec) : tc_func_rt<T, 2, 2>(vec);
    case 4: return rt == 1 ? tc_func_rt<T, 4, 1>(vec) : tc_func_rt<T, 4, 2>(vec);
    default: return tc_func_rt<T, 8, 1>(vec);
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

unsigned grid_for_elements(int64_t items) {
  int64_t blocks = ceil_div(items, kElementwiseThreads);
  const int64_t cap = 65535LL * 16;  // grid-stride loops cover the rest
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks);
}

bool parse_tc(const char* s, TcConfig& cfg) {
  int mt = 0, rt = 0, kw = 0;
  if (!s || std::sscanf(s, "%d,%d,%d", &mt, &rt, &kw) != 3) return false;
  if (mt != 1 && mt != 2 && mt != 4 && mt != 8) return false;
  if (rt != 1 && rt != 2) return false;
  if (mt * rt > 8 || kw < 1 || kw > kMaxWarpsPerBlock) return false;
  cfg = TcConfig{mt, rt, kw};
  return true;
}

}  // namespace

bool vector_loads_ok(const fp4::W4A16Problem& p, const void* x, const void* w) {
  return p.k % 8 == 0 && p.w_row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

bool staged_loads_ok(const fp4::W4A16Problem& p, const void* x, const void* w, const void* scales) {
  return vector_loads_ok(p, x, w) && p.k % kStepK == 0 && p.scale_row_bytes % kStageScaleBytes == 0 &&
         reinterpret_cast<uintptr_t>(scales) % kStageScaleBytes == 0;
}

// Dispatch. Crossovers measured on an H200 (docs/cuda.md): tensor-core kernel up to
// kTcMaxM rows of x, then dequantize + cuBLAS; float32 x uses the SIMT kernel while M is small.
namespace {
constexpr int64_t kTcMaxM = 32;
constexpr int64_t kSimtMaxM = 32;

// Measured on the H200 (docs/cuda.md): about 2048 warps in flight is best; two weight-row tiles
// per warp (rt = 2, x fragments reused twice) when N still gives every SM a block, and warps per
// block (kw) splitting K up to 16 warps per SM, with at least 2 steps of K per warp.
// The staged kernel (its own measured optimum, docs/cuda.md): always two row tiles per warp, and
// warps per block doubled while the grid stays within about 8 warps per SM (8192^2: 4, 14336 x
// 4096: 2, 4096 x 14336: 8), since its ring already keeps 3 steps per warp in flight.
TcConfig auto_tc_config(const fp4::W4A16Problem& p, const DeviceInfo& dev, bool staged) {
  TcConfig c;
  const int64_t m = p.m;
  c.mt = m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8;
  if (staged && m <= kStagedTcMaxM && c.mt > kMaxStagedColTiles) c.mt = kMaxStagedColTiles;
  const bool staged_tile = staged && c.mt <= kMaxStagedColTiles;
  c.rt = (c.mt * 2 <= 8 && (staged_tile || ceil_div(p.n, 2 * kMmaRows) >= dev.sm_count)) ? 2 : 1;
  const int64_t blocks = ceil_div(p.m, kMmaCols * c.mt) * ceil_div(p.n, kMmaRows * c.rt);
  const int64_t nsteps = ceil_div(p.k, kStepK);
  const int64_t warp_budget = int64_t(dev.sm_count) * (staged_tile ? kStagedWarpsPerSm : 2 * kStagedWarpsPerSm);
  int kw = 1;
  if (staged_tile) {
    while (kw < kMaxWarpsPerBlock && blocks * kw * 2 <= warp_budget && nsteps >= 4 * kw * 2) kw *= 2;
  } else {
    while (kw < kMaxWarpsPerBlock && blocks * kw * 2 <= warp_budget && nsteps >= 4 * kw) kw *= 2;
  }
  c.kw = kw;
  return c;
}
}  // namespace

Plan plan_w4a16(const fp4::W4A16Problem& p, const DeviceInfo& dev, bool vec, bool staged,
                const char* path_override, const char* tc_override) {
  Plan plan;
  plan.vec = vec;
  plan.staged = vec && staged;
  const bool half_x = p.x_dtype == fp4::kDtypeBF16 || p.x_dtype == fp4::kDtypeF16;
  plan.tc = auto_tc_config(p, dev, plan.staged);
  if (half_x) {
    // Past kTcMaxM the staged kernel (x tiles of 32 rows) still beats dequantize + cuBLASLt up
    // to kStagedTcMaxM when its grid gets at least 2 warps per block (measured, docs/cuda.md).
    const bool staged_mid = plan.staged && p.m <= kStagedTcMaxM && plan.tc.kw >= 2;
    plan.path = (p.m <= kTcMaxM || staged_mid) ? Path::kTensorCore : Path::kDequantGemm;
  } else {
    plan.path = p.m <= kSimtMaxM ? Path::kSimt : Path::kDequantGemm;
  }
  if (path_override && *path_override) {
    if (!std::strcmp(path_override, "simt")) plan.path = Path::kSimt;
    if (!std::strcmp(path_override, "dequant")) plan.path = Path::kDequantGemm;
    if (!std::strcmp(path_override, "tc") && half_x) plan.path = Path::kTensorCore;
  }
  TcConfig forced;
  if (parse_tc(tc_override, forced)) plan.tc = forced;
  return plan;
}

Launch tc_launch(const fp4::W4A16Problem& p, const TcConfig& cfg, bool vec, bool staged) {
  Launch l;
  staged = staged && vec && cfg.mt <= kMaxStagedColTiles;
  const int rt = vec ? cfg.rt : 1;
  if (staged) {
    l.func = p.x_dtype == fp4::kDtypeF16 ? staged_func_t<__half>(cfg.mt, rt) : staged_func_t<__nv_bfloat16>(cfg.mt, rt);
  } else {
    l.func = p.x_dtype == fp4::kDtypeF16 ? tc_func_t<__half>(cfg.mt, rt, vec)
                                         : tc_func_t<__nv_bfloat16>(cfg.mt, rt, vec);
  }
  const int64_t gx = ceil_div(p.m, kMmaCols * cfg.mt);
  const int64_t gy = ceil_div(p.n, kMmaRows * rt);
  if (gy > 65535 || gx > 0x7FFFFFFF) {
    throw std::runtime_error("[W4A16Matmul] CUDA backend: N too large for the tensor-core grid");
  }
  l.grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), 1);
  l.block = dim3(32 * cfg.kw, 1, 1);
  l.smem = staged ? staged_smem_bytes(rt, cfg.kw) : 0;
  return l;
}

template <typename XT>
CUfunction simt_func(bool vec, int rows) {
  if (rows == 1) return vec ? func_of(w4a16_simt_kernel<XT, true, 1>) : func_of(w4a16_simt_kernel<XT, false, 1>);
  return vec ? func_of(w4a16_simt_kernel<XT, true, kSimtRows>) : func_of(w4a16_simt_kernel<XT, false, kSimtRows>);
}

Launch simt_launch(const fp4::W4A16Problem& p, bool vec) {
  Launch l;
  const int rows = p.m == 1 ? 1 : kSimtRows;  // one row of x: no redundant passes
  l.func = p.x_dtype == fp4::kDtypeF32   ? simt_func<float>(vec, rows)
           : p.x_dtype == fp4::kDtypeF16 ? simt_func<__half>(vec, rows)
                                         : simt_func<__nv_bfloat16>(vec, rows);
  const int64_t gx = ceil_div(p.n, kSimtWarps);
  int64_t gy = ceil_div(p.m, rows);
  if (gy > 65535) gy = 65535;  // the kernel loops over the remaining rows of x
  if (gx > 0x7FFFFFFF) throw std::runtime_error("[W4A16Matmul] CUDA backend: N too large");
  l.grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), 1);
  l.block = dim3(kSimtWarps * 32, 1, 1);
  return l;
}

Launch dequant_launch(const DequantArgs& d, bool vec) {
  Launch l;
  switch (d.out_dtype) {
    case fp4::kDtypeF32:
      l.func = vec ? func_of(w4a16_dequant_kernel<float, true>) : func_of(w4a16_dequant_kernel<float, false>);
      break;
    case fp4::kDtypeF16:
      l.func = vec ? func_of(w4a16_dequant_kernel<__half, true>) : func_of(w4a16_dequant_kernel<__half, false>);
      break;
    default:
      l.func = vec ? func_of(w4a16_dequant_kernel<__nv_bfloat16, true>)
                   : func_of(w4a16_dequant_kernel<__nv_bfloat16, false>);
      break;
  }
  const int64_t gx = ceil_div(ceil_div(d.k, 8), int64_t(kDequantThreads) * kDequantWords);
  const int64_t gy = d.n < 65535 ? d.n : 65535;
  l.grid = dim3(static_cast<unsigned>(gx < 65535 ? gx : 65535), static_cast<unsigned>(gy > 0 ? gy : 1), 1);
  l.block = dim3(kDequantThreads, 1, 1);
  return l;
}

Launch epilogue_launch(const fp4::W4A16Problem& p) {
  Launch l;
  l.func = func_of(w4a16_epilogue_kernel);
  l.grid = dim3(grid_for_elements(p.m * p.n), 1, 1);
  l.block = dim3(kElementwiseThreads, 1, 1);
  return l;
}

void preload_kernels() {
  // With lazy module loading (the CUDA 12+ default) a kernel is loaded on first use, which costs
  // milliseconds; do it once for all of them instead of on the first call of each shape.
  for (int dt : {fp4::kDtypeBF16, fp4::kDtypeF16, fp4::kDtypeF32}) {
    fp4::W4A16Problem p{};
    p.m = p.n = p.k = 1;
    p.x_dtype = dt;
    for (bool vec : {true, false}) {
      if (dt != fp4::kDtypeF32) {
        for (int mt : {1, 2, 4, 8})
          for (int rt : {1, 2})
            if (mt * rt <= 8) {
              tc_launch(p, TcConfig{mt, rt, 1}, vec, false);
              if (!vec || mt > kMaxStagedColTiles) continue;
              // The staged kernels take more than the default 48 KB of dynamic shared memory.
              const Launch l = tc_launch(p, TcConfig{mt, rt, kMaxWarpsPerBlock}, true, true);
              const CUresult r = cuFuncSetAttribute(l.func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                    static_cast<int>(l.smem));
              if (r != CUDA_SUCCESS) throw std::runtime_error("[W4A16Matmul] CUDA backend: cuFuncSetAttribute failed");
            }
      }
      simt_launch(p, vec);
      p.m = 2;
      simt_launch(p, vec);
      p.m = 1;
      DequantArgs d{};
      d.n = d.k = 1;
      d.out_dtype = dt;
      dequant_launch(d, vec);
    }
  }
  epilogue_launch(fp4::W4A16Problem{});
}

const float* device_constant_zero() {
  void* ptr = nullptr;
  const cudaError_t e = cudaGetSymbolAddress(&ptr, g_const_zero);
  if (e != cudaSuccess) throw_cuda(e, "cudaGetSymbolAddress");
  return static_cast<const float*>(ptr);
}

const float* device_constant_one() {
  void* ptr = nullptr;
  const cudaError_t e = cudaGetSymbolAddress(&ptr, g_const_one);
  if (e != cudaSuccess) throw_cuda(e, "cudaGetSymbolAddress");
  return static_cast<const float*>(ptr);
}

}  // namespace cuda
}  // namespace mlx_fp4
