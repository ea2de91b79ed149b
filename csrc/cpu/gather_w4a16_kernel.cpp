// CPU gathered W4A16 (mixture-of-experts). Pairs are grouped by expert (a counting sort: sorted
// indices are already runs), so each expert's weights are read once per call for all of its rows:
//  * small groups (decode: a few tokens per expert) run the GEMV hot loop, all groups' weight
//    tiles as the tasks of one parallel pass;
//  * large groups (prefill) run the W4A16 GEMM on the group's gathered rows, one group at a time.
// Each output is computed by one task in a fixed order: results do not depend on the threads.
#include "gather_w4a16_kernel.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "microkernel.h"
#include "mlx/types/half_types.h"
#include "thread_pool.h"
#include "tiling_cpu.h"
#include "w4a16_kernel.h"

namespace mlx_fp4::cpu {
namespace {

namespace mx = mlx::core;

// A group of at most this many rows takes the GEMV path (the crossover of the dense kernel).
constexpr int kGatherGemvMaxRows = kGemvMaxRows;
// Rows packed per task when converting activations (enough work per task to amortize its handout).
constexpr int64_t kPackRowsPerTask = 8;

// Calls f with a value of the C++ type of an OperandDtype code.
template <typename F>
void visit_dtype(int dtype, F&& f) {
  switch (dtype) {
    case fp4::kDtypeF16: f(mx::float16_t{}); break;
    case fp4::kDtypeBF16: f(mx::bfloat16_t{}); break;
    default: f(float{}); break;
  }
}

// Pairs of one expert: order[first .. first + count) are their pair ids, in pair order.
struct Group {
  int64_t expert;
  int64_t first;
  int64_t count;
};

// Unsigned compares: a negative index arrives as a large uint32 (the op's canonical form).
bool bad_pair(const fp4::GatherW4A16Problem& g, const GatherBuffers& b, int64_t p) {
  return b.lhs[p] >= g.x_batches || b.rhs[p] >= g.experts;
}

// NaN rows for the out-of-range pairs (the GPU kernels' contract): a defined result that reads
// neither x nor a weight through a bad index.
void fill_bad_pairs(const fp4::GatherW4A16Problem& g, const GatherBuffers& b) {
  for (int64_t p = 0; p < g.pairs; ++p) {
    if (!bad_pair(g, b, p)) continue;
    visit_dtype(g.mm.out_dtype, [&](auto tag) {
      using T = decltype(tag);
      T* dst = static_cast<T*>(b.out) + p * g.mm.m * g.mm.n;
      std::fill(dst, dst + g.mm.m * g.mm.n, static_cast<T>(std::numeric_limits<float>::quiet_NaN()));
    });
  }
}

// Counting sort of the in-range pairs by expert (stable), then one group per expert that has pairs.
std::vector<Group> group_by_expert(const fp4::GatherW4A16Problem& g, const GatherBuffers& b,
                                   std::vector<int64_t>& order) {
  std::vector<int64_t> start(g.experts + 1, 0);
  for (int64_t p = 0; p < g.pairs; ++p) {
    if (!bad_pair(g, b, p)) ++start[b.rhs[p] + 1];
  }
  for (int64_t e = 0; e < g.experts; ++e) start[e + 1] += start[e];
  order.resize(start.back());
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t p = 0; p < g.pairs; ++p) {
    if (!bad_pair(g, b, p)) order[next[b.rhs[p]]++] = p;
  }
  std::vector<Group> groups;
  for (int64_t e = 0; e < g.experts; ++e) {
    if (start[e + 1] > start[e]) groups.push_back({e, start[e], start[e + 1] - start[e]});
  }
  return groups;
}

// Multiplier, chain and cast of v[0..count) = y[row, col0..) for a row of `expert`; stores it.
void finish(const fp4::GatherW4A16Problem& g, const GatherBuffers& b, int64_t expert, int64_t row, int64_t col0,
            int64_t count, float* v) {
  const fp4::W4A16Problem& p = g.mm;
  if (p.has_global_scale) {
    const float mult = fp4::gather_multiplier(g, b.global_scale, expert);
    for (int64_t j = 0; j < count; ++j) v[j] *= mult;
  }
  thread_local std::vector<float> opnd;
  opnd.resize(count);
  for (int i = 0; i < p.num_ops; ++i) {
    const fp4::EpilogueOp& op = p.ops[i];
    if (op.operand < 0) {
      std::fill(opnd.begin(), opnd.end(), op.p0);
    } else {
      const int kind = p.operand_kind[op.operand];
      const int64_t at = fp4::operand_offset(kind, row, col0, p.n);
      const bool per_col = kind == fp4::kOperandCol || kind == fp4::kOperandFull;
      visit_dtype(p.operand_dtype[op.operand], [&](auto tag) {
        const auto* src = static_cast<const decltype(tag)*>(b.operands[op.operand]) + at;
        for (int64_t j = 0; j < count; ++j) opnd[j] = static_cast<float>(src[per_col ? j : 0]);
      });
    }
    hot_loops().epilogue_op(op.code, v, opnd.data(), count, op.p0, op.p1);
  }
  visit_dtype(p.out_dtype, [&](auto tag) {
    using T = decltype(tag);
    T* dst = static_cast<T*>(b.out) + row * p.n + col0;
    for (int64_t j = 0; j < count; ++j) dst[j] = static_cast<T>(v[j]);
  });
}

// Activation row `src` -> fp32 in the hot loops' chunk order, zero-padded to kp.
void pack_row(const fp4::GatherW4A16Problem& g, const GatherBuffers& b, int64_t src, int64_t kp, float* dst) {
  const int vec = hot_loops().vector_floats;
  std::fill(dst, dst + kp, 0.0f);
  visit_dtype(g.mm.x_dtype, [&](auto tag) {
    const auto* x = static_cast<const decltype(tag)*>(b.x) + src * g.mm.k;
    for (int64_t k = 0; k < g.mm.k; ++k) dst[xorder_index(k, vec)] = static_cast<float>(x[k]);
  });
}

// Rows of x and of the output for the pair order[first + i / m], row i % m.
int64_t x_row(const fp4::GatherW4A16Problem& g, const GatherBuffers& b, int64_t pair, int64_t r) {
  return static_cast<int64_t>(b.lhs[pair]) * g.mm.m + r;
}

void run_gemv_groups(const fp4::GatherW4A16Problem& g, const GatherBuffers& b, const std::vector<Group>& groups,
                     const std::vector<int64_t>& order) {
  if (groups.empty()) return;
  const HotLoops& h = hot_loops();
  const int64_t m = g.mm.m;
  const int64_t n = g.mm.n;
  const int64_t kp = (g.mm.k + 2 * h.vector_floats - 1) / (2 * h.vector_floats) * (2 * h.vector_floats);
  // Packed rows of every group back to back: group j's rows start at row_start[j].
  std::vector<int64_t> row_start(groups.size() + 1, 0);
  for (size_t j = 0; j < groups.size(); ++j) row_start[j + 1] = row_start[j] + groups[j].count * m;
  const int64_t rows = row_start.back();
  std::vector<int64_t> src(rows), dst(rows);
  for (size_t j = 0; j < groups.size(); ++j) {
    for (int64_t i = 0; i < groups[j].count * m; ++i) {
      const int64_t pair = order[groups[j].first + i / m];
      src[row_start[j] + i] = x_row(g, b, pair, i % m);
      dst[row_start[j] + i] = pair * m + i % m;
    }
  }
  std::vector<float> xs(static_cast<size_t>(rows) * kp);
  parallel_for((rows + kPackRowsPerTask - 1) / kPackRowsPerTask, [&](int64_t t) {
    for (int64_t r = t * kPackRowsPerTask; r < std::min(rows, (t + 1) * kPackRowsPerTask); ++r) {
      pack_row(g, b, src[r], kp, xs.data() + r * kp);
    }
  });
  std::vector<float> y(static_cast<size_t>(rows) * n);
  const int64_t tiles = (n + kGemvTaskRows - 1) / kGemvTaskRows;
  parallel_for(static_cast<int64_t>(groups.size()) * tiles, [&](int64_t task) {
    const size_t j = static_cast<size_t>(task / tiles);
    const Group& grp = groups[j];
    GemvArgs a;
    a.w = b.w + grp.expert * g.w_expert_bytes;
    a.ldw = g.mm.w_row_bytes;
    a.s = b.scales + grp.expert * g.scale_expert_bytes;
    a.lds = g.mm.scale_row_bytes;
    a.k = g.mm.k;
    a.kp = kp;
    a.n0 = (task % tiles) * kGemvTaskRows;
    a.n1 = std::min(n, a.n0 + kGemvTaskRows);
    a.ldy = n;
    a.mode = g.mm.mode;
    const int group_rows = static_cast<int>(grp.count * m);
    for (int r0 = 0; r0 < group_rows; r0 += kGemvPassRows) {
      a.rows = std::min(kGemvPassRows, group_rows - r0);
      a.x = xs.data() + (row_start[j] + r0) * kp;
      a.y = y.data() + (row_start[j] + r0) * n;
      h.gemv(a);
    }
    for (int r = 0; r < group_rows; ++r) {
      const int64_t at = row_start[j] + r;
      finish(g, b, grp.expert, dst[at], a.n0, a.n1 - a.n0, y.data() + at * n + a.n0);
    }
  });
}

// One large group: its x rows gathered contiguously, the dense W4A16 kernel into fp32, then the
// multiplier and the chain per output row.
void run_gemm_group(const fp4::GatherW4A16Problem& g, const GatherBuffers& b, const Group& grp,
                    const std::vector<int64_t>& order) {
  const int64_t m = g.mm.m;
  const int64_t rows = grp.count * m;
  const int64_t k = g.mm.k;
  const int64_t n = g.mm.n;
  std::vector<float> y(static_cast<size_t>(rows) * n);
  fp4::W4A16Problem sub = g.mm;
  sub.m = rows;
  sub.out_dtype = fp4::kDtypeF32;
  sub.has_global_scale = 0;
  sub.num_ops = 0;
  sub.num_operands = 0;
  Buffers db{};
  db.w = b.w + grp.expert * g.w_expert_bytes;
  db.scales = b.scales + grp.expert * g.scale_expert_bytes;
  db.out = y.data();
  visit_dtype(g.mm.x_dtype, [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> xg(static_cast<size_t>(rows) * k);
    for (int64_t i = 0; i < rows; ++i) {
      const T* x = static_cast<const T*>(b.x) + x_row(g, b, order[grp.first + i / m], i % m) * k;
      std::copy(x, x + k, xg.begin() + i * k);
    }
    db.x = xg.data();
    run_w4a16(sub, db);
  });
  parallel_for(rows, [&](int64_t i) {
    const int64_t pair = order[grp.first + i / m];
    finish(g, b, grp.expert, pair * m + i % m, 0, n, y.data() + i * n);
  });
}

}  // namespace

void run_gather_w4a16(const fp4::GatherW4A16Problem& g, const GatherBuffers& b) {
  if (fp4::gather_out_rows(g) == 0 || g.mm.n == 0) return;
  fill_bad_pairs(g, b);
  std::vector<int64_t> order;
  const std::vector<Group> groups = group_by_expert(g, b, order);
  std::vector<Group> small;
  for (const Group& grp : groups) {
    if (grp.count * g.mm.m <= kGatherGemvMaxRows) {
      small.push_back(grp);
    } else {
      run_gemm_group(g, b, grp, order);
    }
  }
  run_gemv_groups(g, b, small, order);
}

}  // namespace mlx_fp4::cpu
