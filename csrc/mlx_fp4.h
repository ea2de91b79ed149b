// Public C++ API of mlx_fp4: lazy MLX graph ops for the NVFP4 weight format and W4A16 matmul.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "mlx/array.h"
#include "mlx/utils.h"

namespace mlx_fp4 {
namespace mx = mlx::core;

// One op of the fused epilogue. `code` is an fp4::EpilogueCode. Ops with a tensor operand
// (add, mul) take `operand`; without one they use `p0` (a Python float). clamp uses p0, p1.
struct EpilogueSpec {
  int code;
  std::optional<mx::array> operand;
  float p0 = 0.0f;
  float p1 = 0.0f;
};

// global_scale everywhere is MLX's convention (mx::quantize / mx::dequantize): the fp32 tensor
// amax; the weights decode as e2m1 * e4m3 * (global_scale / 2688).
//
// y = epilogue((global_scale / 2688) * (x @ dequantize(w, scales).T)), fp32 accumulation.
// x [..., K] float16/bfloat16/float32; w uint8 [N, ceil(K/2)] or uint32 [N, ceil(K/8)];
// scales uint8 [N, ceil(K/block)] (E4M3 bits per 16 / E8M0 per 32 by mode); global_scale fp32 scalar
// (nvfp4 only); out [..., N].
mx::array w4a16_matmul(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& global_scale,
    const std::vector<EpilogueSpec>& epilogue,
    std::optional<mx::Dtype> out_dtype,
    const std::string& mode = "nvfp4",
    mx::StreamOrDevice s = {});

// `mode` everywhere: "nvfp4" (E4M3 scales per 16 weights, optional global scale) or "mxfp4" (E8M0
// scales per 32 weights, no global scale), as in mx.quantize; anything else is a ValueError.
//
// Quantize w [N, K] to (packed uint8 [N, ceil(K/2)], scales uint8 [N, ceil(K/block)]) and, when
// with_global_scale (nvfp4 only), the float32 scalar global_scale = amax(|w|) (MLX's convention).
std::vector<mx::array> quantize(
    const mx::array& w, bool with_global_scale, const std::string& mode = "nvfp4", mx::StreamOrDevice s = {});
// The same with a given global_scale (e.g. the amax of a whole tensor of which w is a shard);
// returns (packed, scales), as mx::quantize does.
std::vector<mx::array> quantize(const mx::array& w, const std::optional<mx::array>& global_scale,
                                const std::string& mode = "nvfp4", mx::StreamOrDevice s = {});

// Decode to [N, k] in `dtype` (exact in bf16/fp16/fp32 without global scale; the global scale
// is applied in fp32 before the one cast).
mx::array dequantize(
    const mx::array& packed,
    const mx::array& scales,
    std::optional<int> k,
    const std::optional<mx::array>& global_scale,
    mx::Dtype dtype,
    const std::string& mode = "nvfp4",
    mx::StreamOrDevice s = {});

// The same math as w4a16_matmul written with MLX ops only (dequantize + fp32 matmul + chain).
// Backs vjp/jvp and serves as the oracle for backends in tests.
mx::array w4a16_matmul_reference_ops(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& global_scale,
    const std::vector<EpilogueSpec>& epilogue,
    std::optional<mx::Dtype> out_dtype,
    const std::string& mode = "nvfp4",
    mx::StreamOrDevice s = {});

}  // namespace mlx_fp4
