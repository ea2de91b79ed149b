// metal: the gathered kernel is not written yet; the op runs its MLX-ops form on GPU streams (gather_ops.cpp).
#include <stdexcept>

#include "../gather_primitive.h"

namespace mlx_fp4 {

bool gather_gpu_kernel_available() { return false; }

void GatherW4A16Matmul::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error(
      "[GatherW4A16Matmul] no metal kernel yet "
      "(the op routes GPU streams to MLX ops).");
}

}  // namespace mlx_fp4
