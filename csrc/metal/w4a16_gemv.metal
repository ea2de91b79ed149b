// The vector path of the W4A16 NVFP4 matmul on Apple GPUs (M <= kMetalGemvMaxM):
// out = epilogue(gs * (x @ dequant(w, scales)^T)), registers only, no threadgroup memory, no
// threadgroup barrier. Layouts as in w4a16_matmul.metal. The file must stay ASCII.
#include "w4a16_device.h"

// Resolved when the pipeline is created (kMetalFcGemvAligned, set by the host).
constant bool fc_gemv_aligned [[function_constant(kMetalFcGemvAligned)]];

// Per-thread state: the MT x R fp32 accumulators, and the R weight and scale rows.
template <int MT, int R>
struct GemvAcc {
  float v[MT][R];
};
template <int R>
struct GemvRows {
  device const uchar* w[R];
  device const uchar* s[R];
};

// Accumulates every whole 16-column block of K: lane l owns blocks l, l + 32, ... For each block
// it loads the R weight rows' 8-byte words and scales once, decodes them into registers (bit-built
// halves, fp32), then for each of the MT rows of x loads the 16 x values once and dots them with
// the R rows; the block scale multiplies each 16-term partial sum once.
// ALIGNED: 8-byte weight loads and 4-element x loads; otherwise byte and element loads.
// FULL: all MT rows of x exist (no per-row check).
// 16 consecutive x values as fp32, as 4-element vector loads (x rows 4-element aligned).
template <typename XT>
inline void load_x16(device const XT* xr, thread float* xv) {
  for (int q4 = 0; q4 < kBlockSize / 4; ++q4) {
    const vec<XT, 4> t = *((device const vec<XT, 4>*)(xr + 4 * q4));
    xv[4 * q4] = float(t.x);
    xv[4 * q4 + 1] = float(t.y);
    xv[4 * q4 + 2] = float(t.z);
    xv[4 * q4 + 3] = float(t.w);
  }
}

// The scale of 16-column block b of a row and the factor its partial sums take: NVFP4 folds the
// bit-built offset 2^14 into the E4M3 value; MXFP4 multiplies the sum by 2^14 first (exact), since
// 2^14 times a large E8M0 scale would overflow.
// MX is a template parameter (the kernel branches once, uniformly): the NVFP4 loops are unchanged.
template <bool MX>
inline float gemv_scale(device const uchar* srow, int b) {
  return MX ? e8m0_to_float(srow[b / (kMxfp4BlockSize / kBlockSize)]) : block_scale_f32(srow[b]);
}
template <bool MX>
inline float gemv_unscaled(float d) { return MX ? d * kE2M1HalfUnscale : d; }

template <typename XT, int MT, int R, bool ALIGNED, bool FULL, bool MX>
inline void gemv_blocks(
    thread GemvAcc<MT, R>& acc,
    device const XT* x,
    thread const GemvRows<R>& rows,
    constant W4A16MetalParams& p,
    int m0,
    int rows_m,
    int lane,
    int full_blocks) {
  for (int b = lane; b < full_blocks; b += kMetalSimdWidth) {
    float wf[R][kBlockSize];
    float s[R];
    for (int r = 0; r < R; ++r) {
      device const uchar* wb = rows.w[r] + b * (kBlockSize / kValuesPerByte);
      const uint2 q = ALIGNED ? *((device const uint2*)wb) : load_u2_bytes(wb);
      decode_block16_f32(q, wf[r]);
      s[r] = gemv_scale<MX>(rows.s[r], b);
    }
    for (int mi = 0; mi < MT; ++mi) {
      if (!FULL && mi >= rows_m) {
        break;  // uniform: every lane of the threadgroup has the same rows_m
      }
      device const XT* xr = x + long(m0 + mi) * p.k + b * kBlockSize;
      float xv[kBlockSize];
      if (ALIGNED) {
        load_x16(xr, xv);
      } else {
        for (int i = 0; i < kBlockSize; ++i) {
          xv[i] = float(xr[i]);
        }
      }
      for (int r = 0; r < R; ++r) {
        float d = 0.0f;
        for (int i = 0; i < kBlockSize; ++i) {
          d = fma(xv[i], wf[r][i], d);
        }
        acc.v[mi][r] = fma(gemv_unscaled<MX>(d), s[r], acc.v[mi][r]);
      }
    }
  }
}

// The partial block at the end of K (K % 16 != 0), by one lane: byte loads, nothing read at or
// past K (weight padding nibbles and x columns alike).
template <typename XT, int MT, int R, bool MX>
inline void gemv_tail(
    thread GemvAcc<MT, R>& acc,
    device const XT* x,
    thread const GemvRows<R>& rows,
    constant W4A16MetalParams& p,
    int m0,
    int rows_m,
    int b) {
  const int kb = b * kBlockSize;
  for (int r = 0; r < R; ++r) {
    const float s = gemv_scale<MX>(rows.s[r], b);
    for (int mi = 0; mi < MT; ++mi) {
      if (mi >= rows_m) {
        break;
      }
      device const XT* xr = x + long(m0 + mi) * p.k;
      float d = 0.0f;
      for (int k = kb; k < p.k; ++k) {
        const uint code = uint(rows.w[r][k / kValuesPerByte]) >> (uint(k % kValuesPerByte) * 4u);
        // one code through the pair decode: the low half of pair 0
        const float wv = float(as_type<half2>(e2m1_pair_half_bits(code & kNibbleMask, 0)).x);
        d = fma(float(xr[k]), wv, d);
      }
      acc.v[mi][r] = fma(gemv_unscaled<MX>(d), s, acc.v[mi][r]);
    }
  }
}

// Every block of K into acc: the whole blocks (aligned / full variants), then the tail.
template <typename XT, int MT, int R, bool MX>
inline void gemv_accumulate(
    thread GemvAcc<MT, R>& acc,
    device const XT* x,
    thread const GemvRows<R>& rows,
    constant W4A16MetalParams& p,
    int m0,
    int rows_m,
    int lane) {
  const int full_blocks = p.k / kBlockSize;
  if (fc_gemv_aligned && rows_m == MT) {
    gemv_blocks<XT, MT, R, true, true, MX>(acc, x, rows, p, m0, rows_m, lane, full_blocks);
  } else if (fc_gemv_aligned) {
    gemv_blocks<XT, MT, R, true, false, MX>(acc, x, rows, p, m0, rows_m, lane, full_blocks);
  } else {
    gemv_blocks<XT, MT, R, false, false, MX>(acc, x, rows, p, m0, rows_m, lane, full_blocks);
  }
  if (p.k % kBlockSize != 0 && lane == full_blocks % kMetalSimdWidth) {
    gemv_tail<XT, MT, R, MX>(acc, x, rows, p, m0, rows_m, full_blocks);
  }
}

// One threadgroup: kMetalGemvSimdgroups simdgroups x R weight rows, MT rows of x. Threadgroup
// index = tile_m * tiles_n + tile_n. Weight rows past N are clamped to row N - 1 (read, never
// stored); lanes reduce with simd_sum, lane 0 applies the epilogue and stores.
template <typename XT, typename OutT, int MT>
[[max_total_threads_per_threadgroup(kMetalGemvThreads)]] [[kernel]] void w4a16_gemv(
    device const XT* x [[buffer(kMetalBufX)]],
    device const uchar* w [[buffer(kMetalBufW)]],
    device const uchar* scales [[buffer(kMetalBufScales)]],
    device OutT* out [[buffer(kMetalBufOut)]],
    constant W4A16MetalParams& p [[buffer(kMetalBufParams)]],
    device const float* gscale [[buffer(kMetalBufGlobalScale)]],
    device const uchar* op0 [[buffer(kMetalBufOperand0)]],
    device const uchar* op1 [[buffer(kMetalBufOperand1)]],
    device const uchar* op2 [[buffer(kMetalBufOperand2)]],
    device const uchar* op3 [[buffer(kMetalBufOperand3)]],
    uint tg_index [[threadgroup_position_in_grid]],
    uint sgid [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  constexpr int R = metal_gemv_rows(MT);
  const int tile_n = int(tg_index) % p.tiles_n;
  const int tile_m = int(tg_index) / p.tiles_n;
  const int n0 = (tile_n * kMetalGemvSimdgroups + int(sgid)) * R;
  if (n0 >= p.n) {
    return;  // the whole simdgroup leaves; this kernel has no threadgroup barrier
  }
  const int m0 = tile_m * MT;
  const int rows_m = min(MT, p.m - m0);
  GemvRows<R> rows;
  for (int r = 0; r < R; ++r) {
    const int n = min(n0 + r, p.n - 1);
    rows.w[r] = w + long(n) * p.w_row_bytes;
    rows.s[r] = scales + long(n) * p.scale_row_bytes;
  }
  GemvAcc<MT, R> acc;
  for (int mi = 0; mi < MT; ++mi) {
    for (int r = 0; r < R; ++r) {
      acc.v[mi][r] = 0.0f;
    }
  }
  if ((p.flags & kMetalFlagMxfp4) != 0) {  // uniform
    gemv_accumulate<XT, MT, R, true>(acc, x, rows, p, m0, rows_m, int(lane));
  } else {
    gemv_accumulate<XT, MT, R, false>(acc, x, rows, p, m0, rows_m, int(lane));
  }
  for (int mi = 0; mi < MT; ++mi) {
    for (int r = 0; r < R; ++r) {
      const float v = simd_sum(acc.v[mi][r]);
      if (lane == 0 && mi < rows_m && n0 + r < p.n) {
        const int row = m0 + mi;
        const int col = n0 + r;
        out[long(row) * p.n + col] =
            OutT(finish_value(v, row, col, p, gscale, op0, op1, op2, op3));
      }
    }
  }
}
