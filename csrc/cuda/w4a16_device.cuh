// Device helpers of the CUDA W4A16 kernels: element access, the fused epilogue, streaming loads, the
// register FP4 decode and the tensor-core step / reduction shared by both tensor-core kernels.
// Included by w4a16_matmul.cu only (one translation unit, internal linkage).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

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

// Product blockIdx.z of a batched launch (W4A16Args::batch_rhs): pointers moved to its expert,
// x matrix, output rows and operand rows (Row/Full operands are indexed by the output row).
// `live` is false for an out-of-range pair: only `out` is moved then (batch_fill_nan).
__device__ __forceinline__ W4A16Args batch_view(const W4A16Args& a, bool& live) {
  W4A16Args b = a;
  const int64_t z = blockIdx.z, M = a.p.m, N = a.p.n;
  const uint32_t e = a.batch_rhs[z], l = a.batch_lhs[z];
  live = e < a.batch_experts && l < a.batch_x_matrices;
  const int out_size = fp4::dtype_bytes(a.p.out_dtype);
  b.out = static_cast<uint8_t*>(a.out) + z * M * N * out_size;
  if (!live) return b;
  b.w = a.w + e * a.w_batch_bytes;
  b.scales = a.scales + e * a.scale_batch_bytes;
  b.x = static_cast<const uint8_t*>(a.x) + int64_t(l) * M * a.p.k * fp4::dtype_bytes(a.p.x_dtype);
  if (a.p.has_global_scale && a.multiplier_per_expert) b.global_scale = a.global_scale + e;
  for (int i = 0; i < a.p.num_operands; ++i) {
    const int kind = a.p.operand_kind[i];
    const int64_t rows_first = kind == fp4::kOperandRow ? z * M : kind == fp4::kOperandFull ? z * M * N : 0;
    b.operands[i] = static_cast<const uint8_t*>(a.operands[i]) + rows_first * fp4::dtype_bytes(a.p.operand_dtype[i]);
  }
  return b;
}

// NaN rows for an out-of-range pair: the first block of its grid writes them.
__device__ __forceinline__ void batch_fill_nan(const W4A16Args& b) {
  if (blockIdx.x != 0 || blockIdx.y != 0) return;
  for (int64_t i = threadIdx.x; i < b.p.m * b.p.n; i += blockDim.x) {
    store_from_float(b.out, b.p.out_dtype, i, __int_as_float(0x7FC00000));
  }
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

// The contiguous range [begin, end) of the K steps that warp `warp` of `nwarps` takes.
__device__ __forceinline__ void warp_step_range(int64_t nsteps, int warp, int nwarps, int64_t& begin,
                                                int64_t& end) {
  const int64_t per = (nsteps + nwarps - 1) / nwarps;
  begin = int64_t(warp) * per;
  end = (begin + per < nsteps) ? begin + per : nsteps;
}

// Accumulators of one warp: [weight-row tile][x tile][mma C register].
template <int MT, int RT>
__device__ __forceinline__ void zero_acc(float (&acc)[RT][MT][4]) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[rt][j][c] = 0.0f;
}

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

}  // namespace
}  // namespace cuda
}  // namespace mlx_fp4
