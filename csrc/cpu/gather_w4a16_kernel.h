// CPU gathered W4A16 kernel entry (mixture-of-experts): framework-free apart from the problem.
#pragma once
#include "../shared/gather_w4a16_problem.h"

namespace mlx_fp4::cpu {

struct GatherBuffers {
  const void* x;            // x_batches matrices of [m, k], x_dtype
  const uint8_t* w;         // experts x [n, w_row_bytes]
  const uint8_t* scales;    // experts x [n, scale_row_bytes]
  const uint32_t* lhs;      // [pairs]
  const uint32_t* rhs;      // [pairs]
  const float* global_scale;  // 1 or `experts` values (MLX amax), or nullptr
  const void* operands[fp4::kMaxEpilogueOperands];
  void* out;  // [pairs * m, n], out_dtype
};

// Writes the whole output and does not throw for bad indices (see gather_w4a16_matmul.cpp):
// out-of-range pairs get NaN rows, as on the GPU backends, and nothing is read through them.
// Pairs are grouped by expert so that each expert's weights stream once.
void run_gather_w4a16(const fp4::GatherW4A16Problem& g, const GatherBuffers& b);

}  // namespace mlx_fp4::cpu
