// The op with the global scale already converted to the decode multiplier
// (MLX's global_scale / 2688): what the W4A16Matmul primitive stores and its transforms call.
// The public functions in mlx_fp4.h take MLX's convention (the tensor amax) and convert once.
#pragma once
#include "mlx_fp4.h"

namespace mlx_fp4 {

// w4a16_matmul (reference_ops = false) or w4a16_matmul_reference_ops (true).
mx::array w4a16_matmul_with_multiplier(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& multiplier,
    const std::vector<EpilogueSpec>& epilogue,
    std::optional<mx::Dtype> out_dtype,
    bool reference_ops,
    const std::string& mode = "nvfp4",
    mx::StreamOrDevice s = {});

}  // namespace mlx_fp4
