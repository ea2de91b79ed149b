// NEON build of the hot loops (AArch64: Apple silicon, Graviton-class cores; plain ARMv8.0-A).
// Decode: one `tbl` maps the 8 nibbles of a chunk to the high bytes of their fp16 values (every
// E2M1 value is an fp16 whose low byte is 0), widened and converted with fcvtl. GEMM: the
// weights are the FMA's lane operand (fmla by element), four k per weight load.
// The whole file is AArch64-only (CMake adds it there; the guard lets glob-based scripts such as
// tests/cpp/run_sanitizers.sh compile csrc/cpu/*.cpp on x86-64 too).
#if defined(__aarch64__)
#include <arm_neon.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#define MK_NS neon
#define MK_VEC_BYTES 16
#define MK_MICRO_ROWS 8
#define MK_NAME "neon"
#define MK_GEMV_LINE_UNROLL 2
#define MK_CUSTOM_DECODE
#define MK_CUSTOM_MICRO
// 32 vector registers: the GEMV may keep 16 accumulators live.
#define MK_GEMV_ACCS 16

namespace mlx_fp4::cpu::neon {
typedef float vf __attribute__((vector_size(16), aligned(4)));

// High byte of the fp16 encoding of E2M1 code c (sign in bit 3): 0, 0.5, 1, 1.5, 2, 3, 4, 6.
alignas(16) constexpr uint8_t kE2M1Fp16High[16] = {0x00, 0x38, 0x3C, 0x3E, 0x40, 0x42, 0x44, 0x46,
                                                   0x80, 0xB8, 0xBC, 0xBE, 0xC0, 0xC2, 0xC4, 0xC6};

// 4 packed bytes (8 values, inside one scale block in every mode) -> lo = even k, hi = odd k, scaled.
template <int Mode>
__attribute__((always_inline)) inline void decode_chunk(const uint8_t* b, const uint8_t* s, const float* stab, vf& lo, vf& hi) {
  uint32_t word;
  std::memcpy(&word, b, sizeof(word));  // exactly the chunk's 4 bytes (no read past a row)
  const uint8x8_t v = vreinterpret_u8_u32(vdup_n_u32(word));
  // Bytes 0..3: low nibbles (even k), bytes 4..7: high nibbles (odd k).
  const uint8x8_t codes = vand_u8(vext_u8(v, vshr_n_u8(v, 4), 4), vdup_n_u8(0x0F));
  const uint8x8_t high = vqtbl1_u8(vld1q_u8(kE2M1Fp16High), codes);
  const float16x8_t h = vreinterpretq_f16_u16(vshll_n_u8(high, 8));
  const float32x4_t sc = vdupq_n_f32(stab[s[0]]);
  lo = (vf)vmulq_f32(vcvt_f32_f16(vget_low_f16(h)), sc);
  hi = (vf)vmulq_f32(vcvt_high_f32_f16(h), sc);
}
}  // namespace mlx_fp4::cpu::neon

#include "microkernel.inc"

namespace mlx_fp4::cpu::neon {

// c[i][j] += sum_k w[i][k] * x[k][j]: per row, one load of w[i][k..k+3] feeds 4 * NV lane FMAs.
// The k order per output is the generic micro kernel's (same bits). kc is a multiple of 4.
template <int NV, int MR>
void micro_lanes(int kc, const float* w, const float* x, float* c, int64_t ldc) {
  // Fully unrolled, so that the accumulators live in registers (MR * NV <= 16 of the 32).
  float32x4_t acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[i][v] = vld1q_f32(c + i * ldc + v * kVec);
  }
  for (int k = 0; k < kc; k += 4) {
    float32x4_t xv[4][NV];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) xv[u][v] = vld1q_f32(x + (k + u) * (NV * kVec) + v * kVec);
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const float32x4_t wv = vld1q_f32(w + i * kGemmDepth + k);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) {
        acc[i][v] = vfmaq_laneq_f32(acc[i][v], xv[0][v], wv, 0);
        acc[i][v] = vfmaq_laneq_f32(acc[i][v], xv[1][v], wv, 1);
        acc[i][v] = vfmaq_laneq_f32(acc[i][v], xv[2][v], wv, 2);
        acc[i][v] = vfmaq_laneq_f32(acc[i][v], xv[3][v], wv, 3);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) vst1q_f32(c + i * ldc + v * kVec, acc[i][v]);
  }
}
static_assert(kGemmDepth % 4 == 0 && kChunkValues % 4 == 0, "micro_lanes steps k by 4");

void micro2(int kc, const float* w, const float* x, float* c, int64_t ldc) { micro_lanes<2, kMR2>(kc, w, x, c, ldc); }
// The 1-vector tile as two halves of kMR2 rows: 16 accumulators plus 16 early weight loads
// spilled (GCC 12); two passes over the L1-resident x panel cost less.
void micro1(int kc, const float* w, const float* x, float* c, int64_t ldc) {
  static_assert(kMR1 == 2 * kMR2, "micro1 runs as two kMR2-row halves");
  micro_lanes<1, kMR2>(kc, w, x, c, ldc);
  micro_lanes<1, kMR2>(kc, w + kMR2 * kGemmDepth, x, c + kMR2 * ldc, ldc);
}

}  // namespace mlx_fp4::cpu::neon

namespace mlx_fp4::cpu {
const HotLoops& hot_loops_neon() { return neon::hot_loops(); }
}  // namespace mlx_fp4::cpu
#endif  // __aarch64__
