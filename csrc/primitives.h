// The W4A16Matmul primitive: immutable state, shape inference, transforms. Backends define
// eval_cpu (csrc/cpu/), eval_gpu (csrc/metal/, csrc/cuda/ or csrc/no_gpu/) in files of the
// same stem, w4a16_matmul.*.
#pragma once
#include <vector>

#include "mlx/primitives.h"
#include "mlx_fp4.h"
#include "shared/w4a16_problem.h"

namespace mlx_fp4 {

// Input order of the primitive: x, w (uint8 view), scales, [global scale], operands...
enum W4A16Input : int { kInputX = 0, kInputW = 1, kInputScales = 2, kInputFirstOptional = 3 };

// Equal epilogue chains (the same operand kinds and op constants bit for bit, so -0.0 and NaN
// constants are distinct chains): part of is_equivalent of both primitives.
bool same_epilogue_chain(const std::vector<fp4::EpilogueOp>& a, const std::vector<int>& a_kinds,
                         const std::vector<fp4::EpilogueOp>& b, const std::vector<int>& b_kinds);

// Throws std::invalid_argument naming `op` unless x's K, w's rows ([..., N, bytes]), the scales
// ([..., N, ceil(K/block)]) and the global scale (1 or `global_scales` values) agree: run at eval.
void check_eval_shapes(const char* op, const mx::array& x, const mx::array& w, const mx::array& scales, int mode,
                       const mx::array* global_scale, int64_t global_scales);

class W4A16Matmul : public mx::Primitive {
 public:
  W4A16Matmul(
      mx::Stream stream,
      mx::Dtype out_dtype,
      bool has_global_scale,
      std::vector<fp4::EpilogueOp> ops,
      std::vector<int> operand_kinds,
      int mode = fp4::kModeNvfp4);

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;

  std::vector<mx::array> jvp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& tangents,
      const std::vector<int>& argnums) override;
  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>& outputs) override;
  std::pair<std::vector<mx::array>, std::vector<int>> vmap(
      const std::vector<mx::array>& inputs, const std::vector<int>& axes) override;

  const char* name() const override { return "W4A16Matmul"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

  // Throws std::invalid_argument unless K, N, the weight rows, the scales and the global scale agree.
  void check_input_shapes(const std::vector<mx::array>& inputs) const;
  // The problem for these inputs and output (shapes checked); every backend launches from it.
  fp4::W4A16Problem problem(const std::vector<mx::array>& inputs, const mx::array& out) const;

  mx::Dtype out_dtype() const { return out_dtype_; }
  bool has_global_scale() const { return has_global_scale_; }
  const std::vector<fp4::EpilogueOp>& ops() const { return ops_; }
  const std::vector<int>& operand_kinds() const { return operand_kinds_; }
  int mode() const { return mode_; }
  int operand_input_index(int operand) const {
    return kInputFirstOptional + (has_global_scale_ ? 1 : 0) + operand;
  }

 private:
  // Rebuild the user-level call (operands in broadcastable shapes) from primal inputs.
  std::vector<EpilogueSpec> epilogue_specs(const std::vector<mx::array>& inputs) const;

  const mx::Dtype out_dtype_;
  const bool has_global_scale_;
  const std::vector<fp4::EpilogueOp> ops_;
  const std::vector<int> operand_kinds_;
  const int mode_;  // fp4::Mode
};

// Whether this build's GPU backend has W4A16 kernels for an fp4::Mode at M rows of x (defined next
// to eval_gpu). Without them the op runs MLX's own kernel or its MLX-ops form on GPU streams.
bool gpu_kernel_supports_mode(int mode, int64_t m);

// Maps an MLX dtype to the fp4::OperandDtype code kernels understand (throws otherwise).
int operand_dtype_code(mx::Dtype dtype);

}  // namespace mlx_fp4
