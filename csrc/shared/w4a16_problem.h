// The W4A16 problem description every backend receives, framework-free so that C++, CUDA and
// Metal hosts share it. Pointers are not part of it: each backend binds its own buffers.
#pragma once
#include "epilogue.h"
#include "fp4_format.h"

namespace fp4 {

// Most dimensions of an x that a backend copies to rows itself (CUDA: strided_copy.cuh); x with
// more goes through a Contiguous node.
constexpr int kMaxStridedXDims = 8;

struct W4A16Problem {
  int64_t m;                 // rows of x (product of the leading dims), may be 0
  int64_t n;                 // rows of the weight = output columns
  int64_t k;                 // reduction length, any k >= 1
  int64_t w_row_bytes;       // bytes per packed weight row (>= ceil(k / 2))
  int64_t scale_row_bytes;   // bytes per scale row (== ceil(k / block_size(mode)))
  int x_dtype;               // OperandDtype of x (rows of k elements, contiguous)
  int out_dtype;             // OperandDtype of the output (rows of n elements, contiguous)
  int has_global_scale;      // 1: multiply the fp32 accumulator by *global_scale first
  int num_ops;               // epilogue ops used in `ops`
  int num_operands;          // operand tensors used in operand_kind / operand_dtype
  EpilogueOp ops[kMaxEpilogueOps];
  int operand_kind[kMaxEpilogueOperands];   // OperandKind
  int operand_dtype[kMaxEpilogueOperands];  // OperandDtype
  int mode;                  // fp4::Mode: the scale format (E4M3 per 16 or E8M0 per 32)
};

// Element offset of operand `i` at (row, col) for its broadcast kind.
FP4_FN int64_t operand_offset(int kind, int64_t row, int64_t col, int64_t n) {
  return kind == kOperandScalar ? 0
       : kind == kOperandCol    ? col
       : kind == kOperandRow    ? row
                                : row * n + col;
}

// Packed-weight geometry from k.
FP4_FN int64_t packed_bytes_for_k(int64_t k) { return (k + kValuesPerByte - 1) / kValuesPerByte; }
FP4_FN int64_t packed_words_for_k(int64_t k) { return (k + kValuesPerWord - 1) / kValuesPerWord; }
FP4_FN int64_t scale_blocks_for_k(int64_t k, int mode = kModeNvfp4) {
  return (k + block_size(mode) - 1) / block_size(mode);
}

}  // namespace fp4
