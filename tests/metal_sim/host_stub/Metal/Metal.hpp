// metal_sim: declarations-only stand-in for Apple's metal-cpp (Metal/Metal.hpp), just enough for
// MLX's wheel header mlx/backend/metal/device.h to parse on Linux. Used only to check that
// csrc/metal/w4a16_matmul.cpp compiles against the exact MLX Metal API (-fsyntax-only); it
// cannot link or run.
#pragma once
#include <cstddef>

namespace NS {
using UInteger = unsigned long;
class String;
class Error;
class AutoreleasePool;
template <class T>
class SharedPtr {
 public:
  T* get() const { return p_; }
  T* operator->() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  T* p_ = nullptr;
};
}  // namespace NS

namespace MTL {
enum DataType : NS::UInteger { DataTypeBool = 53 };
struct Size {
  Size(NS::UInteger w, NS::UInteger h, NS::UInteger d) : width(w), height(h), depth(d) {}
  NS::UInteger width, height, depth;
};
class Resource {};
class Allocation {};
class Buffer : public Resource {};
class ResidencySet {};
class Function {};
class LinkedFunctions {};
class Library {};
class ComputePipelineState {
 public:
  NS::UInteger maxTotalThreadsPerThreadgroup() const { return 0; }
};
class Fence {};
class CommandQueue {};
class CommandBuffer {};
class Device {};
class ComputeCommandEncoder {
 public:
  void setComputePipelineState(const ComputePipelineState*) {}
  void setBytes(const void*, NS::UInteger, NS::UInteger) {}
  void setThreadgroupMemoryLength(NS::UInteger, NS::UInteger) {}
  void setBuffer(const Buffer*, NS::UInteger, NS::UInteger) {}
};
}  // namespace MTL
