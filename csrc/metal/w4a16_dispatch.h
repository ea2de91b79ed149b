// Host-side arithmetic of the Metal backend, framework-free so that eval_gpu (w4a16_matmul.cpp,
// macOS) and the metal_sim tests (tests/metal_sim, Linux) run the same code: the kernel choice,
// tile config, threadgroup grid (Morton log2 dims), parameter block, buffer bindings, kernel and
// library names, and the MSL lines that instantiate a kernel at JIT time.
// The dispatch table is documented in docs/metal.md; keep the two in step.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "../shared/w4a16_problem.h"
#include "w4a16_kernel_abi.h"

namespace fp4 {

// Input order of the W4A16Matmul primitive (csrc/primitives.h, W4A16Input); eval_gpu checks
// that the two agree at compile time.
FP4_CONST int kMetalInputX = 0;
FP4_CONST int kMetalInputW = 1;
FP4_CONST int kMetalInputScales = 2;
FP4_CONST int kMetalInputFirstOptional = 3;

enum class MetalKernel : int { kGemv = 0, kGemm = 1 };

struct MetalConfig {
  MetalKernel kernel = MetalKernel::kGemm;
  int bm = 0;                 // GEMM rows per threadgroup (0 for GEMV)
  int bk = 0;                 // GEMM strip depth (0 for GEMV)
  bool stage_scales = false;  // GEMM: stage each strip's scales in threadgroup memory
  int mt = 0;                 // GEMV: rows of x per threadgroup (0: chosen from M)
  int split = 0;              // GEMM split-K partitions: 0 = chosen from the grid, 1 = none
};

// A boolean [[function_constant(index)]] the pipeline is specialized on.
struct MetalBoolConstant {
  int index = 0;
  bool value = false;
};
FP4_CONST int kMetalMaxConstants = 5;

// Byte addresses (or offsets from 16-byte aligned buffer starts) of the bound data. Only their
// alignment matters: vector loads are enabled when every such load is naturally aligned.
struct MetalAddresses {
  uint64_t x = 0;
  uint64_t w = 0;
  uint64_t scales = 0;
  uint64_t out = 0;
};

// Where each buffer slot's data comes from: a primitive input index (>= 0), the output, or the
// parameter block (set_bytes).
FP4_CONST int kMetalBindOutput = -1;
FP4_CONST int kMetalBindParams = -2;
FP4_CONST int kMetalBindPartials = -3;  // split-K: the fp32 partials (a temporary)

struct MetalLaunch {
  MetalConfig config;
  std::string kernel_name;    // [[host_name]] of the specialization
  std::string library_name;   // MLX caches JIT libraries by name: one library per kernel
  std::string instantiation;  // MSL appended to the embedded source to instantiate it
  std::string pipeline_name;  // the specialized pipeline: kernel name + function constants
  int num_constants = 0;
  MetalBoolConstant constants[kMetalMaxConstants];
  uint32_t grid = 0;          // threadgroups (1-D grid)
  uint32_t threads = 0;       // threads per threadgroup
  // Split-K: a second dispatch, w4a16_splitk_reduce (in the same library), over the partials.
  bool split = false;
  uint64_t partial_bytes = 0;
  std::string reduce_kernel_name;
  uint32_t reduce_grid = 0;
  uint32_t reduce_threads = 0;
  W4A16MetalParams params{};
  int binding[kMetalNumBuffers] = {};
};

inline int metal_dtype_size(int dtype) { return dtype == kDtypeF32 ? 4 : 2; }

// MSL spelling of an OperandDtype, used in template arguments of the instantiation.
inline const char* metal_type_name(int dtype) {
  switch (dtype) {
    case kDtypeF32: return "float";
    case kDtypeF16: return "half";
    case kDtypeBF16: return "bfloat";
    default: throw std::runtime_error("[w4a16_matmul] Metal backend: unknown dtype code.");
  }
}

inline const char* metal_dtype_tag(int dtype) {
  switch (dtype) {
    case kDtypeF32: return "f32";
    case kDtypeF16: return "f16";
    case kDtypeBF16: return "bf16";
    default: throw std::runtime_error("[w4a16_matmul] Metal backend: unknown dtype code.");
  }
}

inline int metal_ceil_log2(int64_t v) {
  int r = 0;
  while ((int64_t(1) << r) < v) {
    ++r;
  }
  return r;
}

// The configs the fused GEMM is instantiated for: (BM, BK) in {(128, 64), (64, 32)}, scale
// staging on or off. Production uses (64, 32, off) and (128, 64, on); the others exist for
// A/B measurement (MLX_FP4_METAL_KERNEL) and are tested in the sim like the rest.
inline std::vector<MetalConfig> metal_all_configs() {
  std::vector<MetalConfig> v;
  for (int mt = 1; mt <= kMetalGemvMaxMt; mt *= 2) {
    v.push_back({MetalKernel::kGemv, 0, 0, false, mt});
  }
  for (int large = 0; large < 2; ++large) {
    for (int stage = 0; stage < 2; ++stage) {
      MetalConfig c;
      c.kernel = MetalKernel::kGemm;
      c.bm = large ? kMetalLargeBM : kMetalSmallBM;
      c.bk = large ? kMetalLargeBK : kMetalSmallBK;
      c.stage_scales = stage != 0;
      v.push_back(c);
    }
  }
  return v;
}

// The dispatch table (docs/metal.md), the same for both modes. M = rows of x after flattening
// the batch dims.
inline MetalConfig metal_choose_config(const W4A16Problem& p) {
  if (p.m <= kMetalGemvAutoMaxM) {
    return {MetalKernel::kGemv, 0, 0, false, metal_gemv_mt(int(p.m))};
  }
  if (p.m < kMetalLargeTileMinM) {
    return {MetalKernel::kGemm, kMetalSmallBM, kMetalSmallBK, false};
  }
  return {MetalKernel::kGemm, kMetalLargeBM, kMetalLargeBK, true};
}

// Parses a test/benchmark override of the kernel choice: "gemv" (rows of x per threadgroup
// chosen from M), "gemv1", "gemv2", "gemv4", "gemv8", "gemv16", "gemm64", "gemm64s", "gemm128",
// "gemm128s" ("s": staged scales). Empty or null: no override.
inline bool metal_parse_override(const char* text, MetalConfig* out) {
  if (text == nullptr || text[0] == '\0') {
    return false;
  }
  const std::string s(text);
  if (s == "gemv") {
    *out = {MetalKernel::kGemv, 0, 0, false, 0};
    return true;
  }
  // A GEMM name may end in "k<N>": N split-K partitions (1: none; default: chosen).
  const size_t kpos = s.rfind('k');
  const bool has_split = s.rfind("gemm", 0) == 0 && kpos != std::string::npos && kpos > 4 &&
      kpos + 1 < s.size() && s.find_first_not_of("0123456789", kpos + 1) == std::string::npos;
  const std::string base = has_split ? s.substr(0, kpos) : s;
  for (const MetalConfig& c : metal_all_configs()) {
    std::string name = c.kernel == MetalKernel::kGemv
        ? "gemv" + std::to_string(c.mt)
        : "gemm" + std::to_string(c.bm) + (c.stage_scales ? "s" : "");
    if (name == base) {
      *out = c;
      if (has_split) {
        out->split = std::max(1, std::atoi(s.c_str() + kpos + 1));
      }
      return true;
    }
  }
  throw std::invalid_argument(
      "[w4a16_matmul] MLX_FP4_METAL_KERNEL must be one of gemv, gemv1, gemv2, gemv4, gemv8, "
      "gemv16, gemm64, gemm64s, gemm128, gemm128s (a GEMM optionally with k<N>: N split-K "
      "partitions) but got '" + s + "'.");
}

inline std::string metal_kernel_name(const MetalConfig& c, int x_dtype, int out_dtype) {
  std::string name = "mlx_fp4_w4a16_";
  if (c.kernel == MetalKernel::kGemv) {
    name += "gemv_mt" + std::to_string(c.mt);
  } else {
    name += "gemm_bm" + std::to_string(c.bm) + "_bk" + std::to_string(c.bk) +
        (c.stage_scales ? "_s1" : "_s0");
  }
  name += std::string("_x") + metal_dtype_tag(x_dtype) + "_o" + metal_dtype_tag(out_dtype);
  return name;
}

inline std::string metal_reduce_kernel_name(int out_dtype) {
  return std::string("mlx_fp4_w4a16_splitk_reduce_o") + metal_dtype_tag(out_dtype);
}

// The instantiation of the split-K reduction for one output dtype.
inline std::string metal_reduce_instantiation(int out_dtype) {
  const std::string fn = std::string("w4a16_splitk_reduce<") + metal_type_name(out_dtype) + ">";
  return "template [[host_name(\"" + metal_reduce_kernel_name(out_dtype) +
      "\")]] [[kernel]] decltype(" + fn + ") " + fn + ";\n";
}

// Split-K partitions for a GEMM grid of `tiles` threadgroups over `strips` strips of K, M rows.
inline int metal_choose_split(int64_t tiles, int strips, int64_t m) {
  int split = 1;
  while (split < kMetalSplitKMax && 2 * split * tiles <= kMetalSplitKTargetThreadgroups &&
         strips / (2 * split) >= kMetalSplitKMinStrips && 2 * split * m <= kMetalSplitKMaxRows) {
    split *= 2;
  }
  return split;
}

// The explicit instantiation of one kernel, in the form MLX's own JIT kernels use.
inline std::string metal_instantiation(const MetalConfig& c, int x_dtype, int out_dtype) {
  std::string fn;
  if (c.kernel == MetalKernel::kGemv) {
    fn = std::string("w4a16_gemv<") + metal_type_name(x_dtype) + ", " +
        metal_type_name(out_dtype) + ", " + std::to_string(c.mt) + ">";
  } else {
    fn = std::string("w4a16_gemm<") + metal_type_name(x_dtype) + ", " +
        metal_type_name(out_dtype) + ", " + std::to_string(c.bm) + ", " + std::to_string(c.bk) +
        ", " + (c.stage_scales ? "true" : "false") + ">";
  }
  return "template [[host_name(\"" + metal_kernel_name(c, x_dtype, out_dtype) +
      "\")]] [[kernel]] decltype(" + fn + ") " + fn + ";\n";
}

inline void metal_check_int32(int64_t v, const char* what) {
  if (v < 0 || v > int64_t(0x7fffffff)) {
    throw std::runtime_error(
        std::string("[w4a16_matmul] Metal backend: ") + what + " = " + std::to_string(v) +
        " does not fit the kernels' 32-bit index; split the call.");
  }
}

// Everything eval_gpu needs to launch the problem. `force` (may be null) overrides the table.
// Requires p.m >= 1 and p.n >= 1 (the caller skips empty outputs).
inline MetalLaunch metal_plan(
    const W4A16Problem& p, const MetalAddresses& addr, const MetalConfig* force) {
  if (p.m < 1 || p.n < 1 || p.k < 1) {
    throw std::runtime_error("[w4a16_matmul] Metal backend: empty problem reached metal_plan.");
  }
  metal_check_int32(p.m, "M");
  metal_check_int32(p.n, "N");
  metal_check_int32(p.k, "K");
  metal_check_int32(p.w_row_bytes, "w_row_bytes");
  if (p.num_ops < 0 || p.num_ops > kMaxEpilogueOps || p.num_operands < 0 ||
      p.num_operands > kMaxEpilogueOperands) {
    throw std::runtime_error("[w4a16_matmul] Metal backend: epilogue larger than supported.");
  }
  if (p.w_row_bytes < packed_bytes_for_k(p.k) || p.scale_row_bytes < scale_blocks_for_k(p.k, p.mode)) {
    throw std::runtime_error("[w4a16_matmul] Metal backend: weight rows shorter than K.");
  }

  MetalLaunch l;
  l.config = force != nullptr ? *force : metal_choose_config(p);
  if (l.config.kernel == MetalKernel::kGemv && l.config.mt == 0) {
    l.config.mt = metal_gemv_mt(int(p.m));
  }
  const MetalConfig& c = l.config;
  if (c.kernel == MetalKernel::kGemv && p.m > kMetalGemvMaxM) {
    throw std::invalid_argument(
        "[w4a16_matmul] the Metal GEMV handles M <= " + std::to_string(kMetalGemvMaxM) +
        " rows but got M = " + std::to_string(p.m) + ".");
  }

  W4A16MetalParams& q = l.params;
  q.m = int(p.m);
  q.n = int(p.n);
  q.k = int(p.k);
  q.w_row_bytes = int(p.w_row_bytes);
  q.scale_row_bytes = int(p.scale_row_bytes);
  const int xs = metal_dtype_size(p.x_dtype);
  const int os = metal_dtype_size(p.out_dtype);
  int flags = 0;
  if (p.has_global_scale) flags |= kMetalFlagGlobalScale;
  if (p.mode == kModeMxfp4) flags |= kMetalFlagMxfp4;
  if (p.k % 2 == 0 && addr.x % uint64_t(2 * xs) == 0) flags |= kMetalFlagXVec2;
  if (p.k % 4 == 0 && addr.x % uint64_t(4 * xs) == 0) flags |= kMetalFlagXVec4;
  if (p.w_row_bytes % 8 == 0 && addr.w % 8 == 0) flags |= kMetalFlagWVec8;
  if (p.n % 2 == 0 && addr.out % uint64_t(2 * os) == 0) flags |= kMetalFlagOutVec2;
  q.flags = flags;
  q.split_k = 1;
  q.num_ops = p.num_ops;
  for (int i = 0; i < kMaxEpilogueOperands; ++i) {
    q.operand_kind[i] = i < p.num_operands ? p.operand_kind[i] : kOperandScalar;
    q.operand_dtype[i] = i < p.num_operands ? p.operand_dtype[i] : kDtypeF32;
  }
  for (int i = 0; i < kMaxEpilogueOps; ++i) {
    q.ops[i] = i < p.num_ops ? p.ops[i] : EpilogueOp{0, -1, 0.0f, 0.0f};
    if (i < p.num_ops && q.ops[i].operand >= p.num_operands) {
      throw std::runtime_error("[w4a16_matmul] Metal backend: epilogue operand out of range.");
    }
  }

  if (c.kernel == MetalKernel::kGemm) {
    const int word = c.bk / block_size(p.mode);  // scale bytes per row and strip
    if (p.scale_row_bytes % word == 0 && addr.scales % uint64_t(word) == 0) {
      q.flags |= kMetalFlagScaleWord;
    }
    // The same bits as function constants: the pipeline is specialized on them.
    const int fc_bits[] = {kMetalFlagXVec2, kMetalFlagWVec8, kMetalFlagScaleWord, kMetalFlagOutVec2,
                           kMetalFlagMxfp4};
    const int fc_index[] = {kMetalFcGemmXVec2, kMetalFcGemmWVec8, kMetalFcGemmScaleWord,
                            kMetalFcGemmOutVec2, kMetalFcGemmMxfp4};
    static_assert(sizeof(fc_bits) / sizeof(fc_bits[0]) == kMetalMaxConstants, "one slot per constant");
    for (int i = 0; i < kMetalMaxConstants; ++i) {
      l.constants[l.num_constants++] = {fc_index[i], (q.flags & fc_bits[i]) != 0};
    }
  }

  if (c.kernel == MetalKernel::kGemv) {
    const int cols = kMetalGemvSimdgroups * metal_gemv_rows(c.mt);  // weight rows per group
    q.tiles_m = int((p.m + c.mt - 1) / c.mt);
    q.tiles_n = int((p.n + cols - 1) / cols);
    if (int64_t(q.tiles_m) * q.tiles_n > int64_t(0x7fffffff)) {
      throw std::runtime_error("[w4a16_matmul] Metal backend: too many GEMV threadgroups; split "
                               "the call.");
    }
    l.grid = uint32_t(q.tiles_m) * uint32_t(q.tiles_n);
    l.threads = uint32_t(kMetalGemvThreads);
    // Aligned loads: 8-byte weight words, 4-element x vectors (rows and buffer offsets).
    const bool aligned = p.w_row_bytes % 8 == 0 && addr.w % 8 == 0 && p.k % 4 == 0 &&
        addr.x % uint64_t(4 * xs) == 0;
    l.constants[l.num_constants++] = {kMetalFcGemvAligned, aligned};
  } else {
    q.tiles_m = int((p.m + c.bm - 1) / c.bm);
    q.tiles_n = int((p.n + kMetalBN - 1) / kMetalBN);
    q.log2_grid_m = metal_ceil_log2(q.tiles_m);
    q.log2_grid_n = metal_ceil_log2(q.tiles_n);
    if (q.log2_grid_m + q.log2_grid_n > 31) {
      throw std::runtime_error(
          "[w4a16_matmul] Metal backend: M = " + std::to_string(p.m) + ", N = " +
          std::to_string(p.n) + " needs more threadgroups than one dispatch allows; split the "
          "call.");
    }
    l.grid = uint32_t(1) << (q.log2_grid_m + q.log2_grid_n);
    l.threads = uint32_t(metal_gemm_threads(c.bm));
    // Split-K: ceil(strips / split) strips per partition, the partitions that remain non-empty.
    const int strips = int((p.k + c.bk - 1) / c.bk);
    int split = c.split > 0 ? c.split
                            : metal_choose_split(int64_t(q.tiles_m) * q.tiles_n, strips, p.m);
    split = std::min(split, strips);
    if (split > 1) {
      q.split_strips = (strips + split - 1) / split;
      q.split_k = (strips + q.split_strips - 1) / q.split_strips;
      if (uint64_t(l.grid) * uint64_t(q.split_k) > uint64_t(0x7fffffff)) {
        throw std::runtime_error("[w4a16_matmul] Metal backend: split-K grid too large.");
      }
      l.grid *= uint32_t(q.split_k);
      l.split = true;
      l.partial_bytes = uint64_t(q.split_k) * uint64_t(p.m) * uint64_t(p.n) * sizeof(float);
      l.reduce_threads = uint32_t(kMetalReduceThreads);
      l.reduce_grid = uint32_t((uint64_t(p.m) * uint64_t(p.n) + kMetalReduceThreads - 1) /
                               kMetalReduceThreads);
    }
  }
  // Metal counts grid sizes in threads with 32-bit values.
  if (uint64_t(l.grid) * l.threads > uint64_t(0xffffffffu)) {
    throw std::runtime_error(
        "[w4a16_matmul] Metal backend: M = " + std::to_string(p.m) + ", N = " +
        std::to_string(p.n) + " needs more threads than one dispatch allows; split the call.");
  }

  // Bindings: slots without data get x (every declared buffer argument must be bound).
  for (int s = 0; s < kMetalNumBuffers; ++s) {
    l.binding[s] = kMetalInputX;
  }
  l.binding[kMetalBufX] = kMetalInputX;
  l.binding[kMetalBufW] = kMetalInputW;
  l.binding[kMetalBufScales] = kMetalInputScales;
  l.binding[kMetalBufOut] = kMetalBindOutput;
  l.binding[kMetalBufParams] = kMetalBindParams;
  if (l.split) {
    l.binding[kMetalBufPartials] = kMetalBindPartials;
  }
  const int first_operand = kMetalInputFirstOptional + (p.has_global_scale ? 1 : 0);
  if (p.has_global_scale) {
    l.binding[kMetalBufGlobalScale] = kMetalInputFirstOptional;
  }
  for (int i = 0; i < p.num_operands; ++i) {
    l.binding[kMetalBufOperand0 + i] = first_operand + i;
  }

  l.kernel_name = metal_kernel_name(c, p.x_dtype, p.out_dtype);
  l.library_name = l.kernel_name;
  l.pipeline_name = l.kernel_name;
  for (int i = 0; i < l.num_constants; ++i) {
    l.pipeline_name += "_fc" + std::to_string(l.constants[i].index) +
        (l.constants[i].value ? "t" : "f");
  }
  l.instantiation = metal_instantiation(c, p.x_dtype, p.out_dtype);
  if (c.kernel == MetalKernel::kGemm) {
    // the reduction lives in every GEMM library, so that a split launch finds it there
    l.instantiation += metal_reduce_instantiation(p.out_dtype);
    l.reduce_kernel_name = metal_reduce_kernel_name(p.out_dtype);
  }
  return l;
}

}  // namespace fp4
