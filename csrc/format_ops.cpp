// quantize / dequantize: lazy MLX graph ops for the NVFP4 format. They run on every backend
// because they are built from MLX ops; the code tables come from csrc/shared/fp4_format.h.
#include <algorithm>
#include <cmath>
#include <limits>

#include "errors.h"
#include "format_tables.h"
#include "mlx/ops.h"
#include "mlx_fp4.h"
#include "shared/w4a16_problem.h"

namespace mlx_fp4 {
namespace {

// fp32 bit-field constants used to build powers of two exactly.
constexpr uint32_t kF32MantissaBits = 23;
constexpr uint32_t kF32ExpMask = 0xFF;
constexpr int kF32Bias = 127;

mx::array u32(uint32_t v) { return mx::array(v, mx::uint32); }
mx::array f32(float v) { return mx::array(v, mx::float32); }

// Unbiased exponent of positive fp32 values (fp32 subnormals and 0 give -127).
mx::array f32_exponent(const mx::array& x, mx::StreamOrDevice s) {
  auto bits = mx::view(x, mx::uint32, s);
  auto e = mx::bitwise_and(mx::right_shift(bits, u32(kF32MantissaBits), s), u32(kF32ExpMask), s);
  return mx::subtract(mx::astype(e, mx::int32, s), mx::array(kF32Bias, mx::int32), s);
}

// 2^e for int32 e in the normal fp32 range, exact.
mx::array pow2(const mx::array& e, mx::StreamOrDevice s) {
  auto biased = mx::astype(mx::add(e, mx::array(kF32Bias, mx::int32), s), mx::uint32, s);
  return mx::view(mx::left_shift(biased, u32(kF32MantissaBits), s), mx::float32, s);
}

// E4M3 encode of non-negative fp32 values: round-to-nearest-even, saturating at 448,
// NaN -> 0x7F. Built as code = (e + 6) * 8 + round(x / 2^(e-3)), e = max(exponent, -6),
// which also covers subnormals (e = -6) and the carry into the next binade.
mx::array e4m3_encode(const mx::array& x, mx::StreamOrDevice s) {
  constexpr int kMantSteps = 1 << fp4::kE4M3MantissaBits;  // 8
  auto e = mx::maximum(f32_exponent(x, s), mx::array(fp4::kE4M3MinNormalExp, mx::int32), s);
  auto inv_quantum = pow2(mx::subtract(mx::array(fp4::kE4M3MantissaBits, mx::int32), e, s), s);
  auto r = mx::astype(mx::round(mx::multiply(x, inv_quantum, s), 0, s), mx::int32, s);
  auto code = mx::add(
      mx::multiply(mx::subtract(e, mx::array(fp4::kE4M3MinNormalExp, mx::int32), s),
                   mx::array(kMantSteps, mx::int32), s),
      r, s);
  auto max_code = mx::array(int32_t(0x7E), mx::int32);  // 448
  code = mx::where(mx::greater_equal(x, f32(fp4::kE4M3Max), s), max_code, code, s);
  code = mx::where(mx::isnan(x, s), mx::array(int32_t(fp4::kE4M3NaNMag), mx::int32), code, s);
  return mx::astype(code, mx::uint8, s);
}

// E2M1 encode (saturating at 6) of fp32 values, as a uint32 code per value: round-to-nearest-even
// with the sign kept (-0), as MLX's GPU quantizers (Metal fp4_e2m1, CUDA cvt.rn) encode both modes.
mx::array e2m1_encode(const mx::array& v, mx::StreamOrDevice s) {
  auto a = mx::abs(v, s);
  auto code = mx::zeros(v.shape(), mx::uint32, s);
  for (int i = 0; i < fp4::kE2M1NumEdges; ++i) {
    auto edge = f32(fp4::e2m1_edge(i));
    auto past = fp4::e2m1_edge_tie_rounds_up(i) ? mx::greater_equal(a, edge, s) : mx::greater(a, edge, s);
    code = mx::add(code, mx::astype(past, mx::uint32, s), s);
  }
  auto sign = mx::right_shift(mx::view(v, mx::uint32, s), u32(31), s);
  return mx::bitwise_or(code, mx::left_shift(sign, u32(3), s), s);
}

// E8M0 exponent of MXFP4 block scales as mx.quantize computes them on MLX's Metal GPUs
// (fp_quantize, mx_scale_round_up): the smallest e with 2^e >= amax / 6, the quotient in fp32,
// clamped to -127 (byte 0, also for an all-zero block); non-finite -> NaN.
mx::array e8m0_encode(const mx::array& amax, mx::StreamOrDevice s) {
  auto qf = mx::divide(mx::astype(amax, mx::float32, s), f32(fp4::kE2M1Max), s);
  auto bits = mx::view(qf, mx::uint32, s);
  auto mantissa = mx::bitwise_and(bits, u32((1u << kF32MantissaBits) - 1), s);
  // ceil(log2(q)) for normal q: the exponent, plus one unless q is a power of two.
  auto e = mx::add(f32_exponent(qf, s), mx::astype(mx::not_equal(mantissa, u32(0), s), mx::int32, s), s);
  // fp32 subnormals and 0 (exponent field 0): 2^-127 covers q <= 2^-127, 2^-126 the rest.
  const auto min_normal = f32(fp4_math::bits_to_float(1u << kF32MantissaBits));
  const auto half_min_normal = f32(fp4_math::bits_to_float(fp4::kF32TwoPowMinus127));
  auto sub = mx::where(mx::greater(qf, half_min_normal, s), mx::array(1 - fp4::kE8M0Bias, mx::int32),
                       mx::array(-fp4::kE8M0Bias, mx::int32), s);
  e = mx::where(mx::less(qf, min_normal, s), sub, e, s);
  auto code = mx::add(e, mx::array(fp4::kE8M0Bias, mx::int32), s);
  code = mx::where(mx::isfinite(qf, s), code, mx::array(int32_t(fp4::kE8M0NaN), mx::int32), s);
  return mx::astype(code, mx::uint8, s);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_quantize_input(const mx::array& w_in) {
  if (w_in.ndim() != 2) {
    throw_invalid("[quantize] w must be 2-D [N, K] or stacked [..., N, K] but got shape ", shape_str(w_in.shape()),
                  ".");
  }
  if (!mx::issubdtype(w_in.dtype(), mx::floating)) {
    throw_invalid("[quantize] w must be a floating dtype (float16, bfloat16, float32) but got ",
                  dtype_str(w_in.dtype()), ".");
  }
  if (w_in.shape(1) < 1) {
    throw_invalid("[quantize] w must have K >= 1 columns but got shape ", shape_str(w_in.shape()), ".");
  }
}

// Stacked or not: no dim of w may be 0 (mx.quantize raises from inside, "[argmin] ... zero size").
void check_quantize_not_empty(const mx::array& w_in) {
  if (w_in.ndim() < 2 || w_in.size() > 0) return;
  if (w_in.shape(-1) < 1) {
    throw_invalid("[quantize] w must have K >= 1 columns but got shape ", shape_str(w_in.shape()), ".");
  }
  throw_invalid("[quantize] w must have N >= 1 rows and at least one matrix (w.shape[:-2] without 0) but got "
                "shape ", shape_str(w_in.shape()), ".");
}

// A global scale the caller gives (MLX's convention, the tensor amax) must be finite and > 0: with
// 0, -1 or NaN the bytes came out as without one, so dequantizing with it gave zeros, flipped signs
// or NaN. A value readable now is checked here; a lazy or traced one gives NaN scales instead.
void check_given_global_scale(const mx::array& gs) {
  if (gs.is_tracer() || !gs.is_available()) return;
  const float v = gs.data<float>()[0];  // one fp32 value (checked_global_scale)
  // The encode scale 2688 / global_scale (what mx.quantize multiplies by) overflows below ~8e-36;
  // the decode multiplier global_scale / 2688 is then > 0 too.
  if (!(std::isfinite(v) && v > 0.0f && std::isfinite(fp4::kGlobalScaleDenominator / v))) {
    throw_invalid("[quantize] global_scale must be finite and > 0, with 2688 / global_scale finite in fp32 (the "
                  "amax of |w|, MLX's convention), but got ", v,
                  "; an all-zero w has no global scale: quantize it with global_scale=True or without one.");
  }
}

}  // namespace

static std::vector<mx::array> quantize_2d(const mx::array& w_in, const std::optional<mx::array>& global_scale,
                                          bool given, int mode, mx::StreamOrDevice s);

// Stacked weights [..., N, K] (mixture-of-experts): each matrix quantized on its own, so a
// global scale is one per matrix (shape w.shape[:-2]), as mlx-lm's per-expert nvfp4 scales.
static std::vector<mx::array> quantize_stacked(const mx::array& w, bool with_global_scale, const std::string& mode,
                                               mx::StreamOrDevice s) {
  const mx::Shape lead(w.shape().begin(), w.shape().end() - 2);
  const int n = w.shape(-2);
  const int k = w.shape(-1);
  // [matrices, ...] -> lead + [...]
  auto restack = [&](const mx::array& a) {
    mx::Shape shape = lead;
    shape.insert(shape.end(), a.shape().begin() + 1, a.shape().end());
    return mx::reshape(a, shape, s);
  };
  int matrices = 1;
  for (int d : lead) matrices *= d;
  if (!with_global_scale) {
    auto out = quantize(mx::reshape(w, {matrices * n, k}, s), false, mode, s);
    for (auto& a : out) a = restack(mx::reshape(a, {matrices, n, a.shape(-1)}, s));
    return out;
  }
  auto flat = mx::reshape(w, {matrices, n, k}, s);
  std::vector<std::vector<mx::array>> parts(3);
  for (int e = 0; e < matrices; ++e) {
    auto q = quantize(mx::take(flat, e, 0, s), true, mode, s);
    for (int i = 0; i < 3; ++i) parts[i].push_back(q[i]);
  }
  std::vector<mx::array> out;
  for (auto& part : parts) out.push_back(restack(mx::stack(part, 0, s)));
  return out;
}

std::vector<mx::array> quantize(const mx::array& w_in, bool with_global_scale, const std::string& mode,
                                mx::StreamOrDevice s) {
  check_no_global_scale(parse_mode(mode, "quantize"), with_global_scale, "quantize");
  check_quantize_not_empty(w_in);
  if (w_in.ndim() > 2) {
    return quantize_stacked(w_in, with_global_scale, mode, s);
  }
  if (!with_global_scale) {
    return quantize(w_in, std::optional<mx::array>{}, mode, s);
  }
  check_quantize_input(w_in);
  // MLX's convention: the global scale is the tensor amax (mx.quantize / mx.dequantize).
  auto amax = mx::max(mx::abs(mx::astype(w_in, mx::float32, s), s), s);
  auto out = quantize_2d(w_in, amax, false, parse_mode(mode, "quantize"), s);
  out.push_back(amax);
  return out;
}

std::vector<mx::array> quantize(const mx::array& w_in, const std::optional<mx::array>& global_scale,
                                const std::string& mode_str, mx::StreamOrDevice s) {
  const int mode = parse_mode(mode_str, "quantize");
  check_no_global_scale(mode, global_scale.has_value(), "quantize");
  check_quantize_input(w_in);
  check_quantize_not_empty(w_in);
  if (global_scale) check_given_global_scale(checked_global_scale(*global_scale, "quantize"));
  return quantize_2d(w_in, global_scale, true, mode, s);
}

// The 2-D quantizer, inputs checked. `given`: the global scale is the caller's (a lazy one that is
// not finite and > 0 gives NaN scales), not the amax computed here (0 for an all-zero w, whose
// scales are all 0 whatever the multiplier).
static std::vector<mx::array> quantize_2d(const mx::array& w_in, const std::optional<mx::array>& global_scale,
                                          bool given, int mode, mx::StreamOrDevice s) {
  const int n = w_in.shape(0);
  const int k = w_in.shape(1);
  const int block = fp4::block_size(mode);
  const int blocks = static_cast<int>(fp4::scale_blocks_for_k(k, mode));
  const int kpad = blocks * block;
  auto w = mx::astype(w_in, mx::float32, s);  // both modes work in fp32, as MLX's GPU quantizers
  if (kpad != k) {
    w = mx::pad(w, {{0, 0}, {0, kpad - k}}, mx::array(0.0f, w.dtype()), "constant", s);
  }
  auto wb = mx::reshape(w, {n, blocks, block}, s);
  auto amax = mx::max(mx::abs(wb, s), -1, true, s);  // [N, blocks, 1]

  mx::array scale_codes = mx::array(0);
  mx::array v = mx::array(0.0f);
  if (mode == fp4::kModeMxfp4) {
    scale_codes = e8m0_encode(amax, s);
    // Exact division by the power of two (codes past 0xFE are NaN scales: their values are NaN).
    auto scale_values = mx::take(e8m0_table(), mx::astype(scale_codes, mx::uint32, s), s);
    v = mx::divide(wb, scale_values, s);
  } else {
    // mx.quantize's GPU arithmetic (Metal and CUDA fp_quantize), so that the bytes are its bytes:
    // encode scale enc = 2688 / global_scale (1 without), block scale E4M3(amax / 6 * enc),
    // values w * (enc / scale). A tie of w / scale can land an ulp off in that product: there the
    // product decides, as on MLX's GPUs (its CPU fallback divides and ties low: test_quantize.py).
    auto enc = f32(1.0f);
    if (global_scale) {
      auto gs = mx::reshape(checked_global_scale(*global_scale, "quantize"), {}, s);
      auto e = mx::divide(f32(fp4::kGlobalScaleDenominator), gs, s);
      // Usable: 0 < enc < inf. A zero amax (all-zero tensor) would turn every scale into NaN; an
      // infinite, negative or NaN global scale gives enc <= 0 or NaN.
      auto usable = mx::logical_and(mx::greater(e, f32(0.0f), s), mx::isfinite(e, s), s);
      enc = mx::where(usable, e, f32(given ? std::numeric_limits<float>::quiet_NaN() : 1.0f), s);
    }
    auto target = mx::multiply(mx::divide(amax, f32(fp4::kE2M1Max), s), enc, s);
    scale_codes = e4m3_encode(target, s);  // [N, blocks, 1]
    auto scale_values = mx::take(e4m3_table(), mx::astype(scale_codes, mx::uint32, s), s);
    // An all-zero block has scale 0: its values are 0, not w * inf.
    auto zero = mx::equal(scale_values, f32(0.0f), s);
    v = mx::multiply(wb, mx::where(zero, f32(0.0f), mx::divide(enc, scale_values, s), s), s);
  }
  auto codes = mx::reshape(e2m1_encode(v, s), {n, kpad}, s);
  // Padding columns past K hold code 0 already (w was zero-padded).
  auto pairs = mx::reshape(codes, {n, kpad / 2, 2}, s);
  auto lo = mx::take(pairs, 0, 2, s);
  auto hi = mx::take(pairs, 1, 2, s);
  auto packed = mx::astype(mx::bitwise_or(lo, mx::left_shift(hi, u32(fp4::kNibbleBits), s), s), mx::uint8, s);
  packed = mx::slice(packed, {0, 0}, {n, static_cast<int>(fp4::packed_bytes_for_k(k))}, s);
  auto scales = mx::reshape(scale_codes, {n, blocks}, s);
  return {packed, scales};
}

void check_packed(const mx::array& packed, const char* op, const char* arg) {
  if (packed.ndim() != 2) {
    throw_invalid("[", op, "] ", arg, " must be 2-D [N, packed] but got shape ",
                  shape_str(packed.shape()), ".");
  }
  if (packed.dtype() != mx::uint8 && packed.dtype() != mx::uint32) {
    throw_invalid("[", op, "] ", arg, " must be uint8 [N, ceil(K/2)] or uint32 [N, ceil(K/8)] but got dtype ",
                  dtype_str(packed.dtype()), ".");
  }
}

const mx::array& checked_global_scale(const mx::array& gs, const char* op) {
  if (gs.size() != 1 || gs.ndim() > 1) {
    throw_invalid("[", op, "] global_scale must be a scalar (shape () or (1,)) but got shape ",
                  shape_str(gs.shape()), ".");
  }
  if (gs.dtype() != mx::float32) {
    throw_invalid("[", op, "] global_scale must be a Python float or a float32 array but got dtype ",
                  dtype_str(gs.dtype()), ".");
  }
  return gs;
}

mx::array global_scale_multiplier(const mx::array& gs, const char* op, mx::StreamOrDevice s) {
  // One fp32 division, as mx.dequantize(..., mode="nvfp4", global_scale=gs) computes it.
  return mx::divide(mx::reshape(checked_global_scale(gs, op), {}, s), f32(fp4::kGlobalScaleDenominator), s);
}

// fp32 [N, k] weights: e2m1 * scale (E4M3 or E8M0 by mode), exact. `packed` is uint8 or uint32;
// nibble j of an element sits at bits 4j..4j+3 (little-endian order), so both layouts decode
// without a view node.
mx::array decode_f32(const mx::array& packed, const mx::array& scales, int k, int mode, mx::StreamOrDevice s) {
  const int n = packed.shape(0);
  const int per_element = static_cast<int>(packed.itemsize()) * fp4::kValuesPerByte;
  const int ncodes = packed.shape(1) * per_element;
  auto b = mx::astype(packed, mx::uint32, s);
  std::vector<mx::array> nibbles;
  for (int j = 0; j < per_element; ++j) {
    nibbles.push_back(mx::bitwise_and(mx::right_shift(b, u32(fp4::kNibbleBits * j), s), u32(fp4::kNibbleMask), s));
  }
  // k <= ncodes (validated). Columns are picked with gathers over constant index arrays, not
  // slices or pads: those MLX primitives have no output_shapes, which shapeless compile needs.
  auto codes = mx::reshape(mx::stack(nibbles, -1, s), {n, ncodes}, s);
  auto column = mx::arange(k, mx::int32, s);
  if (ncodes != k) {
    codes = mx::take(codes, column, 1, s);
  }
  auto values = mx::take(e2m1_table(), codes, s);
  auto scale_values = mx::take(scale_table(mode), mx::astype(scales, mx::uint32, s), s);
  auto block_of_column = mx::floor_divide(column, mx::array(fp4::block_size(mode), mx::int32), s);
  return mx::multiply(values, mx::take(scale_values, block_of_column, 1, s), s);
}

// Stacked [..., N, bytes] weights: a scalar global scale applies to all, one per matrix to each.
static mx::array dequantize_stacked(
    const mx::array& packed,
    const mx::array& scales,
    std::optional<int> k,
    const std::optional<mx::array>& global_scale,
    mx::Dtype dtype,
    const std::string& mode,
    mx::StreamOrDevice s) {
  const mx::Shape lead(packed.shape().begin(), packed.shape().end() - 2);
  if (scales.ndim() != packed.ndim() || !std::equal(lead.begin(), lead.end(), scales.shape().begin())) {
    throw_invalid("[dequantize] scales must have the batch dims of packed ", shape_str(lead), " but got shape ",
                  shape_str(scales.shape()), ".");
  }
  int matrices = 1;
  for (int d : lead) matrices *= d;
  const int n = packed.shape(-2);
  auto flat_p = mx::reshape(packed, {matrices * n, packed.shape(-1)}, s);
  auto flat_s = mx::reshape(scales, {matrices * n, scales.shape(-1)}, s);
  // [matrices * n, k] -> lead + [n, k]
  auto restack = [&](const mx::array& a) {
    mx::Shape shape = lead;
    shape.push_back(n);
    shape.push_back(a.shape(-1));
    return mx::reshape(a, shape, s);
  };
  if (!global_scale || global_scale->size() == 1) {
    return restack(dequantize(flat_p, flat_s, k, global_scale, dtype, mode, s));
  }
  if (global_scale->shape() != lead) {
    throw_invalid("[dequantize] global_scale must be a scalar or have shape packed.shape[:-2] = ", shape_str(lead),
                  " but got ", shape_str(global_scale->shape()), ".");
  }
  auto gs = mx::reshape(*global_scale, {matrices}, s);
  auto p3 = mx::reshape(packed, {matrices, n, packed.shape(-1)}, s);
  auto s3 = mx::reshape(scales, {matrices, n, scales.shape(-1)}, s);
  std::vector<mx::array> parts;
  for (int e = 0; e < matrices; ++e) {
    parts.push_back(
        dequantize(mx::take(p3, e, 0, s), mx::take(s3, e, 0, s), k, mx::take(gs, e, 0, s), dtype, mode, s));
  }
  return restack(mx::reshape(mx::stack(parts, 0, s), {matrices * n, -1}, s));
}

mx::array dequantize(
    const mx::array& packed,
    const mx::array& scales,
    std::optional<int> k_opt,
    const std::optional<mx::array>& global_scale,
    mx::Dtype dtype,
    const std::string& mode_str,
    mx::StreamOrDevice s) {
  const int mode = parse_mode(mode_str, "dequantize");
  check_no_global_scale(mode, global_scale.has_value(), "dequantize");
  if (packed.ndim() > 2) {
    return dequantize_stacked(packed, scales, k_opt, global_scale, dtype, mode_str, s);
  }
  check_packed(packed, "dequantize", "packed");
  const int n = packed.shape(0);
  const int nbytes = packed.shape(1) * static_cast<int>(packed.itemsize());
  const int k = k_opt.value_or(2 * nbytes);
  if (k < 1 || k > 2 * nbytes) {
    throw_invalid("[dequantize] k must be in [1, ", 2 * nbytes, "] for packed of shape ",
                  shape_str(packed.shape()), " but got ", k, ".");
  }
  if (dtype != mx::float32 && dtype != mx::float16 && dtype != mx::bfloat16) {
    throw_invalid("[dequantize] dtype must be float16, bfloat16 or float32 but got ", dtype_str(dtype), ".");
  }
  const int blocks = static_cast<int>(fp4::scale_blocks_for_k(k, mode));
  if (scales.dtype() != mx::uint8 || scales.ndim() != 2 || scales.shape(0) != n || scales.shape(1) != blocks) {
    throw_invalid("[dequantize] scales must be uint8 of shape (N, ceil(k/", fp4::block_size(mode), ")) = (", n, ", ",
                  blocks, ") but got ", dtype_str(scales.dtype()), " ", shape_str(scales.shape()), " (mode '",
                  mode_name(mode), "').");
  }
  auto w = decode_f32(packed, scales, k, mode, s);
  if (global_scale) {
    w = mx::multiply(w, global_scale_multiplier(*global_scale, "dequantize", s), s);
  }
  return mx::astype(w, dtype, s);
}

}  // namespace mlx_fp4
