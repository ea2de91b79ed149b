// GatherW4A16Matmul::eval_gpu for MLX's CUDA backend: binds MLX buffers and adds the kernels of
// gather_w4a16_matmul.cu (a pair kernel, or the plan then the grouped GEMV or tensor cores) to
// MLX's CUDA graph as CUfunction nodes.
// Compiled by the C++ compiler (MLX's CUDA headers need fmt, see fmt_shim/), never by nvcc.
#include <cstdlib>
#include <optional>
#include <string>

#include "../gather_primitive.h"
#include "gather_w4a16_kernels.h"
#include "mlx_memory.h"
#include "mlx/allocator.h"
#include "mlx/backend/cuda/device.h"
#include "mlx/backend/cuda/utils.h"

namespace mlx_fp4 {

bool gather_gpu_kernel_available() { return true; }
bool gather_gpu_kernel_supports_mode(int mode) { return mode == fp4::kModeNvfp4 || mode == fp4::kModeMxfp4; }

namespace {

// MLX_FP4_CUDA_GATHER_PATH=pairs|simt|tc forces a kernel (tests, A/B timing; simt = the grouped
// GEMV); a kernel that cannot run the problem (tc with float32 x or MXFP4) falls back to the plan.
cuda::GatherKernel gather_kernel(const fp4::GatherW4A16Problem& g) {
  static const char* env = std::getenv("MLX_FP4_CUDA_GATHER_PATH");
  if (!env || !*env) return cuda::gather_kernel_for(g);
  const std::string path(env);
  const cuda::GatherKernel forced = path == "pairs" ? cuda::GatherKernel::kPairs
                                    : path == "tc"  ? cuda::GatherKernel::kTc
                                                    : cuda::GatherKernel::kGemv;
  return cuda::gather_kernel_supports(forced, g) ? forced : cuda::gather_kernel_for(g);
}

// MLX_FP4_CUDA_GATHER_PAIRS=runs|tc|decode|simt forces a pair kernel where it can run (tests, A/B
// timing; tc = batched without runs); -1 when unset (gather_pair_launch's order).
int pairs_forced() {
  static const int forced = [] {
    const char* env = std::getenv("MLX_FP4_CUDA_GATHER_PAIRS");
    const std::string v = env ? env : "";
    return v == "runs"     ? int(cuda::PairKernel::kRunsTc)
           : v == "tc"     ? int(cuda::PairKernel::kBatchedTc)
           : v == "decode" ? int(cuda::PairKernel::kDecode)
           : v == "simt"   ? int(cuda::PairKernel::kSimt)
                           : -1;
  }();
  return forced;
}

// MLX_FP4_CUDA_GATHER_TC="1,rt,kw" forces the batched pair kernel's tile, "product" keeps one
// product's warps (A/B timing; cuda::batched_tc_config); null when unset (the rule).
const char* pairs_tc_override() {
  static const char* env = std::getenv("MLX_FP4_CUDA_GATHER_TC");
  return env;
}

// MLX_FP4_CUDA_DECODE_SHAPE=i runs the decode GEMV in kDecodeShapes[i] (A/B timing through MLX,
// tests); -1 (unset) leaves it to kDecodePlannedShape.
int decode_shape_forced() {
  static const int shape = std::getenv("MLX_FP4_CUDA_DECODE_SHAPE") ? std::atoi(std::getenv("MLX_FP4_CUDA_DECODE_SHAPE")) : -1;
  return shape;
}

// MLX_FP4_CUDA_GATHER_STAGED=0 keeps the plan's tiles on the register-prefetch kernel (tests, A/B
// timing); otherwise gather_tc_for decides.
bool gather_staged_allowed() {
  static const bool disabled = std::getenv("MLX_FP4_CUDA_GATHER_STAGED") &&
                               std::string(std::getenv("MLX_FP4_CUDA_GATHER_STAGED")) == "0";
  return !disabled;
}

// The grouped wgmma kernel where this device runs it: MLX_FP4_CUDA_GATHER_WGMMA=0 keeps it off,
// =1 forces it wherever it can run (tests, A/B timing); otherwise gather_tc_for's rows rule.
cuda::GatherWgmma gather_wgmma(int device) {
  static const char* env = std::getenv("MLX_FP4_CUDA_GATHER_WGMMA");
  const std::string forced = env ? env : "";
  if (!cuda::device_info(device).wgmma || forced == "0") return cuda::kWgmmaOff;
  return forced == "1" ? cuda::kWgmmaForced : cuda::kWgmmaAuto;
}

}  // namespace

void GatherW4A16Matmul::eval_gpu(const std::vector<mx::array>& given, std::vector<mx::array>& outputs) {
  namespace cu = mx::cu;
  auto& out = outputs[0];
  auto& enc = cu::get_command_encoder(stream());
  out.set_data(cuda::device_data(out.nbytes(), enc));
  // gather_ops.cpp adds no Contiguous node for x and the indices on CUDA (a router's top-k slice
  // and the broadcast default lhs are strided): rows of them here, by a node of ours when needed.
  std::vector<mx::array> inputs = given;
  for (int i : {kGatherX, kGatherLhs, kGatherRhs}) inputs[i] = cuda::row_contiguous(given[i], enc, "GatherW4A16Matmul");
  const fp4::GatherW4A16Problem g = problem(inputs, out);
  if (fp4::gather_out_rows(g) == 0 || g.mm.n == 0) return;

  cuda::GatherArgs a{};
  a.x = mx::gpu_ptr<void>(inputs[kGatherX]);
  a.w = mx::gpu_ptr<uint8_t>(inputs[kGatherW]);
  a.scales = mx::gpu_ptr<uint8_t>(inputs[kGatherScales]);
  a.lhs = mx::gpu_ptr<uint32_t>(inputs[kGatherLhs]);
  a.rhs = mx::gpu_ptr<uint32_t>(inputs[kGatherRhs]);
  a.global_scale = has_global_scale() ? mx::gpu_ptr<float>(inputs[kGatherFirstOptional]) : nullptr;
  for (int i = 0; i < g.mm.num_operands; ++i) a.operands[i] = mx::gpu_ptr<void>(inputs[operand_input_index(i)]);
  a.out = mx::gpu_ptr<void>(out);
  const cuda::GatherKernel kernel = gather_kernel(g);
  a.g = g;
  const int device = enc.device().cuda_device();
  a.use_tc = kernel == cuda::GatherKernel::kTc ? cuda::gather_tc_for(a, gather_staged_allowed(), gather_wgmma(device))
                                               : cuda::kTcNone;
  a.tile_rows = cuda::gather_tile_rows(a.use_tc);
  const bool vec = cuda::vector_loads_ok(g.mm, a.x, a.w);

  if (kernel == cuda::GatherKernel::kPairs) {  // one node: no plan, no workspace
    for (const auto& in : inputs) enc.set_input_array(in);
    enc.set_output_array(out);
    const cuda::PairLaunch run = cuda::gather_pair_launch(a, vec, cuda::device_info(device), pairs_forced(),
                                                          decode_shape_forced(), pairs_tc_override());
    if (run.kernel == cuda::PairKernel::kBatchedTc || run.kernel == cuda::PairKernel::kRunsTc) {
      cuda::W4A16Args b = cuda::batched_args(a);  // non-const: MLX takes the kernel arguments by pointer
      enc.add_kernel_node_ex(run.launch.func, run.launch.grid, run.launch.block, {}, run.launch.smem, b);
    } else {
      enc.add_kernel_node_ex(run.launch.func, run.launch.grid, run.launch.block, {}, run.launch.smem, a);
    }
    return;
  }

  // The plan's workspace comes from MLX's allocator (mlx_memory.h), back in its cache once run.
  const int64_t rows = fp4::gather_out_rows(g);
  const int64_t words = fp4::cuda_gather_tiling::plan_workspace_words(g.experts, g.pairs, rows);
  mx::array ws = cuda::device_array({static_cast<int>(words)}, mx::int32, enc);
  a.workspace = mx::gpu_ptr<int32_t>(ws);
  // Plan: reads the indices, writes the workspace (and NaN rows for out-of-range pairs).
  enc.set_input_array(inputs[kGatherLhs]);
  enc.set_input_array(inputs[kGatherRhs]);
  enc.set_output_array(ws);
  enc.set_output_array(out);
  const cuda::Launch plan = cuda::gather_plan_launch(g);
  enc.add_kernel_node_ex(plan.func, plan.grid, plan.block, {}, plan.smem, a);
  const bool wgmma = a.use_tc == cuda::kTcWgmma;
  cuda::W4A16Args b = cuda::grouped_args(a);  // non-const: MLX takes the kernel arguments by pointer
  // The wgmma kernel's x: its rows gathered into the sorted order and permuted (its k order).
  const int64_t kp = wgmma ? cuda::wgmma_padded_k(g.mm.k) : 0;
  std::optional<mx::array> xp;
  if (wgmma) {
    xp = cuda::device_array({static_cast<int>(rows), static_cast<int>(kp)}, inputs[kGatherX].dtype(), enc);
    cuda::WgmmaPermuteArgs pa{a.x, mx::gpu_ptr<void>(*xp), rows, g.mm.k, kp, b.x_rows};
    enc.set_input_array(inputs[kGatherX]);
    enc.set_input_array(ws);
    enc.set_output_array(*xp);
    const cuda::Launch permute = cuda::wgmma_permute_launch(pa, g.mm.x_dtype);
    enc.add_kernel_node_ex(permute.func, permute.grid, permute.block, {}, permute.smem, pa);
  }
  // GEMV over every active expert, or a tensor-core kernel over the plan's tiles.
  for (const auto& in : inputs) enc.set_input_array(in);
  enc.set_input_array(ws);
  if (wgmma) enc.set_input_array(*xp);
  enc.set_output_array(out);
  const int64_t tiles = fp4::cuda_gather_tiling::max_tc_tiles(g.experts, rows, a.tile_rows);
  if (wgmma) {
    cuda::WgmmaArgs wa;
    cuda::wgmma_prepare_grouped(wa, b, mx::gpu_ptr<void>(*xp), rows, g.experts);
    const cuda::Launch run = cuda::wgmma_grouped_launch(g.mm, tiles);
    enc.add_kernel_node_ex(run.func, run.grid, run.block, {}, run.smem, wa);
    enc.add_temporary(*xp);
  } else if (a.use_tc == cuda::kTcStaged) {
    const cuda::Launch run = cuda::tc_grouped_launch(g.mm, cuda::device_info(device), tiles);
    enc.add_kernel_node_ex(run.func, run.grid, run.block, {}, run.smem, b);
  } else {
    const cuda::Launch run = a.use_tc ? cuda::gather_tc_launch(g, vec) : cuda::gather_gemv_launch(g, vec);
    enc.add_kernel_node_ex(run.func, run.grid, run.block, {}, run.smem, a);
  }
  enc.add_temporary(ws);
}

}  // namespace mlx_fp4
