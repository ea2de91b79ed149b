// Decode tables as MLX arrays, generated from csrc/shared/fp4_format.h (no second copy).
#pragma once
#include "mlx/array.h"
#include "mlx/utils.h"

namespace mlx_fp4 {
namespace mx = mlx::core;

mx::array e2m1_table();  // float32 [16], code -> value
mx::array e4m3_table();  // float32 [256], byte -> value (0x7F, 0xFF -> NaN)

// Shared helpers of the format ops and the matmul op.
void check_packed(const mx::array& packed, const char* op, const char* arg);
// global_scale checked (one float32 element) and reshaped to a 0-d fp32 array.
mx::array global_scale_f32(const mx::array& gs, const char* op, mx::StreamOrDevice s);
// MLX's global_scale (the tensor amax) -> the decode multiplier amax / 2688, checked.
mx::array global_scale_multiplier(const mx::array& gs, const char* op, mx::StreamOrDevice s);
mx::array decode_f32(const mx::array& bytes, const mx::array& scales, int k, mx::StreamOrDevice s);

}  // namespace mlx_fp4
