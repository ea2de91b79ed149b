// W4A16 FP4 matmul kernels for Apple GPUs: out = epilogue(gs * (x @ dequant(w, scales)^T)).
// x [M, K] (float, half or bfloat, rows contiguous); w [N, w_row_bytes] packed E2M1, low nibble
// = even k; scales [N, scale_row_bytes]: E4M3 bytes, one per 16 columns (NVFP4), or E8M0 bytes,
// one per 32 columns (MXFP4: the fc_gemm_mxfp4 function constant); out [M, N].
// Kernel: w4a16_gemm (fused cooperative decode + simdgroup MMA, BN = 64, (BM, BK) = (128, 64)
// or (64, 32), optional staged scales); the vector path is w4a16_gemv.metal. The host picks
// one in w4a16_dispatch.h; kernels are instantiated at JIT time by lines that
// fp4::metal_instantiation() writes. Tile constants: csrc/shared/tiling_metal.h.
// The file must stay ASCII (MLX hands the source to Metal as an ASCII string).
#include <metal_stdlib>

#include "w4a16_device.h"

using namespace metal;
using namespace fp4;

// ---------------------------------------------------------------------------------------------
// Fused GEMM

// Alignment, resolved when the pipeline is created (the host sets them from the same conditions
// as the kMetalFlag* bits): no alignment branch survives in the inner loops.
constant bool fc_gemm_x_vec2 [[function_constant(kMetalFcGemmXVec2)]];
constant bool fc_gemm_w_vec8 [[function_constant(kMetalFcGemmWVec8)]];
constant bool fc_gemm_scale_word [[function_constant(kMetalFcGemmScaleWord)]];
constant bool fc_gemm_out_vec2 [[function_constant(kMetalFcGemmOutVec2)]];
// The scale format (kMetalFlagMxfp4), resolved at pipeline creation like the alignment.
constant bool fc_gemm_mxfp4 [[function_constant(kMetalFcGemmMxfp4)]];

// Row offsets (in elements of x) of the 4 fragment rows one lane reads. Rows past M are clamped
// to M - 1: they are read (in bounds) but their results are never stored. live: the simdgroup's
// leading fragment rows that hold any row < M (the same for all its lanes); the MMA skips the
// others, so a tile mostly past M (M = 9 ... 63 on the 64-row tile) does only the work it needs.
struct ARows {
  long off[kMetalSgFrags];
  int live;
};

// ARows::live for a simdgroup whose first fragment row is `first` of `rows` rows that exist.
inline int live_frag_rows(int first, int rows) {
  const int live = (rows - first + kMetalFrag - 1) / kMetalFrag;
  return live < 0 ? 0 : live > kMetalSgFrags ? int(kMetalSgFrags) : live;
}

// The B tile's element type and the decode's scale type, per mode. NVFP4: half (every E2M1 x
// E4M3 product has at most 6 significant bits and a magnitude in [2^-10, 2688]: exact in half).
// MXFP4: an E8M0 scale (2^-127 .. 2^127) does not fit a half; bfloat has fp32's exponent range
// and holds every E2M1 x E8M0 product exactly (2 significant bits) while it is an fp32 (scale
// codes <= 252; above, |w| >= 2^128 is Inf, as in mx.dequantize), the scale kept in fp32.
template <bool MX>
struct GemmTile {
  typedef half T;
  typedef half S;
};
template <>
struct GemmTile<true> {
  typedef bfloat T;
  typedef float S;
};

// Two decoded E2M1 values (exact halves) times the block scale, as tile elements: one half2
// multiply (NVFP4), or fp32 then an exact bfloat conversion (MXFP4).
inline half2 scaled_pair(half2 v, half s) { return v * s; }
inline vec<bfloat, 2> scaled_pair(half2 v, float s) {
  vec<bfloat, 2> r;
  r.x = bfloat(float(v.x) * s);
  r.y = bfloat(float(v.y) * s);
  return r;
}
inline half scaled_one(half v, half s) { return v * s; }
inline bfloat scaled_one(half v, float s) { return bfloat(float(v) * s); }

// Four tile elements as one aligned 4-element store.
template <typename TT>
inline void store4(threadgroup TT* dst, TT a, TT b, TT c, TT d) {
  vec<TT, 4> t;
  t.x = a;
  t.y = b;
  t.z = c;
  t.w = d;
  *((threadgroup vec<TT, 4>*)dst) = t;
}

// Decodes one 16-column scale block of weight row n, columns [kb, kb + 16), times scale s, into
// 16 tile elements at dst (the exact weights, see GemmTile). The codes are bit-built halves
// (fp4_format.h), two per 32-bit op; times 2^14 (exact: normal halves of the E2M1 values) and
// times s (exact), two weights per multiply.
// CHECKED = false: the block lies inside the matrix and the 8 packed bytes are one aligned word.
// CHECKED = true: byte loads; entries with n >= N or k >= K are zero and read nothing.
template <bool CHECKED, typename TT, typename ST>
inline void decode_block16(
    threadgroup TT* dst,
    device const uchar* w,
    constant W4A16MetalParams& p,
    int n,
    int kb,
    ST s) {
  if (!CHECKED) {
    const uint2 q = *((device const uint2*)(w + long(n) * p.w_row_bytes + kb / 2));
    const half2 unscale = half2(half(kE2M1HalfUnscale));
    for (int wd = 0; wd < 2; ++wd) {
      const uint word = wd == 0 ? q.x : q.y;
      vec<TT, 2> h[4];
      for (int j = 0; j < 4; ++j) {
        h[j] = scaled_pair(as_type<half2>(e2m1_pair_half_bits(word, j)) * unscale, s);
      }
      // pair j holds codes j (low half) and j + 4 (high half) of the word
      store4(dst + 8 * wd, h[0].x, h[1].x, h[2].x, h[3].x);
      store4(dst + 8 * wd + 4, h[0].y, h[1].y, h[2].y, h[3].y);
    }
  } else {
    const bool row_ok = n < p.n;
    device const uchar* wrow = w + long(row_ok ? n : 0) * p.w_row_bytes;
    for (int g = 0; g < 4; ++g) {
      TT v[4];
      for (int e = 0; e < 4; ++e) {
        const int k = kb + 4 * g + e;
        v[e] = TT(0.0f);
        if (row_ok && k < p.k) {
          const uint byte = wrow[k / 2];
          v[e] = scaled_one(e2m1_f16(byte >> (uint(k % 2) * 4u)), s);
        }
      }
      store4(dst + 4 * g, v[0], v[1], v[2], v[3]);
    }
  }
}

// Scale of weight row n, block kb / 16, as half (exact); 0 when the block lies outside.
inline half load_scale(device const uchar* scales, constant W4A16MetalParams& p, int n, int kb) {
  if (n >= p.n || kb >= p.k) {
    return half(0.0f);
  }
  return block_scale_f16(scales[long(n) * p.scale_row_bytes + kb / kBlockSize]);
}

// MXFP4: the scale of weight row n, block kb / 32, as fp32; 0 when the block lies outside.
inline float load_scale_mx(
    device const uchar* scales, constant W4A16MetalParams& p, int n, int kb) {
  if (n >= p.n || kb >= p.k) {
    return 0.0f;
  }
  return scale_to_float(kModeMxfp4, scales[long(n) * p.scale_row_bytes + kb / kMxfp4BlockSize]);
}

// Decode threads per 32-column MXFP4 block (each thread decodes kMetalDecodeCols columns).
FP4_CONST int kMxDecodeThreads = kMxfp4BlockSize / kMetalDecodeCols;

// Per-thread scale load + decode of one block (the unstaged path, tiles crossing N, the K tail):
// the thread loads the scale of weight row n at column kb (E4M3 per 16 or E8M0 per 32 columns)
// and decodes the block into dst. FAST: the unchecked decode (whole tile inside N and K).
template <bool FAST, bool MX>
inline void decode_own_scale(
    threadgroup typename GemmTile<MX>::T* dst,
    device const uchar* w,
    device const uchar* scales,
    constant W4A16MetalParams& p,
    int n,
    int kb) {
  typedef typename GemmTile<MX>::S ST;
  const ST sc = MX ? ST(load_scale_mx(scales, p, n, kb)) : ST(load_scale(scales, p, n, kb));
  decode_block16<!FAST>(dst, w, p, n, kb, sc);
}

// Accumulates one strip of BK columns, [k0, k0 + BK), into this simdgroup's 32 x 32 tile.
// B comes from the decoded threadgroup tile bs ([BN][BK + pad] of TT), A from device memory.
// KMASK: the strip crosses K; A columns >= K read as zero and touch no memory past K. ALL: every
// fragment row is live (a.live == 4, the common case: no per-row check in the unrolled loops).
template <typename XT, int BK, bool KMASK, bool ALL, typename TT>
inline void mma_strip(
    thread simdgroup_float8x8* acc,
    threadgroup const TT* bs,
    device const XT* x,
    ARows a,
    int k0,
    int k_end,
    bool x_vec,
    short fm,
    short fn,
    int sg_n) {
  const int ld = BK + kMetalBPad;
  for (int kk = 0; kk < BK; kk += kMetalFrag) {
    simdgroup_float8x8 af[kMetalSgFrags];
    simdgroup_float8x8 bf[kMetalSgFrags];
    const int col = k0 + kk + fn;
    for (int i = 0; i < kMetalSgFrags; ++i) {
      if (!ALL && i >= a.live) {
        break;  // uniform per simdgroup
      }
      float e0;
      float e1;
      if (KMASK) {
        // Clamp the column so that the load stays inside row a.off[i], then zero it.
        const int c0 = min(col, k_end - 1);
        const int c1 = min(col + 1, k_end - 1);
        const float v0 = float(x[a.off[i] + c0]);
        const float v1 = float(x[a.off[i] + c1]);
        e0 = col < k_end ? v0 : 0.0f;
        e1 = col + 1 < k_end ? v1 : 0.0f;
      } else if (x_vec) {
        const vec<XT, 2> t = *((device const vec<XT, 2>*)(x + a.off[i] + col));
        e0 = float(t.x);
        e1 = float(t.y);
      } else {
        e0 = float(x[a.off[i] + col]);
        e1 = float(x[a.off[i] + col + 1]);
      }
      af[i].thread_elements()[0] = e0;
      af[i].thread_elements()[1] = e1;
    }
    for (int j = 0; j < kMetalSgFrags; ++j) {
      // B fragment element (row k, col n) = W[n][k]: lane holds (fm, fn) and (fm, fn + 1).
      const int nl = sg_n * kMetalSgTile + j * kMetalFrag + fn;
      bf[j].thread_elements()[0] = float(bs[nl * ld + kk + fm]);
      bf[j].thread_elements()[1] = float(bs[(nl + 1) * ld + kk + fm]);
    }
    for (int i = 0; i < kMetalSgFrags; ++i) {
      if (!ALL && i >= a.live) {
        break;
      }
      for (int j = 0; j < kMetalSgFrags; ++j) {
        simdgroup_multiply_accumulate(
            acc[i * kMetalSgFrags + j], af[i], bf[j], acc[i * kMetalSgFrags + j]);
      }
    }
  }
}

// The unsigned integer of `bytes` bytes (the scale bytes of one row and strip).
template <int bytes>
struct ScaleWord;
template <>
struct ScaleWord<1> {
  typedef uchar type;
};
template <>
struct ScaleWord<2> {
  typedef ushort type;
};
template <>
struct ScaleWord<4> {
  typedef uint type;
};

// One strip's MMAs, the K-tail mask chosen by `full` (the strip lies inside K), the live-row
// check only where a fragment row is past M (the K-tail strip, once per tile, keeps it).
template <typename XT, int BK, typename TT>
inline void mma_strip_at(
    thread simdgroup_float8x8* acc,
    threadgroup const TT* bs,
    device const XT* x,
    ARows a,
    int k0,
    int k_end,
    bool full,
    bool x_vec,
    short fm,
    short fn,
    int sg_n) {
  if (a.live == 0) {
    return;  // uniform: no row of this simdgroup's tile exists
  }
  const bool all = a.live == kMetalSgFrags;
  if (full && all) {
    mma_strip<XT, BK, false, true, TT>(acc, bs, x, a, k0, k_end, x_vec, fm, fn, sg_n);
  } else if (full) {
    mma_strip<XT, BK, false, false, TT>(acc, bs, x, a, k0, k_end, x_vec, fm, fn, sg_n);
  } else {
    mma_strip<XT, BK, true, false, TT>(acc, bs, x, a, k0, k_end, x_vec, fm, fn, sg_n);
  }
}

// Strips [s_begin, s_end) of the 64 weight rows from n0 into acc with two B buffers in bs: the
// prologue decodes strip s_begin into buffer 0, then each step decodes strip s + 1 into the
// other buffer while the simdgroups multiply strip s; one barrier separates the steps. Thread
// tid decodes row tid / (BK / 16), block tid % (BK / 16) of each strip, its scale loaded itself.
// Called uniformly by the whole threadgroup (barriers); w_fast: the unchecked decode applies to
// the strips inside K.
template <typename XT, int BK, bool MX>
inline void gemm_strips_double_buffered(
    thread simdgroup_float8x8* acc,
    threadgroup typename GemmTile<MX>::T* bs,
    device const XT* x,
    ARows a,
    device const uchar* w,
    device const uchar* scales,
    constant W4A16MetalParams& p,
    int n0,
    int s_begin,
    int s_end,
    bool w_fast,
    bool x_vec,
    uint tid,
    short fm,
    short fn,
    int sg_n) {
  typedef typename GemmTile<MX>::T TT;
  constexpr int kBlocks = BK / kBlockSize;  // decode threads per weight row
  constexpr int kLd = BK + kMetalBPad;
  const int full_strips = p.k / BK;
  const int dn = int(tid) / kBlocks;
  const int dcol = (int(tid) % kBlocks) * kMetalDecodeCols;
  const int doff = dn * kLd + dcol;
  if (w_fast && s_begin < full_strips) {
    decode_own_scale<true, MX>(bs + doff, w, scales, p, n0 + dn, s_begin * BK + dcol);
  } else {
    decode_own_scale<false, MX>(bs + doff, w, scales, p, n0 + dn, s_begin * BK + dcol);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int s = s_begin; s < s_end; ++s) {
    if (s + 1 < s_end) {
      threadgroup TT* dst = bs + ((s + 1 - s_begin) % 2) * kMetalBN * kLd + doff;
      const int kb = (s + 1) * BK + dcol;
      if (w_fast && s + 1 < full_strips) {
        decode_own_scale<true, MX>(dst, w, scales, p, n0 + dn, kb);
      } else {
        decode_own_scale<false, MX>(dst, w, scales, p, n0 + dn, kb);
      }
    }
    threadgroup const TT* src = bs + ((s - s_begin) % 2) * kMetalBN * kLd;
    mma_strip_at<XT, BK, TT>(acc, src, x, a, s * BK, p.k, s < full_strips, x_vec, fm, fn, sg_n);
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
}

// A lane's two adjacent outputs of a fragment row (cols fn, fn + 1): one 2-element store when
// out_vec (both inside N, aligned), else one or two scalar stores (`two`: col + 1 < N).
template <typename OutT>
inline void store_lane_pair(device OutT* dst, float v0, float v1, bool two, bool out_vec) {
  if (two && out_vec) {
    vec<OutT, 2> t;
    t.x = OutT(v0);
    t.y = OutT(v1);
    *((device vec<OutT, 2>*)dst) = t;
    return;
  }
  dst[0] = OutT(v0);
  if (two) {
    dst[1] = OutT(v1);
  }
}

// One threadgroup computes a BM x 64 output tile. Threads: BM / 32 * 2 simdgroups. Each strip
// of BK columns: the threadgroup decodes the (64, BK) weight sub-tile into threadgroup memory
// (thread t decodes row t / (BK / 16), block t % (BK / 16)), then every simdgroup runs its
// 4 x 4 fragment MMAs. STAGE = false: two B buffers, one barrier per strip; each decode thread
// loads its own scale byte. STAGE = true: 64 threads first load the strip's scales, one word of
// BK / 16 bytes per weight row, into threadgroup memory; one B buffer, three barriers per strip
// (the seed's measured M5 layout). Tiles crossing N, the K tail and unaligned scale rows use the
// per-thread loads. MXFP4 (fc_gemm_mxfp4): the same plan; a strip holds BK / 32 E8M0 blocks (two
// decode threads per block), the tile is bfloat and staged scales are fp32 (GemmTile).
// The kernel (below) declares the threadgroup memory: bs4 (the B tiles) and ss (staged scales:
// BN x BK / 16 halfs or BN x BK / 32 floats, the same bytes).
template <typename XT, typename OutT, int BM, int BK, bool STAGE, bool MX>
inline void w4a16_gemm_tile(
    device const XT* x,
    device const uchar* w,
    device const uchar* scales,
    device OutT* out,
    constant W4A16MetalParams& p,
    device const float* gscale,
    device const uchar* op0,
    device const uchar* op1,
    device const uchar* op2,
    device const uchar* op3,
    device float* partials,
    threadgroup half4* bs4,
    threadgroup float* ss_raw,
    uint tg_index,
    uint tid,
    uint sgid,
    uint lane) {
  constexpr int kThreads = metal_gemm_threads(BM);
  constexpr int kTpr = kThreads / kMetalBN;  // decode threads per weight row
  constexpr int kBlocks = BK / kBlockSize;         // NVFP4 scale blocks per strip
  constexpr int kMxBlocks = BK / kMxfp4BlockSize;  // MXFP4 scale blocks per strip
  constexpr int kLd = BK + kMetalBPad;
  static_assert(kTpr * kMetalDecodeCols == BK, "one thread decodes one scale block per strip");
  static_assert(kTpr == kBlocks, "a decode thread owns one scale block of the strip");
  static_assert(kMxBlocks * kMxfp4BlockSize == BK, "a strip holds whole MXFP4 blocks");
  static_assert(kBlocks * sizeof(half) == kMxBlocks * sizeof(float), "ss holds either mode's scales");
  typedef typename GemmTile<MX>::T TT;
  typedef typename GemmTile<MX>::S ST;
  threadgroup ST* ss = (threadgroup ST*)ss_raw;  // staged scales of this mode

  // Split-K: the high bits of the index pick the K partition, the low ones the Morton tile.
  const uint log2_tiles = uint(p.log2_grid_m + p.log2_grid_n);
  const int part = int(tg_index >> log2_tiles);
  const MortonTile tile =
      morton_decode(tg_index & ((1u << log2_tiles) - 1u), p.log2_grid_m, p.log2_grid_n);
  if (int(tile.m) >= p.tiles_m || int(tile.n) >= p.tiles_n) {
    return;  // the whole threadgroup leaves, before any barrier
  }
  threadgroup TT* bs = (threadgroup TT*)bs4;
  const int m0 = int(tile.m) * BM;
  const int n0 = int(tile.n) * kMetalBN;
  const int sg_m = int(sgid) / kMetalSgN;
  const int sg_n = int(sgid) % kMetalSgN;
  // Fragment coordinates of this lane (the layout MLX's steel GEMM uses).
  const short qid = short(lane / 4u);
  const short fm = short((qid & 4) + short((lane / 2u) % 4u));
  const short fn = short((qid & 2) * 2 + short(lane % 2u) * 2);

  ARows a;
  for (int i = 0; i < kMetalSgFrags; ++i) {
    const int r = min(m0 + sg_m * kMetalSgTile + i * kMetalFrag + fm, p.m - 1);
    a.off[i] = long(r) * p.k;
  }
  a.live = live_frag_rows(m0 + sg_m * kMetalSgTile, p.m);
  simdgroup_float8x8 acc[kMetalSgFrags * kMetalSgFrags];
  for (int i = 0; i < kMetalSgFrags * kMetalSgFrags; ++i) {
    acc[i] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  }

  const bool x_vec = fc_gemm_x_vec2;
  // Unchecked decode needs the whole 64-row tile inside N and aligned 8-byte weight words.
  const bool w_fast = (n0 + kMetalBN <= p.n) && fc_gemm_w_vec8;
  const int full_strips = p.k / BK;
  const int num_strips = (p.k + BK - 1) / BK;
  // This threadgroup's strips [s_begin, s_end): all of K, or one split-K partition.
  const int s_begin = p.split_strips > 0 ? part * p.split_strips : 0;
  const int s_end = p.split_strips > 0 ? min(num_strips, s_begin + p.split_strips) : num_strips;
  const int dn = int(tid) / kTpr;    // decoded row within the tile
  const int dblk = int(tid) % kTpr;  // decoded block within the strip
  const int dcol = dblk * kMetalDecodeCols;  // its first column within the strip
  const int doff = dn * kLd + dcol;          // ... and its place in the tile

  if (STAGE) {
    using ScaleWordT = typename ScaleWord<kBlocks>::type;
    using MxScaleWordT = typename ScaleWord<kMxBlocks>::type;
    const bool s_word = fc_gemm_scale_word;
    for (int s = s_begin; s < s_end; ++s) {
      const int k0 = s * BK;
      if (w_fast && s_word && s < full_strips) {
        // One coalesced load per weight row: the strip's scale bytes as one word.
        if (int(tid) < kMetalBN) {
          device const uchar* srow = scales + long(n0 + tid) * p.scale_row_bytes;
          if (MX) {
            const MxScaleWordT word = *((device const MxScaleWordT*)(srow + s * kMxBlocks));
            for (int b = 0; b < kMxBlocks; ++b) {
              const uint code = (uint(word) >> (8u * uint(b))) & 0xFFu;
              ss[tid * kMxBlocks + b] = ST(scale_to_float(kModeMxfp4, code));
            }
          } else {
            const ScaleWordT word = *((device const ScaleWordT*)(srow + s * kBlocks));
            for (int b = 0; b < kBlocks; ++b) {
              ss[tid * kBlocks + b] = ST(block_scale_f16((uint(word) >> (8u * uint(b))) & 0xFFu));
            }
          }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // this decode thread's block: dblk (NVFP4), dblk / 2 (MXFP4)
        const ST sc = MX ? ss[dn * kMxBlocks + dblk / kMxDecodeThreads] : ss[dn * kBlocks + dblk];
        decode_block16<false>(bs + doff, w, p, n0 + dn, k0 + dcol, sc);
      } else {
        decode_own_scale<false, MX>(bs + doff, w, scales, p, n0 + dn, k0 + dcol);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      mma_strip_at<XT, BK, TT>(acc, bs, x, a, k0, p.k, s < full_strips, x_vec, fm, fn, sg_n);
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
  } else {
    gemm_strips_double_buffered<XT, BK, MX>(acc, bs, x, a, w, scales, p, n0, s_begin, s_end, w_fast, x_vec, tid,
                                            fm, fn, sg_n);
  }

  // Epilogue: lane holds (row fm, cols fn and fn + 1) of each 8 x 8 fragment.
  const bool out_vec = fc_gemm_out_vec2;
  for (int i = 0; i < kMetalSgFrags; ++i) {
    const int row = m0 + sg_m * kMetalSgTile + i * kMetalFrag + fm;
    if (row >= p.m) {
      continue;
    }
    for (int j = 0; j < kMetalSgFrags; ++j) {
      const int col = n0 + sg_n * kMetalSgTile + j * kMetalFrag + fn;
      if (col >= p.n) {
        continue;
      }
      const long idx = long(row) * p.n + col;
      if (p.split_strips > 0) {
        // split-K: raw fp32 partial sums; w4a16_splitk_reduce finishes them
        device float* dst = partials + long(part) * p.m * p.n + idx;
        dst[0] = acc[i * kMetalSgFrags + j].thread_elements()[0];
        if (col + 1 < p.n) {
          dst[1] = acc[i * kMetalSgFrags + j].thread_elements()[1];
        }
        continue;
      }
      const float v0 = finish_value(
          acc[i * kMetalSgFrags + j].thread_elements()[0], row, col, p, gscale, op0, op1, op2,
          op3);
      const bool two = col + 1 < p.n;
      const float v1 = two ? finish_value(acc[i * kMetalSgFrags + j].thread_elements()[1], row, col + 1, p,
                                          gscale, op0, op1, op2, op3)
                           : 0.0f;
      store_lane_pair(out + idx, v0, v1, two, out_vec);
    }
  }
}

template <typename XT, typename OutT, int BM, int BK, bool STAGE>
[[max_total_threads_per_threadgroup(kMetalGemmMaxThreads)]] [[kernel]] void w4a16_gemm(
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
    device float* partials [[buffer(kMetalBufPartials)]],
    uint tg_index [[threadgroup_position_in_grid]],
    uint tid [[thread_index_in_threadgroup]],
    uint sgid [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  constexpr int kNumBuf = STAGE ? 1 : 2;
  // 8-byte elements so that the 4-element stores of the decode are aligned (the tile holds half
  // or bfloat, GemmTile); ss: BN x BK / 32 floats = BN x BK / 16 halfs (float-aligned for both).
  threadgroup half4 bs4[kNumBuf * kMetalBN * (BK + kMetalBPad) / 4];
  threadgroup float ss[STAGE ? kMetalBN * (BK / kMxfp4BlockSize) : 1];
  if (fc_gemm_mxfp4) {  // resolved at pipeline creation
    w4a16_gemm_tile<XT, OutT, BM, BK, STAGE, true>(
        x, w, scales, out, p, gscale, op0, op1, op2, op3, partials, bs4, ss, tg_index, tid, sgid,
        lane);
  } else {
    w4a16_gemm_tile<XT, OutT, BM, BK, STAGE, false>(
        x, w, scales, out, p, gscale, op0, op1, op2, op3, partials, bs4, ss, tg_index, tid, sgid,
        lane);
  }
}

// ---------------------------------------------------------------------------------------------
// Split-K reduction: one thread per output element sums the split_k fp32 partials in partition
// order, then the global scale, the epilogue and the one cast (as the GEMM's own epilogue).
template <typename OutT>
[[max_total_threads_per_threadgroup(kMetalReduceThreads)]] [[kernel]] void w4a16_splitk_reduce(
    device const float* partials [[buffer(kMetalBufPartials)]],
    device OutT* out [[buffer(kMetalBufOut)]],
    constant W4A16MetalParams& p [[buffer(kMetalBufParams)]],
    device const float* gscale [[buffer(kMetalBufGlobalScale)]],
    device const uchar* op0 [[buffer(kMetalBufOperand0)]],
    device const uchar* op1 [[buffer(kMetalBufOperand1)]],
    device const uchar* op2 [[buffer(kMetalBufOperand2)]],
    device const uchar* op3 [[buffer(kMetalBufOperand3)]],
    uint gid [[thread_position_in_grid]]) {
  const long total = long(p.m) * p.n;
  if (long(gid) >= total) {
    return;  // no barrier in this kernel
  }
  float v = 0.0f;
  for (int s = 0; s < p.split_k; ++s) {
    v += partials[long(s) * total + gid];
  }
  const int row = int(long(gid) / p.n);
  const int col = int(long(gid) % p.n);
  out[gid] = OutT(finish_value(v, row, col, p, gscale, op0, op1, op2, op3));
}
