// CPU blocking. The vector width comes from the build variant (see microkernel.inc).
#pragma once

namespace mlx_fp4::cpu {

// Rows up to this use the GEMV path (weights streamed once for all rows).
constexpr int kGemvMaxRows = 8;
// Register tile of the GEMM microkernel: kMicroRows rows x (2 vectors) columns.
constexpr int kMicroRows = 6;
// Cache blocking: one task owns kBlockRows x kBlockCols outputs; K advances by kBlockDepth.
constexpr int kBlockRows = 16 * kMicroRows;  // 96
constexpr int kBlockCols = 64;
constexpr int kBlockDepth = 256;  // a multiple of the 16-value scale block
// GEMV: output columns per task.
constexpr int kGemvCols = 16;

}  // namespace mlx_fp4::cpu
