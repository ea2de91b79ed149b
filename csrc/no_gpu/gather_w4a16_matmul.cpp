// Builds without a GPU backend (Linux CPU-only MLX): the gathered op's GPU path reports what is missing.
#include <stdexcept>

#include "../gather_primitive.h"

namespace mlx_fp4 {

bool gather_gpu_kernel_available() { return false; }
bool gather_gpu_kernel_supports_mode(int mode) { return mode == fp4::kModeNvfp4; }

void GatherW4A16Matmul::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error(
      "[GatherW4A16Matmul] this build of mlx_fp4 has no GPU implementation (MLX was found without Metal or "
      "CUDA); run on mx.cpu.");
}

}  // namespace mlx_fp4
