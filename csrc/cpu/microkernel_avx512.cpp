// AVX-512F build of the hot loops (compiled with -mavx512f -mfma; chosen only when the CPU has it).
// x86-only file: the weight decode uses intrinsics (the 16 E2M1 values fit one zmm: vpermps).
// GCC 12 warns about its own _mm512_undefined_* inside the intrinsics headers.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "../shared/fp4_format.h"

#define MK_NS avx512
#define MK_VEC_BYTES 64
#define MK_MICRO_ROWS 14
#define MK_NAME "avx512f"
#define MK_CUSTOM_DECODE
#define MK_CUSTOM_SPLAT
// GCC (12) places 64-byte vector locals in AddressSanitizer's use-after-return fake stack at
// offsets that are only 32-byte aligned and still uses aligned moves on them (a fault under
// detect_stack_use_after_return=1). The hot loops of this build therefore skip ASan
// instrumentation; the same loops are instrumented in the avx2 and generic builds.
#define MK_HOT_ATTR __attribute__((no_sanitize_address))

namespace mlx_fp4::cpu::avx512 {
typedef float vf __attribute__((vector_size(64), aligned(4)));
inline vf splat(float s) { return (vf)_mm512_set1_ps(s); }
// 16 packed bytes (32 values: two NVFP4 scale blocks, one MXFP4 block) -> lo = even k, hi = odd k, scaled.
template <int Mode>
__attribute__((always_inline)) inline void decode_chunk(const uint8_t* b, const uint8_t* s, const float* stab, vf& lo, vf& hi) {
  const __m512 lut = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                    -2.0f, -3.0f, -4.0f, -6.0f);
  const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
  // Lanes 0..7 hold bytes 0..7 (scale block 0), lanes 8..15 bytes 8..15 (NVFP4: block 1).
  constexpr int kSecond = fp4::block_size(Mode) == fp4::kNvfp4BlockSize ? 1 : 0;
  const __m512 sc = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(stab[s[0]]), _mm512_set1_ps(stab[s[kSecond]]));
  const __m512 l = _mm512_permutexvar_ps(d, lut);  // low 4 bits index
  const __m512 h = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), lut);
  lo = (vf)_mm512_mul_ps(l, sc);
  hi = (vf)_mm512_mul_ps(h, sc);
}
}  // namespace mlx_fp4::cpu::avx512

#include "microkernel.inc"

namespace mlx_fp4::cpu {
const HotLoops& hot_loops_avx512() { return avx512::hot_loops(); }
}  // namespace mlx_fp4::cpu
