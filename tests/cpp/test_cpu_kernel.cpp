// Standalone test driver of the CPU W4A16 kernel (csrc/cpu/*.cpp without MLX or Python):
//   * run_w4a16 over a grid of shapes / dtypes / epilogues vs a scalar float64 reference with
//     its own E2M1 / E4M3 decode (not csrc/shared/fp4_format.h);
//   * (run_sanitizers.sh builds it once per hot-loop build: native dispatch, and with
//     __builtin_cpu_supports forced so that avx2-fma and generic-128 are picked);
//   * NaN scale codes (0x7F / 0xFF) poison exactly the outputs that use them;
//   * several std::threads calling run_w4a16 at once give bit-identical results (also the
//     determinism check: repeated calls are bit-identical);
// (The int64 index helpers past 2^31: tests/cpp/test_index_helpers.cpp.)
// Built and run by tests/cpp/run_sanitizers.sh (plain, -fsanitize=thread,
// -fsanitize=address,undefined). Exit status 0 = all passed. Argument "quick" runs fewer shapes.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/thread_pool.h"
#include "cpu/w4a16_kernel.h"
#include "mlx/types/half_types.h"
#include "shared/w4a16_problem.h"

namespace mx = mlx::core;
using mlx_fp4::cpu::Buffers;

static int g_failures = 0;
static int g_checks = 0;

#define CHECK(cond, ...)                                  \
  do {                                                    \
    ++g_checks;                                           \
    if (!(cond)) {                                        \
      ++g_failures;                                       \
      std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                  \
      std::fprintf(stderr, "\n");                         \
      if (g_failures > 20) std::exit(1);                  \
    }                                                     \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Independent scalar reference decode (from the format definitions, not fp4_format.h).

double ref_e2m1(unsigned code) {
  static const double mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  double v = mag[code & 7];
  return (code & 8) ? -v : v;
}

double ref_e4m3(unsigned code) {
  unsigned e = (code >> 3) & 0xF, m = code & 7;
  if ((code & 0x7F) == 0x7F) return std::numeric_limits<double>::quiet_NaN();
  double v = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1.0 + m / 8.0, int(e) - 7);
  return (code & 0x80) ? -v : v;
}

// ---------------------------------------------------------------------------------------------
// Typed storage: values are generated as floats exactly representable in the dtype.

size_t dtype_size(int dt) { return dt == fp4::kDtypeF32 ? 4 : 2; }

float round_to(int dt, float v) {
  if (dt == fp4::kDtypeF16) return static_cast<float>(mx::float16_t(v));
  if (dt == fp4::kDtypeBF16) return static_cast<float>(mx::bfloat16_t(v));
  return v;
}

void store(std::vector<uint8_t>& buf, int dt, size_t i, float v) {
  if (dt == fp4::kDtypeF16) {
    mx::float16_t h(v);
    std::memcpy(buf.data() + 2 * i, &h, 2);
  } else if (dt == fp4::kDtypeBF16) {
    mx::bfloat16_t h(v);
    std::memcpy(buf.data() + 2 * i, &h, 2);
  } else {
    std::memcpy(buf.data() + 4 * i, &v, 4);
  }
}

double load(const std::vector<uint8_t>& buf, int dt, size_t i) {
  if (dt == fp4::kDtypeF16) {
    mx::float16_t h;
    std::memcpy(&h, buf.data() + 2 * i, 2);
    return static_cast<float>(h);
  }
  if (dt == fp4::kDtypeBF16) {
    mx::bfloat16_t h;
    std::memcpy(&h, buf.data() + 2 * i, 2);
    return static_cast<float>(h);
  }
  float f;
  std::memcpy(&f, buf.data() + 4 * i, 4);
  return f;
}

double unit(int dt) { return dt == fp4::kDtypeF32 ? std::ldexp(1.0, -24) : dt == fp4::kDtypeF16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8); }

// ---------------------------------------------------------------------------------------------
// A problem with owned, exactly sized buffers (so ASan sees any overrun).

struct Case {
  fp4::W4A16Problem p{};
  std::vector<uint8_t> x, w, scales, out;
  std::vector<std::vector<uint8_t>> operands;
  float gs = 1.0f;

  Buffers buffers() {
    Buffers b{};
    b.x = x.empty() ? nullptr : x.data();
    b.w = w.data();
    b.scales = scales.data();
    b.global_scale = p.has_global_scale ? &gs : nullptr;
    for (int i = 0; i < p.num_operands; ++i) b.operands[i] = operands[i].data();
    b.out = out.empty() ? nullptr : out.data();
    return b;
  }
};

int64_t operand_elems(const fp4::W4A16Problem& p, int kind) {
  return kind == fp4::kOperandScalar ? 1 : kind == fp4::kOperandCol ? p.n : kind == fp4::kOperandRow ? p.m : p.m * p.n;
}

// chain: 0 none, 1 every operand kind + activations, 2 clamp/scale/tanh/sigmoid/gelu_approx
Case make_case(int64_t m, int64_t n, int64_t k, int xdt, int odt, int chain, bool gs, uint32_t seed,
               int extra_row_bytes = 0) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> nib(0, 15), sc(0x18, 0x47), any(0, 255);
  Case c;
  fp4::W4A16Problem& p = c.p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.w_row_bytes = fp4::packed_bytes_for_k(k) + extra_row_bytes;
  p.scale_row_bytes = fp4::scale_blocks_for_k(k);
  p.x_dtype = xdt;
  p.out_dtype = odt;
  p.has_global_scale = gs ? 1 : 0;
  c.gs = 0.3671875f;
  c.x.resize(static_cast<size_t>(m * k) * dtype_size(xdt));
  for (int64_t i = 0; i < m * k; ++i) store(c.x, xdt, i, round_to(xdt, normal(gen)));
  c.w.resize(static_cast<size_t>(n * p.w_row_bytes));
  for (auto& b : c.w) b = static_cast<uint8_t>(any(gen));  // garbage in padding nibbles/bytes too
  c.scales.resize(static_cast<size_t>(n * p.scale_row_bytes));
  for (auto& s : c.scales) s = static_cast<uint8_t>(sc(gen));
  c.out.assign(static_cast<size_t>(m * n) * dtype_size(odt), 0xCD);
  auto add_operand = [&](int kind, int dt) {
    int idx = p.num_operands++;
    p.operand_kind[idx] = kind;
    p.operand_dtype[idx] = dt;
    int64_t cnt = operand_elems(p, kind);
    std::vector<uint8_t> buf(static_cast<size_t>(cnt) * dtype_size(dt));
    for (int64_t i = 0; i < cnt; ++i) store(buf, dt, i, round_to(dt, normal(gen)));
    c.operands.push_back(std::move(buf));
    return idx;
  };
  auto add_op = [&](int code, int operand, float p0 = 0.0f, float p1 = 0.0f) {
    p.ops[p.num_ops++] = fp4::EpilogueOp{code, operand, p0, p1};
  };
  if (chain == 1) {
    add_op(fp4::kEpiAdd, add_operand(fp4::kOperandCol, fp4::kDtypeF32));
    add_op(fp4::kEpiMul, add_operand(fp4::kOperandRow, fp4::kDtypeBF16));
    add_op(fp4::kEpiSilu, -1);
    add_op(fp4::kEpiAdd, add_operand(fp4::kOperandFull, fp4::kDtypeF16));
    add_op(fp4::kEpiMul, add_operand(fp4::kOperandScalar, fp4::kDtypeF32));
    add_op(fp4::kEpiGelu, -1);
    add_op(fp4::kEpiRelu, -1);
    add_op(fp4::kEpiAdd, -1, 0.25f);
  } else if (chain == 2) {
    add_op(fp4::kEpiScale, -1, -0.75f);
    add_op(fp4::kEpiClamp, -1, -3.0f, 2.5f);
    add_op(fp4::kEpiGeluApprox, -1);
    add_op(fp4::kEpiTanh, -1);
    add_op(fp4::kEpiSigmoid, -1);
    add_op(fp4::kEpiMul, -1, 3.0f);
  }
  return c;
}

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// Reference of one output: value, and an error bound for an fp32 implementation.
void reference(const Case& c, int64_t row, int64_t col, double* y_out, double* bound_out) {
  const fp4::W4A16Problem& p = c.p;
  double acc = 0.0, mag = 0.0;
  for (int64_t k = 0; k < p.k; ++k) {
    unsigned byte = c.w[col * p.w_row_bytes + k / 2];
    unsigned code = (k % 2) ? (byte >> 4) : (byte & 15);
    double wv = ref_e2m1(code) * ref_e4m3(c.scales[col * p.scale_row_bytes + k / 16]);
    double xv = load(c.x, p.x_dtype, row * p.k + k);
    acc += xv * wv;
    mag += std::fabs(xv * wv);
  }
  const double u = std::ldexp(1.0, -24);
  if (p.has_global_scale) {
    acc *= c.gs;
    mag *= std::fabs(c.gs);
  }
  double v = acc, e = (p.k + 2) * u * mag;
  for (int i = 0; i < p.num_ops; ++i) {
    const fp4::EpilogueOp& op = p.ops[i];
    double t = op.p0;
    if (op.operand >= 0) {
      t = load(c.operands[op.operand], p.operand_dtype[op.operand],
               fp4::operand_offset(p.operand_kind[op.operand], row, col, p.n));
    }
    double lip = 1.0;
    switch (op.code) {
      case fp4::kEpiAdd: v = v + t; break;
      case fp4::kEpiMul: v = v * t; lip = std::fabs(t); break;
      case fp4::kEpiScale: v = v * op.p0; lip = std::fabs(op.p0); break;
      case fp4::kEpiRelu: v = v < 0 ? 0.0 : v; break;
      case fp4::kEpiSilu: v = v * sigmoid(v); lip = 1.1; break;
      case fp4::kEpiGelu: v = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); lip = 1.13; break;
      case fp4::kEpiGeluApprox:
        v = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
        lip = 1.13;
        break;
      case fp4::kEpiSigmoid: v = sigmoid(v); lip = 0.25; break;
      case fp4::kEpiTanh: v = std::tanh(v); break;
      case fp4::kEpiClamp: v = v < op.p0 ? op.p0 : (v > op.p1 ? op.p1 : v); break;
    }
    e = e * lip + 16 * u * (std::fabs(v) + std::fabs(t) + 1e-30);
  }
  *y_out = v;
  *bound_out = 2.0 * (e + unit(p.out_dtype) * std::fabs(v)) + std::ldexp(1.0, -24);
}

std::string describe(const Case& c) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "m=%lld n=%lld k=%lld x=%d out=%d ops=%d gs=%d rowbytes=%lld",
                (long long)c.p.m, (long long)c.p.n, (long long)c.p.k, c.p.x_dtype, c.p.out_dtype,
                c.p.num_ops, c.p.has_global_scale, (long long)c.p.w_row_bytes);
  return buf;
}

void check_case(Case& c) {
  Buffers b = c.buffers();
  mlx_fp4::cpu::run_w4a16(c.p, b);
  int bad = 0;
  for (int64_t r = 0; r < c.p.m && bad < 3; ++r) {
    for (int64_t col = 0; col < c.p.n && bad < 3; ++col) {
      double y, bound;
      reference(c, r, col, &y, &bound);
      double got = load(c.out, c.p.out_dtype, r * c.p.n + col);
      bool ok = std::isnan(y) ? std::isnan(got) : std::fabs(got - y) <= bound;
      if (!ok) ++bad;
      CHECK(ok, "%s at (%lld, %lld): got %.9g expected %.9g bound %.3g", describe(c).c_str(),
            (long long)r, (long long)col, got, y, bound);
    }
  }
  // Determinism: a second run gives the same bits.
  std::vector<uint8_t> first = c.out;
  std::fill(c.out.begin(), c.out.end(), 0x5A);
  mlx_fp4::cpu::run_w4a16(c.p, b);
  CHECK(first == c.out, "%s: second run differs", describe(c).c_str());
}

// ---------------------------------------------------------------------------------------------

void test_grid(bool quick) {
  const int64_t ms_full[] = {0, 1, 3, 8, 9, 50, 97, 200};
  const int64_t ns_full[] = {1, 15, 16, 17, 64, 65, 130};
  const int64_t ks_full[] = {1, 2, 15, 16, 17, 31, 33, 255, 256, 257, 600};
  const int64_t ms_quick[] = {0, 1, 8, 9, 97};
  const int64_t ns_quick[] = {1, 17, 65};
  const int64_t ks_quick[] = {1, 17, 33, 257};
  const int dts[] = {fp4::kDtypeF32, fp4::kDtypeF16, fp4::kDtypeBF16};
  uint32_t seed = 1;
  auto run = [&](const int64_t* ms, int nm, const int64_t* ns, int nn, const int64_t* ks, int nk) {
    for (int a = 0; a < nm; ++a)
      for (int b = 0; b < nn; ++b)
        for (int d = 0; d < nk; ++d) {
          ++seed;
          int xdt = dts[seed % 3], odt = dts[(seed / 3) % 3];
          int chain = static_cast<int>(seed % 3);
          Case c = make_case(ms[a], ns[b], ks[d], xdt, odt, chain, seed % 2 == 0, seed,
                             static_cast<int>(seed % 4 == 1 ? 3 : 0));
          check_case(c);
        }
  };
  if (quick) {
    run(ms_quick, 5, ns_quick, 3, ks_quick, 4);
  } else {
    run(ms_full, 8, ns_full, 7, ks_full, 11);
  }
}

void test_nan_scales() {
  for (unsigned code : {0x7Fu, 0xFFu}) {
    for (int64_t m : {2, 20}) {
      Case c = make_case(m, 5, 40, fp4::kDtypeF32, fp4::kDtypeF32, 0, false, 77);
      c.scales[2 * c.p.scale_row_bytes + 2] = static_cast<uint8_t>(code);  // row 2, last block (k 32..39)
      Buffers b = c.buffers();
      mlx_fp4::cpu::run_w4a16(c.p, b);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t col = 0; col < 5; ++col) {
          double got = load(c.out, fp4::kDtypeF32, r * 5 + col);
          CHECK(std::isnan(got) == (col == 2), "NaN scale 0x%X m=%lld: (%lld,%lld) = %g", code,
                (long long)m, (long long)r, (long long)col, got);
        }
    }
  }
  // Every scale code as the scale of every block: compare with the reference (NaN where used).
  for (unsigned code = 0; code < 256; ++code) {
    Case c = make_case(3, 2, 20, fp4::kDtypeF32, fp4::kDtypeF32, 0, false, 1000 + code);
    for (auto& s : c.scales) s = static_cast<uint8_t>(code);
    check_case(c);
  }
}

// Several threads call run_w4a16 at once (the pool serializes jobs; each job fans out).
void test_concurrent_callers(bool quick) {
  const int threads = 4, iters = quick ? 3 : 6;
  std::vector<Case> cases;
  std::vector<std::vector<uint8_t>> expected;
  for (int t = 0; t < threads; ++t) {
    // GEMV and GEMM paths, with epilogues.
    cases.push_back(make_case(t % 2 ? 5 : 130, 70, 100 + 16 * t, fp4::kDtypeBF16, fp4::kDtypeF32, t % 3, t % 2, 900 + t));
  }
  for (auto& c : cases) {
    Buffers b = c.buffers();
    mlx_fp4::cpu::run_w4a16(c.p, b);
    expected.push_back(c.out);
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      Case mine = cases[t];  // own output buffer
      for (int i = 0; i < iters; ++i) {
        std::fill(mine.out.begin(), mine.out.end(), 0);
        Buffers b = mine.buffers();
        mlx_fp4::cpu::run_w4a16(mine.p, b);
        if (mine.out != expected[t]) mismatches.fetch_add(1);
      }
    });
  }
  for (auto& th : pool) th.join();
  CHECK(mismatches.load() == 0, "concurrent callers: %d results differ from the serial run", mismatches.load());
}

void test_parallel_for() {
  // Every task index runs exactly once, for task counts around the pool size.
  for (int64_t tasks : {0, 1, 2, 3, 7, 64, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(tasks));
    for (auto& h : hits) h.store(0);
    mlx_fp4::cpu::parallel_for(tasks, [&](int64_t t) { hits[t].fetch_add(1); });
    for (int64_t t = 0; t < tasks; ++t) CHECK(hits[t].load() == 1, "parallel_for(%lld): task %lld ran %d times", (long long)tasks, (long long)t, hits[t].load());
  }
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "quick";
  std::printf("threads: %d, hot loops: %s\n", mlx_fp4::cpu::num_threads(), mlx_fp4::cpu::hot_loops_name());
  const char* want = std::getenv("MLX_FP4_EXPECT_HOT_LOOPS");
  if (want && *want) {
    CHECK(std::string(want) == mlx_fp4::cpu::hot_loops_name(), "hot loops %s, expected %s",
          mlx_fp4::cpu::hot_loops_name(), want);
  }
  test_parallel_for();
  test_nan_scales();
  test_grid(quick);
  test_concurrent_callers(quick);
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
