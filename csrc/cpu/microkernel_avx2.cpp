// AVX2 + FMA build of the hot loops (compiled with -mavx2 -mfma; chosen only when the CPU has both).
// x86-only file: the weight decode uses intrinsics (8-entry vpermps LUT of scaled magnitudes + sign bit).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#define MK_NS avx2
#define MK_VEC_BYTES 32
#define MK_MICRO_ROWS 6
#define MK_NAME "avx2-fma"
#define MK_CUSTOM_DECODE
#define MK_CUSTOM_SPLAT

namespace mlx_fp4::cpu::avx2 {
typedef float vf __attribute__((vector_size(32), aligned(4)));
inline vf splat(float s) { return (vf)_mm256_set1_ps(s); }
// 8 packed bytes (16 values, inside one scale block in every mode) -> lo = even k, hi = odd k, scaled.
template <int Mode>
__attribute__((always_inline)) inline void decode_chunk(const uint8_t* b, const uint8_t* s, const float* stab, vf& lo, vf& hi) {
  const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  // Entry m of the table is pre-xored with m << 28: the code shifted to bits 28..31 (magnitude
  // bits 28..30, sign bit 31) then clears those bits again and sets the sign, with no mask.
  const __m256i code_bits = _mm256_setr_epi32(0, 1 << 28, 2 << 28, 3 << 28, 4 << 28, 5 << 28, 6 << 28, 7 << 28);
  const __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
  const __m256i dh = _mm256_srli_epi32(d, 4);
  // The 8 magnitudes times the block scale, then looked up: one multiply per 16 values, and the
  // same bits as scaling each value (a sign flip commutes with the rounding of the product).
  const __m256 table = _mm256_xor_ps(_mm256_mul_ps(mag, _mm256_set1_ps(stab[s[0]])), _mm256_castsi256_ps(code_bits));
  lo = (vf)_mm256_xor_ps(_mm256_permutevar8x32_ps(table, d), _mm256_castsi256_ps(_mm256_slli_epi32(d, 28)));
  hi = (vf)_mm256_xor_ps(_mm256_permutevar8x32_ps(table, dh), _mm256_castsi256_ps(_mm256_slli_epi32(dh, 28)));
}
}  // namespace mlx_fp4::cpu::avx2

#include "microkernel.inc"

namespace mlx_fp4::cpu {
const HotLoops& hot_loops_avx2() { return avx2::hot_loops(); }
}  // namespace mlx_fp4::cpu
