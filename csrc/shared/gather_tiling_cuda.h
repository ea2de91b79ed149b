// Launch constants of the CUDA gathered (mixture-of-experts) kernels
// (csrc/cuda/gather_w4a16_matmul.cu), shared by the kernels, the MLX glue and the harness.
#pragma once
#include "fp4_format.h"

namespace fp4 {
namespace cuda_gather_tiling {

enum : int {
  // Plan kernel: one block groups the pairs by expert (counting sort in global memory).
  kPlanThreads = 1024,
  // GEMV kernel: one warp per weight row of one expert, kRowsPerPass rows of x per pass over it
  // (the row stays in L1/L2 between passes), kWarps weight rows per block.
  kWarps = 8,
  kRowsPerPass = 4,
};

// int32 words of the plan workspace: cursor[E], start[E + 1], active[E], num_active, order[P].
FP4_FN int64_t plan_workspace_words(int64_t experts, int64_t pairs) { return 3 * experts + 2 + pairs; }

}  // namespace cuda_gather_tiling
}  // namespace fp4
