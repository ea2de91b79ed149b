// w4a16_matmul: validates every argument once, canonicalizes the epilogue operands, and adds
// one W4A16Matmul node to the graph. Also the same math in plain MLX ops (reference_ops).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <typeinfo>
#include <variant>

#include "errors.h"
#include "format_tables.h"
#include "mlx/backend/metal/metal.h"
#include "mlx/device.h"
#include "mlx/ops.h"
#include "mlx_fp4.h"
#include "op_common.h"
#include "ops_internal.h"
#include "gather_primitive.h"
#include "metal/w4a16_route.h"
#include "metal_route_table.h"
#include "primitives.h"

namespace mlx::core::cu {
bool is_available();  // mlx/backend/cuda/cuda.h (exported by every libmlx build)
}  // namespace mlx::core::cu

namespace mlx_fp4 {
namespace {

constexpr const char* kOp = "w4a16_matmul";

}  // namespace

bool is_supported_float(mx::Dtype d) { return d == mx::float32 || d == mx::float16 || d == mx::bfloat16; }

namespace {

// Shape facts every path needs, checked once.
struct Checked {
  mx::array x;
  mx::array w_bytes;  // uint8 [N, bytes] or uint32 [N, words]: the same bytes
  mx::array scales;
  std::optional<mx::array> gs;
  mx::Dtype out_dtype;
  mx::Shape out_shape;
  int n;
  int k;
  int mode;  // fp4::Mode
};

Checked check(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& global_scale,
    std::optional<mx::Dtype> out_dtype,
    int mode,
    mx::StreamOrDevice s) {
  check_no_global_scale(mode, global_scale.has_value(), kOp);
  if (x.ndim() < 1) {
    throw_invalid("[", kOp, "] x must have at least 1 dimension [..., K] but got a scalar.");
  }
  if (!is_supported_float(x.dtype())) {
    throw_invalid("[", kOp, "] x must be float16, bfloat16 or float32 but got ", dtype_str(x.dtype()), ".");
  }
  const int k = x.shape(-1);
  if (k < 1) {
    throw_invalid("[", kOp, "] x must have K >= 1 (its last dimension) but got shape ", shape_str(x.shape()), ".");
  }
  if (w.ndim() != 2) {
    throw_invalid("[", kOp, "] w must be 2-D [N, ceil(K/2)] uint8 or [N, ceil(K/8)] uint32 but got shape ",
                  shape_str(w.shape()), ".");
  }
  const int n = w.shape(0);
  const int64_t bytes_u8 = fp4::packed_bytes_for_k(k);
  const int64_t words = fp4::packed_words_for_k(k);
  if (w.dtype() == mx::uint32) {
    if (w.shape(1) != words) {
      throw_invalid("[", kOp, "] w (uint32) must have shape (N, ceil(K/8)) = (", n, ", ", words,
                    ") for K = ", k, " (from x) but got ", shape_str(w.shape()), ".");
    }
  } else if (w.dtype() == mx::uint8) {
    // MLX's uint32 layout viewed as bytes is also accepted: 4 * ceil(K/8) bytes per row.
    if (w.shape(1) != bytes_u8 && w.shape(1) != 4 * words) {
      throw_invalid("[", kOp, "] w (uint8) must have shape (N, ceil(K/2)) = (", n, ", ", bytes_u8,
                    ") for K = ", k, " (from x) but got ", shape_str(w.shape()), ".");
    }
  } else {
    throw_invalid("[", kOp, "] w must be uint8 [N, ceil(K/2)] or uint32 [N, ceil(K/8)] but got dtype ",
                  dtype_str(w.dtype()), ".");
  }
  const int64_t blocks = fp4::scale_blocks_for_k(k, mode);
  if (scales.dtype() != mx::uint8) {
    throw_invalid("[", kOp, "] scales must be uint8 (", mode == fp4::kModeMxfp4 ? "E8M0" : "E4M3",
                  " bits) but got dtype ", dtype_str(scales.dtype()), ".");
  }
  if (scales.ndim() != 2 || scales.shape(0) != n || scales.shape(1) != blocks) {
    throw_invalid("[", kOp, "] scales must have shape (N, ceil(K/", fp4::block_size(mode), ")) = (", n, ", ", blocks,
                  ") but got ", shape_str(scales.shape()), " (mode '", mode_name(mode), "').");
  }
  mx::Dtype od = out_dtype.value_or(x.dtype());
  if (!is_supported_float(od)) {
    throw_invalid("[", kOp, "] out_dtype must be float16, bfloat16 or float32 but got ", dtype_str(od), ".");
  }
  std::optional<mx::array> gs;
  if (global_scale) {
    gs = checked_global_scale(*global_scale, kOp);
  }
  mx::Shape out_shape = x.shape();
  out_shape.back() = n;
  // Kernels read either layout as bytes; no view node, so shapeless compile keeps working.
  return Checked{x, w, scales, gs, od, out_shape, n, k, mode};
}

// A Contiguous node only for arrays that may need one: an evaluated row-contiguous array (model
// weights, scales) is passed as is, since every graph node costs host time at each call.
// An output of our own matmuls not yet evaluated (the fused SwiGLU's up projection, every layer):
// every backend's eval gives it a fresh row-contiguous buffer of its shape.
bool own_pending_output(const mx::array& a) {
  if (a.is_available() || !a.has_primitive()) return false;
  const auto& p = typeid(a.primitive());
  return p == typeid(W4A16Matmul) || p == typeid(GatherW4A16Matmul);
}

}  // namespace

mx::array contiguous_input(const mx::array& a, mx::StreamOrDevice s) {
  if (a.is_available() && a.flags().row_contiguous) return a;
  if (own_pending_output(a)) return a;  // the kernel's check of the layout still runs at eval
  return mx::contiguous(a, false, s);
}

// Classify and canonicalize one operand against the output shape (see OperandKind).
std::pair<int, mx::array> canonical_operand(
    const mx::array& t, const mx::Shape& out_shape, int index, mx::StreamOrDevice s, const char* kOp) {
  const int on = static_cast<int>(out_shape.size());
  if (static_cast<int>(t.ndim()) > on) {
    throw_invalid("[", kOp, "] epilogue[", index, "] operand must broadcast to the output shape ",
                  shape_str(out_shape), " but got shape ", shape_str(t.shape()), ".");
  }
  bool varies_col = false;
  bool varies_row = false;
  const int offset = on - static_cast<int>(t.ndim());
  for (int i = 0; i < static_cast<int>(t.ndim()); ++i) {
    int od = out_shape[offset + i];
    int td = t.shape(i);
    if (td != 1 && td != od) {
      throw_invalid("[", kOp, "] epilogue[", index, "] operand must broadcast to the output shape ",
                    shape_str(out_shape), " but got shape ", shape_str(t.shape()), ".");
    }
    if (td != 1) {
      (offset + i == on - 1 ? varies_col : varies_row) = true;
    }
  }
  auto v = is_supported_float(t.dtype()) ? t : mx::astype(t, mx::float32, s);
  const int n = out_shape.back();
  mx::Shape row_shape = out_shape;
  row_shape.back() = 1;
  if (!varies_col && !varies_row) {
    return {fp4::kOperandScalar, contiguous_input(mx::reshape(v, {}, s), s)};
  }
  // One output row (decode) and an operand of the output's shape made by our matmul from the
  // same rows (SwiGLU's up projection): already the full [1, N] layout, no reshape node. Other
  // [1, N] operands stay columns, which a shapeless compile may broadcast over more rows.
  bool one_row = static_cast<int>(t.ndim()) == on && own_pending_output(t);
  for (int i = 0; one_row && i + 1 < on; ++i) one_row = out_shape[i] == 1;
  if (varies_col && !varies_row && !one_row) {
    return {fp4::kOperandCol, contiguous_input(mx::reshape(v, {n}, s), s)};
  }
  // Operands that already have the full leading shape need no broadcast node (which would
  // pin the traced shape under shapeless compile); only a reshape that adds leading 1s.
  const mx::Shape& target = varies_col ? out_shape : row_shape;
  bool full_leading = static_cast<int>(t.ndim()) == on;
  for (int i = 0; full_leading && i < on; ++i) {
    full_leading = t.shape(i) == target[i];
  }
  auto expanded = full_leading ? v : mx::broadcast_to(v, target, s);
  return {varies_col ? fp4::kOperandFull : fp4::kOperandRow, contiguous_input(expanded, s)};
}

mx::array rows_input(const mx::array& a, mx::StreamOrDevice s) {
  const bool on_cpu = mx::to_stream(s).device == mx::Device::cpu;
  const bool cuda_gpu = !on_cpu && mx::cu::is_available();
  if (on_cpu || (cuda_gpu && static_cast<int>(a.ndim()) <= fp4::kMaxStridedXDims)) return a;
  return contiguous_input(a, s);
}

static bool takes_operand(int code) { return code == fp4::kEpiAdd || code == fp4::kEpiMul; }

void check_epilogue_length(size_t ops, const char* kOp) {
  if (ops > static_cast<size_t>(fp4::kMaxEpilogueOps)) {
    throw_invalid("[", kOp, "] epilogue must have at most ", fp4::kMaxEpilogueOps, " ops but got ", ops, ".");
  }
}

void check_epilogue(const std::vector<EpilogueSpec>& epilogue, const char* kOp) {
  check_epilogue_length(epilogue.size(), kOp);
  int operands = 0;
  for (size_t i = 0; i < epilogue.size(); ++i) {
    const auto& op = epilogue[i];
    if (op.code < 0 || op.code >= fp4::kEpiNumCodes) {
      throw_invalid("[", kOp, "] epilogue op ", i, " has unknown code ", op.code, ".");
    }
    if (op.operand && !takes_operand(op.code)) {
      throw_invalid("[", kOp, "] epilogue op ", i, " takes no tensor operand but got one.");
    }
    operands += op.operand ? 1 : 0;
  }
  if (operands > fp4::kMaxEpilogueOperands) {
    throw_invalid("[", kOp, "] epilogue must have at most ", fp4::kMaxEpilogueOperands,
                  " tensor operands but got ", operands, ".");
  }
}

// fp32 MLX-ops version of one epilogue op.
mx::array apply_op_ops(const mx::array& v, const EpilogueSpec& op, mx::StreamOrDevice s) {
  auto opnd = op.operand ? mx::astype(*op.operand, mx::float32, s) : mx::array(op.p0, mx::float32);
  const float kInvSqrt2 = 0.70710678118654752f;
  const float kSqrt2OverPi = 0.79788456080286536f;
  const float kGeluCubic = 0.044715f;
  auto half = mx::array(0.5f);
  auto one = mx::array(1.0f);
  switch (op.code) {
    case fp4::kEpiAdd: return mx::add(v, opnd, s);
    case fp4::kEpiMul: return mx::multiply(v, opnd, s);
    case fp4::kEpiScale: return mx::multiply(v, mx::array(op.p0), s);
    case fp4::kEpiRelu: return mx::where(mx::less(v, mx::array(0.0f), s), mx::array(0.0f), v, s);
    case fp4::kEpiSilu: return mx::multiply(v, mx::sigmoid(v, s), s);
    case fp4::kEpiGelu:
      return mx::multiply(mx::multiply(half, v, s), mx::add(one, mx::erf(mx::multiply(v, mx::array(kInvSqrt2), s), s), s), s);
    case fp4::kEpiGeluApprox: {
      auto cube = mx::multiply(mx::multiply(v, v, s), v, s);
      auto inner = mx::multiply(mx::array(kSqrt2OverPi), mx::add(v, mx::multiply(mx::array(kGeluCubic), cube, s), s), s);
      return mx::multiply(mx::multiply(half, v, s), mx::add(one, mx::tanh(inner, s), s), s);
    }
    case fp4::kEpiSigmoid: return mx::sigmoid(v, s);
    case fp4::kEpiTanh: return mx::tanh(v, s);
    case fp4::kEpiClamp:
      return mx::where(mx::less(v, mx::array(op.p0), s), mx::array(op.p0),
                       mx::where(mx::greater(v, mx::array(op.p1), s), mx::array(op.p1), v, s), s);
    default: return v;
  }
}

namespace {

// Every check of both entry points, once: arguments, the chain, and each operand against the
// output shape (canonical operand per op, nullopt for ops without a tensor operand).
struct Prepared {
  Checked c;
  std::vector<std::optional<std::pair<int, mx::array>>> operands;
};

Prepared prepare(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& global_scale,
    const std::vector<EpilogueSpec>& epilogue,
    std::optional<mx::Dtype> out_dtype,
    int mode,
    mx::StreamOrDevice s) {
  Prepared p{check(x, w, scales, global_scale, out_dtype, mode, s), {}};
  check_epilogue(epilogue, kOp);
  for (size_t i = 0; i < epilogue.size(); ++i) {
    if (epilogue[i].operand) {
      p.operands.emplace_back(canonical_operand(*epilogue[i].operand, p.c.out_shape, static_cast<int>(i), s, kOp));
    } else {
      p.operands.emplace_back(std::nullopt);
    }
  }
  return p;
}

// Where w4a16_matmul runs on an Apple GPU (docs/metal.md, "Routing"). MLX_FP4_METAL_ROUTE:
// auto (default: fp4::metal_auto_route of csrc/metal/w4a16_route.h), ours, mlx, cpu.
// - cpu: GPUs without simdgroup_matrix and bfloat (before the Apple7 family, e.g. the
//   paravirtual GPU of macOS CI VMs): our kernels cannot compile there; the op runs on the CPU
//   (said once on stderr).
// - mlx: where MLX's qmm runs on the M5's neural accelerators (its NAX kernel). The product
//   comes back rounded to x's dtype (one extra rounding), then the global scale and the epilogue
//   run as MLX ops in fp32.
using fp4::MetalRoute;
constexpr int kMlxBits = 4;  // MLX's quantized_matmul: group size = the mode's block

// The Apple GPU's architecture string from MLX's device_info ("applegpu_g17s"), read once: the
// GPU does not change within a process.
struct AppleGpu {
  std::string arch;
  fp4::AppleGpuId id;
};

const AppleGpu& apple_gpu() {
  static const AppleGpu gpu = [] {
    const auto& info = mx::device_info(mx::Device::gpu);
    auto it = info.find("architecture");
    std::string arch = it != info.end() && std::holds_alternative<std::string>(it->second)
        ? std::get<std::string>(it->second) : "";
    const fp4::AppleGpuId id = fp4::parse_apple_gpu_arch(arch);
    return AppleGpu{std::move(arch), id};
  }();
  return gpu;
}

MetalRoute metal_route(const Checked& c, const mx::Stream& stream) {
  const char* env = std::getenv("MLX_FP4_METAL_ROUTE");
  const std::string mode = env != nullptr ? env : "auto";
  if (mode != "auto" && mode != "mlx" && mode != "ours" && mode != "cpu") {
    throw_invalid("[", kOp, "] MLX_FP4_METAL_ROUTE must be auto, ours, mlx or cpu but got '", mode, "'.");
  }
  if (stream.device != mx::Device::gpu || !mx::metal::is_available() || mode == "ours") {
    return MetalRoute::kOurs;
  }
  if (mode == "cpu") {
    return MetalRoute::kCpu;
  }
  if (mode == "mlx") {
    if (c.k % fp4::block_size(c.mode) != 0) {
      throw_invalid("[", kOp, "] MLX_FP4_METAL_ROUTE=mlx needs K % ", fp4::block_size(c.mode), " == 0 (MLX's ",
                    mode_name(c.mode), " layout) but got K = ", c.k, ".");
    }
    return MetalRoute::kMlx;
  }
  const AppleGpu& gpu = apple_gpu();
  const int64_t m = c.x.size() / c.k;
  const MetalRoute route = fp4::metal_auto_route(gpu.id, m, c.n, c.k, c.x.dtype() == mx::float32);
  if (route == MetalRoute::kCpu) {
    static const bool said = [&] {  // once per process (thread-safe static initialization)
      std::fprintf(stderr, "[mlx_fp4] Metal GPU architecture '%s' is not Apple7 or later (no simdgroup_matrix "
                   "or bfloat): w4a16_matmul runs on the CPU. MLX_FP4_METAL_ROUTE=ours forces the Metal "
                   "kernels.\n", gpu.arch.c_str());
      return true;
    }();
    (void)said;
    return route;
  }
  // The tuner's measured decision for this shape, where it has one (MLX's route needs its layout).
  const MetalRouteKey key{metal_shape_bucket(m), c.n, c.k, operand_dtype_code(c.x.dtype()), c.mode};
  const std::optional<MetalRoute> tuned = metal_route_table().get(key);
  if (tuned && (*tuned != MetalRoute::kMlx || c.k % fp4::block_size(c.mode) == 0)) {
    return *tuned;
  }
  return route;
}

// MLX's quantized_matmul in the problem's mode (nvfp4: the Metal route above; any mode: the GPU
// fallback), then the multiplier and the chain in fp32.
mx::array mlx_nvfp4_route(const Checked& c, const std::vector<EpilogueSpec>& epilogue, mx::StreamOrDevice s) {
  // MLX's layout: uint32 words [N, K / 8] (a uint8 [N, K / 2] weight is the same bytes).
  mx::array w32 = c.w_bytes.dtype() == mx::uint32
      ? c.w_bytes : mx::view(mx::contiguous(c.w_bytes, false, s), mx::uint32, s);
  auto y = mx::quantized_matmul(c.x, w32, c.scales, std::nullopt, true, fp4::block_size(c.mode), kMlxBits,
                                mode_name(c.mode), s);
  y = mx::astype(y, mx::float32, s);
  if (c.gs) {
    y = mx::multiply(y, global_scale_multiplier(*c.gs, kOp, s), s);
  }
  for (const auto& op : epilogue) {
    y = apply_op_ops(y, op, s);
  }
  return mx::astype(y, c.out_dtype, s);
}

// One W4A16Matmul node over the checked, canonical inputs (the mode is part of its state).
mx::array matmul_node(const Prepared& p, const std::vector<EpilogueSpec>& epilogue, mx::StreamOrDevice s) {
  const Checked& c = p.c;
  std::vector<mx::array> inputs = {
      rows_input(c.x, s), contiguous_input(c.w_bytes, s), contiguous_input(c.scales, s)};
  if (c.gs) {
    inputs.push_back(*c.gs);
  }
  std::vector<fp4::EpilogueOp> ops;
  std::vector<int> kinds;
  for (size_t i = 0; i < epilogue.size(); ++i) {
    const auto& spec = epilogue[i];
    fp4::EpilogueOp op{spec.code, -1, spec.p0, spec.p1};
    if (p.operands[i]) {
      op.operand = static_cast<int>(kinds.size());
      kinds.push_back(p.operands[i]->first);
      inputs.push_back(p.operands[i]->second);
    }
    ops.push_back(op);
  }
  return mx::array(
      c.out_shape,
      c.out_dtype,
      std::make_shared<W4A16Matmul>(mx::to_stream(s), c.out_dtype, c.gs.has_value(), std::move(ops),
                                    std::move(kinds), c.mode),
      std::move(inputs));
}

// The same math in MLX ops: exact fp32 decode, fp32 matmul, multiplier, chain, one cast.
mx::array reference_graph(const Checked& c, const std::vector<EpilogueSpec>& epilogue, mx::StreamOrDevice s) {
  auto wf = decode_f32(c.w_bytes, c.scales, c.k, c.mode, s);  // [N, K] fp32, exact
  auto y = mx::matmul(mx::astype(c.x, mx::float32, s), mx::transpose(wf, s), s);
  if (c.gs) {
    y = mx::multiply(y, global_scale_multiplier(*c.gs, kOp, s), s);
  }
  for (const auto& op : epilogue) {
    y = apply_op_ops(y, op, s);
  }
  return mx::astype(y, c.out_dtype, s);
}

}  // namespace

mx::array w4a16_matmul_routed(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& global_scale,
    const std::vector<EpilogueSpec>& epilogue,
    std::optional<mx::Dtype> out_dtype,
    bool reference_ops,
    const std::string& mode,
    mx::StreamOrDevice s) {
  const Prepared p = prepare(x, w, scales, global_scale, epilogue, out_dtype, parse_mode(mode, kOp), s);
  if (reference_ops) {
    return reference_graph(p.c, epilogue, s);
  }
  switch (metal_route(p.c, mx::to_stream(s))) {
    case MetalRoute::kMlx:
      return mlx_nvfp4_route(p.c, epilogue, s);
    case MetalRoute::kCpu:
      return matmul_node(p, epilogue, mx::default_stream(mx::Device::cpu));
    case MetalRoute::kOurs:
      break;
  }
  if (mx::to_stream(s).device == mx::Device::gpu && !gpu_kernel_supports_mode(p.c.mode, p.c.x.size() / p.c.k)) {
    // No kernel of ours for the mode on this GPU: MLX's own (its layout: K a multiple of the
    // block), else the MLX-ops form.
    return p.c.k % fp4::block_size(p.c.mode) == 0 ? mlx_nvfp4_route(p.c, epilogue, s) : reference_graph(p.c, epilogue, s);
  }
  return matmul_node(p, epilogue, s);
}

mx::array w4a16_matmul(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& global_scale,
    const std::vector<EpilogueSpec>& epilogue,
    std::optional<mx::Dtype> out_dtype,
    const std::string& mode,
    mx::StreamOrDevice s) {
  return w4a16_matmul_routed(x, w, scales, global_scale, epilogue, out_dtype,
                                      /*reference_ops=*/false, mode, s);
}

mx::array w4a16_matmul_reference_ops(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& global_scale,
    const std::vector<EpilogueSpec>& epilogue,
    std::optional<mx::Dtype> out_dtype,
    const std::string& mode,
    mx::StreamOrDevice s) {
  return w4a16_matmul_routed(x, w, scales, global_scale, epilogue, out_dtype,
                                      /*reference_ops=*/true, mode, s);
}

}  // namespace mlx_fp4
