// Launch constants of the CUDA gathered (mixture-of-experts) kernels
// (csrc/cuda/gather_w4a16_matmul.cu), shared by the kernels, the MLX glue and the harness.
#pragma once
#include "fp4_format.h"
#include "tiling_cuda.h"

namespace fp4 {
namespace cuda_gather_tiling {

enum : int {
  // Plan kernel: one block groups the pairs by expert (counting sort: counts in global memory,
  // the scans over experts as block-wide scans, so no thread walks all experts alone).
  kPlanThreads = 1024,
  // GEMV kernel: one warp per weight row of one expert, kRowsPerPass rows of x per pass over it
  // (the row stays in L1/L2 between passes), kWarps weight rows per block.
  kWarps = 8,
  kRowsPerPass = 4,
  // Tensor-core kernel (bf16/fp16 x, prefill): a block covers kTcColTiles x 8 rows of one expert
  // group and kTcRowTiles x 16 weight rows; its kTcWarps warps split K (the dense tensor-core step).
  kTcColTiles = 4,
  kTcRowTiles = 2,
  kTcWarps = 4,
  // Resident blocks per SM asked of the compiler: at 255 registers only 2 fit (8 warps per SM,
  // 12% occupancy in ncu at 512 tokens), too few to hide the loads.
  kTcMinBlocksPerSm = 3,
  kTcTileRows = kTcColTiles * 8,
  // Decode without a plan: each pair reads its expert directly (a repeated expert comes from L2),
  // when there are at most this many rows of x in all. At 16 tokens (128 pairs) of Qwen3-30B-A3B
  // experts the batched pair kernel took 47 / 50 us where the plan and grouped staged kernel took
  // 70 / 79 (768 x 2048 / 2048 x 768, H200, gather_kernel_harness bench); more was not measured.
  kPairsMaxRows = 128,
  // Grouped wgmma kernel (sm_90a, prefill): the plan's tiles are this many rows of one expert (the
  // dense wgmma kernel's mid x tile: 4 stages fit its ring, 2 at 128 rows), and it runs where the
  // rows per expert average at least kWgmmaGroupMinRows. Measured (H200, Qwen3-30B-A3B experts,
  // benchmarks/results/cuda/moe/gather_kernel_harness_grouped_wgmma.txt): at 32 rows per expert
  // (512 tokens) it beats the grouped staged kernel 136 vs 186 us (768 x 2048) and 198 vs 227
  // (2048 x 768), at 128 (2048 tokens) 345 vs 537 and 510 vs 746; fewer rows were not measured.
  kWgmmaGroupTileRows = cuda_tiling::kWgmmaTileMMid,
  kWgmmaGroupMinRows = 32,
  kMaxGridY = 65535,
};

// Decode GEMV (one row of x per pair): a block is `warps` warps; a warp splits into 32 / `lanes`
// lane groups, each owning `rows` weight rows of its pair's expert; each lane issues the loads of
// `chunks` 32-value chunks of every row it owns before any math (rows x chunks 16-byte weight
// loads in flight per lane), stepping over K by lanes x chunks chunks. Shape 0 (four rows per
// warp) is the plan's; shape 1 is the grid of MLX's gather_qmv (a warp per row, 8 rows per
// block, one load per lane and step); shape 2 is the fastest at K = 768 of eight shapes timed
// (H200, Qwen3-30B-A3B experts, 1-16 tokens; gather_kernel_harness_no_local_copies.txt): at
// K = 2048 shape 0 beat every other (8.05 us at 1 token, 8.11-12.06 for the rest), at K = 768
// the batched tensor-core kernel beat shape 2 (6.93 vs 7.91 us). kDecodePlannedShape is the plan's;
// the harness times each, MLX_FP4_CUDA_DECODE_SHAPE forces one through MLX.
struct DecodeShape {
  int lanes, rows, chunks, warps;
};
inline constexpr DecodeShape kDecodeShapes[] = {{32, 4, 2, 4}, {32, 1, 1, 8}, {8, 2, 3, 8}};
inline constexpr int kNumDecodeShapes = int(sizeof(kDecodeShapes) / sizeof(kDecodeShapes[0]));
FP4_FN constexpr int decode_rows_per_block(const DecodeShape& d) { return d.warps * (32 / d.lanes) * d.rows; }
// The least K at which a shape's first step keeps every lane busy (below it the batched
// tensor-core kernel was faster: shape 0 at K = 768, 8 of 32 lanes idle, took 22.9 us where
// that kernel took 12.7; H200, 8 pairs of 2048 x 768).
FP4_FN constexpr int64_t decode_min_k(const DecodeShape& d) { return int64_t(d.lanes) * d.chunks * 32; }
// The shape the plan runs, at every K (no other shape beat it where the decode GEMV runs).
inline constexpr int kDecodePlannedShape = 0;

// The pair kernels (no plan), in the order the rule tries them: with the sorted hint, the dense
// staged tensor-core kernel over runs of consecutive pairs of one expert (one row of x per pair:
// each run reads its expert once; H200, 128 experts of 768 x 2048, 16 sorted tokens: 37.4 against
// 47.1 us batched; unsorted, with nothing to merge, 2-5% slower, gather_kernel_harness_runs.txt),
// the same kernel batched over the pairs, the decode GEMV, the SIMT pair GEMV (gather_pair_launch).
enum class PairKernel : int { kBatchedTc = 0, kDecode = 1, kSimt = 2, kRunsTc = 3 };

// The kernels of one gathered call: the plan-free pair GEMV, or the plan and then the grouped
// GEMV or the grouped tensor-core kernel.
enum class GatherKernel : int { kPairs = 0, kGemv = 1, kTc = 2 };

// Upper bound of the tensor-core tiles: every active expert's rows in tiles of `tile_rows` (the
// workspace holds the bound of the smallest tiles, kTcTileRows).
FP4_FN int64_t max_tc_tiles(int64_t experts, int64_t rows, int64_t tile_rows = kTcTileRows) {
  return (rows + tile_rows - 1) / tile_rows + (experts < rows ? experts : rows);
}

// Whether the grouped wgmma kernel's grid y holds every tile of `rows` rows of x over `experts`,
// and (gather_wgmma_rows_ok) whether its tiles would also be full enough to take it.
FP4_FN bool gather_wgmma_tiles_fit(int64_t rows, int64_t experts) {
  return max_tc_tiles(experts, rows, kWgmmaGroupTileRows) <= kMaxGridY;
}
FP4_FN bool gather_wgmma_rows_ok(int64_t rows, int64_t experts) {
  return experts > 0 && rows >= int64_t(kWgmmaGroupMinRows) * experts && gather_wgmma_tiles_fit(rows, experts);
}

// The plan workspace (int32 words): cursor[E] at 0, start[E + 1], active[E], num_active,
// order[P], num_tiles, tiles[max_tiles] x (expert, first row), x_rows[rows], out_rows[rows].
struct PlanLayout {
  int64_t start, active, num_active, order, num_tiles, tiles, x_rows, out_rows, words;
};
FP4_FN PlanLayout plan_layout(int64_t experts, int64_t pairs, int64_t rows) {
  PlanLayout l{};
  l.start = experts;
  l.active = l.start + experts + 1;
  l.num_active = l.active + experts;
  l.order = l.num_active + 1;
  l.num_tiles = l.order + pairs;
  l.tiles = l.num_tiles + 1;
  l.x_rows = l.tiles + 2 * max_tc_tiles(experts, rows);
  l.out_rows = l.x_rows + rows;
  l.words = l.out_rows + rows;
  return l;
}
FP4_FN int64_t plan_workspace_words(int64_t experts, int64_t pairs, int64_t rows) {
  return plan_layout(experts, pairs, rows).words;
}

}  // namespace cuda_gather_tiling
}  // namespace fp4
