// The gathered W4A16 problem (mixture-of-experts): `pairs` independent products
// out[p] = epilogue(mult(e) * (x[lhs[p]] @ W[e].T)), e = rhs[p], each x[l] an [m, k] matrix and
// each W[e] an [n, k] NVFP4 expert. Framework-free, shared by C++, CUDA and Metal hosts.
#pragma once
#include "w4a16_problem.h"

namespace fp4 {

struct GatherW4A16Problem {
  // One product: m = rows per pair, n, k, row strides of one expert, dtypes and the chain.
  // Epilogue operands (kinds Row/Full) are indexed by the output row p * m + r.
  W4A16Problem mm;
  int64_t pairs;            // products = elements of the broadcast index shape
  int64_t x_batches;        // matrices in x; lhs indices must be < x_batches
  int64_t experts;          // matrices in w; rhs indices must be < experts
  int64_t w_expert_bytes;   // bytes between experts in w (n * w_row_bytes)
  int64_t scale_expert_bytes;  // bytes between experts in scales (n * scale_row_bytes)
  int global_scale_per_expert;   // 1: global_scale[rhs[p]]; 0: one global scale for all (if any)
  int sorted_rhs;              // a hint: rhs is non-decreasing (runs of one expert)
};

// The decode multiplier of expert e: MLX's global scale (the amax; one value or one per expert)
// / 2688, or 1 without one. C++ and CUDA only: MSL pointers need an address space.
#if !defined(__METAL_VERSION__)
FP4_FN float gather_multiplier(const GatherW4A16Problem& g, const float* global_scale, int64_t e) {
  return g.mm.has_global_scale ? decode_multiplier(global_scale[g.global_scale_per_expert ? e : 0]) : 1.0f;
}
#endif

// Output rows of the whole gathered product.
FP4_FN int64_t gather_out_rows(GatherW4A16Problem p) { return p.pairs * p.mm.m; }

}  // namespace fp4
