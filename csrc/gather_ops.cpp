// gather_w4a16_matmul: validates every argument once (ValueError naming the argument), turns the
// indices and the global scale into the primitive's canonical inputs, and adds one
// GatherW4A16Matmul node. Also the same math in plain MLX ops (reference_ops).
#include "gather_ops.h"

#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "errors.h"
#include "format_tables.h"
#include "gather_primitive.h"
#include "metal_route_table.h"
#include "mlx/ops.h"
#include "op_common.h"
#include "primitives.h"

namespace mlx_fp4 {
namespace {

constexpr const char* kOp = "gather_w4a16_matmul";

int64_t product(mx::Shape::const_iterator first, mx::Shape::const_iterator last) {
  return std::accumulate(first, last, int64_t{1}, std::multiplies<int64_t>());
}

// The batch dims of a stack of matrices: everything but the last two.
mx::Shape batch_shape(const mx::array& a) { return mx::Shape(a.shape().begin(), a.shape().end() - 2); }

// Canonical inputs of the primitive, every check done.
struct Canonical {
  GatherInputs in;
  mx::Dtype out_dtype;
  bool squeeze_m;  // x was 1-D [K] (no indices): drop the M axis again
  bool sorted_rhs;
};

void check_weights(const mx::array& x, const mx::array& w, const mx::array& scales, int mode) {
  const int k = x.shape(-1);
  if (w.ndim() < 2) {
    throw_invalid("[", kOp, "] w must be [..., N, ceil(K/2)] uint8 or [..., N, ceil(K/8)] uint32 (experts first) "
                  "but got shape ", shape_str(w.shape()), ".");
  }
  const int64_t bytes_u8 = fp4::packed_bytes_for_k(k);
  const int64_t words = fp4::packed_words_for_k(k);
  if (w.dtype() == mx::uint32) {
    if (w.shape(-1) != words) {
      throw_invalid("[", kOp, "] w (uint32) must have last dimension ceil(K/8) = ", words, " for K = ", k,
                    " (from x) but got shape ", shape_str(w.shape()), ".");
    }
  } else if (w.dtype() == mx::uint8) {
    if (w.shape(-1) != bytes_u8 && w.shape(-1) != 4 * words) {
      throw_invalid("[", kOp, "] w (uint8) must have last dimension ceil(K/2) = ", bytes_u8, " for K = ", k,
                    " (from x) but got shape ", shape_str(w.shape()), ".");
    }
  } else {
    throw_invalid("[", kOp, "] w must be uint8 or uint32 (packed E2M1) but got dtype ", dtype_str(w.dtype()), ".");
  }
  if (scales.dtype() != mx::uint8) {
    throw_invalid("[", kOp, "] scales must be uint8 (", mode == fp4::kModeMxfp4 ? "E8M0" : "E4M3",
                  " bits) but got dtype ", dtype_str(scales.dtype()), ".");
  }
  mx::Shape expected = w.shape();
  expected.back() = static_cast<int>(fp4::scale_blocks_for_k(k, mode));
  if (scales.shape() != expected) {
    throw_invalid("[", kOp, "] scales must have shape w.shape[:-1] + (ceil(K/", fp4::block_size(mode), "),) = ",
                  shape_str(expected), " but got ", shape_str(scales.shape()), " (mode '", mode_name(mode), "').");
  }
}

// Values of an integer array that is already computed, as int64 (nullopt when not readable now:
// a lazy or traced array, or a strided view; the kernels check those when they run).
template <typename T>
std::vector<int64_t> values_as(const mx::array& a) {
  const T* p = a.data<T>();
  return std::vector<int64_t>(p, p + a.size());
}
std::optional<std::vector<int64_t>> readable_values(const mx::array& a) {
  if (a.is_tracer() || !a.is_available() || !a.flags().row_contiguous) return std::nullopt;
  switch (a.dtype()) {
    case mx::int8: return values_as<int8_t>(a);
    case mx::int16: return values_as<int16_t>(a);
    case mx::int32: return values_as<int32_t>(a);
    case mx::int64: return values_as<int64_t>(a);
    case mx::uint8: return values_as<uint8_t>(a);
    case mx::uint16: return values_as<uint16_t>(a);
    case mx::uint32: return values_as<uint32_t>(a);
    default: break;
  }
  // uint64: compare unsigned (values past int64 are out of range anyway).
  std::vector<int64_t> out;
  for (uint64_t v : values_as<uint64_t>(a)) out.push_back(v > INT64_MAX ? -1 : static_cast<int64_t>(v));
  return out;
}

// The indices for `arg` as uint32, checked against the `batch` of matrices they pick from when their
// values can be read now.
mx::array canonical_indices(const mx::array& idx, const char* arg, const char* of, const mx::Shape& batch,
                            mx::StreamOrDevice s) {
  const int64_t limit = product(batch.begin(), batch.end());
  if (!mx::issubdtype(idx.dtype(), mx::integer)) {
    throw_invalid("[", kOp, "] ", arg, " must be an integer array but got dtype ", dtype_str(idx.dtype()), ".");
  }
  if (auto values = readable_values(idx)) {
    for (size_t i = 0; i < values->size(); ++i) {
      const int64_t v = (*values)[i];
      if (v < 0 || v >= limit) {
        throw_invalid("[", kOp, "] ", arg, " must be in [0, ", limit, ") (the matrices in ", of, " with batch shape ",
                      shape_str(batch), ") but got ", v, " at flat position ", i, ".");
      }
    }
  }
  if (idx.itemsize() == 8) {
    // A lazy 64-bit index past uint32 would wrap in the cast (2^32 + 1 -> expert 1). Any value out of
    // [0, 2^32 - 1) maps to 2^32 - 1 instead, which every kernel treats as out of range: a NaN row.
    // Nodes only for 64-bit indices; mlx-lm's routing gives uint32.
    const auto bad = mx::array(static_cast<uint32_t>(UINT32_MAX));
    const auto wide = mx::astype(idx, mx::int64, s);
    const auto ok = mx::logical_and(mx::greater_equal(wide, mx::array(int64_t{0}), s),
                                    mx::less(wide, mx::array(int64_t{UINT32_MAX}), s), s);
    return mx::where(ok, mx::astype(idx, mx::uint32, s), bad, s);
  }
  return mx::astype(idx, mx::uint32, s);
}

// The default indices (every matrix of `batch` in order) broadcast to `shape`, made on the host as a
// constant: no Arange, Reshape or Broadcast node. Each node costs host time at every call, and an
// mlx-lm SwitchGLU decode step runs three gathered products without lhs_indices per layer.
mx::array make_default_indices(const mx::Shape& batch, const mx::Shape& shape) {
  const size_t nd = shape.size(), lead = nd - batch.size();  // batch aligns with shape's last dims
  std::vector<int64_t> stride(nd, 0);  // 0 on broadcast dims
  int64_t step = 1;
  for (size_t d = batch.size(); d-- > 0;) {
    stride[lead + d] = batch[d] == 1 ? 0 : step;
    step *= batch[d];
  }
  std::vector<uint32_t> values(static_cast<size_t>(product(shape.begin(), shape.end())));
  std::vector<int64_t> coord(nd, 0);
  for (auto& v : values) {
    int64_t flat = 0;
    for (size_t d = 0; d < nd; ++d) flat += coord[d] * stride[d];
    v = static_cast<uint32_t>(flat);
    for (size_t d = nd; d-- > 0;) {  // the next position, row-major
      if (++coord[d] < shape[d]) break;
      coord[d] = 0;
    }
  }
  return mx::array(values.begin(), shape, mx::uint32);
}

// Shape pairs remembered at most (decode repeats a few; prompts of new lengths add more).
constexpr size_t kMaxCachedDefaultIndices = 64;

// make_default_indices, remembered per (batch, shape): on CUDA the array lives in managed memory, so
// one array reused stays where the GPU read it instead of being written by the host at each call.
// The cache holds each array, so none is ever donated to an op's output. Never destroyed (arrays
// released after MLX's allocator at exit would call into it).
// MLX_FP4_GATHER_DEFAULT_INDICES=nodes builds them as mx.gather_qmm does (Arange, Reshape,
// Broadcast nodes at every call) instead: the A/B of the constants' cost on a device.
mx::array default_indices(const mx::Shape& batch, const mx::Shape& shape, mx::StreamOrDevice s) {
  static const bool nodes = [] {
    const char* v = std::getenv("MLX_FP4_GATHER_DEFAULT_INDICES");
    return v && std::string(v) == "nodes";
  }();
  if (nodes) {
    const int limit = static_cast<int>(product(batch.begin(), batch.end()));
    return mx::broadcast_to(mx::reshape(mx::arange(limit, mx::uint32, s), batch, s), shape, s);
  }
  static std::mutex mu;
  using Key = std::pair<std::vector<int>, std::vector<int>>;  // mx::Shape has no ordering
  static auto* cache = new std::map<Key, mx::array>();
  std::lock_guard<std::mutex> lock(mu);
  Key key{{batch.begin(), batch.end()}, {shape.begin(), shape.end()}};
  if (auto it = cache->find(key); it != cache->end()) return it->second;
  if (cache->size() >= kMaxCachedDefaultIndices) cache->clear();
  return cache->emplace(std::move(key), make_default_indices(batch, shape)).first->second;
}

// The global scale (tensor amax, MLX's convention): one value (shape () or (1,), as given: no node)
// or [E]. The kernels divide by 2688 in place, as MLX's do.
mx::array canonical_global_scale(const mx::array& gs, const mx::array& w, mx::StreamOrDevice s) {
  if (gs.dtype() != mx::float32) {
    throw_invalid("[", kOp, "] global_scale must be a Python float or a float32 array but got dtype ",
                  dtype_str(gs.dtype()), ".");
  }
  const mx::Shape batch = batch_shape(w);
  const int experts = static_cast<int>(product(batch.begin(), batch.end()));
  if (gs.size() == 1 && gs.ndim() <= 1) return gs;
  if (gs.ndim() == 1 && gs.shape(0) == experts) return gs;
  if (gs.shape() != batch) {
    throw_invalid("[", kOp, "] global_scale must be a scalar or have one value per expert, shape w.shape[:-2] = ",
                  shape_str(batch), ", but got shape ", shape_str(gs.shape()), ".");
  }
  return mx::reshape(gs, {experts}, s);
}

Canonical canonicalize(
    const mx::array& x_in,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& lhs_indices,
    const std::optional<mx::array>& rhs_indices,
    const std::optional<mx::array>& global_scale,
    std::optional<mx::Dtype> out_dtype,
    bool sorted_indices,
    int mode,
    mx::StreamOrDevice s) {
  check_no_global_scale(mode, global_scale.has_value(), kOp);
  if (!is_supported_float(x_in.dtype())) {
    throw_invalid("[", kOp, "] x must be float16, bfloat16 or float32 but got ", dtype_str(x_in.dtype()), ".");
  }
  const bool indexed = lhs_indices || rhs_indices;
  const bool squeeze_m = !indexed && x_in.ndim() == 1;
  if (x_in.ndim() < (squeeze_m ? 1 : 2)) {
    throw_invalid("[", kOp, "] x must have at least 2 dimensions [..., M, K] but got shape ",
                  shape_str(x_in.shape()), ".");
  }
  const mx::array x = squeeze_m ? mx::expand_dims(x_in, 0, s) : x_in;
  if (x.shape(-1) < 1) {
    throw_invalid("[", kOp, "] x must have K >= 1 (its last dimension) but got shape ", shape_str(x_in.shape()), ".");
  }
  check_weights(x, w, scales, mode);
  const mx::Dtype od = out_dtype.value_or(x.dtype());
  if (!is_supported_float(od)) {
    throw_invalid("[", kOp, "] out_dtype must be float16, bfloat16 or float32 but got ", dtype_str(od), ".");
  }
  mx::Shape xb = batch_shape(x);
  mx::Shape wb = batch_shape(w);
  if (!indexed) {
    // As mx.gather_qmm without indices (quantized_matmul): the batch dims broadcast together.
    mx::Shape both;
    try {
      both = mx::broadcast_shapes(xb, wb);
    } catch (const std::invalid_argument&) {
      throw_invalid("[", kOp, "] without indices the batch dims of x ", shape_str(xb), " and w ", shape_str(wb),
                    " must broadcast together.");
    }
    auto lhs = default_indices(xb, both, s);
    auto rhs = default_indices(wb, both, s);
    std::optional<mx::array> gs;
    if (global_scale) gs = canonical_global_scale(*global_scale, w, s);
    return {{x, w, scales, lhs, rhs, gs, mode}, od, squeeze_m, false};
  }
  // An absent side's shape is its batch shape (mx.gather_qmm's arange over it); it is made once the
  // broadcast shape is known.
  std::optional<mx::array> lhs, rhs;
  if (lhs_indices) lhs = canonical_indices(*lhs_indices, "lhs_indices", "x", xb, s);
  if (rhs_indices) rhs = canonical_indices(*rhs_indices, "rhs_indices", "w", wb, s);
  const mx::Shape lhs_shape = lhs ? lhs->shape() : xb, rhs_shape = rhs ? rhs->shape() : wb;
  mx::Shape b;
  try {
    b = mx::broadcast_shapes(lhs_shape, rhs_shape);
  } catch (const std::invalid_argument&) {
    throw_invalid("[", kOp, "] lhs_indices of shape ", shape_str(lhs_shape), " and rhs_indices of shape ",
                  shape_str(rhs_shape), " must broadcast together.");
  }
  if (!lhs) lhs = default_indices(xb, b, s);
  if (!rhs) rhs = default_indices(wb, b, s);
  std::optional<mx::array> gs;
  if (global_scale) gs = canonical_global_scale(*global_scale, w, s);
  // As mx.gather_qmm: the hint holds for rhs only when lhs is the default.
  const bool sorted_rhs = sorted_indices && rhs_indices && !lhs_indices;
  return {{x, w, scales, mx::broadcast_to(*lhs, b, s), mx::broadcast_to(*rhs, b, s), gs, mode}, od, false, sorted_rhs};
}

mx::array squeeze_if(const mx::array& y, bool squeeze_m, mx::StreamOrDevice s) {
  return squeeze_m ? mx::squeeze(y, -2, s) : y;
}

}  // namespace

mx::array gather_w4a16_node(
    const GatherInputs& in, const std::vector<EpilogueSpec>& epilogue, mx::Dtype out_dtype, bool sorted_rhs,
    mx::StreamOrDevice s) {
  check_epilogue(epilogue, kOp);
  mx::Shape out_shape = in.lhs.shape();
  out_shape.push_back(in.x.shape(-2));
  out_shape.push_back(in.w.shape(-2));
  // No Contiguous node where none is needed (every graph node costs host time at each call).
  std::vector<mx::array> inputs = {rows_input(in.x, s), contiguous_input(in.w, s), contiguous_input(in.scales, s),
                                   rows_input(in.lhs, s), rows_input(in.rhs, s)};
  if (in.global_scale) inputs.push_back(contiguous_input(*in.global_scale, s));
  std::vector<fp4::EpilogueOp> ops;
  std::vector<int> kinds;
  for (size_t i = 0; i < epilogue.size(); ++i) {
    const auto& spec = epilogue[i];
    fp4::EpilogueOp op{spec.code, -1, spec.p0, spec.p1};
    if (spec.operand) {
      auto [kind, operand] = canonical_operand(*spec.operand, out_shape, static_cast<int>(i), s, kOp);
      op.operand = static_cast<int>(kinds.size());
      kinds.push_back(kind);
      inputs.push_back(operand);
    }
    ops.push_back(op);
  }
  auto stream = mx::to_stream(s);
  return mx::array(
      out_shape,
      out_dtype,
      std::make_shared<GatherW4A16Matmul>(stream, out_dtype, in.global_scale.has_value(), sorted_rhs, std::move(ops),
                                          std::move(kinds), in.mode),
      std::move(inputs));
}

// fp32 products -> each pair's decode multiplier (global scale / 2688), the chain, one cast (the
// reference and the MLX route).
static mx::array finish_gather(mx::array y, const GatherInputs& in, const std::vector<EpilogueSpec>& epilogue,
                        mx::Dtype out_dtype, mx::StreamOrDevice s) {
  const auto& rhs = in.rhs;
  if (in.global_scale) {
    const mx::array& gs = *in.global_scale;
    if (gs.size() == 1) {
      y = mx::multiply(y, global_scale_multiplier(gs, kOp, s), s);
    } else {
      auto multiplier = mx::divide(gs, mx::array(fp4::kGlobalScaleDenominator, mx::float32), s);
      auto per_pair = mx::take(multiplier, rhs, 0, s);
      y = mx::multiply(y, mx::expand_dims(per_pair, {-2, -1}, s), s);
    }
  }
  for (const auto& op : epilogue) {
    y = apply_op_ops(y, op, s);
  }
  return mx::astype(y, out_dtype, s);
}

InRangePairs in_range_pairs(const GatherInputs& in, mx::StreamOrDevice s) {
  const auto count = [](const mx::array& a) {
    return mx::array(static_cast<uint32_t>(product(a.shape().begin(), a.shape().end() - 2)), mx::uint32);
  };
  const auto zero = mx::array(uint32_t{0});
  auto bad_lhs = mx::greater_equal(in.lhs, count(in.x), s);
  auto bad_rhs = mx::greater_equal(in.rhs, count(in.w), s);
  auto bad = mx::expand_dims(mx::logical_or(bad_lhs, bad_rhs, s), {-2, -1}, s);
  auto factor = mx::where(bad, mx::array(std::numeric_limits<float>::quiet_NaN()), mx::array(1.0f), s);
  return {mx::where(bad_lhs, zero, in.lhs, s), mx::where(bad_rhs, zero, in.rhs, s), factor, mx::any(bad_lhs, s)};
}

// `in` with its indices from `pairs` (every index in range).
static GatherInputs with_pairs(const GatherInputs& in, const InRangePairs& pairs) {
  GatherInputs safe = in;
  safe.lhs = pairs.lhs;
  safe.rhs = pairs.rhs;
  return safe;
}

mx::array gather_w4a16_reference_canonical(
    const GatherInputs& in_any, const std::vector<EpilogueSpec>& epilogue, mx::Dtype out_dtype,
    mx::StreamOrDevice s) {
  const InRangePairs pairs = in_range_pairs(in_any, s);
  const GatherInputs in = with_pairs(in_any, pairs);
  const auto& [x, w, scales, lhs, rhs, global_scale, mode] = in;
  const int k = x.shape(-1);
  const int n = w.shape(-2);
  const int experts = static_cast<int>(product(w.shape().begin(), w.shape().end() - 2));
  // Decode every expert as one [E * N, K] matrix: exact fp32 values.
  auto wf = decode_f32(mx::reshape(w, {experts * n, w.shape(-1)}, s),
                       mx::reshape(scales, {experts * n, scales.shape(-1)}, s), k, mode, s);
  wf = mx::reshape(wf, {experts, n, k}, s);
  const int m = x.shape(-2);
  const int x_batches = static_cast<int>(product(x.shape().begin(), x.shape().end() - 2));
  auto xf = mx::reshape(mx::astype(x, mx::float32, s), {x_batches, m, k}, s);
  auto y = mx::gather_mm(xf, mx::swapaxes(wf, -1, -2, s), lhs, rhs, false, s);
  return finish_gather(mx::multiply(y, pairs.factor, s), in, epilogue, out_dtype, s);
}

// GPU streams without our kernel for the mode: MLX's own mx::gather_qmm of that mode (its layout
// needs K a multiple of the block; it rounds to x's dtype, then the chain runs in fp32 as above).
static mx::array gather_mlx_route(
    const GatherInputs& in_any, const std::vector<EpilogueSpec>& epilogue, mx::Dtype out_dtype, bool sorted_rhs,
    mx::StreamOrDevice s) {
  const InRangePairs pairs = in_range_pairs(in_any, s);
  const GatherInputs in = with_pairs(in_any, pairs);
  const int k = in.x.shape(-1);
  const int n = in.w.shape(-2);
  const int experts = static_cast<int>(product(in.w.shape().begin(), in.w.shape().end() - 2));
  const int x_batches = static_cast<int>(product(in.x.shape().begin(), in.x.shape().end() - 2));
  auto words = in.w.dtype() == mx::uint32 ? in.w : mx::view(mx::contiguous(in.w, false, s), mx::uint32, s);
  words = mx::reshape(words, {experts, n, -1}, s);
  auto scales = mx::reshape(in.scales, {experts, n, in.scales.shape(-1)}, s);
  auto x = mx::reshape(in.x, {x_batches, in.x.shape(-2), k}, s);
  auto y = mx::gather_qmm(x, words, scales, std::nullopt, in.lhs, in.rhs, true, fp4::block_size(in.mode),
                          fp4::kNibbleBits, mode_name(in.mode), std::nullopt, sorted_rhs, s);
  return finish_gather(mx::multiply(mx::astype(y, mx::float32, s), pairs.factor, s), in, epilogue, out_dtype, s);
}

// The Metal tuner's measured route of the gathered shape (python/mlx_fp4/tuning.py), if it has one:
// rows = all pairs' rows of x, N, K, x dtype, mode, experts, the sorted hint.
static std::optional<fp4::MetalRoute> tuned_gather_route(const Canonical& c) {
  const GatherInputs& in = c.in;
  const int64_t experts = product(in.w.shape().begin(), in.w.shape().end() - 2);
  const MetalRouteKey key{metal_shape_bucket(int64_t(in.rhs.size()) * in.x.shape(-2)), in.w.shape(-2),
                          in.x.shape(-1), operand_dtype_code(in.x.dtype()), in.mode, experts, c.sorted_rhs};
  return metal_route_table().get(key);
}

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
    const std::string& mode,
    mx::StreamOrDevice s) {
  const Canonical c = canonicalize(x, w, scales, lhs_indices, rhs_indices, global_scale, out_dtype, sorted_indices,
                                   parse_mode(mode, kOp), s);
  // Operands of a 1-D x broadcast against the [N] output: give them the M axis the node has.
  std::vector<EpilogueSpec> chain = epilogue;
  if (c.squeeze_m) {
    for (auto& spec : chain) {
      if (spec.operand && spec.operand->ndim() >= 1) spec.operand = mx::expand_dims(*spec.operand, -2, s);
    }
  }
  const bool kernel = mx::to_stream(s).device != mx::Device::gpu ||
                      (gather_gpu_kernel_available() && gather_gpu_kernel_supports_mode(c.in.mode));
  const bool mlx_layout = x.shape(-1) % fp4::block_size(c.in.mode) == 0;
  const bool tuned_mlx = kernel && mlx_layout && mx::to_stream(s).device == mx::Device::gpu &&
                         tuned_gather_route(c) == fp4::MetalRoute::kMlx;
  auto y = tuned_mlx    ? gather_mlx_route(c.in, chain, c.out_dtype, c.sorted_rhs, s)
           : kernel     ? gather_w4a16_node(c.in, chain, c.out_dtype, c.sorted_rhs, s)
           : mlx_layout ? gather_mlx_route(c.in, chain, c.out_dtype, c.sorted_rhs, s)
                        : gather_w4a16_reference_canonical(c.in, chain, c.out_dtype, s);
  return squeeze_if(y, c.squeeze_m, s);
}

mx::array gather_w4a16_matmul_reference_ops(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& lhs_indices,
    const std::optional<mx::array>& rhs_indices,
    const std::optional<mx::array>& global_scale,
    const std::vector<EpilogueSpec>& epilogue,
    std::optional<mx::Dtype> out_dtype,
    const std::string& mode,
    mx::StreamOrDevice s) {
  const Canonical c =
      canonicalize(x, w, scales, lhs_indices, rhs_indices, global_scale, out_dtype, false, parse_mode(mode, kOp), s);
  check_epilogue(epilogue, kOp);
  auto y = gather_w4a16_reference_canonical(c.in, epilogue, c.out_dtype, s);
  return squeeze_if(y, c.squeeze_m, s);
}

}  // namespace mlx_fp4
