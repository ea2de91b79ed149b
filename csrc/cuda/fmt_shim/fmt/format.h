// Minimal stand-in for <fmt/format.h>: MLX's CUDA headers include it (lru_cache.h uses
// fmt::format in a throw path) but the MLX wheel ships no fmt. Only "{}" placeholders are
// supported, which is all those headers use. Compiled only into the CUDA backend's .cpp files.
#pragma once
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

namespace fmt {
namespace shim_detail {
inline void append(std::ostringstream& os, std::string_view& rest) { os << rest; rest = {}; }
template <typename T, typename... Rest>
void append(std::ostringstream& os, std::string_view& rest, T&& value, Rest&&... more) {
  const auto pos = rest.find("{}");
  if (pos == std::string_view::npos) {
    os << rest;
    rest = {};
    return;
  }
  os << rest.substr(0, pos) << std::forward<T>(value);
  rest.remove_prefix(pos + 2);
  append(os, rest, std::forward<Rest>(more)...);
}
}  // namespace shim_detail

template <typename... Args>
std::string format(std::string_view f, Args&&... args) {
  std::ostringstream os;
  shim_detail::append(os, f, std::forward<Args>(args)...);
  return os.str();
}
}  // namespace fmt
