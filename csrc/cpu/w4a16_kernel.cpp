// CPU W4A16: y[m, n] = epilogue(gs * sum_k x[m, k] * e2m1(w[n, k]) * e4m3(s[n, k/16])).
// Small M: GEMV (each weight byte streamed once for all rows, decoded in registers).
// Larger M: GEMM (decode a kGemmDepth-deep panel of weight rows to fp32 once per activation
// chunk, register-tiled FMA micro kernel with the weights as the broadcast operand).
// Every output is computed by one task with a fixed reduction order (k in chunk order, lanes
// summed in a fixed order): results do not depend on the thread count.
#include "w4a16_kernel.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "microkernel.h"
#include "thread_pool.h"
#include "tiling_cpu.h"
#include "mlx/types/half_types.h"

namespace mlx_fp4::cpu {
namespace {

namespace mx = mlx::core;

const HotLoops& pick_hot_loops() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  if (const char* env = std::getenv("MLX_FP4_CPU_ISA")) {  // testing: force a narrower build
    if (std::strcmp(env, "generic") == 0) return hot_loops_generic();
    if (std::strcmp(env, "avx2") == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      return hot_loops_avx2();
    }
  }
  if (__builtin_cpu_supports("avx512f")) return hot_loops_avx512();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return hot_loops_avx2();
#elif defined(__aarch64__)
  // Advanced SIMD is part of every AArch64 CPU; the generic build stays selectable for testing.
  const char* env = std::getenv("MLX_FP4_CPU_ISA");
  if (env == nullptr || std::strcmp(env, "generic") != 0) return hot_loops_neon();
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

// dst[j] = float(src[j]) for j < count.
void load_floats(const void* base, int dtype, int64_t i0, int64_t count, float* dst) {
  switch (dtype) {
    case fp4::kDtypeF16: {
      const auto* s = static_cast<const mx::float16_t*>(base) + i0;
      for (int64_t j = 0; j < count; ++j) dst[j] = static_cast<float>(s[j]);
      break;
    }
    case fp4::kDtypeBF16: {
      const auto* s = static_cast<const uint16_t*>(base) + i0;
      for (int64_t j = 0; j < count; ++j) {
        const uint32_t bits = static_cast<uint32_t>(s[j]) << 16;
        std::memcpy(dst + j, &bits, sizeof(float));
      }
      break;
    }
    default: std::memcpy(dst, static_cast<const float*>(base) + i0, sizeof(float) * count); break;
  }
}

void store_floats(void* base, int dtype, int64_t i0, int64_t count, const float* src) {
  switch (dtype) {
    case fp4::kDtypeF16: {
      auto* d = static_cast<mx::float16_t*>(base) + i0;
      for (int64_t j = 0; j < count; ++j) d[j] = mx::float16_t(src[j]);
      break;
    }
    case fp4::kDtypeBF16: {
      auto* d = static_cast<mx::bfloat16_t*>(base) + i0;
      for (int64_t j = 0; j < count; ++j) d[j] = mx::bfloat16_t(src[j]);
      break;
    }
    default: std::memcpy(static_cast<float*>(base) + i0, src, sizeof(float) * count); break;
  }
}

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// Applies the global scale and the epilogue chain to v[0..count) = y[row, col0..), stores.
// Op-major loops over a row segment so that the simple ops vectorize.
void finish(const fp4::W4A16Problem& p, const Buffers& b, int64_t row, int64_t col0, int64_t count, float* v) {
  if (p.has_global_scale) {
    const float gs = fp4::decode_multiplier(*b.global_scale);
    for (int64_t j = 0; j < count; ++j) v[j] *= gs;
  }
  float opnd[kGemmPanelRows + 64];
  for (int i = 0; i < p.num_ops; ++i) {
    const fp4::EpilogueOp& op = p.ops[i];
    for (int64_t j0 = 0; j0 < count; j0 += kGemmPanelRows) {
      const int64_t cnt = std::min<int64_t>(kGemmPanelRows, count - j0);
      float* vv = v + j0;
      if (op.operand >= 0) {
        const int kind = p.operand_kind[op.operand];
        const void* base = b.operands[op.operand];
        const int dt = p.operand_dtype[op.operand];
        if (kind == fp4::kOperandCol || kind == fp4::kOperandFull) {
          load_floats(base, dt, fp4::operand_offset(kind, row, col0 + j0, p.n), cnt, opnd);
        } else {
          const float o = load_float(base, dt, fp4::operand_offset(kind, row, col0 + j0, p.n));
          for (int64_t j = 0; j < cnt; ++j) opnd[j] = o;
        }
      } else {
        for (int64_t j = 0; j < cnt; ++j) opnd[j] = op.p0;
      }
      hot().epilogue_op(op.code, vv, opnd, cnt, op.p0, op.p1);
    }
  }
  store_floats(b.out, p.out_dtype, row * p.n + col0, count, v);
}

// Activation row `row` -> fp32 in chunk order, zero-padded to kp.
void pack_x_row(const fp4::W4A16Problem& p, const Buffers& b, int64_t row, int64_t kp, int vec, float* dst,
                std::vector<float>& tmp) {
  tmp.resize(kp);
  load_floats(b.x, p.x_dtype, row * p.k, p.k, tmp.data());
  std::fill(tmp.begin() + p.k, tmp.begin() + kp, 0.0f);
  const int64_t chunk = 2 * vec;
  for (int64_t c0 = 0; c0 < kp; c0 += chunk) {
    for (int j = 0; j < vec; ++j) {
      dst[c0 + j] = tmp[c0 + 2 * j];
      dst[c0 + vec + j] = tmp[c0 + 2 * j + 1];
    }
  }
}

void run_gemv(const fp4::W4A16Problem& p, const Buffers& b) {
  const HotLoops& h = hot();
  const int rows = static_cast<int>(p.m);
  const int64_t kp = round_up(p.k, 2 * h.vector_floats);
  std::vector<float> xs(static_cast<size_t>(rows) * kp);
  std::vector<float> tmp;
  for (int r = 0; r < rows; ++r) pack_x_row(p, b, r, kp, h.vector_floats, xs.data() + r * kp, tmp);
  std::vector<float> y(static_cast<size_t>(rows) * p.n);
  const int64_t tasks = (p.n + kGemvTaskRows - 1) / kGemvTaskRows;
  parallel_for(tasks, [&](int64_t task) {
    GemvArgs a;
    a.w = b.w;
    a.ldw = p.w_row_bytes;
    a.s = b.scales;
    a.lds = p.scale_row_bytes;
    a.k = p.k;
    a.kp = kp;
    a.n0 = task * kGemvTaskRows;
    a.n1 = std::min(p.n, a.n0 + kGemvTaskRows);
    a.ldy = p.n;
    a.mode = p.mode;
    // Passes of at most kGemvPassRows activation rows: more live rows would leave fewer weight
    // rows per pass in registers. The task's weight rows stay in L2 between passes.
    for (int r0 = 0; r0 < rows; r0 += kGemvPassRows) {
      a.rows = std::min(kGemvPassRows, rows - r0);
      a.x = xs.data() + r0 * kp;
      a.y = y.data() + static_cast<int64_t>(r0) * p.n;
      h.gemv(a);
    }
    for (int r = 0; r < rows; ++r) finish(p, b, r, a.n0, a.n1 - a.n0, y.data() + r * p.n + a.n0);
  });
}

void run_gemm(const fp4::W4A16Problem& p, const Buffers& b) {
  const HotLoops& h = hot();
  const int vec = h.vector_floats;
  const int xw = 2 * vec;  // activation rows per 2-vector group
  const int64_t kp = round_up(p.k, 2 * vec);
  const int threads = num_threads();
  // Weight-row blocks: about kGemmPanelRows each, a multiple of the thread count in number.
  int64_t nblocks = (p.n + kGemmPanelRows - 1) / kGemmPanelRows;
  nblocks = round_up(nblocks, threads);
  const int64_t nb_rows = round_up((p.n + nblocks - 1) / nblocks, h.micro_rows2);
  nblocks = (p.n + nb_rows - 1) / nb_rows;
  const int64_t panel_rows = round_up(nb_rows, h.micro_rows1);

  std::vector<float> xpack;
  for (int64_t m0 = 0; m0 < p.m; m0 += kGemmChunkRows) {
    const int64_t mrows = std::min<int64_t>(kGemmChunkRows, p.m - m0);
    const int64_t groups = (mrows + xw - 1) / xw;
    const int64_t ldc = groups * xw;
    xpack.resize(static_cast<size_t>(groups) * kp * xw);
    // Pack activations: group g = rows [g*xw, ..) as [kp][width] in chunk order, zero-padded.
    parallel_for(groups, [&](int64_t g) {
      thread_local std::vector<float> row, tmp;
      row.resize(kp);
      const int64_t r0 = g * xw;
      const int64_t rcount = std::min<int64_t>(xw, mrows - r0);
      const int width = rcount <= vec ? vec : xw;
      float* dst = xpack.data() + g * kp * xw;
      for (int64_t r = 0; r < width; ++r) {
        if (r < rcount) {
          pack_x_row(p, b, m0 + r0 + r, kp, vec, row.data(), tmp);
          for (int64_t k = 0; k < kp; ++k) dst[k * width + r] = row[k];
        } else {
          for (int64_t k = 0; k < kp; ++k) dst[k * width + r] = 0.0f;
        }
      }
    });
    parallel_for(nblocks, [&](int64_t blk) {
      thread_local std::vector<float> panel, cbuf, line;
      panel.resize(static_cast<size_t>(panel_rows) * kGemmDepth);
      cbuf.assign(static_cast<size_t>(panel_rows) * ldc, 0.0f);
      line.resize(nb_rows);
      const int64_t n0 = blk * nb_rows;
      const int nvalid = static_cast<int>(std::min<int64_t>(nb_rows, p.n - n0));
      const int rows2 = static_cast<int>(round_up(nvalid, h.micro_rows2));
      const int rows1 = static_cast<int>(round_up(nvalid, h.micro_rows1));
      for (int64_t k0 = 0; k0 < kp; k0 += kGemmDepth) {
        const int kc = static_cast<int>(std::min<int64_t>(kGemmDepth, kp - k0));
        DecodeArgs d;
        d.w = b.w;
        d.ldw = p.w_row_bytes;
        d.s = b.scales;
        d.lds = p.scale_row_bytes;
        d.k = p.k;
        d.n0 = n0;
        d.nvalid = nvalid;
        d.nrows = rows1;
        d.k0 = k0;
        d.kc = kc;
        d.dst = panel.data();
        d.mode = p.mode;
        h.decode_panel(d);
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t rcount = std::min<int64_t>(xw, mrows - g * xw);
          const bool one = rcount <= vec;
          const int width = one ? vec : xw;
          const float* xs = xpack.data() + g * kp * xw + k0 * width;
          float* c = cbuf.data() + g * xw;
          if (one) {
            for (int i = 0; i < rows1; i += h.micro_rows1) {
              h.micro1(kc, panel.data() + static_cast<int64_t>(i) * kGemmDepth, xs, c + i * ldc, ldc);
            }
          } else {
            for (int i = 0; i < rows2; i += h.micro_rows2) {
              h.micro2(kc, panel.data() + static_cast<int64_t>(i) * kGemmDepth, xs, c + i * ldc, ldc);
            }
          }
        }
      }
      for (int64_t r = 0; r < mrows; ++r) {
        for (int j = 0; j < nvalid; ++j) line[j] = cbuf[j * ldc + r];
        finish(p, b, m0 + r, n0, nvalid, line.data());
      }
    });
  }
}

}  // namespace

const char* hot_loops_name() { return hot().name; }
const HotLoops& hot_loops() { return hot(); }

CpuTiles cpu_tiles() {
  const HotLoops& h = hot();
  return {h.vector_floats, h.micro_rows2, h.micro_rows1, kGemmDepth, kGemmPanelRows, kGemvPassRows, kGemvTaskRows};
}

void run_w4a16(const fp4::W4A16Problem& p, const Buffers& b) {
  if (p.m == 0 || p.n == 0) {
    return;
  }
  if (p.m <= kGemvMaxRows) {
    run_gemv(p, b);
  } else {
    run_gemm(p, b);
  }
}

}  // namespace mlx_fp4::cpu
