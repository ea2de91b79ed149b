// Host-side arithmetic of the gathered (MoE) Metal kernel, framework-free so that eval_gpu
// (gather_w4a16_matmul.cpp, macOS) and the metal_sim tests (Linux) run the same code: parameter
// block, grid, bindings, kernel name and the MSL line that instantiates it.
#pragma once
#include <stdexcept>
#include <string>

#include "../shared/gather_w4a16_problem.h"
#include "gather_kernel_abi.h"
#include "w4a16_dispatch.h"

namespace fp4 {

// Input order of the GatherW4A16Matmul primitive (csrc/gather_primitive.h, GatherInput).
FP4_CONST int kMetalGatherInputX = 0;
FP4_CONST int kMetalGatherInputW = 1;
FP4_CONST int kMetalGatherInputScales = 2;
FP4_CONST int kMetalGatherInputLhs = 3;
FP4_CONST int kMetalGatherInputRhs = 4;
FP4_CONST int kMetalGatherInputFirstOptional = 5;

struct GatherMetalLaunch {
  std::string kernel_name;
  std::string library_name;
  std::string instantiation;
  std::string pipeline_name;
  int num_constants = 0;   // the function constants the pipeline is specialized on
  MetalBoolConstant constants[kMetalMaxConstants];
  uint32_t grid_x = 0;     // weight-row tiles
  uint32_t grid_y = 0;     // pairs, runs of pairs or GEMM tiles of pairs
  uint32_t threads = 0;
  GatherMetalParams params{};
  int binding[kMetalGatherNumBuffers] = {};  // input index, kMetalBindOutput or kMetalBindParams
};

// The gathered kernels: one pair per GEMV threadgroup (pairs), kMetalGatherRun consecutive pairs
// per GEMV threadgroup split into runs of one expert (runs), or the GEMM tile over consecutive
// pairs (gemm). MLX_FP4_METAL_GATHER=pairs|runs|gemm forces one (A/B timing on a Mac, the
// simulator's counts); runs and gemm need one row per pair, else the plan's choice runs.
enum class GatherMetalKernel : int { kAuto = 0, kPairs = 1, kRuns = 2, kGemm = 3 };

inline GatherMetalKernel gather_metal_parse_kernel(const char* s) {
  const std::string v = s ? s : "";
  if (v.empty()) return GatherMetalKernel::kAuto;
  if (v == "pairs") return GatherMetalKernel::kPairs;
  if (v == "runs") return GatherMetalKernel::kRuns;
  if (v == "gemm") return GatherMetalKernel::kGemm;
  throw std::invalid_argument("[gather_w4a16_matmul] MLX_FP4_METAL_GATHER must be one of pairs, runs, gemm but got '" +
                              v + "'.");
}

// The plan (tiling_metal.h): with the sorted hint, one row per pair and at least
// kMetalGatherRunMinPairs pairs (mlx-lm's sorted prefill) the runs, and the GEMM from
// kMetalGatherGemmMinRows pairs per expert on average; otherwise one pair per threadgroup.
inline GatherMetalKernel gather_metal_kernel(const GatherW4A16Problem& g, GatherMetalKernel forced) {
  if (forced == GatherMetalKernel::kPairs || (forced != GatherMetalKernel::kAuto && g.mm.m == 1)) return forced;
  if (!g.sorted_rhs || g.mm.m != 1 || g.pairs < kMetalGatherRunMinPairs) return GatherMetalKernel::kPairs;
  return g.pairs >= int64_t(kMetalGatherGemmMinRows) * g.experts ? GatherMetalKernel::kGemm : GatherMetalKernel::kRuns;
}

// The GEMM's tile: the dense GEMM's small configuration, double-buffered, no split K.
inline MetalConfig gather_metal_gemm_config() {
  MetalConfig c;
  c.kernel = MetalKernel::kGemm;
  c.bm = kMetalSmallBM;
  c.bk = kMetalSmallBK;
  c.stage_scales = false;
  c.split = 1;
  return c;
}

// [[host_name]] and MSL template of one kernel (`kernel` not kAuto).
inline std::string gather_metal_kernel_name(int x_dtype, int out_dtype, GatherMetalKernel kernel) {
  const std::string dtypes = std::string("_x") + metal_dtype_tag(x_dtype) + "_o" + metal_dtype_tag(out_dtype);
  if (kernel == GatherMetalKernel::kGemm) {
    const MetalConfig c = gather_metal_gemm_config();
    return "mlx_fp4_gather_gemm_bm" + std::to_string(c.bm) + "_bk" + std::to_string(c.bk) + dtypes;
  }
  return "mlx_fp4_gather_gemv" + dtypes + (kernel == GatherMetalKernel::kRuns ? "_run" + std::to_string(kMetalGatherRun) : "");
}

inline std::string gather_metal_instantiation(int x_dtype, int out_dtype, GatherMetalKernel kernel) {
  const std::string types = std::string(metal_type_name(x_dtype)) + ", " + metal_type_name(out_dtype) + ", ";
  const MetalConfig c = gather_metal_gemm_config();
  const std::string fn =
      kernel == GatherMetalKernel::kGemm
          ? "gather_w4a16_gemm<" + types + std::to_string(c.bm) + ", " + std::to_string(c.bk) + ">"
          : "gather_w4a16_gemv<" + types + std::to_string(kernel == GatherMetalKernel::kRuns ? kMetalGatherRun : 1) + ">";
  return "template [[host_name(\"" + gather_metal_kernel_name(x_dtype, out_dtype, kernel) + "\")]] [[kernel]] decltype(" +
      fn + ") " + fn + ";\n";
}

// Everything eval_gpu needs. Requires pairs * m >= 1 and n >= 1 (the caller skips empty outputs).
inline GatherMetalLaunch gather_metal_plan(const GatherW4A16Problem& g, const MetalAddresses& addr,
                                           GatherMetalKernel forced = GatherMetalKernel::kAuto) {
  const W4A16Problem& p = g.mm;
  metal_check_int32(p.m, "M");
  metal_check_int32(g.pairs, "pairs");
  metal_check_int32(g.w_expert_bytes, "bytes per expert");
  const GatherMetalKernel kernel = gather_metal_kernel(g, forced);
  const bool gemm = kernel == GatherMetalKernel::kGemm;
  // The dense plan fills the product's parameters (flags, chain, operand kinds, weight-row tiles,
  // function constants): the GEMV's of one row (the kernel loops over the pair's m rows itself),
  // or the GEMM tile's over the pairs' rows (one row of x per pair).
  W4A16Problem rows = p;
  rows.m = gemm ? g.pairs : 1;
  const MetalConfig gemv{MetalKernel::kGemv, 0, 0, false, 1};
  const MetalConfig gemm_cfg = gather_metal_gemm_config();
  const MetalLaunch dense = metal_plan(rows, addr, gemm ? &gemm_cfg : &gemv);
  GatherMetalLaunch l;
  l.params.mm = dense.params;
  l.params.mm.m = int(p.m);
  l.params.pairs = int(g.pairs);
  l.params.x_batches = int(g.x_batches < 0x7fffffff ? g.x_batches : 0x7fffffff);
  l.params.experts = int(g.experts < 0x7fffffff ? g.experts : 0x7fffffff);
  l.params.global_scale_per_expert = g.global_scale_per_expert;
  l.params.w_expert_bytes = int(g.w_expert_bytes);
  l.params.scale_expert_bytes = int(g.scale_expert_bytes);
  l.num_constants = dense.num_constants;
  for (int i = 0; i < dense.num_constants; ++i) {
    l.constants[i] = dense.constants[i];
    // the same loads on every expert: their offsets keep the alignment of the first
    const int fc = l.constants[i].index;
    if (fc == kMetalFcGemvAligned || fc == kMetalFcGemmWVec8) l.constants[i].value &= g.w_expert_bytes % 8 == 0;
  }
  if (gemm) {
    l.grid_x = uint32_t(dense.params.tiles_n);
    l.grid_y = uint32_t((g.pairs + gemm_cfg.bm - 1) / gemm_cfg.bm);
    l.threads = uint32_t(metal_gemm_threads(gemm_cfg.bm));
  } else {
    // Weight-row tiles of the simdgroups' metal_gemv_rows(run) rows; pair runs.
    const int run = kernel == GatherMetalKernel::kRuns ? kMetalGatherRun : 1;
    const int64_t cols = int64_t(kMetalGemvSimdgroups) * metal_gemv_rows(run);
    l.params.mm.tiles_n = int((p.n + cols - 1) / cols);
    l.grid_x = uint32_t(l.params.mm.tiles_n);
    l.grid_y = uint32_t((g.pairs + run - 1) / run);
    l.threads = uint32_t(kMetalGemvThreads);
  }
  l.kernel_name = gather_metal_kernel_name(p.x_dtype, p.out_dtype, kernel);
  l.instantiation = gather_metal_instantiation(p.x_dtype, p.out_dtype, kernel);
  for (int s = 0; s < kMetalNumBuffers; ++s) l.binding[s] = dense.binding[s];
  // The dense binding counts optional inputs from its own first optional slot; shift them.
  const int shift = kMetalGatherInputFirstOptional - kMetalInputFirstOptional;
  for (int s = kMetalBufGlobalScale; s < kMetalNumBuffers; ++s) {
    if (l.binding[s] >= kMetalInputFirstOptional) l.binding[s] += shift;
  }
  l.binding[kMetalGatherBufLhs] = kMetalGatherInputLhs;
  l.binding[kMetalGatherBufRhs] = kMetalGatherInputRhs;
  l.library_name = l.kernel_name;
  l.pipeline_name = l.kernel_name;
  for (int i = 0; i < l.num_constants; ++i) {
    l.pipeline_name += "_fc" + std::to_string(l.constants[i].index) + (l.constants[i].value ? "t" : "f");
  }
  return l;
}

}  // namespace fp4
