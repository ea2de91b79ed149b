// metal_sim: Metal scalar and vector types for clang (C++20). No keyword macros here, so the
// runtime can include it too. half = _Float16, bfloat = __bf16, vectors = ext_vector_type.
#pragma once
#if !defined(__clang__) || __clang_major__ < 17
#error "metal_sim needs clang >= 17 (__bf16 arithmetic); use clang-19 (Debian: apt-get install clang-19)"
#endif
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

// Lane limits. MSL vectors have 2, 3 or 4 lanes; the M5 Metal backend also crashes on
// arithmetic over 16-bit-element vectors wider than 16 lanes (Modular's M5 finding). The second
// limit only matters where the first is raised (the negative test does).
#ifndef METAL_SIM_MAX_VECTOR_LANES
#define METAL_SIM_MAX_VECTOR_LANES 4
#endif
#ifndef METAL_SIM_MAX_16BIT_LANES
#define METAL_SIM_MAX_16BIT_LANES 16
#endif

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;
typedef __bf16 bfloat;

namespace msim {

template <class T, int N>
constexpr bool vec_ok() {
  static_assert(N >= 1 && N <= METAL_SIM_MAX_VECTOR_LANES,
                "metal_sim: MSL vectors have at most 4 lanes (METAL_SIM_MAX_VECTOR_LANES)");
  static_assert(!(sizeof(T) == 2 && N > METAL_SIM_MAX_16BIT_LANES),
                "metal_sim: M5 check: 16-bit vectors wider than 16 lanes crash the M5 Metal "
                "backend (METAL_SIM_MAX_16BIT_LANES)");
  return true;
}

template <class T>
struct vec_traits {
  static constexpr bool is_vec = false;
  static constexpr int lanes = 1;
  using elem = T;
};
template <class T, int N>
struct vec_traits<T __attribute__((ext_vector_type(N)))> {
  static constexpr bool is_vec = true;
  static constexpr int lanes = N;
  using elem = T;
};

}  // namespace msim

namespace metal {
// The third parameter runs the lane checks at every use; T and N stay deducible.
template <class T, int N, bool = msim::vec_ok<T, N>()>
using vec = T __attribute__((ext_vector_type(N)));
}  // namespace metal

#define MSIM_VEC_TYPES(S)                                  \
  typedef S S##2 __attribute__((ext_vector_type(2)));      \
  typedef S S##3 __attribute__((ext_vector_type(3)));      \
  typedef S S##4 __attribute__((ext_vector_type(4)));
MSIM_VEC_TYPES(char)
MSIM_VEC_TYPES(uchar)
MSIM_VEC_TYPES(short)
MSIM_VEC_TYPES(ushort)
MSIM_VEC_TYPES(int)
MSIM_VEC_TYPES(uint)
MSIM_VEC_TYPES(long)
MSIM_VEC_TYPES(ulong)
MSIM_VEC_TYPES(half)
MSIM_VEC_TYPES(bfloat)
MSIM_VEC_TYPES(float)
#undef MSIM_VEC_TYPES

namespace msim {

template <class S, int N, class A>
inline void vec_append(S (&buf)[N], int& i, const A& a) {
  using tr = vec_traits<A>;
  if constexpr (tr::is_vec) {
    for (int j = 0; j < tr::lanes; ++j) buf[i++] = static_cast<S>(a[j]);
  } else {
    buf[i++] = static_cast<S>(a);
  }
}

// Metal vector constructor: float4(x) splats a scalar or converts a vector element-wise;
// float4(a.xy, b, c) concatenates.
// Arguments by value: deduction then drops the address space of a device/threadgroup operand
// (the address-space build, simbuild.check_address_spaces).
template <class S, int N, class... A>
inline typename metal::vec<S, N> make_vec(A... a) {
  constexpr int total = (0 + ... + vec_traits<A>::lanes);
  static_assert(total == N || (sizeof...(A) == 1 && total == 1),
                "metal_sim: vector constructor lane count mismatch");
  S buf[N];
  int i = 0;
  (vec_append<S, N>(buf, i, a), ...);
  if (total == 1) {
    for (int j = 1; j < N; ++j) buf[j] = buf[0];
  }
  metal::vec<S, N> r;
  for (int j = 0; j < N; ++j) r[j] = buf[j];
  return r;
}

// static_cast<bfloat>(x): Metal converts from any arithmetic type (clang rejects half ->
// __bf16); msl_prep rewrites the cast into this call. Rounds once, through float, which is
// exact for half (every half is a float).
template <class T>
inline bfloat bf16_cast(const T& v) {
  if constexpr (std::is_same_v<T, half>) {
    return static_cast<bfloat>(static_cast<float>(v));
  } else {
    return static_cast<bfloat>(v);
  }
}

}  // namespace msim

// Bit cast between types of the same size (scalars or vectors). A global built-in in MSL:
// `as_type<uint>(x)` works without `using namespace metal`, `metal::as_type` does not parse.
template <class T, class U>
inline T as_type(const U& u) {
  static_assert(sizeof(T) == sizeof(U), "metal_sim: as_type needs types of equal size");
  T t;
  std::memcpy(&t, &u, sizeof(T));
  return t;
}
