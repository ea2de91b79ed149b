// GatherW4A16Matmul::eval_gpu for MLX's CUDA backend: binds MLX buffers and adds the two kernels
// of gather_w4a16_matmul.cu (plan, then GEMV or grouped tensor cores) to MLX's CUDA graph as
// CUfunction nodes.
// Compiled by the C++ compiler (MLX's CUDA headers need fmt, see fmt_shim/), never by nvcc.
#include <cstdlib>
#include <string>

#include "../gather_primitive.h"
#include "gather_w4a16_kernels.h"
#include "mlx/allocator.h"
#include "mlx/backend/cuda/device.h"
#include "mlx/backend/cuda/utils.h"

namespace mlx_fp4 {

bool gather_gpu_kernel_available() { return true; }
bool gather_gpu_kernel_supports_mode(int mode) { return mode == fp4::kModeNvfp4 || mode == fp4::kModeMxfp4; }

void GatherW4A16Matmul::eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  namespace cu = mx::cu;
  auto& out = outputs[0];
  auto& enc = cu::get_command_encoder(stream());
  out.set_data(mx::allocator::malloc(out.nbytes()));
  const fp4::GatherW4A16Problem g = problem(inputs, out);
  if (fp4::gather_out_rows(g) == 0 || g.mm.n == 0) return;

  const int64_t words = fp4::cuda_gather_tiling::plan_workspace_words(g.experts, g.pairs, fp4::gather_out_rows(g));
  mx::array ws({static_cast<int>(words)}, mx::int32, nullptr, {});
  ws.set_data(mx::allocator::malloc(ws.nbytes()));
  cuda::GatherArgs a{};
  a.x = mx::gpu_ptr<void>(inputs[kGatherX]);
  a.w = mx::gpu_ptr<uint8_t>(inputs[kGatherW]);
  a.scales = mx::gpu_ptr<uint8_t>(inputs[kGatherScales]);
  a.lhs = mx::gpu_ptr<uint32_t>(inputs[kGatherLhs]);
  a.rhs = mx::gpu_ptr<uint32_t>(inputs[kGatherRhs]);
  a.multiplier = has_multiplier() ? mx::gpu_ptr<float>(inputs[kGatherFirstOptional]) : nullptr;
  for (int i = 0; i < g.mm.num_operands; ++i) a.operands[i] = mx::gpu_ptr<void>(inputs[operand_input_index(i)]);
  a.out = mx::gpu_ptr<void>(out);
  a.workspace = mx::gpu_ptr<int32_t>(ws);
  // MLX_FP4_CUDA_GATHER_PATH=simt|tc forces a kernel (tests, A/B timing); tc needs bf16/fp16 x.
  static const char* path_env = std::getenv("MLX_FP4_CUDA_GATHER_PATH");
  const bool half_x = g.mm.x_dtype != fp4::kDtypeF32;
  const bool tc = path_env && *path_env ? (half_x && std::string(path_env) == "tc") : cuda::gather_use_tc(g);
  a.use_tc = tc ? 1 : 0;
  a.g = g;

  // Plan: reads the indices, writes the workspace (and NaN rows for out-of-range pairs).
  enc.set_input_array(inputs[kGatherLhs]);
  enc.set_input_array(inputs[kGatherRhs]);
  enc.set_output_array(ws);
  enc.set_output_array(out);
  const cuda::Launch plan = cuda::gather_plan_launch(g);
  enc.add_kernel_node_ex(plan.func, plan.grid, plan.block, {}, plan.smem, a);
  // GEMV over every active expert, or the tensor-core kernel over the plan's tiles.
  for (const auto& in : inputs) enc.set_input_array(in);
  enc.set_input_array(ws);
  enc.set_output_array(out);
  const bool vec = cuda::vector_loads_ok(g.mm, a.x, a.w);
  const cuda::Launch run = tc ? cuda::gather_tc_launch(g, vec) : cuda::gather_gemv_launch(g, vec);
  enc.add_kernel_node_ex(run.func, run.grid, run.block, {}, run.smem, a);
  enc.add_temporary(ws);
}

}  // namespace mlx_fp4
