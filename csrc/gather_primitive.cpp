// GatherW4A16Matmul: state, shape inference and transforms. Gradients come from the MLX-ops
// version of the same math (gather_w4a16_reference_canonical, built on mx::gather_mm), which
// MLX differentiates (NaN flows back from the rows of an out-of-range index); vmap folds the mapped
// axis into the index arrays and re-issues the op.
#include "gather_primitive.h"

#include <limits>
#include <numeric>

#include "errors.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "primitives.h"

namespace mlx_fp4 {
namespace {

int64_t leading_product(const mx::array& a) {
  return std::accumulate(a.shape().begin(), a.shape().end() - 2, int64_t{1}, std::multiplies<int64_t>());
}

}  // namespace

GatherW4A16Matmul::GatherW4A16Matmul(
    mx::Stream stream,
    mx::Dtype out_dtype,
    bool has_global_scale,
    bool sorted_rhs,
    std::vector<fp4::EpilogueOp> ops,
    std::vector<int> operand_kinds,
    int mode)
    : mx::Primitive(stream),
      out_dtype_(out_dtype),
      has_global_scale_(has_global_scale),
      sorted_rhs_(sorted_rhs),
      ops_(std::move(ops)),
      operand_kinds_(std::move(operand_kinds)),
      mode_(mode) {}

bool GatherW4A16Matmul::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const GatherW4A16Matmul&>(other);
  return out_dtype_ == o.out_dtype_ && has_global_scale_ == o.has_global_scale_ && sorted_rhs_ == o.sorted_rhs_ &&
         mode_ == o.mode_ && same_epilogue_chain(ops_, operand_kinds_, o.ops_, o.operand_kinds_);
}

// As the dense op (check_eval_shapes), plus the indices: one shape, uint32 (what the op made).
static void check_gather_eval_shapes(const std::vector<mx::array>& inputs, int mode, bool has_global_scale) {
  const auto& w = inputs[kGatherW];
  const int64_t experts = w.ndim() >= 2 ? static_cast<int64_t>(w.size() / (w.shape(-1) * w.shape(-2))) : 0;
  check_eval_shapes("gather_w4a16_matmul", inputs[kGatherX], w, inputs[kGatherScales], mode,
                    has_global_scale ? &inputs[kGatherFirstOptional] : nullptr, experts);
  const auto& lhs = inputs[kGatherLhs];
  const auto& rhs = inputs[kGatherRhs];
  if (inputs[kGatherX].ndim() < 2 || lhs.shape() != rhs.shape() || lhs.dtype() != mx::uint32 ||
      rhs.dtype() != mx::uint32) {
    throw std::invalid_argument(
        "[gather_w4a16_matmul] x must be [..., M, K] and lhs/rhs indices uint32 of one shape when the graph "
        "runs (the inputs changed after the op was built, e.g. under mx.compile(shapeless=True)).");
  }
}

std::vector<mx::Shape> GatherW4A16Matmul::output_shapes(const std::vector<mx::array>& inputs) {
  check_gather_eval_shapes(inputs, mode_, has_global_scale_);
  mx::Shape shape = inputs[kGatherLhs].shape();
  shape.push_back(inputs[kGatherX].shape(-2));
  shape.push_back(inputs[kGatherW].shape(-2));
  return {shape};
}

fp4::GatherW4A16Problem GatherW4A16Matmul::problem(const std::vector<mx::array>& inputs, const mx::array& out) const {
  check_gather_eval_shapes(inputs, mode_, has_global_scale_);
  const auto& x = inputs[kGatherX];
  const auto& w = inputs[kGatherW];
  fp4::GatherW4A16Problem g{};
  fp4::W4A16Problem& p = g.mm;
  p.k = x.shape(-1);
  p.m = x.shape(-2);
  p.n = w.shape(-2);
  p.w_row_bytes = w.shape(-1) * static_cast<int64_t>(w.itemsize());
  p.scale_row_bytes = inputs[kGatherScales].shape(-1);
  p.x_dtype = operand_dtype_code(x.dtype());
  p.out_dtype = operand_dtype_code(out.dtype());
  p.has_global_scale = has_global_scale_ ? 1 : 0;
  p.mode = mode_;
  p.num_ops = static_cast<int>(ops_.size());
  for (size_t i = 0; i < ops_.size(); ++i) p.ops[i] = ops_[i];
  g.pairs = inputs[kGatherLhs].size();
  g.x_batches = leading_product(x);
  g.experts = leading_product(w);
  g.w_expert_bytes = p.n * p.w_row_bytes;
  g.scale_expert_bytes = p.n * p.scale_row_bytes;
  g.global_scale_per_expert = has_global_scale_ && inputs[kGatherFirstOptional].size() > 1 ? 1 : 0;
  g.sorted_rhs = sorted_rhs_ ? 1 : 0;
  const int64_t rows = fp4::gather_out_rows(g);
  p.num_operands = static_cast<int>(operand_kinds_.size());
  for (size_t i = 0; i < operand_kinds_.size(); ++i) {
    p.operand_kind[i] = operand_kinds_[i];
    const auto& opnd = inputs[operand_input_index(static_cast<int>(i))];
    p.operand_dtype[i] = operand_dtype_code(opnd.dtype());
    const int64_t expected = operand_kinds_[i] == fp4::kOperandScalar ? 1
                           : operand_kinds_[i] == fp4::kOperandCol    ? p.n
                           : operand_kinds_[i] == fp4::kOperandRow    ? rows
                                                                      : rows * p.n;
    if (static_cast<int64_t>(opnd.size()) != expected || !opnd.flags().row_contiguous) {
      throw std::invalid_argument(
          "[gather_w4a16_matmul] an epilogue operand has " + std::to_string(opnd.size()) +
          " elements but the output needs " + std::to_string(expected) +
          ". Operands that broadcast over the index dims are expanded when the graph is traced, so "
          "mx.compile(shapeless=True) cannot change those dims: pass them with the full shape.");
    }
  }
  return g;
}

std::vector<EpilogueSpec> GatherW4A16Matmul::epilogue_specs(const std::vector<mx::array>& inputs) const {
  std::vector<EpilogueSpec> specs;
  for (const auto& op : ops_) {
    EpilogueSpec spec{op.code, std::nullopt, op.p0, op.p1};
    if (op.operand >= 0) spec.operand = inputs[operand_input_index(op.operand)];
    specs.push_back(spec);
  }
  return specs;
}

std::vector<mx::array> GatherW4A16Matmul::vjp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& cotangents,
    const std::vector<int>& argnums,
    const std::vector<mx::array>&) {
  // Differentiable: x and the operands; indices get zeros (integer inputs).
  std::vector<int> pos = {kGatherX};
  for (size_t i = 0; i < operand_kinds_.size(); ++i) pos.push_back(operand_input_index(static_cast<int>(i)));
  for (int a : argnums) {
    const bool index = a == kGatherLhs || a == kGatherRhs;
    if (!index && std::find(pos.begin(), pos.end(), a) == pos.end()) {
      throw std::invalid_argument(
          "[gather_w4a16_matmul] gradients with respect to w, scales and global_scale are not supported "
          "(as in mx.gather_qmm); differentiate with respect to x or the epilogue operands.");
    }
  }
  std::optional<mx::array> gs;
  if (has_global_scale_) gs = primals[kGatherFirstOptional];
  const auto specs = epilogue_specs(primals);
  // A pair with an out-of-range index has NaN rows, and NaN flows back: its cotangent is NaN, so
  // every gradient it reaches is; a bad lhs names no row of x, so then all of x's gradient is NaN.
  const auto s = stream();
  const auto pairs = in_range_pairs(
      {primals[kGatherX], primals[kGatherW], primals[kGatherScales], primals[kGatherLhs], primals[kGatherRhs], gs,
       mode_},
      s);
  const std::vector<mx::array> cot = {
      mx::multiply(cotangents[0], mx::astype(pairs.factor, cotangents[0].dtype(), s), s)};
  auto fn = [&](const std::vector<mx::array>& args) {
    auto sp = specs;
    int next = 1;
    for (auto& spec : sp) {
      if (spec.operand) spec.operand = args[next++];
    }
    const GatherInputs in{args[0], primals[kGatherW], primals[kGatherScales], primals[kGatherLhs],
                          primals[kGatherRhs], gs, mode_};
    return std::vector<mx::array>{gather_w4a16_reference_canonical(in, sp, out_dtype_, stream())};
  };
  std::vector<mx::array> args;
  for (int i : pos) args.push_back(primals[i]);
  auto [outs, grads] = mx::vjp(fn, args, cot);
  const auto nan = mx::array(std::numeric_limits<float>::quiet_NaN(), grads[0].dtype());
  grads[0] = mx::where(pairs.lhs_out_of_range, nan, grads[0], s);
  std::vector<mx::array> result;
  for (int a : argnums) {
    auto it = std::find(pos.begin(), pos.end(), a);
    result.push_back(it == pos.end() ? mx::zeros_like(primals[a], s) : grads[it - pos.begin()]);
  }
  return result;
}

std::pair<std::vector<mx::array>, std::vector<int>> GatherW4A16Matmul::vmap(
    const std::vector<mx::array>& inputs, const std::vector<int>& axes) {
  auto s = stream();
  if (axes[kGatherW] >= 0 || axes[kGatherScales] >= 0 || (has_global_scale_ && axes[kGatherFirstOptional] >= 0)) {
    throw std::invalid_argument(
        "[gather_w4a16_matmul] vmap over w, scales or global_scale is not supported; map x, the indices or "
        "the epilogue operands.");
  }
  int batch = 1;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (axes[i] >= 0) batch = inputs[i].shape(axes[i]);
  }
  // Indices with the mapped axis first ([V, ...B] or [1, ...B]).
  auto lead = [&](int i) {
    return axes[i] >= 0 ? mx::moveaxis(inputs[i], axes[i], 0, s) : mx::expand_dims(inputs[i], 0, s);
  };
  auto lhs = lead(kGatherLhs);
  auto rhs = lead(kGatherRhs);
  auto x = inputs[kGatherX];
  if (axes[kGatherX] >= 0) {
    // Map v reads matrix lhs of x[v]: flat index v * (matrices per map) + lhs.
    x = mx::moveaxis(x, axes[kGatherX], 0, s);
    const int per_map = static_cast<int>(leading_product(x) / batch);
    mx::Shape offset_shape(lhs.ndim(), 1);
    offset_shape[0] = batch;
    auto offsets = mx::reshape(mx::multiply(mx::arange(batch, mx::uint32, s), mx::array(per_map, mx::uint32), s),
                               offset_shape, s);
    // An out-of-range lhs stays out of range (plus the offset it would name another map's matrix).
    const auto in_map = mx::less(lhs, mx::array(static_cast<uint32_t>(per_map)), s);
    lhs = mx::where(in_map, mx::add(lhs, offsets, s), mx::array(std::numeric_limits<uint32_t>::max()), s);
  }
  mx::Shape b = mx::broadcast_shapes(lhs.shape(), rhs.shape());
  b[0] = batch;
  lhs = mx::broadcast_to(lhs, b, s);
  rhs = mx::broadcast_to(rhs, b, s);
  const int out_ndim = static_cast<int>(b.size()) + 2;
  auto specs = epilogue_specs(inputs);
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (ops_[i].operand < 0) continue;
    const int idx = operand_input_index(ops_[i].operand);
    if (axes[idx] < 0) continue;  // unmapped operands broadcast over the map as they are
    auto t = mx::moveaxis(inputs[idx], axes[idx], 0, s);
    mx::Shape shape = t.shape();
    shape.insert(shape.begin() + 1, out_ndim - static_cast<int>(t.ndim()), 1);
    specs[i].operand = mx::reshape(t, shape, s);
  }
  std::optional<mx::array> gs;
  if (has_global_scale_) gs = inputs[kGatherFirstOptional];
  auto out = gather_w4a16_node({x, inputs[kGatherW], inputs[kGatherScales], lhs, rhs, gs, mode_}, specs, out_dtype_,
                               false, s);
  return {{out}, {0}};
}

}  // namespace mlx_fp4
