// The fused epilogue chain, defined once for C++, CUDA and Metal: a list of elementwise ops
// applied in order to the fp32 accumulator at (row, col), after the global scale and before
// the single cast to the output dtype.
#pragma once
#include "portable.h"

namespace fp4 {

// Op codes. The Python names map to these in csrc/epilogue_spec.cpp; keep the two in step.
enum EpilogueCode : int {
  kEpiAdd = 0,         // acc + operand
  kEpiMul = 1,         // acc * operand
  kEpiScale = 2,       // acc * p0
  kEpiRelu = 3,        // max(acc, 0), NaN kept
  kEpiSilu = 4,        // acc * sigmoid(acc)
  kEpiGelu = 5,        // 0.5 acc (1 + erf(acc / sqrt 2))
  kEpiGeluApprox = 6,  // 0.5 acc (1 + tanh(sqrt(2/pi) (acc + 0.044715 acc^3)))
  kEpiSigmoid = 7,     // 1 / (1 + exp(-acc))
  kEpiTanh = 8,        // tanh(acc)
  kEpiClamp = 9,       // min(max(acc, p0), p1), NaN kept
  kEpiNumCodes = 10,
};

// Bounds that fix the size of the chain passed to kernels by value.
FP4_CONST int kMaxEpilogueOps = 8;
FP4_CONST int kMaxEpilogueOperands = 4;

// How an operand tensor is laid out after broadcasting to the output [M, N]:
// element (row, col) lives at row * row_stride + col * col_stride.
enum OperandKind : int {
  kOperandScalar = 0,  // one value: strides (0, 0)
  kOperandCol = 1,     // [N], e.g. a bias: strides (0, 1)
  kOperandRow = 2,     // [M, 1], one value per row: strides (1, 0)
  kOperandFull = 3,    // [M, N], e.g. a residual or a gate: strides (N, 1)
};

// Operand element types the kernels read (converted to fp32 on load).
enum OperandDtype : int { kDtypeF32 = 0, kDtypeF16 = 1, kDtypeBF16 = 2 };

// Bytes of one element of an OperandDtype.
FP4_FN int dtype_bytes(int dtype) { return dtype == kDtypeF32 ? 4 : 2; }

struct EpilogueOp {
  int code;     // EpilogueCode
  int operand;  // index into the operand list, or -1 when the op takes none / a constant
  float p0;     // constant operand (add/mul by a Python float, scale, clamp lo)
  float p1;     // clamp hi
};

// Single-precision erf, max error about 1.4 ulp on [-6, 6] (measured against math.erf).
// Own implementation so that Metal, which has no erf, computes the same function.
FP4_FN float erf_f32(float a) {
  float t = fp4_math::abs(a);
  float s = a * a;
  float r;
  if (t > 0.927734375f) {
    r = fp4_math::fma(-1.72853470e-5f, t, 3.83197126e-4f);
    float u = fp4_math::fma(-3.88396438e-3f, t, 2.42546219e-2f);
    r = fp4_math::fma(r, s, u);
    r = fp4_math::fma(r, t, -1.06777877e-1f);
    r = fp4_math::fma(r, t, -6.34846687e-1f);
    r = fp4_math::fma(r, t, -1.28717512e-1f);
    r = fp4_math::fma(r, t, -t);
    r = 1.0f - fp4_math::exp(r);
    r = fp4_math::copysign(r, a);
  } else {
    r = -5.96761703e-4f;
    r = fp4_math::fma(r, s, 4.99119423e-3f);
    r = fp4_math::fma(r, s, -2.67681349e-2f);
    r = fp4_math::fma(r, s, 1.12819925e-1f);
    r = fp4_math::fma(r, s, -3.76125336e-1f);
    r = fp4_math::fma(r, s, 1.28379166e-1f);
    r = fp4_math::fma(r, a, a);
  }
  return r;
}

FP4_FN float sigmoid_f32(float x) { return 1.0f / (1.0f + fp4_math::exp(-x)); }

// One op on one accumulator value. `operand` is the operand value at (row, col) when
// op.operand >= 0, otherwise ignored (p0 is used).
FP4_FN float epilogue_apply(int code, float v, float operand, float p0, float p1) {
  const float kInvSqrt2 = 0.70710678118654752f;
  const float kSqrt2OverPi = 0.79788456080286536f;
  const float kGeluCubic = 0.044715f;
  switch (code) {
    case kEpiAdd: return v + operand;
    case kEpiMul: return v * operand;
    case kEpiScale: return v * p0;
    case kEpiRelu: return v < 0.0f ? 0.0f : v;
    case kEpiSilu: return v * sigmoid_f32(v);
    case kEpiGelu: return 0.5f * v * (1.0f + erf_f32(v * kInvSqrt2));
    case kEpiGeluApprox:
      return 0.5f * v * (1.0f + fp4_math::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v)));
    case kEpiSigmoid: return sigmoid_f32(v);
    case kEpiTanh: return fp4_math::tanh(v);
    case kEpiClamp: return v < p0 ? p0 : (v > p1 ? p1 : v);
    default: return v;
  }
}

}  // namespace fp4
