// The one #if ladder of csrc/shared: lets the same header compile as C++, CUDA and Metal (MSL).
// Everything in csrc/shared is framework-free: no MLX, no std containers, only scalar math.
#pragma once

#if defined(__METAL_VERSION__)
#include <metal_stdlib>
#define FP4_FN inline
#define FP4_CONST constant constexpr
namespace fp4_math {
inline float exp(float x) { return metal::precise::exp(x); }
inline float tanh(float x) { return metal::precise::tanh(x); }
inline float fma(float a, float b, float c) { return metal::fma(a, b, c); }
inline float abs(float x) { return metal::abs(x); }
inline float copysign(float m, float s) { return metal::copysign(m, s); }
inline float bits_to_float(uint32_t b) { return as_type<float>(b); }
}  // namespace fp4_math
#elif defined(__CUDACC__)
#include <cstdint>
#define FP4_FN __host__ __device__ inline
#define FP4_CONST constexpr
namespace fp4_math {
FP4_FN float exp(float x) { return ::expf(x); }
FP4_FN float tanh(float x) { return ::tanhf(x); }
FP4_FN float fma(float a, float b, float c) { return ::fmaf(a, b, c); }
FP4_FN float abs(float x) { return ::fabsf(x); }
FP4_FN float copysign(float m, float s) { return ::copysignf(m, s); }
FP4_FN float bits_to_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  __builtin_memcpy(&f, &b, sizeof(f));
  return f;
#endif
}
}  // namespace fp4_math
#else
#include <cmath>
#include <cstdint>
#include <cstring>
#define FP4_FN inline
#define FP4_CONST constexpr
namespace fp4_math {
inline float exp(float x) { return std::exp(x); }
inline float tanh(float x) { return std::tanh(x); }
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
inline float abs(float x) { return std::fabs(x); }
inline float copysign(float m, float s) { return std::copysign(m, s); }
inline float bits_to_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}
}  // namespace fp4_math
#endif
