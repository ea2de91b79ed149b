// Decode tables as MLX arrays, generated from csrc/shared/fp4_format.h (no second copy).
#pragma once
#include <optional>
#include <string>

#include "mlx/array.h"
#include "mlx/utils.h"

namespace mlx_fp4 {
namespace mx = mlx::core;

mx::array e2m1_table();  // float32 [16], code -> value
mx::array e4m3_table();  // float32 [256], byte -> value (0x7F, 0xFF -> NaN)
mx::array e8m0_table();  // float32 [256], byte -> 2^(byte - 127) (0xFF -> NaN)
mx::array scale_table(int mode);  // the table of an fp4::Mode

// The mode argument ("nvfp4" | "mxfp4", as in mx.quantize) -> fp4::Mode; anything else is a
// ValueError naming `op`.
int parse_mode(const std::string& mode, const char* op);
const char* mode_name(int mode);
// MLX's group_size / bits arguments: accepted when they match the mode (None = the default).
void check_mode_config(int mode, std::optional<int> group_size, std::optional<int> bits, const char* op);
// mxfp4 has no per-tensor scale: a global_scale with it is a ValueError (as in mx.quantize).
void check_no_global_scale(int mode, bool has_global_scale, const char* op);

// Shared helpers of the format ops and the matmul op.
void check_packed(const mx::array& packed, const char* op, const char* arg);
// global_scale checked (one float32 element, shape () or (1,)) and returned as is: no graph node,
// since the kernels take MLX's amax and divide in place (fp4::decode_multiplier).
const mx::array& checked_global_scale(const mx::array& gs, const char* op);
// MLX's global_scale (the tensor amax) -> the decode multiplier amax / 2688, checked.
mx::array global_scale_multiplier(const mx::array& gs, const char* op, mx::StreamOrDevice s);
mx::array decode_f32(const mx::array& bytes, const mx::array& scales, int k, int mode, mx::StreamOrDevice s);

}  // namespace mlx_fp4
