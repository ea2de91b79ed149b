// The FP4 weight formats, defined once for C++, CUDA and Metal. Both share the E2M1 values
// (two nibbles per byte, low nibble = even k) and differ in the block scale:
//   NVFP4: W[n, k] = e2m1(nibble) * e4m3(scale[n, k / 16]) * alpha (optional global multiplier)
//   MXFP4: W[n, k] = e2m1(nibble) * e8m0(scale[n, k / 32])         (OCP MX, gpt-oss; no alpha)
// See FORMAT.md for the layout and the checkpoint dialects.
#pragma once
#include "portable.h"

namespace fp4 {

// The scale format: a kernel parameter (template / function constant), MLX's `mode` argument.
enum Mode : int { kModeNvfp4 = 0, kModeMxfp4 = 1 };
FP4_CONST int kNumModes = 2;

// Weights that share one scale, along K, per mode.
FP4_CONST int kNvfp4BlockSize = 16;
FP4_CONST int kMxfp4BlockSize = 32;
FP4_CONST int kMaxBlockSize = kMxfp4BlockSize;
// The NVFP4 block (code that is not mode-aware yet reads this name).
FP4_CONST int kBlockSize = kNvfp4BlockSize;
FP4_FN constexpr int block_size(int mode) { return mode == kModeMxfp4 ? kMxfp4BlockSize : kNvfp4BlockSize; }
// FP4 values per packed byte, and per MLX uint32 word.
FP4_CONST int kValuesPerByte = 2;
FP4_CONST int kValuesPerWord = 8;
FP4_CONST int kNibbleBits = 4;
FP4_CONST uint32_t kNibbleMask = 0xF;

// E2M1: 1 sign bit, 2 exponent bits (bias 1), 1 mantissa bit; no Inf or NaN.
FP4_CONST uint32_t kE2M1SignBit = 0x8;
FP4_CONST uint32_t kE2M1MagMask = 0x7;
FP4_CONST float kE2M1Max = 6.0f;

// E4M3FN: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; 0x7F/0xFF are NaN, no Inf.
FP4_CONST uint32_t kE4M3SignBit = 0x80;
FP4_CONST uint32_t kE4M3MagMask = 0x7F;
FP4_CONST uint32_t kE4M3NaNMag = 0x7F;
FP4_CONST int kE4M3MantissaBits = 3;
FP4_CONST int kE4M3Bias = 7;
FP4_CONST int kE4M3MinNormalExp = 1 - kE4M3Bias;  // 2^-6
FP4_CONST float kE4M3Max = 448.0f;
// amax of a tensor maps to kE2M1Max * kE4M3Max under a per-tensor global scale (ModelOpt).
FP4_CONST float kGlobalScaleDenominator = kE2M1Max * kE4M3Max;  // 2688

// MLX's global_scale (the tensor amax) -> the decode multiplier, in the kernel as MLX's own kernels
// do it: one IEEE fp32 division, so no extra graph node per call and the value of mx.dequantize.
FP4_FN float decode_multiplier(float global_scale) {
  return fp4_math::div(global_scale, kGlobalScaleDenominator);
}

// Exact decode of an E2M1 code (low 4 bits used). Pure integer-to-float arithmetic: no
// denormal intermediates, so Apple GPUs that flush f32/bf16 denormals decode +-0.5 right.
FP4_FN float e2m1_to_float(uint32_t code) {
  uint32_t mag = code & kE2M1MagMask;
  uint32_t e = mag >> 1;
  uint32_t m = mag & 1u;
  // e == 0: subnormal m * 0.5; else (1 + m/2) * 2^(e-1) = (2 + m) * 2^e / 4.
  float v = (e == 0u) ? 0.5f * float(m) : float(2u + m) * float(1u << e) * 0.25f;
  return (code & kE2M1SignBit) ? -v : v;
}

// Exact decode of an E4M3FN byte; 0x7F and 0xFF are NaN (MLX decodes them as +-480).
FP4_FN float e4m3_to_float(uint32_t code) {
  uint32_t mag = code & kE4M3MagMask;
  if (mag == kE4M3NaNMag) {
    return fp4_math::bits_to_float(0x7FC00000u);
  }
  uint32_t e = mag >> kE4M3MantissaBits;
  uint32_t m = mag & ((1u << kE4M3MantissaBits) - 1u);
  // Subnormal: m * 2^-9. Normal: (8 + m) * 2^(e - 10). 2^-10 is a normal float: exact.
  const float two_pow_minus_9 = 1.0f / 512.0f;
  const float two_pow_minus_10 = 1.0f / 1024.0f;
  float v = (e == 0u) ? float(m) * two_pow_minus_9
                      : float(8u + m) * float(1u << e) * two_pow_minus_10;
  return (code & kE4M3SignBit) ? -v : v;
}

// E8M0 (MXFP4 scales): an unsigned biased exponent, 2^(code - 127); 0xFF is NaN (OCP MX;
// MLX decodes it as +Inf). Code 0 is 2^-127, an fp32 subnormal (exact on CPUs; a GPU that
// flushes fp32 denormals reads it as 0).
FP4_CONST int kE8M0Bias = 127;
FP4_CONST uint32_t kE8M0NaN = 0xFF;
FP4_CONST int kF32MantissaBits = 23;
FP4_CONST uint32_t kF32QuietNaN = 0x7FC00000u;
FP4_CONST uint32_t kF32TwoPowMinus127 = 0x00400000u;  // the subnormal 2^-127
FP4_FN float e8m0_to_float(uint32_t code) {
  code &= 0xFFu;
  return fp4_math::bits_to_float(code == kE8M0NaN ? kF32QuietNaN
                                 : code == 0u    ? kF32TwoPowMinus127
                                                 : code << uint32_t(kF32MantissaBits));
}

// The one scale decode per mode: what every kernel multiplies a block's E2M1 values by.
FP4_FN float scale_to_float(int mode, uint32_t code) {
  return mode == kModeMxfp4 ? e8m0_to_float(code) : e4m3_to_float(code);
}

// Bit-built half decode (the Metal kernels; MLX's fp4.h builds its halves the same way).
// Two E2M1 codes become one 32-bit word of two IEEE half bit patterns: magnitude bits 0..2 go to
// half bits 9..11 and the sign bit to bit 15, so the half is the E2M1 value times 2^-14, exactly
// (+-0.5 becomes the half subnormal 2^-15: Apple GPUs keep half subnormals). Five 32-bit integer
// ops per two weights, no conversion, no per-code arithmetic.
FP4_CONST uint32_t kHalf2E2M1MagMask = 0x0E000E00u;   // half bits 9..11 of both halves
FP4_CONST uint32_t kHalf2E2M1SignMask = 0x80008000u;  // half bit 15 of both halves
FP4_CONST int kE2M1HalfMagShift = 9;                  // code bit 0 -> half bit 9
FP4_CONST int kE2M1HalfSignShift = 12;                // code bit 3 -> half bit 15
// The bit-built half times this is the E2M1 value: 2^14.
FP4_CONST float kE2M1HalfUnscale = 16384.0f;

// Shift left by s bits, or right by -s bits (s is a compile-time constant in the kernels).
FP4_FN uint32_t shift_bits(uint32_t v, int s) { return s >= 0 ? v << uint32_t(s) : v >> uint32_t(-s); }

// Codes j and j + 4 (j = 0..3) of an 8-code word (code i = bits 4i..4i+3, as packed in memory,
// low nibble first) as two half bit patterns: the low half holds code j, the high half code j + 4.
FP4_FN uint32_t e2m1_pair_half_bits(uint32_t word, int j) {
  const int nib = kNibbleBits * j;
  return (shift_bits(word, kE2M1HalfMagShift - nib) & kHalf2E2M1MagMask) |
         (shift_bits(word, kE2M1HalfSignShift - nib) & kHalf2E2M1SignMask);
}

// E4M3FN byte as a half bit pattern of its value times 2^-8 (exponent bias 7 vs 15; E4M3
// subnormals map to half subnormals), exact; NaN (0x7F/0xFF) as a half NaN.
FP4_CONST uint32_t kHalfE4M3Shift = 7;          // E4M3 bits 0..6 -> half bits 7..13
FP4_CONST uint32_t kHalfSignShiftFromByte = 8;  // E4M3 bit 7 -> half bit 15
FP4_CONST uint32_t kHalfQuietNaN = 0x7E00u;
FP4_CONST float kE4M3HalfUnscale = 256.0f;      // 2^8
FP4_FN uint32_t e4m3_half_bits(uint32_t code) {
  const uint32_t mag = code & kE4M3MagMask;
  const uint32_t sign = (code & kE4M3SignBit) << kHalfSignShiftFromByte;
  return (mag == kE4M3NaNMag ? kHalfQuietNaN : (mag << kHalfE4M3Shift)) | sign;
}

// Round-to-nearest-even thresholds of E2M1 on |x|: code c+1 wins when |x| passes
// kE2M1Edges[c]; "inclusive" edges are ties that round up to an even mantissa.
FP4_CONST int kE2M1NumEdges = 7;
FP4_FN float e2m1_edge(int i) {
  // Midpoints between 0, 0.5, 1, 1.5, 2, 3, 4, 6.
  return i == 0 ? 0.25f : i == 1 ? 0.75f : i == 2 ? 1.25f : i == 3 ? 1.75f
       : i == 4 ? 2.5f : i == 5 ? 3.5f : 5.0f;
}
// Ties at 0.75, 1.75 and 3.5 go up (to 1.0, 2.0, 4.0: even mantissa); the others go down.
FP4_FN bool e2m1_edge_tie_rounds_up(int i) { return i == 1 || i == 3 || i == 5; }

// E2M1 encode of one float, round-to-nearest-even, saturating at 6; NaN encodes as 0.
FP4_FN uint32_t float_to_e2m1(float x) {
  float a = fp4_math::abs(x);
  uint32_t code = 0;
  for (int i = 0; i < kE2M1NumEdges; ++i) {
    float edge = e2m1_edge(i);
    code += (a > edge || (a == edge && e2m1_edge_tie_rounds_up(i))) ? 1u : 0u;
  }
  bool neg = fp4_math::copysign(1.0f, x) < 0.0f;
  return code | (neg ? kE2M1SignBit : 0u);
}

}  // namespace fp4
