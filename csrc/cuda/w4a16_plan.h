// Kernel choice of the CUDA backend: path and tensor-core tiles for a problem, from crossovers
// measured on an H200 (docs/cuda.md). Host-only and free of CUDA headers, so that the CPU test
// suite checks the dispatch table (tests/test_cuda_plan.py builds tests/cpp/cuda_plan_main.cpp).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "../shared/tiling_cuda.h"
#include "../shared/w4a16_problem.h"

namespace mlx_fp4 {
namespace cuda {

enum class Path : int { kSimt = 0, kTensorCore = 1, kDequantGemm = 2, kWgmma = 3 };

// Tensor-core kernel configuration: x-row tiles of 8 per block (mt), weight-row tiles of 16 per
// warp (rt), warps per block splitting K (kw).
struct TcConfig {
  int mt = 1, rt = 1, kw = 8;
};

struct DeviceInfo {
  int sm_count = 132;
  int cc_major = 9;
  int cc_minor = 0;
  bool wgmma = false;  // the sm_90a wgmma kernel is built and this device runs it (cc 9.0)
};

// wgmma kernel configuration: x rows per block (tile_m: kWgmmaTileMs), blocks of one weight tile
// splitting K (splits: 1, 2, 4) and weight tiles sharing one multicast x tile (multicast: 1, 2,
// 4); a cluster holds splits x multicast <= kWgmmaMaxClusterBlocks blocks. Multicast was slower
// than none at every point of the H200 sweep (docs/wgmma.md): the plan keeps 1, MLX_FP4_CUDA_WGMMA
// forces it.
struct WgmmaConfig {
  int tile_m = 64, splits = 1, multicast = 1;
};

struct Plan {
  Path path = Path::kSimt;
  TcConfig tc;
  bool vec = false;     // 16-byte loads allowed (alignment and K % 8 checked)
  bool staged = false;  // the staged tensor-core kernel applies (staged_loads_ok)
  WgmmaConfig wg;       // for Path::kWgmma
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// x in bf16 or fp16: what the tensor-core kernels (and the gathered decode GEMV) take.
inline bool half_precision_x(const fp4::W4A16Problem& p) {
  return p.x_dtype == fp4::kDtypeBF16 || p.x_dtype == fp4::kDtypeF16;
}

// True when 16-byte loads of w rows and x rows are aligned for this problem and these pointers.
inline bool vector_loads_ok(const fp4::W4A16Problem& p, const void* x, const void* w) {
  return p.k % 8 == 0 && p.w_row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

// Steps of K per stage of the staged kernel: kStagedSubSteps when K is a multiple of that many
// steps (the scale bytes of a row and stage are then one 16-byte copy), else one.
inline int staged_sub_steps(int64_t k) {
  using namespace fp4::cuda_tiling;
  return k % (int64_t(kStagedSubSteps) * kStepK) == 0 ? kStagedSubSteps : 1;
}

// True when the staged tensor-core kernel applies: vector loads, K a multiple of its 128-wide
// step, and scale rows aligned to the stage's scale copy (8 bytes per step, MXFP4 4).
inline bool staged_loads_ok(const fp4::W4A16Problem& p, const void* x, const void* w, const void* scales) {
  using namespace fp4::cuda_tiling;
  if (!vector_loads_ok(p, x, w) || p.k % kStepK != 0) return false;
  const int64_t copy = int64_t(staged_sub_steps(p.k)) * stage_scale_bytes_per_step(p.mode);
  return p.scale_row_bytes % copy == 0 && reinterpret_cast<uintptr_t>(scales) % copy == 0;
}

// True when the wgmma kernel's TMA copies apply: weight and scale rows in whole 16-byte units
// from 16-byte aligned bases (x is first permuted into a buffer of ours, so any x works).
inline bool wgmma_loads_ok(const fp4::W4A16Problem& p, const void* w, const void* scales) {
  constexpr int64_t kTmaUnit = 16;
  return p.w_row_bytes % kTmaUnit == 0 && p.scale_row_bytes % kTmaUnit == 0 &&
         reinterpret_cast<uintptr_t>(w) % kTmaUnit == 0 && reinterpret_cast<uintptr_t>(scales) % kTmaUnit == 0;
}

namespace plan_detail {
using namespace fp4::cuda_tiling;

// "mt,rt,kw" (MLX_FP4_CUDA_TC), or false when malformed.
inline bool parse_tc(const char* s, TcConfig& cfg) {
  int mt = 0, rt = 0, kw = 0;
  if (!s || std::sscanf(s, "%d,%d,%d", &mt, &rt, &kw) != 3) return false;
  if (mt != 1 && mt != 2 && mt != 4 && mt != 8) return false;
  if (rt != 1 && rt != 2) return false;
  if (mt * rt > 8 || kw < 1 || kw > kMaxStagedWarpsPerBlock) return false;  // plan_w4a16 bounds the others
  cfg = TcConfig{mt, rt, kw};
  return true;
}

// MLX_FP4_CUDA_TC as a list: "mt,rt,kw" for every product, or entries "mt,rt,kw@NxK" for one
// weight shape, separated by ';' (one layer's tile inside a model, for A/B timing); the first
// entry that applies wins. False when none applies or any entry is malformed (the whole list is void).
inline bool parse_tc_for(const char* s, int64_t n, int64_t k, TcConfig& cfg) {
  constexpr size_t kEntryChars = 64;
  bool found = false;
  for (const char* e = s; e && *e;) {
    const char* end = std::strchr(e, ';');
    const size_t len = end ? size_t(end - e) : std::strlen(e);
    if (len >= kEntryChars) return false;
    char entry[kEntryChars];
    std::memcpy(entry, e, len);
    entry[len] = '\0';
    char* at = std::strchr(entry, '@');
    long long en = 0, ek = 0;
    char tail = 0;
    if (at) {
      *at = '\0';
      if (std::sscanf(at + 1, "%lldx%lld%c", &en, &ek, &tail) != 2) return false;
    }
    TcConfig c;
    if (!parse_tc(entry, c)) return false;
    if (!found && (!at || (en == n && ek == k))) {
      cfg = c;
      found = true;
    }
    e = end ? end + 1 : nullptr;
  }
  return found;
}

// Warps per block splitting K: doubled while the grid of `blocks` stays within `warp_budget`
// warps and K holds `min_steps` steps per warp before the doubling (staged kernel: 4 two-step
// stages, kStagedMinSteps; register-prefetch kernel: 4 steps, kTcMinSteps).
constexpr int64_t kTcMinSteps = 4;
constexpr int64_t kStagedMinSteps = 4 * 2;
inline int split_k_warps(int64_t blocks, int64_t nsteps, int64_t warp_budget, int64_t min_steps) {
  int kw = 1;
  while (kw < kMaxWarpsPerBlock && blocks * kw * 2 <= warp_budget && nsteps >= min_steps * kw) kw *= 2;
  return kw;
}

// Register-prefetch kernel: two weight-row tiles per warp (x fragments reused twice) when N still
// gives every SM a block, and warps per block (kw) splitting K up to kTcWarpsPerSm warps per SM,
// with at least 4 steps of K per warp.
// Staged kernel (its own measured optimum): two row tiles per warp, and warps per block doubled
// while the grid stays within kStagedWarpsPerSm (8192^2: 4, 14336 x 4096: 2, 4096 x 14336: 8),
// since its ring already keeps two stages per warp in flight. With one row of x (M = 1) its x
// loads are one broadcast row, so one row tile per warp and twice the warps win instead (6-8% on
// 8192^2 and 4096 x 14336, 4% on 14336 x 4096; at M = 8 two row tiles win).
inline TcConfig auto_tc_config(const fp4::W4A16Problem& p, const DeviceInfo& dev, bool staged) {
  TcConfig c;
  const int64_t m = p.m;
  c.mt = m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8;
  if (staged && m <= kStagedTcMaxM && c.mt > kMaxStagedColTiles) c.mt = kMaxStagedColTiles;
  const bool staged_tile = staged && c.mt <= kMaxStagedColTiles;
  const bool one_row = staged_tile && m == 1;
  c.rt = (!one_row && c.mt * 2 <= 8 && (staged_tile || ceil_div(p.n, 2 * kMmaRows) >= dev.sm_count)) ? 2 : 1;
  const int64_t blocks = ceil_div(p.m, kMmaCols * c.mt) * ceil_div(p.n, kMmaRows * c.rt);
  const int64_t nsteps = ceil_div(p.k, kStepK);
  const int warps_per_sm = one_row ? kStagedOneRowWarpsPerSm : staged_tile ? kStagedWarpsPerSm : kTcWarpsPerSm;
  const int64_t warp_budget = int64_t(dev.sm_count) * warps_per_sm;
  c.kw = split_k_warps(blocks, nsteps, warp_budget, staged_tile ? kStagedMinSteps : kTcMinSteps);
  return c;
}
constexpr int64_t kPercent = 100;  // the unit of the K-unit costs and of the split's gain
// Percent of a 64-row tile's K unit that one K unit of tile `tm` costs (H200 fits, tiling_cuda.h).
constexpr int64_t wgmma_unit_cost_pct(int tm) {
  return tm == kWgmmaTileMHuge    ? kWgmmaHugeTileStageCostPct
         : tm == kWgmmaTileMLarge ? kWgmmaLargeTileStageCostPct
         : tm == kWgmmaTileMWide  ? kWgmmaWideTileStageCostPct
                                  : kPercent;
}
// The 256-row tile is weighed against the others' pick, so it must come last.
static_assert(kWgmmaTileMs[std::size(kWgmmaTileMs) - 1] == kWgmmaTileMHuge, "the 256-row tile is tried last");
// wgmma kernel: the x tile (32 rows up to kWgmmaSmallTileMaxM, 64, 96, 128 or 256) and K split (1 or
// 2, each block keeping kWgmmaMinUnitsPerSplit K units, split only while the unsplit tiles leave
// SMs idle) giving the most blocks
// within one wave of dev.sm_count, ties to the least padding of M, then to the wider tile (fewer
// x tiles, more splits); when none fits one wave, the fewest waves x K units per block x unit
// cost (a partial last wave costs a whole one; a K unit of the 96- or 128-row tile
// kWgmmaWideTileStageCostPct or kWgmmaLargeTileStageCostPct of a 64-row one; a deeper split only
// when it cuts that by kWgmmaSplitMinGainPct), ties to the fewest blocks. The 256-row tile, from
// kWgmmaHugeTileMinM and unsplit, replaces that pick only at a lower cost (a unit costs
// kWgmmaHugeTileStageCostPct). This picks the measured best of the H200 sweeps (docs/wgmma.md,
// stops 30 and 31) at all 24 points M = 32..512 on 8192^2, 14336 x 4096 and 4096 x 14336.
inline WgmmaConfig auto_wgmma_config(const fp4::W4A16Problem& p, const DeviceInfo& dev) {
  const int64_t row_tiles = ceil_div(p.n, kWgmmaBlockRows);
  const int64_t units = ceil_div(p.k, kWgmmaKUnit);  // of K
  WgmmaConfig best{kWgmmaTileMMid, 1};
  int64_t best_blocks = -1, best_pad = 0, best_cost = 0;
  for (int tm : kWgmmaTileMs) {
    if (tm == kWgmmaTileMSmall && p.m > kWgmmaSmallTileMaxM) continue;
    const int64_t padded_m = ceil_div(p.m, tm) * tm;
    const bool huge = tm == kWgmmaTileMHuge;  // unsplit, and only where it costs less than the pick so far
    if (huge && p.m < kWgmmaHugeTileMinM) continue;
    for (int sp = 1; sp <= (huge ? 1 : int(kWgmmaAutoMaxSplits)); sp *= 2) {
      if (sp > 1 && units < int64_t(kWgmmaMinUnitsPerSplit) * sp) break;
      // Split K only to fill SMs the unsplit tiles leave idle: past one wave it lost at every
      // measured point (6144 x 4096, M = 384 and 512: 96/2 55.0 vs 96/1 49.4 us, 128/2 63.7 vs 256/1 52.4).
      if (sp > 1 && row_tiles * ceil_div(p.m, tm) >= dev.sm_count) break;
      const int64_t blocks = row_tiles * ceil_div(p.m, tm) * sp;
      // waves x K units per block x unit cost
      const int64_t cost = ceil_div(blocks, dev.sm_count) * ceil_div(units, sp) * wgmma_unit_cost_pct(tm);
      const bool fits = blocks <= dev.sm_count, best_fits = best_blocks >= 0 && best_blocks <= dev.sm_count;
      bool better;
      if (huge) {
        better = cost < best_cost;
      } else if (best_blocks < 0 || fits != best_fits) {
        better = best_blocks < 0 || fits;
      } else if (fits) {
        better = blocks > best_blocks || (blocks == best_blocks && padded_m <= best_pad);
      } else if (sp > best.splits) {  // a deeper split pays for its reduction only with enough gain
        better = cost * kPercent <= best_cost * (kPercent - kWgmmaSplitMinGainPct);
      } else {
        better = cost < best_cost || (cost == best_cost && blocks < best_blocks) ||
                 (cost == best_cost && blocks == best_blocks && padded_m <= best_pad);
      }
      if (better) {
        best = WgmmaConfig{tm, sp};
        best_blocks = blocks;
        best_pad = padded_m;
        best_cost = cost;
      }
    }
  }
  return best;
}

// "tile_m,splits[,multicast]" (MLX_FP4_CUDA_WGMMA), or false when malformed.
inline bool parse_wgmma(const char* s, WgmmaConfig& cfg) {
  int tm = 0, sp = 0, mc = 1;
  if (!s) return false;
  const int got = std::sscanf(s, "%d,%d,%d", &tm, &sp, &mc);
  if (got != 2 && got != 3) return false;
  if (!is_wgmma_tile_m(tm)) return false;
  if (sp != 1 && sp != 2 && sp != 4) return false;
  if (mc != 1 && mc != 2 && mc != 4) return false;
  if (sp * mc > kWgmmaMaxClusterBlocks) return false;
  cfg = WgmmaConfig{tm, sp, mc};
  return true;
}
}  // namespace plan_detail

// Grouped staged kernel (the gathered op's prefill, tc_grouped_launch): x tiles of the widest
// staged tile, two weight-row tiles per warp, warps per block doubled while the grid of
// `max_tiles` x-row tiles stays within kStagedWarpsPerSm per SM and each warp keeps 4 steps of K (the dense rule).
inline TcConfig grouped_tc_config(const fp4::W4A16Problem& p, const DeviceInfo& dev, int64_t max_tiles) {
  using namespace fp4::cuda_tiling;
  TcConfig c{kMaxStagedColTiles, 2, 1};
  const int64_t blocks = max_tiles * ceil_div(p.n, kMmaRows * c.rt);
  const int64_t nsteps = ceil_div(p.k, kStepK);
  c.kw = plan_detail::split_k_warps(blocks, nsteps, int64_t(dev.sm_count) * kStagedWarpsPerSm,
                                    plan_detail::kStagedMinSteps);
  return c;
}

// The batched staged kernel (the gathered op's decode, tc_batched_launch; one x tile): the tile
// of one product (plan_w4a16's), with warps per block split from the whole grid of `products`
// such tiles, not one: one product's split fills the GPU alone, so at 16 tokens (128 pairs) each
// warp would keep a quarter of K and its block's fixed costs. `tc_override`
// (MLX_FP4_CUDA_GATHER_TC, A/B timing): "1,rt,kw" forces a tile, "product" keeps one product's.
inline TcConfig batched_tc_config(const fp4::W4A16Problem& p, const DeviceInfo& dev, const TcConfig& product_tc,
                                  int64_t products, const char* tc_override = nullptr) {
  using namespace fp4::cuda_tiling;
  TcConfig c = product_tc;
  if (tc_override && !std::strcmp(tc_override, "product")) return c;
  if (plan_detail::parse_tc(tc_override, c) && c.mt == 1) {
    if (c.kw > kMaxWarpsPerBlock) c.kw = kMaxWarpsPerBlock;  // no deep variant of the batched kernels
    return c;
  }
  c = product_tc;
  const int warps_per_sm = p.m == 1 ? kStagedOneRowWarpsPerSm : kStagedWarpsPerSm;
  const int64_t blocks = products * ceil_div(p.n, kMmaRows * c.rt);
  c.kw = plan_detail::split_k_warps(blocks, ceil_div(p.k, kStepK), int64_t(dev.sm_count) * warps_per_sm,
                                    plan_detail::kStagedMinSteps);
  return c;
}

// Kernel choice for a problem. `staged`: staged_loads_ok and not disabled. `path_override` /
// `tc_override` come from the environment (MLX_FP4_CUDA_PATH = simt | tc | dequant | wgmma,
// MLX_FP4_CUDA_TC = "mt,rt,kw", or per weight shape: parse_tc_for); null = automatic. `wgmma`: wgmma_loads_ok (the device's
// dev.wgmma is checked here); `wgmma_override`: MLX_FP4_CUDA_WGMMA = "tile_m,splits[,multicast]".
inline Plan plan_w4a16(const fp4::W4A16Problem& p, const DeviceInfo& dev, bool vec, bool staged,
                       const char* path_override, const char* tc_override, bool wgmma = false,
                       const char* wgmma_override = nullptr) {
  using namespace plan_detail;
  Plan plan;
  plan.vec = vec;
  plan.staged = vec && staged;
  const bool half_x = half_precision_x(p);
  plan.tc = auto_tc_config(p, dev, plan.staged);
  if (half_x) {
    // Past kTcMaxM the staged kernel (x tiles of 32 rows) still beats dequantize + cuBLASLt up
    // to kStagedTcMaxM, also with one warp per block (14336 x 4096, M = 64: 58 vs 77 us; docs/cuda.md).
    const bool staged_mid = plan.staged && p.m <= kStagedTcMaxM;
    plan.path = (p.m <= kTcMaxM || staged_mid) ? Path::kTensorCore : Path::kDequantGemm;
  } else {
    plan.path = p.m <= kSimtMaxM ? Path::kSimt : Path::kDequantGemm;
  }
  // Both tensor-core kernels take either scale format. wgmma: sm_90a builds on cc 9.0, 16-bit x,
  // NVFP4 (E4M3 scales), weight and scale rows in whole 16-byte units (wgmma_loads_ok: through
  // MLX, K % 256 == 0); anything else keeps the paths above.
  const bool tc_ok = half_x;
  const bool wgmma_ok = tc_ok && p.mode == fp4::kModeNvfp4 && wgmma && dev.wgmma;
  plan.wg = auto_wgmma_config(p, dev);
  // Small weights keep the staged kernel where it runs (forcing still works).
  const bool wgmma_pays = p.n * p.k > int64_t(kWgmmaMaxSmallWeightElems) || p.m > kStagedTcMaxM;
  if (wgmma_ok && wgmma_pays && p.m >= kWgmmaMinM && p.m <= kWgmmaMaxM) plan.path = Path::kWgmma;
  if (path_override && *path_override) {
    if (!std::strcmp(path_override, "simt")) plan.path = Path::kSimt;
    if (!std::strcmp(path_override, "dequant")) plan.path = Path::kDequantGemm;
    if (!std::strcmp(path_override, "tc") && tc_ok) plan.path = Path::kTensorCore;
    if (!std::strcmp(path_override, "wgmma") && wgmma_ok) plan.path = Path::kWgmma;
  }
  TcConfig forced;
  if (parse_tc_for(tc_override, p.n, p.k, forced)) plan.tc = forced;
  // Only the staged kernel with one x tile has a deep variant (more than kMaxWarpsPerBlock warps).
  const int max_kw = tc_max_warps(plan.staged && plan.tc.mt <= kMaxStagedColTiles, plan.tc.mt);
  if (plan.tc.kw > max_kw) plan.tc.kw = max_kw;
  WgmmaConfig forced_wg;
  if (parse_wgmma(wgmma_override, forced_wg)) plan.wg = forced_wg;
  return plan;
}

}  // namespace cuda
}  // namespace mlx_fp4
