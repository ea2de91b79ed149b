// Device-side helpers of the W4A16 Metal kernels (w4a16_matmul.metal, w4a16_gemv.metal, and the
// gathered MoE kernel): the epilogue and the bit-built half decode of one 16-column block. MSL
// only; the integer decode itself is csrc/shared/fp4_format.h (shared with the host tests).
#pragma once
#include <metal_stdlib>

#include "w4a16_kernel_abi.h"
#include "../shared/fp4_format.h"
#include "../shared/w4a16_problem.h"

using namespace metal;
using namespace fp4;

// ---------------------------------------------------------------------------------------------
// Epilogue and output

// Reads element `off` of an epilogue operand of dtype `dtype` (OperandDtype) as fp32.
inline float load_operand(device const uchar* base, int dtype, long off) {
  if (dtype == kDtypeF32) {
    return ((device const float*)base)[off];
  }
  if (dtype == kDtypeF16) {
    return float(((device const half*)base)[off]);
  }
  return float(((device const bfloat*)base)[off]);
}

// The fp32 value stored at out[row, col]: global scale, then the epilogue chain in order.
inline float finish_value(
    float v,
    int row,
    int col,
    constant W4A16MetalParams& p,
    device const float* gscale,
    device const uchar* op0,
    device const uchar* op1,
    device const uchar* op2,
    device const uchar* op3) {
  if ((p.flags & kMetalFlagGlobalScale) != 0) {
    v *= fp4::decode_multiplier(gscale[0]);
  }
  for (int i = 0; i < p.num_ops; ++i) {
    const int code = p.ops[i].code;
    const int which = p.ops[i].operand;
    const float p0 = p.ops[i].p0;
    const float p1 = p.ops[i].p1;
    // Ops without a tensor operand take their constant from p0 (add/mul by a Python float).
    float operand = p0;
    if (which >= 0) {
      device const uchar* base = which == 0 ? op0 : which == 1 ? op1 : which == 2 ? op2 : op3;
      const long off = operand_offset(p.operand_kind[which], row, col, p.n);
      operand = load_operand(base, p.operand_dtype[which], off);
    }
    v = epilogue_apply(code, v, operand, p0, p1);
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// Bit-built decode (fp4_format.h): halves of value * 2^-14, no per-code arithmetic

// The 16 weights of one scale block (8 packed bytes as a uint2, low nibble = even k) as fp32
// values times 2^-14, in k order. One 32-bit op builds two halves; the conversion to fp32 is
// exact (half subnormals included).
inline void decode_block16_f32(uint2 q, thread float* wf) {
  for (int wd = 0; wd < 2; ++wd) {
    const uint word = wd == 0 ? q.x : q.y;
    for (int j = 0; j < 4; ++j) {
      const float2 f = float2(as_type<half2>(e2m1_pair_half_bits(word, j)));
      wf[8 * wd + j] = f.x;
      wf[8 * wd + j + 4] = f.y;
    }
  }
}

// The block scale times 2^14 * 2^8 (undoing both bit-built offsets) as fp32, exact; NaN for
// the E4M3 NaN codes.
inline float block_scale_f32(uint code) {
  return float(as_type<half>(ushort(e4m3_half_bits(code)))) *
      (kE2M1HalfUnscale * kE4M3HalfUnscale);
}

// The block scale as half, exact (every E4M3 value is a half; NaN stays NaN).
inline half block_scale_f16(uint code) {
  return as_type<half>(ushort(e4m3_half_bits(code))) * half(kE4M3HalfUnscale);
}

// One E2M1 code (low 4 bits) as its exact half value.
inline half e2m1_f16(uint code) {
  return as_type<half2>(e2m1_pair_half_bits(code & kNibbleMask, 0)).x * half(kE2M1HalfUnscale);
}

// Eight packed bytes from a pointer with byte alignment only, as the uint2 an aligned load gives.
inline uint2 load_u2_bytes(device const uchar* p) {
  uint2 q;
  q.x = uint(p[0]) | (uint(p[1]) << 8) | (uint(p[2]) << 16) | (uint(p[3]) << 24);
  q.y = uint(p[4]) | (uint(p[5]) << 8) | (uint(p[6]) << 16) | (uint(p[7]) << 24);
  return q;
}
