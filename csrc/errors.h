// Error text in MLX's format: "[op] <argument> <expectation> but got <actual>."
// User errors throw std::invalid_argument, which nanobind turns into ValueError.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

#include "mlx/array.h"

namespace mlx_fp4 {

template <typename... Parts>
[[noreturn]] void throw_invalid(const Parts&... parts) {
  std::ostringstream msg;
  (msg << ... << parts);
  throw std::invalid_argument(msg.str());
}

inline std::string shape_str(const mlx::core::Shape& shape) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    s << (i ? ", " : "") << shape[i];
  }
  s << (shape.size() == 1 ? ",)" : ")");
  return s.str();
}

// Python spelling of a dtype (mx.float32 -> "float32").
inline std::string dtype_str(mlx::core::Dtype dtype) {
  namespace mx = mlx::core;
  static const std::pair<mx::Dtype, const char*> names[] = {
      {mx::bool_, "bool"},       {mx::uint8, "uint8"},     {mx::uint16, "uint16"},
      {mx::uint32, "uint32"},    {mx::uint64, "uint64"},   {mx::int8, "int8"},
      {mx::int16, "int16"},      {mx::int32, "int32"},     {mx::int64, "int64"},
      {mx::float16, "float16"},  {mx::bfloat16, "bfloat16"}, {mx::float32, "float32"},
      {mx::float64, "float64"},  {mx::complex64, "complex64"}};
  for (const auto& [d, name] : names) {
    if (d == dtype) return name;
  }
  return "unknown";
}

}  // namespace mlx_fp4
