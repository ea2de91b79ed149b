// Public C++ API of the gathered (mixture-of-experts) W4A16 matmul.
#pragma once
#include "mlx_fp4.h"

namespace mlx_fp4 {

// out[b] = epilogue(gs_mult[e] * (x[lhs[b]] @ dequantize(w[e], scales[e]).T)), e = rhs[b]:
// mx.gather_qmm(x, w, scales, lhs_indices=, rhs_indices=, transpose=True, mode="nvfp4",
// global_scale=) semantics. x [..., M, K]; w uint8 [..., N, ceil(K/2)] or uint32
// [..., N, ceil(K/8)]; scales uint8 [..., N, ceil(K/16)]; indices integer arrays that broadcast
// together to B (flat indices into the batch dims of x and w; defaults: every matrix);
// global_scale fp32, a scalar or one per expert (w.shape[:-2]), in MLX's convention: the tensor
// amax (the kernels divide by 2688 in place, as MLX's do). Output B + [M, N].
mx::array gather_w4a16_matmul(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& lhs_indices,
    const std::optional<mx::array>& rhs_indices,
    const std::optional<mx::array>& global_scale,
    const std::vector<EpilogueSpec>& epilogue,
    std::optional<mx::Dtype> out_dtype,
    bool sorted_indices,
    const std::string& mode = "nvfp4",
    mx::StreamOrDevice s = {});

// The same math with MLX ops only (decode, gather_mm in fp32, chain): the oracle for backends.
mx::array gather_w4a16_matmul_reference_ops(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& lhs_indices,
    const std::optional<mx::array>& rhs_indices,
    const std::optional<mx::array>& global_scale,
    const std::vector<EpilogueSpec>& epilogue,
    std::optional<mx::Dtype> out_dtype,
    const std::string& mode = "nvfp4",
    mx::StreamOrDevice s = {});

}  // namespace mlx_fp4
