// Device helpers of the CUDA W4A16 kernels: element access, the fused epilogue, streaming loads, the
// register FP4 decode and the tensor-core step / reduction shared by both tensor-core kernels, for
// either scale format (fp4::Mode, a template parameter: TcLane says how a lane's k and scales lie).
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

// Global scale (once, in fp32), then the epilogue chain, in the order given. `p` and `operands`
// must be the kernel's parameters themselves, never a copy in a local variable: the chain indexes
// them at run time, which puts a copy in local memory (392-840 bytes written per thread, more
// than the weights a decode GEMV reads).
__device__ __forceinline__ float finish(const fp4::W4A16Problem& p, const void* const (&operands)[fp4::kMaxEpilogueOperands],
                                        float acc, int64_t row, int64_t col, float gs) {
  float v = acc * gs;
  for (int i = 0; i < p.num_ops; ++i) {
    const fp4::EpilogueOp op = p.ops[i];
    // Ops without a tensor operand take the constant p0 (e.g. ("add", 0.5)).
    float operand = op.p0;
    if (op.operand >= 0) {
      const int kind = p.operand_kind[op.operand];
      operand = load_as_float(operands[op.operand], p.operand_dtype[op.operand], fp4::operand_offset(kind, row, col, p.n));
    }
    v = fp4::epilogue_apply(op.code, v, operand, op.p0, op.p1);
  }
  return v;
}
__device__ __forceinline__ float finish(const W4A16Args& a, float acc, int64_t row, int64_t col, float gs) {
  return finish(a.p, a.operands, acc, row, col, gs);
}

// The multiplier of expert `e` of a grouped or batched launch (a.global_scale when not per expert).
__device__ __forceinline__ const float* expert_multiplier(const W4A16Args& a, int64_t e) {
  return a.p.has_global_scale && a.global_scale_per_expert ? a.global_scale + e : a.global_scale;
}

// Product blockIdx.z of a batched launch (W4A16Args::batch_rhs): pointers moved to its expert,
// x matrix and output rows. The operands stay: the store indexes them by the launch's output row
// (z * M + m, batch_chain_row0). `live` is false for an out-of-range pair: only `out` is moved
// then (batch_fill_nan).
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
  b.global_scale = expert_multiplier(a, e);
  return b;
}
__device__ __forceinline__ int64_t batch_chain_row0(const W4A16Args& a) { return int64_t(blockIdx.z) * a.p.m; }

// Pair z of a batched launch with one row of x per pair is in range when both its indices are.
__device__ __forceinline__ bool pair_in_range(const W4A16Args& a, int64_t z) {
  return a.batch_rhs[z] < a.batch_experts && a.batch_lhs[z] < a.batch_x_matrices;
}

// Grid z of a runs launch (one row of x per pair; kStagedRuns): consecutive in-range pairs of one
// expert are one product of up to kCap rows, so an expert's weights are read once per run, not
// once per pair (mlx-lm sorts the pairs by expert from 64 on). Pair z starts a run when it is
// the first of its kCap-aligned window, out of range, after an out-of-range pair or after another
// expert; the run is its pairs up to the next start, so every pair belongs to exactly one run.
// Other blocks have nothing to do (`live` false, `dead` false); an out-of-range start is one NaN
// row (`dead`). The run's rows read x rows lhs[z..] (x_rows) and write out rows z.. in order.
template <int kCap>
__device__ __forceinline__ W4A16Args runs_view(const W4A16Args& a, bool& live, bool& dead) {
  W4A16Args b = a;
  const int64_t z = blockIdx.z, pairs = gridDim.z;
  const uint32_t e = a.batch_rhs[z];
  const bool ok = pair_in_range(a, z);
  const bool start = z % kCap == 0 || !ok || !pair_in_range(a, z - 1) || a.batch_rhs[z - 1] != e;
  b.out = static_cast<uint8_t*>(a.out) + z * a.p.n * fp4::dtype_bytes(a.p.out_dtype);
  b.p.m = 1;
  dead = start && !ok;
  live = start && ok;
  if (!live) return b;
  int64_t r = 1;
  while (z + r < pairs && (z + r) % kCap != 0 && a.batch_rhs[z + r] == e && pair_in_range(a, z + r)) ++r;
  b.p.m = r;
  b.w = a.w + e * a.w_batch_bytes;
  b.scales = a.scales + e * a.scale_batch_bytes;
  b.global_scale = expert_multiplier(a, e);
  // In range, so each index is below batch_x_matrices, an int32 row count of x.
  b.x_rows = reinterpret_cast<const int32_t*>(a.batch_lhs + z);
  return b;
}

// Tile `tile` of a grouped launch (W4A16Args::group_*): its expert, its first row in the sorted
// order and the rows left in its group from there (the kernel's tile covers what fits).
// `live` is false past the plan's tile count.
struct GroupTile {
  int64_t expert, row0, rows;
};
__device__ __forceinline__ GroupTile group_tile(const W4A16Args& a, int64_t tile, bool& live) {
  live = tile < *a.group_num_tiles;
  if (!live) return GroupTile{0, 0, 0};
  const int64_t e = a.group_tiles[2 * tile];
  const int64_t row0 = int64_t(a.group_start[e]) * a.p.m + a.group_tiles[2 * tile + 1];
  return GroupTile{e, row0, int64_t(a.group_start[e + 1]) * a.p.m - row0};
}

// Tile blockIdx.x of a grouped launch as a dense product: p.m = the rows left in its group, w,
// scales and multiplier moved to its expert, row maps to its rows.
__device__ __forceinline__ W4A16Args group_view(const W4A16Args& a, bool& live) {
  W4A16Args b = a;
  const GroupTile t = group_tile(a, blockIdx.x, live);
  if (!live) return b;
  b.p.m = t.rows;
  b.w = a.w + t.expert * a.w_batch_bytes;
  b.scales = a.scales + t.expert * a.scale_batch_bytes;
  b.global_scale = expert_multiplier(a, t.expert);
  b.x_rows = a.x_rows + t.row0;
  b.out_rows = a.out_rows + t.row0;
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
  return a.p.has_global_scale ? fp4::decode_multiplier(*a.global_scale) : 1.0f;
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

// One 32-bit word of a weight row (MXFP4 lane layout: the 4 lanes of a row read one 16-byte block,
// and the next word of the same sector comes from L1), with the same L2 prefetch.
__device__ __forceinline__ uint32_t load_stream4(const void* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::evict_first.L2::256B.u32 %0, [%1];" : "=r"(v) : "l"(p));
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
  // 2^126 in both halves: turns a bit-built pair (value * 2^-126) into the E2M1 values (MXFP4).
  static constexpr uint32_t kValuePair = 0x7E807E80u;
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
  static constexpr uint32_t kValuePair = 0x74007400u;  // 2^14 in both halves (value * 2^-14 -> value)
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

// Accumulator correction for the 2^-7 folded into the decoded weights (NVFP4; MXFP4 operands are
// the E2M1 values themselves).
constexpr float kTcAccScale = 128.0f;
__host__ __device__ constexpr float tc_acc_scale(int mode) { return mode == fp4::kModeMxfp4 ? 1.0f : kTcAccScale; }

// Where a lane's values and scales lie in one 128-wide K step (lane t = lane % 4 of rows g, g + 8),
// per scale format. The two mma k-slices of word q take four values from each lane t.
//  - NVFP4: lane t holds k = 32t .. 32t + 31 (word q: 32t + 8q): one 16-byte load per row; its two
//    blocks of 16 scale the 16-bit operands (scale pairs, E4M3 fits fp16 and bf16).
//  - MXFP4: word q of lane t holds k = 32q + 8t .. +7, so both k-slices of word q (all four lanes)
//    lie in block q of 32. E8M0 (2^-127 .. 2^127, NaN) does not fit a 16-bit operand: the mma of
//    block q runs on the E2M1 values and its fp32 result is multiplied by the block's fp32 scale.
template <int Mode>
struct TcLane {
  static constexpr bool kMx = Mode == fp4::kModeMxfp4;
  static constexpr int kBlocksPerStep = kStepK / fp4::block_size(Mode);
  static constexpr int kScales = kMx ? kBlocksPerStep : kLaneK / fp4::kNvfp4BlockSize;  // per row and step
  static constexpr int kQStride = kMx ? kLaneK : fp4::kValuesPerWord;  // k between words q and q + 1
  // First k (within the step) of word 0 of lane t; word q starts kQStride * q later.
  __device__ static __forceinline__ int k0(int t) { return kMx ? fp4::kValuesPerWord * t : kLaneK * t; }
  // First scale block of lane t in step s (its kScales blocks are consecutive).
  __device__ static __forceinline__ int64_t block0(int64_t s, int t) {
    return s * kBlocksPerStep + (kMx ? 0 : kScales * t);
  }
};

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

// One 128-wide K step on registers: W words of rows (g, g+8) of each row tile (TcLane layout), their
// scales sc (NVFP4: 16-bit scale pairs per block of 16; MXFP4: fp32 bits per block of 32) and x as
// four 16-byte groups per x tile (group q: k = TcLane::k0(t) + q * kQStride .. +7).
template <typename T, int MT, int RT, int Mode = fp4::kModeNvfp4>
__device__ __forceinline__ void tc_step(float (&acc)[RT][MT][4], const uint32_t (&w)[RT][2][4],
                                        const uint32_t (&sc)[RT][2][TcLane<Mode>::kScales],
                                        const uint4 (&X)[MT][4]) {
  using Mma = Mma16<T>;
  constexpr bool kMx = TcLane<Mode>::kMx;
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
      // 16-bit operand multipliers: the block scale pairs (NVFP4), or the constant that turns the
      // bit-built pairs into the E2M1 values (MXFP4: exact, products with x exact in fp32).
      const uint32_t s0 = kMx ? Mma::kValuePair : sc[rt][0][(q >> 1) % TcLane<Mode>::kScales];
      const uint32_t s1 = kMx ? Mma::kValuePair : sc[rt][1][(q >> 1) % TcLane<Mode>::kScales];
      uint32_t p0[4], p1[4];
      fp4_word<T>(w[rt][0][q], p0);
      fp4_word<T>(w[rt][1][q], p1);
      // MXFP4: the fp32 products of block q per x tile, scaled into acc after both k-slices.
      float blk[MT][4];
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) blk[j][c] = 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t a0 = Mma::mul(p0[2 * h], s0);
        const uint32_t a1 = Mma::mul(p1[2 * h], s1);
        const uint32_t a2 = Mma::mul(p0[2 * h + 1], s0);
        const uint32_t a3 = Mma::mul(p1[2 * h + 1], s1);
#pragma unroll
        for (int j = 0; j < MT; ++j) Mma::mma(kMx ? blk[j] : acc[rt][j], a0, a1, a2, a3, bx[j][h][0], bx[j][h][1]);
      }
      if constexpr (kMx) {
        // Rows g (c0, c1) and g + 8 (c2, c3) times the fp32 scale of their block q.
        const float g0 = __uint_as_float(sc[rt][0][q % TcLane<Mode>::kScales]);
        const float g8 = __uint_as_float(sc[rt][1][q % TcLane<Mode>::kScales]);
#pragma unroll
        for (int j = 0; j < MT; ++j) {
          acc[rt][j][0] = fmaf(g0, blk[j][0], acc[rt][j][0]);
          acc[rt][j][1] = fmaf(g0, blk[j][1], acc[rt][j][1]);
          acc[rt][j][2] = fmaf(g8, blk[j][2], acc[rt][j][2]);
          acc[rt][j][3] = fmaf(g8, blk[j][3], acc[rt][j][3]);
        }
      }
    }
  }
}

// Block scales ready-made per byte: NVFP4 as 16-bit pairs (scale * 2^119 for bf16, * 2^7 for fp16),
// MXFP4 as fp32 bits (fp4::e8m0_to_float: 2^-127 subnormal, 0xFF NaN). One shared memory load per
// block instead of a decode.
constexpr int kScaleTableSize = 256;
template <typename T, int Mode = fp4::kModeNvfp4>
__device__ __forceinline__ void fill_scale_table(uint32_t* s_scale) {
  for (int i = threadIdx.x; i < kScaleTableSize; i += blockDim.x) {
    s_scale[i] = Mode == fp4::kModeMxfp4 ? __float_as_uint(fp4::e8m0_to_float(i))
                                         : Mma16<T>::scale_pair(fp4::e4m3_to_float(i));
  }
  __syncthreads();
}

// Cross-warp reduction of the accumulators in a fixed order (deterministic); store(m, n, sum)
// gets each tile element's sum (m, n may lie past the problem: the store bounds them). `red`
// holds nwarps * RT * MT * 4 * 32 floats of shared memory.
template <int MT, int RT, typename Store>
__device__ __forceinline__ void tc_reduce(const float (&acc)[RT][MT][4], float* red, int64_t m_base, int64_t n_base,
                                          Store store) {
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
  for (int idx = threadIdx.x; idx < kSlots * 32; idx += blockDim.x) {
    const int slot = idx >> 5;
    const int ln = idx & 31;
    float sum = 0.0f;
    for (int w = 0; w < nwarps; ++w) sum += red[(w * kSlots + slot) * 32 + ln];
    const int c = slot & 3;
    const int j = (slot >> 2) % MT;
    const int rt = (slot >> 2) / MT;
    store(m_base + j * kMmaCols + 2 * (ln & 3) + (c & 1), n_base + rt * kMmaRows + (ln >> 2) + (c >= 2 ? 8 : 0), sum);
  }
}

// The dense kernels' store: rows m of x (out_rows[m] when grouped), global scale, chain, cast.
// `a` is the block's product (a batched or grouped view); the chain comes from the kernel's
// parameters `chain` (finish), indexed by output row chain_row0 + row.
template <int MT, int RT, bool kGrouped = false>
__device__ __forceinline__ void tc_reduce_store(const W4A16Args& a, const W4A16Args& chain, const float (&acc)[RT][MT][4],
                                                float* red, int64_t m_base, int64_t n_base,
                                                float acc_scale = kTcAccScale, int64_t chain_row0 = 0) {
  const float gs = global_scale_of(a);
  tc_reduce<MT, RT>(acc, red, m_base, n_base, [&](int64_t m, int64_t n, float sum) {
    if (n < a.p.n && m < a.p.m) {
      const int64_t row = kGrouped ? int64_t(a.out_rows[m]) : m;
      store_from_float(a.out, a.p.out_dtype, row * a.p.n + n,
                       finish(chain.p, chain.operands, sum * acc_scale, chain_row0 + row, n, gs));
    }
  });
}

}  // namespace
}  // namespace cuda
}  // namespace mlx_fp4
