// Tile and launch constants of the CUDA kernels (csrc/cuda/w4a16_matmul.cu), in one place so that
// the kernels, the host-side dispatch and the standalone harness agree. Framework-free.
#pragma once
#include "fp4_format.h"

namespace fp4 {
namespace cuda_tiling {

enum : int {
  // Tensor-core kernel (mma.sync m16n8k16; W is the 16-row A operand, x the 8-column B operand).
  kMmaRows = 16,            // weight rows per mma (A rows)
  kMmaCols = 8,             // x rows per mma (B columns)
  kStepK = 128,             // K per warp iteration: 4 lanes x 32 values (16 bytes) per weight row
  kLaneK = 32,              // K values one lane decodes per weight row and step
  kLaneBytes = 16,          // packed weight bytes per lane, row and step (one 16-byte load)
  kMaxWarpsPerBlock = 8,    // warps of a block split K, then reduce through shared memory
  // ... of the deep variant of the one-x-tile staged kernel (a separate instantiation, forced
  // through MLX_FP4_CUDA_TC for A/B timing; the plan does not pick it yet), which reduces in its
  // ring: 16 warps of 3 stages of two row tiles take 216 KB of the 227 KB a block may hold (sm_90).
  kMaxStagedWarpsPerBlock = 16,
  kMaxColTiles = 8,         // at most 8 x-row tiles of 8 (64 rows of x) per block
  kMaxRowTiles = 2,         // at most 2 weight-row tiles of 16 per warp (and MT * RT <= 8)
  // Staged variant (K % kStepK == 0, aligned rows): each warp streams its weight and scale bytes
  // through a private ring of kStages stages in shared memory (cp.async), kStages - 1 ahead. A
  // stage is kStagedSubSteps steps when K allows (one 16-byte scale copy per row), else one step.
  kStages = 3,
  kStagedSubSteps = 2,
  kMaxStagedColTiles = 4,   // x-row tiles of 8 per staged block (32 rows of x; wider would spill)
  kStagedWarpsPerSm = 8,    // the staged kernel's grid: about this many warps per SM (measured)
  kStagedOneRowWarpsPerSm = 16,  // ... with one row of x: one row tile per warp, more warps
  kStagedTcMaxM = 64,       // the staged kernel beats dequantize + cuBLASLt up to here (H200)

  // Dispatch (csrc/cuda/w4a16_plan.h), crossovers on M measured on an H200: tensor cores up to
  // kTcMaxM rows of x (the staged kernel up to kStagedTcMaxM), then dequantize + cuBLASLt;
  // float32 x: SIMT while M <= kSimtMaxM.
  kTcMaxM = 32,
  kSimtMaxM = 32,
  kTcWarpsPerSm = 16,       // the register-prefetch kernel's grid: up to ~2048 warps in flight

  // SIMT kernel (float32 x and the generic path): one warp per weight row, 4 x rows per pass.
  kSimtWarps = 8,
  kSimtRows = 4,

  // wgmma kernel (sm_90a, csrc/cuda/w4a16_wgmma.cuh): per block one producer warpgroup (TMA) and
  // kWgmmaConsumers consumer warpgroups of kWgmmaRows weight rows each (wgmma m64nNk16, the decoded
  // weights as the register A operand), N = x rows per block (kWgmmaTileM*), K in parts of
  // kWgmmaPartK (one set of A registers: a 64-byte weight row, kLaneK values per lane) and ring
  // stages of wgmma_stage_k(tile_m) (below); K padded to kWgmmaKUnit (a 16-byte scale row).
  kWgmmaRows = 64,
  kWgmmaConsumers = 2,
  kWgmmaBlockRows = kWgmmaRows * kWgmmaConsumers,
  kWgmmaThreads = 128 * (kWgmmaConsumers + 1),
  kWgmmaPartK = 128,
  kWgmmaKUnit = 256,        // K of one 16-byte scale row: x's padding, the unit of splits and plan costs
  kWgmmaScaleBox = 16,      // scale bytes per row and stage: its K unit's (TMA's minimum, 16-byte aligned box)
  kWgmmaSliceK = 16,        // K of one wgmma
  kWgmmaXBoxK = 64,         // x values per TMA box row: 128 bytes, the 128-byte swizzle span
  kWgmmaTileMSmall = 32,    // x rows per block (WgmmaConfig::tile_m)
  kWgmmaTileMMid = 64,
  kWgmmaTileMWide = 96,     // M = 96 or 192 in one or two x tiles (3 ring stages; 64-row tiles pad or take 1.5 waves)
  kWgmmaTileMLarge = 128,   // stages of one part: 5 fit its ring (2 of 256: starved, 1.25-1.45x slower than 3)
  kWgmmaTileMHuge = 256,    // large M: half the decodes and weight reads per product of the 128-row tile (3 stages of one part)
  // A K unit of the 128-row tile against a 64-row one, in percent (H200, stop 30, harness_k128_h2:
  // one wave of 64 vs 128 blocks of 32 units at 8192^2 M = 96, 128/1 51.5 vs 64/1 41.5 us: 1.24x for
  // 2x the work; 1.78x with its 2-stage ring of 256).
  kWgmmaLargeTileStageCostPct = 124,
  // A K unit of the 96-row tile against a 64-row one (H200, stop 29, harness_wide_tile_g3.txt): one
  // wave of 128 blocks of 32 units at 8192^2, 96/1 at M = 192 against 64/1 at M = 128, 46.4 vs
  // 40.1 us: 1.16x for 1.5x the work (its ring keeps 3 stages).
  kWgmmaWideTileStageCostPct = 116,
  // ... of the 256-row tile (H200, H7 harness_huge_tile_h7.txt: the range its picks are right at all 9
  // points M = 256..512 is 232..247): 8192^2 M = 512, 128 blocks of 32 units 97.9 us against 128/1
  // 110.8 (256 blocks); 14336 x 4096 M = 256 53.9 against 59.5.
  kWgmmaHugeTileStageCostPct = 240,
  kWgmmaMaxStages = 6,
  kWgmmaSmemBytes = 227 * 1024,  // dynamic shared memory a block may take on sm_90
  kWgmmaMaxSplits = 4,      // split-K over a cluster of up to this many blocks (DSMEM reduction)
  kWgmmaMaxMulticast = 4,   // weight tiles sharing one multicast x tile (box j from group position j % multicast)
  kWgmmaMaxClusterBlocks = 8,  // splits x multicast: the portable cluster size (no opt-in)
  kWgmmaAutoMaxSplits = 2,  // ... the plan's: 4 was slower than 2 or 1 at every point of the sweep
  kWgmmaSmallTileMaxM = 64,  // the plan tries 32-row x tiles up to here (measured up to M = 64)
  kWgmmaMinUnitsPerSplit = 4,  // K units (kWgmmaKUnit) per split
  // Past one wave, a split K must cut waves x stages per block by this many percent (H200: a 25%
  // cut at 8192^2 M = 192 ran 10% faster, a 12.5% cut at 14336 x 4096 M = 256 10% slower).
  kWgmmaSplitMinGainPct = 20,
  // Automatic dispatch to the wgmma kernel for kWgmmaMinM <= M <= kWgmmaMaxM (H200, kernel
  // harness, the staged epilogue, harness_staged_epilogue_f3.txt): at M = 32 it beats the staged
  // kernel on 8192^2 (22.2 vs 32.8 us) and 14336 x 4096 (20.2 vs 32.5), ties on 4096 x 14336
  // (30.3 vs 30.2); for 17 <= M <= 32 both run the same 32-row tiles. With the 128-row tile's
  // 128-K stages (stop 30, harness_k128_h2) it beats dequantize + cuBLASLt on all three shapes up
  // to M = 512 (107.6 vs 126.0, 115.5 vs 122.5, 94.9 vs 110.3 us; at 256 stages it lost there).
  kWgmmaMinM = 17,
  kWgmmaMaxM = 512,
  // Weights of at most this many elements (N x K) take wgmma only past the staged kernel's range
  // (kStagedTcMaxM). Llama-3-8B's k/v projections, 1024 x 4096, per product through MLX (stop 34,
  // planab_s34): staged 4.9 / 8.5 us at M = 32 / 64 against wgmma's 11.8 / 8.8; from M = 128 wgmma
  // 11.0 / 14.0 / 23.3 us at 128 / 256 / 512 against dequantize + cuBLASLt's 29.4 / 21.0 / 23.6
  // (in the kernel harness dequantize + cuBLASLt was ahead, 10.8-13.6 against 16.5-19.0 us:
  // through MLX its two launches and its temporary cost more). Measured at this size and at 4096 x
  // 4096 (wgmma faster at every M) only: the boundary between is open.
  kWgmmaMaxSmallWeightElems = 1024 * 4096,
  // The 256-row tile from this M, never split (its DSMEM reduction moves 128 KB per peer: at 8192^2
  // M = 256, 256/2 62.3 against 128/1 54.9 us), taken over the others' best only at a lower cost
  // (a fitting wave does not suffice: at 8192^2 M = 384, padded to 512, it ran 105.3 against 96/1 89.7).
  kWgmmaHugeTileMinM = 256,

  // Element-wise kernels (epilogue): threads per block.
  kElementwiseThreads = 256,
  // Dequantize: threads per block, 32-bit words (8 values) per thread and pass.
  kDequantThreads = 128,
  kDequantWords = 4,
};

// The wgmma kernel's x tiles, narrowest first (the plan tries them in this order; a forced
// MLX_FP4_CUDA_WGMMA tile must be one of them; each has a kernel instantiation).
inline constexpr int kWgmmaTileMs[] = {kWgmmaTileMSmall, kWgmmaTileMMid, kWgmmaTileMWide, kWgmmaTileMLarge,
                                       kWgmmaTileMHuge};
inline constexpr bool is_wgmma_tile_m(int tm) {  // host code: the plan and its override parser
  for (int t : kWgmmaTileMs)
    if (t == tm) return true;
  return false;
}
// K of one ring stage of a tile: two parts, but one for the 128- and 256-row tiles, whose rings
// then hold 5 and 3 stages (H200, stop 30: at 14336 x 4096 M = 128 31.7 against 40.5 us with
// stages of 256); one part for the others was 3-11% slower at M = 32 and 64 (twice the barrier
// round trips).
FP4_FN constexpr int wgmma_stage_k(int tm) { return tm >= kWgmmaTileMLarge ? kWgmmaPartK : kWgmmaKUnit; }

// Warps a tensor-core block may hold: the staged kernel with one x tile has its deep variant, every
// other tile and the register-prefetch kernel kMaxWarpsPerBlock.
FP4_FN constexpr int tc_max_warps(bool staged, int mt) {
  return staged && mt == 1 ? kMaxStagedWarpsPerBlock : kMaxWarpsPerBlock;
}

// Scale bytes per weight row and 128-wide step (8 NVFP4, 4 MXFP4): the staged kernel's scale copies.
FP4_FN constexpr int stage_scale_bytes_per_step(int mode) { return kStepK / fp4::block_size(mode); }

}  // namespace cuda_tiling
}  // namespace fp4
