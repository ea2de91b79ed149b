// The interface between the Metal host code of the gathered (MoE) matmul (gather_dispatch.h) and
// its kernel (gather_w4a16_matmul.metal): the parameter block and the two extra buffer slots.
// Compiled as MSL and as C++; only 4-byte fields, so the layout is the same in both.
#pragma once
#include "w4a16_kernel_abi.h"

namespace fp4 {

// Slots of the gathered kernel beyond the dense kernel's (kMetalBufX .. kMetalBufOperand3).
enum MetalGatherBuffer : int {
  kMetalGatherBufLhs = kMetalNumBuffers,
  kMetalGatherBufRhs = kMetalNumBuffers + 1,
  kMetalGatherNumBuffers = kMetalNumBuffers + 2,
};

struct GatherMetalParams {
  W4A16MetalParams mm;        // one product: m = rows per pair, n, k, rows, flags, chain, tiles_n
  int pairs;                  // products (threadgroup rows of the grid)
  int x_batches;              // lhs indices must be < x_batches
  int experts;                // rhs indices must be < experts
  int global_scale_per_expert;  // 1: global scale buffer holds one multiplier per expert
  int w_expert_bytes;         // bytes between experts in w
  int scale_expert_bytes;     // bytes between experts in scales
  int reserved0;
  int reserved1;
};

}  // namespace fp4
