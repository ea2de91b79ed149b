// Builds without a GPU backend (Linux CPU-only MLX): the GPU path reports what is missing.
#include <stdexcept>

#include "../primitives.h"

namespace mlx_fp4 {

// No GPU kernels: a GPU stream cannot run here in any mode.
bool gpu_kernel_supports_mode(int mode, int64_t) { return mode == fp4::kModeNvfp4; }


void W4A16Matmul::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error(
      "[W4A16Matmul] this build of mlx_fp4 has no GPU implementation (MLX was found without Metal or "
      "CUDA); run on mx.cpu.");
}

}  // namespace mlx_fp4
