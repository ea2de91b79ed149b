// W4A16Matmul: state, shape inference and transforms. Gradients and forward-mode derivatives
// come from the MLX-ops version of the same math (w4a16_matmul_reference_ops), which MLX
// differentiates; vmap re-issues the op with the mapped axis folded into the rows.
#include "primitives.h"

#include <cstring>

#include "errors.h"
#include "format_tables.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "ops_internal.h"

namespace mlx_fp4 {

int operand_dtype_code(mx::Dtype dtype) {
  if (dtype == mx::float32) return fp4::kDtypeF32;
  if (dtype == mx::float16) return fp4::kDtypeF16;
  if (dtype == mx::bfloat16) return fp4::kDtypeBF16;
  throw std::runtime_error("[W4A16Matmul] unsupported dtype " + dtype_str(dtype));
}

W4A16Matmul::W4A16Matmul(
    mx::Stream stream,
    mx::Dtype out_dtype,
    bool has_global_scale,
    std::vector<fp4::EpilogueOp> ops,
    std::vector<int> operand_kinds,
    int mode)
    : mx::Primitive(stream),
      out_dtype_(out_dtype),
      has_global_scale_(has_global_scale),
      ops_(std::move(ops)),
      operand_kinds_(std::move(operand_kinds)),
      mode_(mode) {}

bool same_epilogue_chain(const std::vector<fp4::EpilogueOp>& a, const std::vector<int>& a_kinds,
                         const std::vector<fp4::EpilogueOp>& b, const std::vector<int>& b_kinds) {
  return a_kinds == b_kinds && a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(fp4::EpilogueOp)) == 0);
}

bool W4A16Matmul::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const W4A16Matmul&>(other);
  return out_dtype_ == o.out_dtype_ && has_global_scale_ == o.has_global_scale_ && mode_ == o.mode_ &&
         same_epilogue_chain(ops_, operand_kinds_, o.ops_, o.operand_kinds_);
}

// The shapes the kernels read, checked again when the graph runs: mx.compile(shapeless=True) hands
// a node inputs of other shapes than the op validated, and a larger K would read past w's rows.
void check_eval_shapes(const char* op, const mx::array& x, const mx::array& w, const mx::array& scales, int mode,
                       const mx::array* global_scale, int64_t global_scales) {
  const auto fail = [op](const std::string& what) {
    throw std::invalid_argument(std::string("[") + op + "] " + what +
                                " (the inputs changed shape after the op was built, e.g. under "
                                "mx.compile(shapeless=True), which cannot change K, N or the weights).");
  };
  if (x.ndim() < 1 || w.ndim() < 2 || scales.ndim() != w.ndim()) fail("x must be [..., K], w and scales [..., N, *]");
  const int64_t k = x.shape(-1);
  const int64_t n = w.shape(-2);
  const int64_t row_bytes = w.shape(-1) * static_cast<int64_t>(w.itemsize());
  // uint8 rows hold ceil(K/2) bytes or, as the bytes of MLX's uint32 words, 4 * ceil(K/8).
  const int64_t word_bytes = 4 * ((k + 7) / 8);
  const int64_t want_bytes = w.itemsize() == 4 ? word_bytes : (k + 1) / 2;
  if (k < 1 || (row_bytes != want_bytes && row_bytes != word_bytes)) {
    fail("x has K = " + std::to_string(k) + " but w's rows hold " + std::to_string(row_bytes) + " bytes, expected " +
         std::to_string(want_bytes));
  }
  const int64_t block = fp4::block_size(mode);
  const int64_t blocks = (k + block - 1) / block;
  mx::Shape want_scales = w.shape();
  want_scales.back() = static_cast<int>(blocks);
  if (scales.shape() != want_scales) {
    fail("scales must be [..., N, ceil(K/" + std::to_string(block) + ")] with N = " + std::to_string(n) +
         ", ceil(K/" + std::to_string(block) + ") = " + std::to_string(blocks) + " for K = " + std::to_string(k));
  }
  if (global_scale && global_scale->size() != 1 && static_cast<int64_t>(global_scale->size()) != global_scales) {
    fail("global_scale must hold 1 or " + std::to_string(global_scales) + " values but holds " +
         std::to_string(global_scale->size()));
  }
}

void W4A16Matmul::check_input_shapes(const std::vector<mx::array>& inputs) const {
  check_eval_shapes("w4a16_matmul", inputs[kInputX], inputs[kInputW], inputs[kInputScales], mode_,
                    has_global_scale_ ? &inputs[kInputFirstOptional] : nullptr, 1);
}

std::vector<mx::Shape> W4A16Matmul::output_shapes(const std::vector<mx::array>& inputs) {
  check_input_shapes(inputs);
  mx::Shape shape = inputs[kInputX].shape();
  shape.back() = inputs[kInputW].shape(0);
  return {shape};
}

fp4::W4A16Problem W4A16Matmul::problem(const std::vector<mx::array>& inputs, const mx::array& out) const {
  check_input_shapes(inputs);
  const auto& x = inputs[kInputX];
  fp4::W4A16Problem p{};
  p.k = x.shape(-1);
  p.m = p.k > 0 ? static_cast<int64_t>(x.size()) / p.k : 0;
  p.n = inputs[kInputW].shape(0);
  p.w_row_bytes = inputs[kInputW].shape(1) * static_cast<int64_t>(inputs[kInputW].itemsize());
  p.scale_row_bytes = inputs[kInputScales].shape(1);
  p.x_dtype = operand_dtype_code(x.dtype());
  p.out_dtype = operand_dtype_code(out.dtype());
  p.has_global_scale = has_global_scale_ ? 1 : 0;
  p.mode = mode_;
  p.num_ops = static_cast<int>(ops_.size());
  for (size_t i = 0; i < ops_.size(); ++i) {
    p.ops[i] = ops_[i];
  }
  p.num_operands = static_cast<int>(operand_kinds_.size());
  for (size_t i = 0; i < operand_kinds_.size(); ++i) {
    p.operand_kind[i] = operand_kinds_[i];
    const auto& opnd = inputs[operand_input_index(static_cast<int>(i))];
    p.operand_dtype[i] = operand_dtype_code(opnd.dtype());
    // The broadcast of an operand is materialized when the graph is built; a shapeless compiled
    // function called with other batch dims would hand the kernel a stale, too-small operand.
    const int64_t expected = operand_kinds_[i] == fp4::kOperandScalar ? 1
                           : operand_kinds_[i] == fp4::kOperandCol    ? p.n
                           : operand_kinds_[i] == fp4::kOperandRow    ? p.m
                                                                      : p.m * p.n;
    if (static_cast<int64_t>(opnd.size()) != expected || !opnd.flags().row_contiguous) {
      size_t op_index = 0;
      while (op_index < ops_.size() && ops_[op_index].operand != static_cast<int>(i)) ++op_index;
      throw std::invalid_argument(
          "[w4a16_matmul] epilogue[" + std::to_string(op_index) + "] operand has " + std::to_string(opnd.size()) +
          " elements but the output needs " + std::to_string(expected) +
          ". An operand that broadcasts over the leading (batch) dims is expanded when the graph is "
          "traced, so mx.compile(shapeless=True) cannot change those dims: pass it with the full "
          "leading shape, or compile without shapeless.");
    }
  }
  return p;
}

std::vector<EpilogueSpec> W4A16Matmul::epilogue_specs(const std::vector<mx::array>& inputs) const {
  std::vector<EpilogueSpec> specs;
  for (const auto& op : ops_) {
    EpilogueSpec spec{op.code, std::nullopt, op.p0, op.p1};
    if (op.operand >= 0) {
      spec.operand = inputs[operand_input_index(op.operand)];
    }
    specs.push_back(spec);
  }
  return specs;
}

namespace {

// Differentiable inputs: x and the operands. Returns their positions in the primal list.
std::vector<int> differentiable_positions(const W4A16Matmul& p) {
  std::vector<int> pos = {kInputX};
  for (size_t i = 0; i < p.operand_kinds().size(); ++i) {
    pos.push_back(p.operand_input_index(static_cast<int>(i)));
  }
  return pos;
}

void check_argnums(const W4A16Matmul& p, const std::vector<int>& argnums) {
  for (int a : argnums) {
    if (a == kInputW || a == kInputScales || (p.has_global_scale() && a == kInputFirstOptional)) {
      throw std::invalid_argument(
          "[w4a16_matmul] gradients with respect to w, scales and global_scale are not supported "
          "(as in mx.quantized_matmul); differentiate with respect to x or the epilogue operands.");
    }
  }
}

// The op as a function of (x, operands...) with w, scales and the global scale held fixed.
std::function<std::vector<mx::array>(const std::vector<mx::array>&)> as_function_of_differentiable(
    W4A16Matmul& p, const std::vector<mx::array>& primals, const std::vector<EpilogueSpec>& specs) {
  std::optional<mx::array> gs;
  if (p.has_global_scale()) {
    gs = primals[kInputFirstOptional];
  }
  auto w = primals[kInputW];
  auto scales = primals[kInputScales];
  auto out_dtype = p.out_dtype();
  auto stream = p.stream();
  const std::string mode = mode_name(p.mode());
  return [=](const std::vector<mx::array>& args) {
    auto sp = specs;
    int next = 1;
    for (auto& spec : sp) {
      if (spec.operand) {
        spec.operand = args[next++];
      }
    }
    return std::vector<mx::array>{
        w4a16_matmul_routed(args[0], w, scales, gs, sp, out_dtype, /*reference_ops=*/true, mode, stream)};
  };
}

}  // namespace

std::vector<mx::array> W4A16Matmul::vjp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& cotangents,
    const std::vector<int>& argnums,
    const std::vector<mx::array>&) {
  check_argnums(*this, argnums);
  auto pos = differentiable_positions(*this);
  std::vector<mx::array> args;
  for (int i : pos) {
    args.push_back(primals[i]);
  }
  auto fn = as_function_of_differentiable(*this, primals, epilogue_specs(primals));
  auto [outs, grads] = mx::vjp(fn, args, cotangents);
  std::vector<mx::array> result;
  for (int a : argnums) {
    auto it = std::find(pos.begin(), pos.end(), a);
    result.push_back(grads[it - pos.begin()]);
  }
  return result;
}

std::vector<mx::array> W4A16Matmul::jvp(
    const std::vector<mx::array>& primals,
    const std::vector<mx::array>& tangents,
    const std::vector<int>& argnums) {
  check_argnums(*this, argnums);
  auto pos = differentiable_positions(*this);
  std::vector<mx::array> args;
  std::vector<mx::array> tans;
  for (int i : pos) {
    args.push_back(primals[i]);
    auto it = std::find(argnums.begin(), argnums.end(), i);
    tans.push_back(it == argnums.end() ? mx::zeros_like(primals[i], stream())
                                       : mx::astype(tangents[it - argnums.begin()], primals[i].dtype(), stream()));
  }
  auto fn = as_function_of_differentiable(*this, primals, epilogue_specs(primals));
  auto [outs, out_tangents] = mx::jvp(fn, args, tans);
  return out_tangents;
}

std::pair<std::vector<mx::array>, std::vector<int>> W4A16Matmul::vmap(
    const std::vector<mx::array>& inputs, const std::vector<int>& axes) {
  auto s = stream();
  for (int i : {static_cast<int>(kInputW), static_cast<int>(kInputScales)}) {
    if (axes[i] >= 0) {
      throw std::invalid_argument("[w4a16_matmul] vmap over w or scales is not supported; map x or the epilogue operands.");
    }
  }
  if (has_global_scale_ && axes[kInputFirstOptional] >= 0) {
    throw std::invalid_argument("[w4a16_matmul] vmap over global_scale is not supported.");
  }
  // Batch size and the output rank once the mapped axis leads.
  int batch = -1;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (axes[i] >= 0) {
      batch = inputs[i].shape(axes[i]);
    }
  }
  auto x = inputs[kInputX];
  if (axes[kInputX] >= 0) {
    x = mx::moveaxis(x, axes[kInputX], 0, s);
  } else {
    mx::Shape shape = x.shape();
    shape.insert(shape.begin(), batch);
    x = mx::broadcast_to(mx::expand_dims(x, 0, s), shape, s);
  }
  const int out_ndim = static_cast<int>(x.ndim());  // batch + leading dims + N
  auto specs = epilogue_specs(inputs);
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (ops_[i].operand < 0) continue;
    int idx = operand_input_index(ops_[i].operand);
    if (axes[idx] < 0) continue;  // unmapped operands broadcast over the batch as they are
    auto t = mx::moveaxis(inputs[idx], axes[idx], 0, s);
    mx::Shape shape = t.shape();
    // Keep the batch axis first and right-align the rest with the output.
    shape.insert(shape.begin() + 1, out_ndim - static_cast<int>(t.ndim()), 1);
    specs[i].operand = mx::reshape(t, shape, s);
  }
  std::optional<mx::array> gs;
  if (has_global_scale_) {
    gs = inputs[kInputFirstOptional];
  }
  auto out = w4a16_matmul_routed(x, inputs[kInputW], inputs[kInputScales], gs, specs, out_dtype_,
                                          /*reference_ops=*/false, mode_name(mode_), s);
  return {{out}, {0}};
}

}  // namespace mlx_fp4
