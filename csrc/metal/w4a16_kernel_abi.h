// The interface between the Metal host code (w4a16_dispatch.h) and the kernels
// (w4a16_matmul.metal): buffer slots, flag bits, the parameter struct passed with set_bytes,
// and the Morton threadgroup order. Compiled as MSL and as C++; only 4-byte fields, so the
// struct has the same layout in both.
#pragma once
#include "../shared/epilogue.h"
#include "../shared/tiling_metal.h"

namespace fp4 {

// Buffer argument slots ([[buffer(n)]]) of every kernel. Slots without data (no global
// scale, fewer operands) are bound to x so that every declared argument has a buffer.
enum MetalBuffer : int {
  kMetalBufX = 0,
  kMetalBufW = 1,
  kMetalBufScales = 2,
  kMetalBufOut = 3,
  kMetalBufParams = 4,
  kMetalBufGlobalScale = 5,
  kMetalBufOperand0 = 6,
  kMetalBufOperand1 = 7,
  kMetalBufOperand2 = 8,
  kMetalBufOperand3 = 9,
  kMetalBufPartials = 10,  // split-K: fp32 partial sums [split_k][M][N]
  kMetalNumBuffers = 11,
};

// W4A16MetalParams::flags. The vector-load flags are set by the host only when every such
// load is naturally aligned (row length and buffer offset); otherwise kernels use scalar loads.
enum MetalFlag : int {
  kMetalFlagGlobalScale = 1,  // multiply the fp32 accumulator by global_scale[0]
  kMetalFlagXVec2 = 2,        // x rows may be read as 2-element vectors
  kMetalFlagXVec4 = 4,        // x rows may be read as 4-element vectors
  kMetalFlagWVec8 = 8,        // packed weight rows may be read as 8-byte words
  kMetalFlagOutVec2 = 16,     // the output may be written as 2-element vectors
  kMetalFlagScaleWord = 32,   // GEMM: a strip's BK / 16 scale bytes of a row form one aligned word
  kMetalFlagMxfp4 = 64,       // E8M0 scales, one per 32 columns (every kernel; the GEMM also
                              // reads it as kMetalFcGemmMxfp4)
};

// [[function_constant(n)]] indices. The host specializes each pipeline on them (MLX's
// get_kernel with a function-constant list), so the kernels' alignment choices are resolved at
// pipeline creation, not branched on in the inner loops.
enum MetalFunctionConstant : int {
  // GEMV: weight rows are 8-byte words and x rows 4-element vectors (aligned loads).
  kMetalFcGemvAligned = 0,
  // GEMM: the kMetalFlagXVec2, kMetalFlagWVec8, kMetalFlagScaleWord, kMetalFlagOutVec2 bits.
  kMetalFcGemmXVec2 = 1,
  kMetalFcGemmWVec8 = 2,
  kMetalFcGemmScaleWord = 3,
  kMetalFcGemmOutVec2 = 4,
  // GEMM: the kMetalFlagMxfp4 bit (E8M0 scales per 32 columns instead of E4M3 per 16).
  kMetalFcGemmMxfp4 = 5,
};

struct W4A16MetalParams {
  int m;                // rows of x and of the output
  int n;                // output columns = weight rows
  int k;                // reduction length, >= 1
  int w_row_bytes;      // bytes per packed weight row
  int scale_row_bytes;  // bytes per scale row
  int tiles_m;          // ceil(m / BM) (GEMM only)
  int tiles_n;          // ceil(n / BN) (GEMM only)
  int log2_grid_m;      // Morton grid: 2^log2_grid_m >= tiles_m
  int log2_grid_n;      // Morton grid: 2^log2_grid_n >= tiles_n
  int flags;            // MetalFlag bits
  int num_ops;          // epilogue ops used
  int split_strips;     // split-K (GEMM): strips of BK columns per K partition; 0 = no split
  int split_k;          // split-K: number of K partitions (1 = no split)
  int reserved;
  int operand_kind[kMaxEpilogueOperands];   // OperandKind per operand
  int operand_dtype[kMaxEpilogueOperands];  // OperandDtype per operand
  EpilogueOp ops[kMaxEpilogueOps];
};

struct MortonTile {
  uint32_t m;
  uint32_t n;
};

// Threadgroup index -> (tile_m, tile_n). The low 2 * min(log2_m, log2_n) bits interleave
// (even bits -> n, odd bits -> m); the high bits extend the longer axis. Neighbouring
// threadgroups then share A rows and B columns in the caches.
FP4_FN MortonTile morton_decode(uint32_t index, uint32_t log2_m, uint32_t log2_n) {
  uint32_t low = log2_m < log2_n ? log2_m : log2_n;
  MortonTile t;
  t.m = 0u;
  t.n = 0u;
  for (uint32_t b = 0u; b < low; ++b) {
    t.n |= ((index >> (2u * b)) & 1u) << b;
    t.m |= ((index >> (2u * b + 1u)) & 1u) << b;
  }
  uint32_t high = index >> (2u * low);
  if (log2_m > log2_n) {
    t.m |= high << low;
  } else {
    t.n |= high << low;
  }
  return t;
}

}  // namespace fp4
