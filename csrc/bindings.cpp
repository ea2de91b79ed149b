// Python bindings (nanobind, NB_DOMAIN mlx so mx.array and mx.Dtype are MLX's own types).
// Python arguments are parsed here; validation of arrays lives in ops.cpp.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "cpu/w4a16_kernel.h"
#include "cpu/thread_pool.h"
#include "epilogue_spec.h"
#include "errors.h"
#include "gather_ops.h"
#include "op_common.h"
#include "mlx/version.h"
#include "format_tables.h"
#include "mlx_fp4.h"
#include "metal/w4a16_dispatch.h"
#include "metal_route_table.h"
#include "primitives.h"

namespace nb = nanobind;
using namespace nb::literals;
namespace mx = mlx::core;

#ifndef MLX_FP4_GPU_BACKEND
#define MLX_FP4_GPU_BACKEND "none"
#endif

namespace {

// global_scale as MLX takes it: None, a Python float or an fp32 array holding the tensor amax.
// A bool is refused here (nanobind would read True as 1.0); shape and dtype are checked in C++.
std::optional<mx::array> parse_global_scale(nb::handle gs, const char* op) {
  if (gs.is_none()) return std::nullopt;
  if (nb::isinstance<nb::bool_>(gs)) {
    mlx_fp4::throw_invalid("[", op, "] global_scale expected None, a float or a float32 scalar array "
                           "(MLX's convention: the tensor amax) but got a bool.");
  }
  if (nb::isinstance<mx::array>(gs)) return nb::cast<mx::array>(gs);
  if (nb::isinstance<nb::float_>(gs) || nb::isinstance<nb::int_>(gs)) {
    return mx::array(nb::cast<float>(gs), mx::float32);
  }
  mlx_fp4::throw_invalid("[", op, "] global_scale expected None, a float or a float32 scalar array but got ",
                         nb::cast<std::string>(nb::str(gs.type())), ".");
}

// MLX's (group_size, bits, mode) arguments: checked against the mode, returned as the mode.
const std::string& checked_mode(const std::string& mode, std::optional<int> group_size, std::optional<int> bits,
                                const char* op) {
  mlx_fp4::check_mode_config(mlx_fp4::parse_mode(mode, op), group_size, bits, op);
  return mode;
}

float as_float(nb::handle h, const std::string& where, const char* op) {
  if (nb::isinstance<nb::float_>(h) || nb::isinstance<nb::int_>(h)) {
    return nb::cast<float>(h);
  }
  mlx_fp4::throw_invalid("[", op, "] ", where, " must be a Python float but got ",
                         nb::cast<std::string>(nb::str(h.type())), ".");
}

mlx_fp4::EpilogueSpec parse_op(nb::handle item, size_t index, const char* op) {
  const std::string where = "epilogue[" + std::to_string(index) + "]";
  nb::handle name_obj;
  std::vector<nb::handle> args;
  if (nb::isinstance<nb::str>(item)) {
    name_obj = item;
  } else if (nb::isinstance<nb::tuple>(item) || nb::isinstance<nb::list>(item)) {
    nb::sequence seq = nb::borrow<nb::sequence>(item);
    size_t len = nb::len(seq);
    if (len == 0 || !nb::isinstance<nb::str>(seq[0])) {
      mlx_fp4::throw_invalid("[", op, "] ", where, " must be a name or a (name, operand...) tuple but got ",
                             nb::cast<std::string>(nb::repr(item)), ".");
    }
    name_obj = seq[0];
    for (size_t i = 1; i < len; ++i) args.push_back(seq[i]);
  } else {
    mlx_fp4::throw_invalid("[", op, "] ", where, " must be a name or a (name, operand...) tuple but got ",
                           nb::cast<std::string>(nb::str(item.type())), ".");
  }
  const std::string name = nb::cast<std::string>(name_obj);
  const mlx_fp4::EpilogueName* found = nullptr;
  std::string known;
  for (const auto& e : mlx_fp4::epilogue_names()) {
    known += (known.empty() ? "" : ", ") + std::string(e.name);
    if (name == e.name) found = &e;
  }
  if (!found) {
    mlx_fp4::throw_invalid("[", op, "] ", where, " has unknown op '", name, "'; expected one of ", known, ".");
  }
  const size_t expected = found->args == mlx_fp4::EpilogueArgs::kNone ? 0
                        : found->args == mlx_fp4::EpilogueArgs::kTwoFloats ? 2 : 1;
  if (args.size() != expected) {
    mlx_fp4::throw_invalid("[", op, "] ", where, " ('", name, "') expected ", expected,
                           " argument(s) but got ", args.size(), ".");
  }
  mlx_fp4::EpilogueSpec spec{found->code, std::nullopt, 0.0f, 0.0f};
  switch (found->args) {
    case mlx_fp4::EpilogueArgs::kNone: break;
    case mlx_fp4::EpilogueArgs::kOperandOrFloat:
      if (nb::isinstance<mx::array>(args[0])) {
        spec.operand = nb::cast<mx::array>(args[0]);
        if (mx::issubdtype(spec.operand->dtype(), mx::complexfloating)) {
          // The chain runs in fp32: a complex operand would silently lose its imaginary part.
          mlx_fp4::throw_invalid("[", op, "] ", where, " operand must be a real array but got dtype complex64.");
        }
      } else {
        if (!nb::isinstance<nb::float_>(args[0]) && !nb::isinstance<nb::int_>(args[0])) {
          mlx_fp4::throw_invalid("[", op, "] ", where, " operand must be an mx.array or a Python float but got ",
                                 nb::cast<std::string>(nb::str(args[0].type())), ".");
        }
        spec.p0 = nb::cast<float>(args[0]);
      }
      break;
    case mlx_fp4::EpilogueArgs::kFloat: spec.p0 = as_float(args[0], where + " constant", op); break;
    case mlx_fp4::EpilogueArgs::kTwoFloats:
      spec.p0 = as_float(args[0], where + " lo", op);
      spec.p1 = as_float(args[1], where + " hi", op);
      if (!(spec.p0 <= spec.p1)) {
        mlx_fp4::throw_invalid("[", op, "] ", where, " clamp expects lo <= hi but got lo = ", spec.p0,
                               ", hi = ", spec.p1, ".");
      }
      break;
  }
  return spec;
}

std::vector<mlx_fp4::EpilogueSpec> parse_epilogue(const std::optional<nb::object>& epilogue, const char* op) {
  std::vector<mlx_fp4::EpilogueSpec> specs;
  if (!epilogue || epilogue->is_none()) return specs;
  if (nb::isinstance<nb::str>(*epilogue) || !(nb::isinstance<nb::list>(*epilogue) || nb::isinstance<nb::tuple>(*epilogue))) {
    mlx_fp4::throw_invalid("[", op, "] epilogue must be a list of ops, e.g. [(\"add\", bias), \"silu\"], but got ",
                           nb::cast<std::string>(nb::repr(*epilogue)), ".");
  }
  // The length first: a list of millions of ops was parsed (seconds, GBs) before being refused.
  mlx_fp4::check_epilogue_length(nb::len(*epilogue), op);
  size_t i = 0;
  for (nb::handle item : *epilogue) specs.push_back(parse_op(item, i++, op));
  return specs;
}


// The tuner's route table (metal_route_table.h): keys from Python arguments, routes as names.
const char* const kRouteNames[] = {"ours", "mlx", "cpu"};
const char* const kDtypeNames[] = {"float32", "float16", "bfloat16"};

// experts > 0: the gathered op's key (m = all pairs' rows of x).
mlx_fp4::MetalRouteKey route_key(int64_t m, int64_t n, int64_t k, mx::Dtype dtype, const std::string& mode,
                                 int64_t experts, bool sorted) {
  return {mlx_fp4::metal_shape_bucket(m), n, k, mlx_fp4::operand_dtype_code(dtype),
          mlx_fp4::parse_mode(mode, "metal_route"), experts, sorted};
}

fp4::MetalRoute parse_route(const std::string& name) {
  for (int i = 0; i < 3; ++i) {
    if (name == kRouteNames[i]) return static_cast<fp4::MetalRoute>(i);
  }
  mlx_fp4::throw_invalid("[metal_route] route must be ours, mlx or cpu but got '", name, "'.");
}

void bind_metal_routes(nb::module_& m) {
  m.def("_metal_shape_bucket", &mlx_fp4::metal_shape_bucket, "m"_a,
        "The tuner's bucket of M rows: M up to 16, then the next power of two.");
  m.def("_metal_route_set",
        [](int64_t m, int64_t n, int64_t k, mx::Dtype dtype, const std::string& mode, std::optional<std::string> route,
           int64_t experts, bool sorted) {
          const auto key = route_key(m, n, k, dtype, mode, experts, sorted);
          if (route) {
            mlx_fp4::metal_route_table().set(key, parse_route(*route));
          } else {
            mlx_fp4::metal_route_table().erase(key);
          }
        },
        "m"_a, "n"_a, "k"_a, "dtype"_a, "mode"_a, "route"_a.none(), nb::kw_only(), "experts"_a = 0, "sorted"_a = false,
        "Sets (None: removes) the measured route of M's bucket, N, K, x dtype and mode (experts > 0: of the "
        "gathered op, M = all pairs' rows).");
  m.def("_metal_route_get",
        [](int64_t m, int64_t n, int64_t k, mx::Dtype dtype, const std::string& mode, int64_t experts,
           bool sorted) -> std::optional<std::string> {
          const auto r = mlx_fp4::metal_route_table().get(route_key(m, n, k, dtype, mode, experts, sorted));
          return r ? std::optional<std::string>(kRouteNames[int(*r)]) : std::nullopt;
        },
        "m"_a, "n"_a, "k"_a, "dtype"_a, "mode"_a, nb::kw_only(), "experts"_a = 0, "sorted"_a = false);
  m.def("_metal_route_clear", []() { mlx_fp4::metal_route_table().clear(); });
  m.def("_metal_route_entries", []() {
    nb::list out;
    for (const auto& [key, route] : mlx_fp4::metal_route_table().entries()) {
      out.append(nb::make_tuple(key.bucket, key.n, key.k, kDtypeNames[key.dtype], mlx_fp4::mode_name(key.mode),
                                key.experts, key.sorted, kRouteNames[int(route)]));
    }
    return out;
  });
  m.def("_metal_kernel",
        [](int64_t m, int64_t n, int64_t k, mx::Dtype dtype, const std::string& mode) {
          // our dispatch's kernel for the shape (aligned buffers), as eval_gpu would plan it
          fp4::W4A16Problem p{};
          p.m = m;
          p.n = n;
          p.k = k;
          p.x_dtype = p.out_dtype = mlx_fp4::operand_dtype_code(dtype);
          p.mode = mlx_fp4::parse_mode(mode, "metal_kernel");
          p.w_row_bytes = fp4::packed_bytes_for_k(k);
          p.scale_row_bytes = fp4::scale_blocks_for_k(k, p.mode);
          const fp4::MetalLaunch l = fp4::metal_plan(p, fp4::MetalAddresses{}, nullptr);
          return l.kernel_name + (l.split ? "_splitk" + std::to_string(l.params.split_k) : "");
        },
        "m"_a, "n"_a, "k"_a, "dtype"_a, "mode"_a = "nvfp4",
        "The Metal kernel our dispatch launches for the shape (the name eval_gpu compiles).");
  m.def("_metal_static_route",
        [](const std::string& arch, int64_t m, int64_t n, int64_t k, mx::Dtype dtype) {
          return kRouteNames[int(fp4::metal_auto_route(fp4::parse_apple_gpu_arch(arch), m, n, k,
                                                       dtype == mx::float32))];
        },
        "arch"_a, "m"_a, "n"_a, "k"_a, "dtype"_a,
        "The static route (csrc/metal/w4a16_route.h) on a GPU architecture string, e.g. 'applegpu_g16s'.");
}
}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "mlx_fp4 C++ extension: NVFP4 (E2M1 + E4M3 block scales) W4A16 ops for MLX.";

  m.def(
      "w4a16_matmul",
      [](const mx::array& x, const mx::array& w, const mx::array& scales, nb::handle global_scale,
         const std::optional<nb::object>& epilogue, std::optional<mx::Dtype> out_dtype, std::optional<int> group_size,
         std::optional<int> bits, const std::string& mode, mx::StreamOrDevice s) {
        return mlx_fp4::w4a16_matmul(x, w, scales, parse_global_scale(global_scale, "w4a16_matmul"),
                                     parse_epilogue(epilogue, "w4a16_matmul"), out_dtype,
                                     checked_mode(mode, group_size, bits, "w4a16_matmul"), s);
      },
      "x"_a, "w"_a, "scales"_a, nb::kw_only(), "global_scale"_a = nb::none(), "epilogue"_a = nb::none(),
      "out_dtype"_a = nb::none(), "group_size"_a = nb::none(), "bits"_a = nb::none(), "mode"_a = "nvfp4", "stream"_a = nb::none(),
      nb::sig("def w4a16_matmul(x: mlx.core.array, w: mlx.core.array, scales: mlx.core.array, *, "
              "global_scale: float | mlx.core.array | None = None, epilogue: list | None = None, "
              "out_dtype: mlx.core.Dtype | None = None, "
              "group_size: int | None = None, bits: int | None = None, mode: str = 'nvfp4', "
              "stream: mlx.core.Stream | mlx.core.Device | None = None) -> mlx.core.array"),
      R"(W4A16 matmul: ``epilogue((global_scale / 2688) * (x @ dequantize(w, scales).T))``.

Args:
    x: activations ``[..., K]``, float16, bfloat16 or float32.
    w: packed FP4 E2M1 weights, uint8 ``[N, ceil(K/2)]`` (low nibble = even k) or MLX's
       uint32 ``[N, ceil(K/8)]`` (as returned by ``mx.quantize(..., mode="nvfp4")``).
    scales: uint8 ``[N, ceil(K/16)]``, E4M3 bits, one per 16 weights along K (``mode="nvfp4"``),
       or ``[N, ceil(K/32)]`` E8M0 bits, one per 32 (``mode="mxfp4"``; 0xFF is NaN).
    global_scale: optional per-tensor scale in MLX's convention (as ``mx.quantize`` /
       ``mx.dequantize`` take it): the fp32 tensor amax, a Python float or a float32 scalar
       array. The weights decode as ``e2m1 * e4m3 * (global_scale / 2688)``; the multiplier
       is applied once in fp32 to the accumulator. nvfp4 only.
    epilogue: optional list of ops applied in order in fp32 before the final cast:
       ``("add", t)``, ``("mul", t)``, ``("scale", c)``, ``"relu"``, ``"silu"``, ``"gelu"``,
       ``"gelu_approx"``, ``"sigmoid"``, ``"tanh"``, ``("clamp", lo, hi)``; ``t`` broadcasts to
       the output (``[N]``, ``[..., 1]``, ``[..., N]``) or is a Python float.
    out_dtype: float16, bfloat16 or float32; default ``x.dtype``.
    group_size, bits: as in ``mx.quantized_matmul``: accepted when they match the mode
       (16 / 32 and 4), otherwise a ValueError.
    mode: ``"nvfp4"`` (default) or ``"mxfp4"`` (gpt-oss), as in ``mx.quantized_matmul``.
    stream: stream or device.

Returns:
    ``[..., N]`` array in ``out_dtype``. Differentiable with respect to ``x`` and the
    epilogue operands.)");

  m.def(
      "w4a16_matmul_reference_ops",
      [](const mx::array& x, const mx::array& w, const mx::array& scales, nb::handle global_scale,
         const std::optional<nb::object>& epilogue, std::optional<mx::Dtype> out_dtype, const std::string& mode,
         mx::StreamOrDevice s) {
        return mlx_fp4::w4a16_matmul_reference_ops(x, w, scales,
                                                   parse_global_scale(global_scale, "w4a16_matmul_reference_ops"),
                                                   parse_epilogue(epilogue, "w4a16_matmul"), out_dtype, mode, s);
      },
      "x"_a, "w"_a, "scales"_a, nb::kw_only(), "global_scale"_a = nb::none(), "epilogue"_a = nb::none(),
      "out_dtype"_a = nb::none(), "mode"_a = "nvfp4", "stream"_a = nb::none(),
      nb::sig("def w4a16_matmul_reference_ops(x: mlx.core.array, w: mlx.core.array, scales: mlx.core.array, *, "
              "global_scale: float | mlx.core.array | None = None, epilogue: list | None = None, "
              "out_dtype: mlx.core.Dtype | None = None, mode: str = 'nvfp4', "
              "stream: mlx.core.Stream | mlx.core.Device | None = None) -> mlx.core.array"),
      "The same math as w4a16_matmul with plain MLX ops (dequantize, fp32 matmul, epilogue).");

  m.def(
      "gather_w4a16_matmul",
      [](const mx::array& x, const mx::array& w, const mx::array& scales, const std::optional<mx::array>& lhs_indices,
         const std::optional<mx::array>& rhs_indices, nb::handle global_scale,
         const std::optional<nb::object>& epilogue, std::optional<mx::Dtype> out_dtype, bool sorted_indices,
         std::optional<int> group_size, std::optional<int> bits, const std::string& mode, mx::StreamOrDevice s) {
        return mlx_fp4::gather_w4a16_matmul(x, w, scales, lhs_indices, rhs_indices,
                                            parse_global_scale(global_scale, "gather_w4a16_matmul"),
                                            parse_epilogue(epilogue, "gather_w4a16_matmul"), out_dtype, sorted_indices,
                                            checked_mode(mode, group_size, bits, "gather_w4a16_matmul"), s);
      },
      "x"_a, "w"_a, "scales"_a, nb::kw_only(), "lhs_indices"_a = nb::none(), "rhs_indices"_a = nb::none(),
      "global_scale"_a = nb::none(), "epilogue"_a = nb::none(), "out_dtype"_a = nb::none(),
      "sorted_indices"_a = false, "group_size"_a = nb::none(), "bits"_a = nb::none(), "mode"_a = "nvfp4", "stream"_a = nb::none(),
      nb::sig("def gather_w4a16_matmul(x: mlx.core.array, w: mlx.core.array, scales: mlx.core.array, *, "
              "lhs_indices: mlx.core.array | None = None, rhs_indices: mlx.core.array | None = None, "
              "global_scale: float | mlx.core.array | None = None, epilogue: list | None = None, "
              "out_dtype: mlx.core.Dtype | None = None, sorted_indices: bool = False, "
              "group_size: int | None = None, bits: int | None = None, mode: str = 'nvfp4', "
              "stream: mlx.core.Stream | mlx.core.Device | None = None) -> mlx.core.array"),
      R"(Gathered W4A16 matmul for mixture-of-experts layers, with the semantics of
``mx.gather_qmm(x, w, scales, lhs_indices=, rhs_indices=, transpose=True, mode="nvfp4",
global_scale=, sorted_indices=)``:
``out[b] = epilogue(global_scale[e] / 2688 * (x[lhs[b]] @ dequantize(w[e], scales[e]).T))``, ``e = rhs[b]``.

Args:
    x: activations ``[..., M, K]``, float16, bfloat16 or float32.
    w: stacked experts, uint8 ``[..., N, ceil(K/2)]`` or MLX's uint32 ``[..., N, ceil(K/8)]``.
    scales: uint8 ``[..., N, ceil(K/16)]`` (E4M3 bits), the batch dims of ``w``.
    lhs_indices, rhs_indices: integer arrays that broadcast together to ``B``; flat indices into
       the batch dims of ``x`` and of ``w`` (default: every matrix in order). Out-of-range
       indices raise a ValueError when they are computed at the call; lazy ones (known only
       when the op runs) give NaN rows for their pairs on every backend, read through nothing.
    global_scale: MLX's nvfp4 tensor scale (the amax; the multiplier is ``global_scale / 2688``),
       a float32 scalar or one value per expert (shape ``w.shape[:-2]``).
    epilogue: the chain of ``w4a16_matmul``; operands broadcast to the output.
    out_dtype: float16, bfloat16 or float32; default ``x.dtype``.
    sorted_indices: a hint that ``rhs_indices`` is sorted (as in ``mx.gather_qmm``).
    group_size, bits, mode: as in ``mx.gather_qmm``: ``mode="mxfp4"`` takes E8M0 scales
       ``[..., N, ceil(K/32)]`` and no global scale.
    stream: stream or device.

Returns:
    ``B + [M, N]`` in ``out_dtype``. Differentiable with respect to ``x`` and the epilogue
    operands; vmap and compile work.)");

  m.def(
      "gather_w4a16_matmul_reference_ops",
      [](const mx::array& x, const mx::array& w, const mx::array& scales, const std::optional<mx::array>& lhs_indices,
         const std::optional<mx::array>& rhs_indices, nb::handle global_scale,
         const std::optional<nb::object>& epilogue, std::optional<mx::Dtype> out_dtype, const std::string& mode,
         mx::StreamOrDevice s) {
        return mlx_fp4::gather_w4a16_matmul_reference_ops(
            x, w, scales, lhs_indices, rhs_indices,
            parse_global_scale(global_scale, "gather_w4a16_matmul_reference_ops"),
            parse_epilogue(epilogue, "gather_w4a16_matmul"),
            out_dtype, mode, s);
      },
      "x"_a, "w"_a, "scales"_a, nb::kw_only(), "lhs_indices"_a = nb::none(), "rhs_indices"_a = nb::none(),
      "global_scale"_a = nb::none(), "epilogue"_a = nb::none(), "out_dtype"_a = nb::none(),
      "mode"_a = "nvfp4", "stream"_a = nb::none(),
      nb::sig("def gather_w4a16_matmul_reference_ops(x: mlx.core.array, w: mlx.core.array, scales: mlx.core.array, *, "
              "lhs_indices: mlx.core.array | None = None, rhs_indices: mlx.core.array | None = None, "
              "global_scale: float | mlx.core.array | None = None, epilogue: list | None = None, "
              "out_dtype: mlx.core.Dtype | None = None, mode: str = 'nvfp4', "
              "stream: mlx.core.Stream | mlx.core.Device | None = None) -> mlx.core.array"),
      "The same math as gather_w4a16_matmul with plain MLX ops (decode, fp32 gather_mm, epilogue).");

  m.def(
      "quantize",
      [](const mx::array& w, nb::handle global_scale, std::optional<int> group_size, std::optional<int> bits,
         const std::string& mode, mx::StreamOrDevice s) {
        const std::string& m = checked_mode(mode, group_size, bits, "quantize");
        auto out = nb::isinstance<nb::bool_>(global_scale)
                       ? mlx_fp4::quantize(w, nb::cast<bool>(global_scale), m, s)
                       : mlx_fp4::quantize(w, parse_global_scale(global_scale, "quantize"), m, s);
        return nb::tuple(nb::cast(out));
      },
      "w"_a, nb::kw_only(), "global_scale"_a = false, "group_size"_a = nb::none(), "bits"_a = nb::none(), "mode"_a = "nvfp4", "stream"_a = nb::none(),
      nb::sig("def quantize(w: mlx.core.array, *, global_scale: bool | float | mlx.core.array | None = False, "
              "group_size: int | None = None, bits: int | None = None, mode: str = 'nvfp4', "
              "stream: mlx.core.Stream | mlx.core.Device | None = None) -> tuple"),
      R"(Quantize ``w [N, K]`` to NVFP4.

Returns:
    ``(packed, scales)``: uint8 ``[N, ceil(K/2)]`` (low nibble = even k, padding nibbles 0)
    and uint8 ``[N, ceil(K/16)]`` E4M3 bits: the bytes of ``mx.quantize(w, mode="nvfp4")`` on
    MLX's GPUs (fp32: block scale E4M3(amax / 6 * enc), values E2M1(w * (enc / scale)), both
    round-to-nearest-even, scales saturating at 448; enc = 2688 / global_scale, 1 without).

    ``global_scale=True`` also returns ``global_scale``, the float32 scalar ``amax(|w|)`` in
    MLX's convention, and quantizes against it: ``w ~= dequantize(packed, scales,
    global_scale=global_scale)``, i.e. block scales relative to ``global_scale / 2688``.
    A given ``global_scale`` (float or float32 scalar array, e.g. the amax of the whole tensor
    ``w`` is a shard of) is used as is and only ``(packed, scales)`` is returned, as from
    ``mx.quantize(w, mode="nvfp4", global_scale=...)``.

With ``mode="mxfp4"`` (group_size 32, no global scale): the bytes of ``mx.quantize(w,
mode="mxfp4")`` on MLX's Metal GPUs (as uint8): E8M0 scales 2^ceil(log2(amax / 6)) (the quotient
in fp32; byte 0 for an all-zero block), values w / scale rounded to nearest even E2M1, -0 kept.)");

  m.def(
      "dequantize",
      [](const mx::array& packed, const mx::array& scales, std::optional<int> k, nb::handle global_scale,
         mx::Dtype dtype, std::optional<int> group_size, std::optional<int> bits, const std::string& mode,
         mx::StreamOrDevice s) {
        return mlx_fp4::dequantize(packed, scales, k, parse_global_scale(global_scale, "dequantize"), dtype,
                                   checked_mode(mode, group_size, bits, "dequantize"), s);
      },
      "packed"_a, "scales"_a, nb::kw_only(), "k"_a = nb::none(), "global_scale"_a = nb::none(),
      "dtype"_a = mx::bfloat16, "group_size"_a = nb::none(), "bits"_a = nb::none(), "mode"_a = "nvfp4", "stream"_a = nb::none(),
      nb::sig("def dequantize(packed: mlx.core.array, scales: mlx.core.array, *, k: int | None = None, "
              "global_scale: float | mlx.core.array | None = None, dtype: mlx.core.Dtype = mlx.core.bfloat16, "
              "group_size: int | None = None, bits: int | None = None, mode: str = 'nvfp4', "
              "stream: mlx.core.Stream | mlx.core.Device | None = None) -> mlx.core.array"),
      R"(Decode NVFP4 weights to ``[N, k]`` (``k`` defaults to ``2 * packed bytes per row``).

``global_scale`` as in ``mx.dequantize``: the tensor amax; the multiplier ``global_scale / 2688``
is applied in fp32 to the exact ``e2m1 * e4m3`` value before the one cast. Exact in bfloat16,
float16 and float32 without a global scale. E4M3 codes 0x7F and 0xFF are NaN. ``mode="mxfp4"``: E8M0
scales per 32 weights (2^(byte - 127); 0xFF is NaN, where MLX decodes +Inf), no global scale.)");

  nb::dict names;
  for (const auto& e : mlx_fp4::epilogue_names()) names[e.name] = e.code;
  m.attr("EPILOGUE_OPS") = names;

  bind_metal_routes(m);
  m.def("build_info", []() {
    nb::dict d;
    d["mlx_version"] = std::to_string(MLX_VERSION_MAJOR) + "." + std::to_string(MLX_VERSION_MINOR) + "." +
                       std::to_string(MLX_VERSION_PATCH);
    d["gpu_backend"] = MLX_FP4_GPU_BACKEND;
    return d;
  });
  m.def("cpu_info", []() {
    nb::dict d;
    d["threads"] = mlx_fp4::cpu::num_threads();
    d["hot_loops"] = mlx_fp4::cpu::hot_loops_name();
    const mlx_fp4::cpu::CpuTiles t = mlx_fp4::cpu::cpu_tiles();
    nb::dict tiles;
    tiles["vector_floats"] = t.vector_floats;
    tiles["micro_tile"] = std::to_string(t.micro_rows2) + "x" + std::to_string(2 * t.vector_floats) + ", " +
                          std::to_string(t.micro_rows1) + "x" + std::to_string(t.vector_floats);
    tiles["gemm_depth"] = t.gemm_depth;
    tiles["gemm_panel_rows"] = t.gemm_panel_rows;
    tiles["gemv_pass_rows"] = t.gemv_pass_rows;
    tiles["gemv_task_rows"] = t.gemv_task_rows;
    d["tiles"] = tiles;
    return d;
  });
}
