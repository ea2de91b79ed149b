// CPU W4A16: y[m, n] = epilogue(gs * sum_k x[m, k] * e2m1(w[n, k]) * e4m3(s[n, k/16])).
// Small M: GEMV (each weight row decoded once, dotted with all rows). Larger M: blocked GEMM
// (decode a kBlockDepth x kBlockCols weight panel to fp32, register-tiled FMA microkernel).
// Each output element is owned by one task with a fixed reduction order: results do not
// depend on the thread count.
#include "w4a16_kernel.h"

#include <algorithm>
#include <array>
#include <vector>

#include "microkernel.h"
#include "thread_pool.h"
#include "tiling_cpu.h"
#include "mlx/types/half_types.h"

namespace mlx_fp4::cpu {
namespace {

namespace mx = mlx::core;

struct Tables {
  float e4m3[256];
  float pair[256][2];  // byte -> (value of low nibble, value of high nibble)
  Tables() {
    for (uint32_t c = 0; c < 256; ++c) {
      e4m3[c] = fp4::e4m3_to_float(c);
      pair[c][0] = fp4::e2m1_to_float(c & fp4::kNibbleMask);
      pair[c][1] = fp4::e2m1_to_float(c >> fp4::kNibbleBits);
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}

const HotLoops& pick_hot_loops() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return hot_loops_avx512();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return hot_loops_avx2();
#endif
  return hot_loops_generic();
}
const HotLoops& hot() {
  static const HotLoops& h = pick_hot_loops();
  return h;
}

inline float load_float(const void* base, int dtype, int64_t i) {
  switch (dtype) {
    case fp4::kDtypeF16: return static_cast<float>(static_cast<const mx::float16_t*>(base)[i]);
    case fp4::kDtypeBF16: return static_cast<float>(static_cast<const mx::bfloat16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

inline void store_float(void* base, int dtype, int64_t i, float v) {
  switch (dtype) {
    case fp4::kDtypeF16: static_cast<mx::float16_t*>(base)[i] = mx::float16_t(v); break;
    case fp4::kDtypeBF16: static_cast<mx::bfloat16_t*>(base)[i] = mx::bfloat16_t(v); break;
    default: static_cast<float*>(base)[i] = v; break;
  }
}

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// Decodes weight row n, columns [k0, k0 + len) (k0, len multiples of 16) to scaled fp32;
// columns past K read nothing and are 0.
void decode_row(const fp4::W4A16Problem& p, const Buffers& b, int64_t n, int64_t k0, int64_t len, float* dst) {
  const Tables& t = tables();
  const uint8_t* wrow = b.w + n * p.w_row_bytes;
  const uint8_t* srow = b.scales + n * p.scale_row_bytes;
  const int64_t valid_bytes = fp4::packed_bytes_for_k(p.k);
  constexpr int kBytesPerBlock = fp4::kBlockSize / fp4::kValuesPerByte;
  for (int64_t k = k0; k < k0 + len; k += fp4::kBlockSize) {
    const float s = t.e4m3[srow[k / fp4::kBlockSize]];
    const int64_t byte0 = k / fp4::kValuesPerByte;
    float* d = dst + (k - k0);
    if (byte0 + kBytesPerBlock <= valid_bytes) {
      for (int j = 0; j < kBytesPerBlock; ++j) {
        const float* v = t.pair[wrow[byte0 + j]];
        d[2 * j] = v[0] * s;
        d[2 * j + 1] = v[1] * s;
      }
    } else {
      // The tail block: bounded reads, zeros past K.
      for (int j = 0; j < fp4::kBlockSize; ++j) {
        const int64_t kk = k + j;
        d[j] = kk < p.k ? t.pair[wrow[kk / 2]][kk & 1] * s : 0.0f;
      }
    }
  }
}

// Applies the global scale and the epilogue chain to acc[0..count) = y[row, col0..), stores.
void finish(const fp4::W4A16Problem& p, const Buffers& b, int64_t row, int64_t col0, int64_t count, const float* acc) {
  const float gs = p.has_global_scale ? *b.global_scale : 1.0f;
  for (int64_t j = 0; j < count; ++j) {
    const int64_t col = col0 + j;
    float v = p.has_global_scale ? acc[j] * gs : acc[j];
    for (int i = 0; i < p.num_ops; ++i) {
      const fp4::EpilogueOp& op = p.ops[i];
      float opnd = op.p0;
      if (op.operand >= 0) {
        opnd = load_float(b.operands[op.operand], p.operand_dtype[op.operand],
                          fp4::operand_offset(p.operand_kind[op.operand], row, col, p.n));
      }
      v = fp4::epilogue_apply(op.code, v, opnd, op.p0, op.p1);
    }
    store_float(b.out, p.out_dtype, row * p.n + col, v);
  }
}

void run_gemv(const fp4::W4A16Problem& p, const Buffers& b, int64_t row0, int rows) {
  const int64_t kpad = round_up(p.k, fp4::kBlockSize);
  // Rows of x in fp32, zero-padded to whole scale blocks (shared by all tasks).
  std::vector<float> xs(static_cast<size_t>(rows) * kpad, 0.0f);
  for (int r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < p.k; ++k) {
      xs[r * kpad + k] = load_float(b.x, p.x_dtype, (row0 + r) * p.k + k);
    }
  }
  const HotLoops& h = hot();
  const int64_t tasks = (p.n + kGemvCols - 1) / kGemvCols;
  parallel_for(tasks, [&](int64_t task) {
    thread_local std::vector<float> wrow;
    wrow.resize(kpad);
    float acc[kGemvCols][kGemvMaxRows];
    const int64_t n0 = task * kGemvCols;
    const int64_t n1 = std::min(p.n, n0 + kGemvCols);
    for (int64_t n = n0; n < n1; ++n) {
      decode_row(p, b, n, 0, kpad, wrow.data());
      h.dot_rows(wrow.data(), xs.data(), kpad, rows, kpad, acc[n - n0]);
    }
    for (int r = 0; r < rows; ++r) {
      float line[kGemvCols];
      for (int64_t n = n0; n < n1; ++n) line[n - n0] = acc[n - n0][r];
      finish(p, b, row0 + r, n0, n1 - n0, line);
    }
  });
}

void run_gemm(const fp4::W4A16Problem& p, const Buffers& b) {
  const HotLoops& h = hot();
  const int64_t kpad = round_up(p.k, fp4::kBlockSize);
  const int64_t mblocks = (p.m + kBlockRows - 1) / kBlockRows;
  const int64_t nblocks = (p.n + kBlockCols - 1) / kBlockCols;
  const int micro_cols = 2 * h.vector_floats;
  parallel_for(mblocks * nblocks, [&](int64_t task) {
    thread_local std::vector<float> apack, bpack, ctile, wseg;
    apack.resize(static_cast<size_t>(kBlockRows) * kBlockDepth);
    bpack.resize(static_cast<size_t>(kBlockDepth) * kBlockCols);
    ctile.assign(static_cast<size_t>(kBlockRows) * kBlockCols, 0.0f);
    wseg.resize(kBlockDepth);
    const int64_t m0 = (task / nblocks) * kBlockRows;
    const int64_t n0 = (task % nblocks) * kBlockCols;
    const int rows = static_cast<int>(std::min<int64_t>(kBlockRows, p.m - m0));
    const int groups = (rows + kMicroRows - 1) / kMicroRows;
    for (int64_t k0 = 0; k0 < kpad; k0 += kBlockDepth) {
      const int kc = static_cast<int>(std::min<int64_t>(kBlockDepth, kpad - k0));
      for (int j = 0; j < kBlockCols; ++j) {
        const int64_t n = n0 + j;
        if (n < p.n) {
          decode_row(p, b, n, k0, kc, wseg.data());
          for (int kk = 0; kk < kc; ++kk) bpack[kk * kBlockCols + j] = wseg[kk];
        } else {
          for (int kk = 0; kk < kc; ++kk) bpack[kk * kBlockCols + j] = 0.0f;
        }
      }
      for (int g = 0; g < groups; ++g) {
        float* a = apack.data() + static_cast<size_t>(g) * kBlockDepth * kMicroRows;
        for (int i = 0; i < kMicroRows; ++i) {
          const int64_t row = m0 + g * kMicroRows + i;
          const int64_t kvalid = row < p.m ? std::min<int64_t>(kc, p.k - k0) : 0;
          for (int kk = 0; kk < kc; ++kk) {
            a[kk * kMicroRows + i] = kk < kvalid ? load_float(b.x, p.x_dtype, row * p.k + k0 + kk) : 0.0f;
          }
        }
        for (int c = 0; c < kBlockCols; c += micro_cols) {
          h.micro_tile(kc, a, bpack.data() + c, kBlockCols, ctile.data() + g * kMicroRows * kBlockCols + c, kBlockCols);
        }
      }
    }
    const int64_t cols = std::min<int64_t>(kBlockCols, p.n - n0);
    for (int r = 0; r < rows; ++r) {
      finish(p, b, m0 + r, n0, cols, ctile.data() + r * kBlockCols);
    }
  });
}

}  // namespace

const char* hot_loops_name() { return hot().name; }

void run_w4a16(const fp4::W4A16Problem& p, const Buffers& b) {
  if (p.m == 0 || p.n == 0) {
    return;
  }
  if (p.m <= kGemvMaxRows) {
    run_gemv(p, b, 0, static_cast<int>(p.m));
  } else {
    run_gemm(p, b);
  }
}

}  // namespace mlx_fp4::cpu
