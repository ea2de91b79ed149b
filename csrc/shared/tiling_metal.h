// Tile shapes and dispatch thresholds of the Metal kernels (csrc/metal/w4a16_matmul.metal).
// Compiled as MSL (embedded in the JIT source) and as C++ (host dispatch, metal_sim tests), so
// the host arithmetic and the kernels read the same numbers. Framework-free, see portable.h.
#pragma once
#include "portable.h"

namespace fp4 {

// Threads per simdgroup on every Apple GPU.
FP4_CONST int kMetalSimdWidth = 32;
// Side of one simdgroup_matrix fragment (the only size MSL offers).
FP4_CONST int kMetalFrag = 8;

// Fused GEMM. Threadgroup tile BM x BN; each simdgroup owns a 32 x 32 output tile, that is
// 2 x 2 MMA tiles of 16 x 16, each made of 2 x 2 simdgroup_float8x8 fragments.
FP4_CONST int kMetalBN = 64;
FP4_CONST int kMetalSgTile = 32;
FP4_CONST int kMetalSgFrags = kMetalSgTile / kMetalFrag;  // 4 fragments per side
FP4_CONST int kMetalSgN = kMetalBN / kMetalSgTile;        // 2 simdgroups along N
// The two (BM, BK) pairs. One thread decodes one 16-column scale block per strip, so
// BK = (threads / BN) * 16: 256 threads -> BK 64, 128 threads -> BK 32.
FP4_CONST int kMetalLargeBM = 128;
FP4_CONST int kMetalLargeBK = 64;
FP4_CONST int kMetalSmallBM = 64;
FP4_CONST int kMetalSmallBK = 32;
FP4_CONST int kMetalDecodeCols = 16;
// Padding (in halfs) at the end of each row of the decoded B tile: spreads the column reads
// of the B fragments over more threadgroup-memory banks. A multiple of 4 keeps half4 stores
// aligned.
FP4_CONST int kMetalBPad = 8;

// GEMV (the vector path): kMetalGemvSimdgroups simdgroups per threadgroup, each computing
// metal_gemv_rows(MT) output columns (weight rows) for MT rows of x. The decoded weights of a
// 16-column block stay in registers for all MT rows; x is read once per block and row and reused
// for every weight row of the simdgroup. M > MT runs ceil(M / MT) threadgroup rows.
FP4_CONST int kMetalGemvSimdgroups = 4;
FP4_CONST int kMetalGemvThreads = kMetalGemvSimdgroups * kMetalSimdWidth;
FP4_CONST int kMetalGemvMaxMt = 16;
// Weight rows per simdgroup: 4 for up to 4 rows of x (4 x 16 decoded weights + 16 x values in
// registers), 2 for 8 or 16 rows (the MT x R accumulators need the registers).
FP4_CONST int kMetalGemvRows = 4;
FP4_CONST int kMetalGemvRowsWide = 2;
FP4_FN constexpr int metal_gemv_rows(int mt) {
  return mt <= 4 ? kMetalGemvRows : kMetalGemvRowsWide;
}
// Gathered (MoE) GEMV: with the sorted hint, one row per pair and at least kMetalGatherRunMinPairs
// pairs (mlx-lm sorts from 64 pairs: prefill), a threadgroup takes kMetalGatherRun consecutive
// pairs; each run among them of one expert with consecutive x matrices (mlx-lm's sorted layout)
// is one GEMV pass of its rows, which reads the expert's weight rows once for the run.
// Fewer pairs (decode) keep one pair per threadgroup, so that the grid stays wide.
FP4_CONST int kMetalGatherRun = 8;
FP4_CONST int kMetalGatherRunMinPairs = 64;
// ... and from kMetalGatherGemmMinRows pairs per expert on average, the gathered GEMM instead
// (gather_w4a16_gemm: the BM = kMetalSmallBM, BK = kMetalSmallBK fused GEMM tile over consecutive
// pairs, one pass per expert among them). The crossover is the simulator's count
// (tests/metal_sim/gather_cost.py, benchmarks/results/metal/gather_cost.json), in lane-cycles
// with each simdgroup multiply weighted by its FMAs: per pair and weight the GEMM costs 6.7
// against the runs' 5.5 at 16 pairs per expert (a 64-pair tile multiplies all its rows once per
// expert in it), 4.1 against 5.1 at 32. No Apple GPU has timed it.
FP4_CONST int kMetalGatherGemmMinRows = 32;
// Rows of x per GEMV threadgroup for M rows: 1, 2, 4, 8 or 16 (one threadgroup row up to
// M = 16: each weight block is decoded once per threadgroup row).
FP4_FN constexpr int metal_gemv_mt(int m) {
  return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : m <= 8 ? 8 : kMetalGemvMaxMt;
}
// The automatic choice takes the vector path for M <= kMetalGemvAutoMaxM: in the cost model
// (benchmarks/results/metal/cost_model.json, lane-cycles with each 8x8x8 simdgroup multiply
// weighted by its 512 FMAs) the MT = 16 GEMV, which has no matrix work, costs less than the BM=64
// GEMM up to M = 16. Forced (MLX_FP4_METAL_KERNEL), the GEMV takes up to kMetalGemvMaxM rows.
FP4_CONST int kMetalGemvAutoMaxM = 16;
FP4_CONST int kMetalGemvMaxM = 16;

// Dispatch thresholds on M (rows of x). See docs/metal.md for the table and the reasons.
// M <= kMetalGemvMaxM: GEMV. M < kMetalLargeTileMinM: BM=64/BK=32. Otherwise BM=128/BK=64
// with staged scales.
FP4_CONST int kMetalLargeTileMinM = 256;

// Split-K of the fused GEMM when its tiles alone cannot fill the GPU (small M, e.g. the 64
// threadgroups of M <= 64 at N = 4096 on a 40-core GPU): partitions double while the grid stays
// within kMetalSplitKTargetThreadgroups (MLX's qmm_splitk aims at 512 too) and every partition
// keeps at least kMetalSplitKMinStrips strips; fp32 partials, then w4a16_splitk_reduce applies
// the global scale and the epilogue.
FP4_CONST int kMetalSplitKTargetThreadgroups = 512;
FP4_CONST int kMetalSplitKMinStrips = 4;
// ... and while split x M <= kMetalSplitKMaxRows: the fp32 partials cost 8 bytes per row and
// partition per weight column (written, then read), at most 1024 / K bytes per weight.
FP4_CONST int kMetalSplitKMaxRows = 128;
FP4_CONST int kMetalSplitKMax = 16;
FP4_CONST int kMetalReduceThreads = 256;

// Limits every Apple GPU family has; the metal_sim shim enforces the same numbers.
FP4_CONST int kMetalMaxThreadgroupBytes = 32768;
FP4_CONST int kMetalMaxThreadsPerThreadgroup = 1024;

// Threads of a fused-GEMM threadgroup with BM rows.
FP4_FN constexpr int metal_gemm_threads(int bm) {
  return (bm / kMetalSgTile) * kMetalSgN * kMetalSimdWidth;
}
// The most any GEMM config launches (BM = 128): its [[max_total_threads_per_threadgroup]].
FP4_CONST int kMetalGemmMaxThreads = metal_gemm_threads(kMetalLargeBM);

}  // namespace fp4
