// The op with its reference switch: what the public functions of mlx_fp4.h and the W4A16Matmul
// primitive's transforms call. The global scale is MLX's (the tensor amax) throughout; the primitive
// stores it as its input and the kernels divide (fp4::decode_multiplier).
#pragma once
#include "mlx_fp4.h"

namespace mlx_fp4 {

// w4a16_matmul (reference_ops = false) or w4a16_matmul_reference_ops (true).
mx::array w4a16_matmul_routed(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& global_scale,
    const std::vector<EpilogueSpec>& epilogue,
    std::optional<mx::Dtype> out_dtype,
    bool reference_ops,
    const std::string& mode = "nvfp4",
    mx::StreamOrDevice s = {});

}  // namespace mlx_fp4
