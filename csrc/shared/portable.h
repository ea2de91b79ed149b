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
// Correctly rounded even under fast math, so the value matches an IEEE fp32 division bit for bit.
inline float div(float a, float b) { return metal::precise::divide(a, b); }
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
#if defined(__CUDA_ARCH__)
// Round-to-nearest division whatever the -prec-div / fast-math flags (IEEE fp32, as on the CPU).
FP4_FN float div(float a, float b) { return __fdiv_rn(a, b); }
#else
FP4_FN float div(float a, float b) { return a / b; }
#endif
}  // namespace fp4_math
#else
#include <cmath>
#include <cstdint>
#include <cstring>
#define FP4_FN inline
#define FP4_CONST constexpr
namespace fp4_math {
// Branch-free expf (Cephes polynomial, about 1 ulp on [-87.3, 88.7]) so that the CPU epilogue
// loops vectorize; std::exp is an opaque call. Results below 2^-126 flush to 0; NaN is kept.
inline float exp(float x) {
  const float kMaxArg = 88.7228390f;   // ln(FLT_MAX)
  const float kMinArg = -87.3365448f;  // ln(FLT_MIN)
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f;   // ln 2 split so that n * kLn2Hi is exact
  const float kLn2Lo = -2.12194440e-4f;
  float xc = x < kMinArg ? kMinArg : (x > kMaxArg ? kMaxArg : x);
  float n = std::nearbyint(xc * kLog2e);
  float r = xc - n * kLn2Hi - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n as two normal factors: n reaches 128 near the top and -126 near the bottom.
  int32_t n1 = static_cast<int32_t>(n) / 2;
  int32_t n2 = static_cast<int32_t>(n) - n1;
  uint32_t b1 = static_cast<uint32_t>(n1 + 127) << 23;
  uint32_t b2 = static_cast<uint32_t>(n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, sizeof(s1));
  std::memcpy(&s2, &b2, sizeof(s2));
  float y = p * s1 * s2;
  y = x > kMaxArg ? HUGE_VALF : (x < kMinArg ? 0.0f : y);
  return x != x ? x : y;
}
// Branch-free tanhf (Cephes): an odd polynomial below 0.625, 1 - 2 / (exp(2|x|) + 1) above.
inline float tanh(float x) {
  float a = x < 0.0f ? -x : x;
  float z = x * x;
  float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
                  1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
  float big = 1.0f - 2.0f / (exp(2.0f * a) + 1.0f);
  big = x < 0.0f ? -big : big;
  return a == 0.0f ? x : (a < 0.625f ? small : (x != x ? x : big));  // keeps -0
}
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
inline float abs(float x) { return std::fabs(x); }
inline float copysign(float m, float s) { return std::copysign(m, s); }
inline float bits_to_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}
inline float div(float a, float b) { return a / b; }
}  // namespace fp4_math
#endif
