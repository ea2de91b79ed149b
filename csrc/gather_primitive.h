// The GatherW4A16Matmul primitive (mixture-of-experts W4A16): immutable state, shape inference,
// vjp and vmap. Backends define eval_cpu / eval_gpu in files of the stem gather_w4a16_matmul.*
// (csrc/cpu, csrc/cuda, csrc/metal, csrc/no_gpu).
#pragma once
#include <vector>

#include "mlx/primitives.h"
#include "mlx_fp4.h"
#include "shared/gather_w4a16_problem.h"

namespace mlx_fp4 {

// Inputs: x [..., M, K], w [..., N, bytes] (uint8 or uint32), scales [..., N, blocks],
// lhs and rhs (uint32, one broadcast shape B), [global_scale (MLX amax): one value or [E] fp32], operands...
// Output: B + [M, N].
enum GatherInput : int {
  kGatherX = 0,
  kGatherW = 1,
  kGatherScales = 2,
  kGatherLhs = 3,
  kGatherRhs = 4,
  kGatherFirstOptional = 5,
};

class GatherW4A16Matmul : public mx::Primitive {
 public:
  GatherW4A16Matmul(
      mx::Stream stream,
      mx::Dtype out_dtype,
      bool has_global_scale,
      bool sorted_rhs,
      std::vector<fp4::EpilogueOp> ops,
      std::vector<int> operand_kinds,
      int mode = fp4::kModeNvfp4);

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;

  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>& outputs) override;
  std::pair<std::vector<mx::array>, std::vector<int>> vmap(
      const std::vector<mx::array>& inputs, const std::vector<int>& axes) override;

  const char* name() const override { return "GatherW4A16Matmul"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

  // The problem for these inputs and output; every backend launches from it.
  fp4::GatherW4A16Problem problem(const std::vector<mx::array>& inputs, const mx::array& out) const;

  bool has_global_scale() const { return has_global_scale_; }
  int operand_input_index(int operand) const {
    return kGatherFirstOptional + (has_global_scale_ ? 1 : 0) + operand;
  }

 private:
  // The user-level chain (operands in their canonical, broadcastable shapes) from the inputs.
  std::vector<EpilogueSpec> epilogue_specs(const std::vector<mx::array>& inputs) const;

  const mx::Dtype out_dtype_;
  const bool has_global_scale_;
  const bool sorted_rhs_;
  const std::vector<fp4::EpilogueOp> ops_;
  const std::vector<int> operand_kinds_;
  const int mode_;  // fp4::Mode
};

// Whether this build's GPU backend has the gathered kernel (defined next to eval_gpu). Without it
// the op runs its MLX-ops form on GPU streams.
bool gather_gpu_kernel_available();
// Whether those kernels read the scales of an fp4::Mode (without: MLX's own gather_qmm of the mode).
bool gather_gpu_kernel_supports_mode(int mode);

// The primitive's canonical operands: x, stacked weights, the uint32 indices in one broadcast
// shape B and the global scale (MLX amax: one value, shape () or (1,), or [E]).
struct GatherInputs {
  mx::array x;
  mx::array w;
  mx::array scales;
  mx::array lhs;
  mx::array rhs;
  std::optional<mx::array> global_scale;
  int mode = fp4::kModeNvfp4;  // fp4::Mode of the scales
};

// The pairs of canonical inputs with every out-of-range index (the kernels' NaN rows) replaced by
// 0, and per pair a factor of 1 or NaN. The MLX-ops forms read these: mx.gather_mm reads a bad
// index modulo the batch (a finite, wrong row) and its vjp scatters past x (a SIGSEGV).
struct InRangePairs {
  mx::array lhs;          // B, uint32, < the matrices of x
  mx::array rhs;          // B, uint32, < the experts
  mx::array factor;       // B + [1, 1] fp32: NaN where the pair had an out-of-range index, else 1
  mx::array lhs_out_of_range;  // scalar bool: some lhs index was out of range
};
InRangePairs in_range_pairs(const GatherInputs& in, mx::StreamOrDevice s);

// The op on canonical inputs: builds the graph node (operands are canonicalized here).
mx::array gather_w4a16_node(
    const GatherInputs& in, const std::vector<EpilogueSpec>& epilogue, mx::Dtype out_dtype, bool sorted_rhs,
    mx::StreamOrDevice s);

// The same math in MLX ops on canonical inputs (decode + gather_mm + chain); backs the vjp.
mx::array gather_w4a16_reference_canonical(
    const GatherInputs& in, const std::vector<EpilogueSpec>& epilogue, mx::Dtype out_dtype, mx::StreamOrDevice s);

}  // namespace mlx_fp4
