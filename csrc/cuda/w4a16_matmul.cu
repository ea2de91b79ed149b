// CUDA W4A16 matmul: y[M, N] = epilogue(gs * (x[M, K] @ dequantize(w, scales)[N, K]^T)).
// w: [N, w_row_bytes] packed E2M1 (low nibble = even k); scales NVFP4 [N, ceil(K/16)] E4M3 bytes or
// MXFP4 [N, ceil(K/32)] E8M0 bytes (p.mode; every kernel but wgmma takes both, a template parameter).
// This file: kernel handles, launch shapes and the dispatch plan_w4a16 (measured crossovers). The
// kernels, one file each, all in this translation unit:
//  - w4a16_tc_staged.cuh: tensor cores, weights through a cp.async ring (K % 128 == 0, M <= 64);
//  - w4a16_tc.cuh:        tensor cores, register prefetch (any K, M <= 32);
//  - w4a16_simt.cuh:      fp32 FMA for float32 x;
//  - w4a16_dequant.cuh:   exact decode of W for the cuBLASLt GEMM (large M) and the epilogue kernel;
//  - w4a16_wgmma.cuh:     sm_90a wgmma with TMA and warp specialization (16 < M <= 192 on sm_90a);
//  - w4a16_device.cuh:    what they share (decode, epilogue, mma step, reduction).
// No MLX header here (nvcc rejects MLX's fmt-based headers); w4a16_matmul.cpp does the MLX glue.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <string>

#include "../shared/gather_tiling_cuda.h"
#include "../shared/tiling_cuda.h"
#include "strided_copy.cuh"
#include "w4a16_dequant.cuh"
#include "w4a16_kernels.h"
#include "w4a16_simt.cuh"
#include "w4a16_tc.cuh"
#include "w4a16_tc_staged.cuh"
#include "w4a16_wgmma.cuh"

namespace mlx_fp4 {
namespace cuda {
namespace {

using namespace fp4::cuda_tiling;

__device__ float g_const_zero = 0.0f;
__device__ float g_const_one = 1.0f;

// ------------------------------------------------------------------------------------------
// Host side

void throw_cuda(cudaError_t e, const char* what) {
  throw std::runtime_error(std::string("[W4A16Matmul] CUDA backend: ") + what + " failed: " +
                           cudaGetErrorString(e));
}

// Handles per (device, kernel), looked up once: cudaGetFuncBySymbol is a runtime call (a lock and
// a search) that every product would otherwise pay on the host.
CUfunction func_of_symbol(const void* symbol) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) throw_cuda(e, "cudaGetDevice");
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, CUfunction> handles;
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find({device, symbol});
  if (it != handles.end()) return it->second;
  cudaFunction_t f = nullptr;
  e = cudaGetFuncBySymbol(&f, symbol);
  if (e != cudaSuccess) throw_cuda(e, "cudaGetFuncBySymbol");
  return handles[{device, symbol}] = reinterpret_cast<CUfunction>(f);
}

template <typename Kernel>
CUfunction func_of(Kernel kernel) {
  return func_of_symbol(reinterpret_cast<const void*>(kernel));
}

template <typename T, int MT, int RT, int Mode>
CUfunction tc_func_rt(bool vec) {
  if (vec) return func_of(w4a16_tc_kernel<T, MT, RT, true, Mode>);
  return func_of(w4a16_tc_kernel<T, MT, 1, false, Mode>);  // guarded loads: one variant per MT is enough
}

template <typename T, int SUB, int Mode>
CUfunction staged_func_sub(int mt, int rt) {
  switch (mt) {
    case 1: return rt == 1 ? func_of(w4a16_tc_staged_kernel<T, 1, 1, SUB, Mode>) : func_of(w4a16_tc_staged_kernel<T, 1, 2, SUB, Mode>);
    case 2: return rt == 1 ? func_of(w4a16_tc_staged_kernel<T, 2, 1, SUB, Mode>) : func_of(w4a16_tc_staged_kernel<T, 2, 2, SUB, Mode>);
    default: return rt == 1 ? func_of(w4a16_tc_staged_kernel<T, 4, 1, SUB, Mode>) : func_of(w4a16_tc_staged_kernel<T, 4, 2, SUB, Mode>);
  }
}

// The batched staged kernels (tc_batched_launch): one x tile (mt = 1), the decode case; kProducts
// is kStagedBatched or kStagedRuns.
template <typename T, int Mode, int kProducts>
CUfunction batched_staged_func(int rt, int sub) {
  if (sub == kStagedSubSteps) {
    return rt == 1 ? func_of(w4a16_tc_staged_kernel<T, 1, 1, kStagedSubSteps, Mode, kProducts>)
                   : func_of(w4a16_tc_staged_kernel<T, 1, 2, kStagedSubSteps, Mode, kProducts>);
  }
  return rt == 1 ? func_of(w4a16_tc_staged_kernel<T, 1, 1, 1, Mode, kProducts>)
                 : func_of(w4a16_tc_staged_kernel<T, 1, 2, 1, Mode, kProducts>);
}
template <typename T, int Mode>
CUfunction batched_staged_func(int rt, int sub, bool runs) {
  return runs ? batched_staged_func<T, Mode, kStagedRuns>(rt, sub) : batched_staged_func<T, Mode, kStagedBatched>(rt, sub);
}

// The grouped staged kernels (tc_grouped_launch): x tiles of kMaxStagedColTiles x 8 rows, two
// weight-row tiles per warp.
template <typename T, int Mode>
CUfunction grouped_staged_func(int sub) {
  return sub == kStagedSubSteps
             ? func_of(w4a16_tc_staged_kernel<T, kMaxStagedColTiles, 2, kStagedSubSteps, Mode, kStagedGrouped>)
             : func_of(w4a16_tc_staged_kernel<T, kMaxStagedColTiles, 2, 1, Mode, kStagedGrouped>);
}
CUfunction grouped_staged_func_of(int x_dtype, int mode, int sub) {
  if (mode == fp4::kModeMxfp4) {
    return x_dtype == fp4::kDtypeF16 ? grouped_staged_func<__half, fp4::kModeMxfp4>(sub)
                                     : grouped_staged_func<__nv_bfloat16, fp4::kModeMxfp4>(sub);
  }
  return x_dtype == fp4::kDtypeF16 ? grouped_staged_func<__half, fp4::kModeNvfp4>(sub)
                                   : grouped_staged_func<__nv_bfloat16, fp4::kModeNvfp4>(sub);
}

// Either x dtype and scale format.
CUfunction batched_staged_func_of(int x_dtype, int mode, int rt, int sub, bool runs) {
  if (mode == fp4::kModeMxfp4) {
    return x_dtype == fp4::kDtypeF16 ? batched_staged_func<__half, fp4::kModeMxfp4>(rt, sub, runs)
                                     : batched_staged_func<__nv_bfloat16, fp4::kModeMxfp4>(rt, sub, runs);
  }
  return x_dtype == fp4::kDtypeF16 ? batched_staged_func<__half, fp4::kModeNvfp4>(rt, sub, runs)
                                   : batched_staged_func<__nv_bfloat16, fp4::kModeNvfp4>(rt, sub, runs);
}

// The deep variant (more than kMaxWarpsPerBlock warps; one x tile).
template <typename T, int SUB, int Mode>
CUfunction deep_staged_func_sub(int rt) {
  constexpr int kDeep = kMaxStagedWarpsPerBlock;
  return rt == 1 ? func_of(w4a16_tc_staged_kernel<T, 1, 1, SUB, Mode, kStagedOne, kDeep>)
                 : func_of(w4a16_tc_staged_kernel<T, 1, 2, SUB, Mode, kStagedOne, kDeep>);
}

template <typename T, int Mode>
CUfunction staged_func_t(int mt, int rt, int sub, bool deep) {
  if (deep) {
    return sub == kStagedSubSteps ? deep_staged_func_sub<T, kStagedSubSteps, Mode>(rt) : deep_staged_func_sub<T, 1, Mode>(rt);
  }
  return sub == kStagedSubSteps ? staged_func_sub<T, kStagedSubSteps, Mode>(mt, rt) : staged_func_sub<T, 1, Mode>(mt, rt);
}

template <typename T, int Mode>
CUfunction tc_func_t(int mt, int rt, bool vec) {
  switch (mt) {
    case 1: return rt == 1 ? tc_func_rt<T, 1, 1, Mode>(vec) : tc_func_rt<T, 1, 2, Mode>(vec);
    case 2: return rt == 1 ? tc_func_rt<T, 2, 1, Mode>(vec) : tc_func_rt<T, 2, 2, Mode>(vec);
    case 4: return rt == 1 ? tc_func_rt<T, 4, 1, Mode>(vec) : tc_func_rt<T, 4, 2, Mode>(vec);
    default: return tc_func_rt<T, 8, 1, Mode>(vec);
  }
}

// Either tensor-core kernel for x dtype T and the problem's scale format.
template <int Mode>
CUfunction tc_func_mode(int x_dtype, int mt, int rt, bool vec, bool staged, int sub, bool deep) {
  if (staged) {
    return x_dtype == fp4::kDtypeF16 ? staged_func_t<__half, Mode>(mt, rt, sub, deep)
                                     : staged_func_t<__nv_bfloat16, Mode>(mt, rt, sub, deep);
  }
  return x_dtype == fp4::kDtypeF16 ? tc_func_t<__half, Mode>(mt, rt, vec) : tc_func_t<__nv_bfloat16, Mode>(mt, rt, vec);
}

unsigned grid_for_elements(int64_t items) {
  int64_t blocks = ceil_div(items, kElementwiseThreads);
  const int64_t cap = 65535LL * 16;  // grid-stride loops cover the rest
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks);
}

// Grid, block and shared memory of a tensor-core launch (tc_launch without the kernel handle).
Launch tc_launch_shape(const fp4::W4A16Problem& p, const TcConfig& cfg, bool vec, bool staged) {
  Launch l;
  const int rt = vec ? cfg.rt : 1;
  const int64_t gx = ceil_div(p.m, kMmaCols * cfg.mt);
  const int64_t gy = ceil_div(p.n, kMmaRows * rt);
  if (gy > 65535 || gx > 0x7FFFFFFF) {
    throw std::runtime_error("[W4A16Matmul] CUDA backend: N too large for the tensor-core grid");
  }
  l.grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), 1);
  l.block = dim3(32 * cfg.kw, 1, 1);
  l.smem = staged ? static_cast<unsigned>(cfg.kw * kStages * staged_slot_bytes(rt, staged_sub_steps(p.k), p.mode)) : 0;
  return l;
}

}  // namespace

Launch tc_launch(const fp4::W4A16Problem& p, const TcConfig& tile, bool vec, bool staged) {
  staged = staged && vec && tile.mt <= kMaxStagedColTiles;
  // Warps past the chosen kernel's launch bounds never launch (a forced tile on a kernel without
  // the deep variant, e.g. unaligned rows falling back to the register-prefetch kernel).
  TcConfig cfg = tile;
  if (cfg.kw > tc_max_warps(staged, cfg.mt)) cfg.kw = tc_max_warps(staged, cfg.mt);
  Launch l = tc_launch_shape(p, cfg, vec, staged);
  const int rt = vec ? cfg.rt : 1;
  const int sub = staged_sub_steps(p.k);
  const bool deep = staged && cfg.mt == 1 && cfg.kw > kMaxWarpsPerBlock;  // kw is within tc_max_warps here
  l.func = p.mode == fp4::kModeMxfp4 ? tc_func_mode<fp4::kModeMxfp4>(p.x_dtype, cfg.mt, rt, vec, staged, sub, deep)
                                     : tc_func_mode<fp4::kModeNvfp4>(p.x_dtype, cfg.mt, rt, vec, staged, sub, deep);
  return l;
}

Launch tc_batched_launch(const fp4::W4A16Problem& p, const DeviceInfo& dev, bool vec, int64_t products, bool runs,
                         const char* tc_override) {
  const Plan plan = plan_w4a16(p, dev, vec, vec, nullptr, nullptr);
  if (plan.path != Path::kTensorCore || !plan.staged || plan.tc.mt != 1 || products > 65535) return Launch{};
  if (runs && p.m != 1) return Launch{};
  const TcConfig cfg = batched_tc_config(p, dev, plan.tc, products, tc_override);
  Launch l = tc_launch_shape(p, cfg, true, true);
  l.func = batched_staged_func_of(p.x_dtype, p.mode, cfg.rt, staged_sub_steps(p.k), runs);
  l.grid.z = static_cast<unsigned>(products);
  return l;
}

Launch tc_grouped_launch(const fp4::W4A16Problem& p, const DeviceInfo& dev, int64_t max_tiles) {
  const TcConfig cfg = grouped_tc_config(p, dev, max_tiles);
  fp4::W4A16Problem tiles = p;
  tiles.m = max_tiles * kMmaCols * cfg.mt;  // grid x = one block row per tile
  Launch l = tc_launch_shape(tiles, cfg, true, true);
  l.func = grouped_staged_func_of(p.x_dtype, p.mode, staged_sub_steps(p.k));
  return l;
}

template <typename XT, int Mode>
CUfunction simt_func(bool vec, int rows) {
  if (rows == 1) {
    return vec ? func_of(w4a16_simt_kernel<XT, true, 1, Mode>) : func_of(w4a16_simt_kernel<XT, false, 1, Mode>);
  }
  return vec ? func_of(w4a16_simt_kernel<XT, true, kSimtRows, Mode>)
             : func_of(w4a16_simt_kernel<XT, false, kSimtRows, Mode>);
}

template <int Mode>
CUfunction simt_func_of_dtype(int x_dtype, bool vec, int rows) {
  return x_dtype == fp4::kDtypeF32   ? simt_func<float, Mode>(vec, rows)
         : x_dtype == fp4::kDtypeF16 ? simt_func<__half, Mode>(vec, rows)
                                     : simt_func<__nv_bfloat16, Mode>(vec, rows);
}

template <typename OT>
CUfunction dequant_func(bool vec, int mode) {
  if (mode == fp4::kModeMxfp4) {
    return vec ? func_of(w4a16_dequant_kernel<OT, true, fp4::kModeMxfp4>)
               : func_of(w4a16_dequant_kernel<OT, false, fp4::kModeMxfp4>);
  }
  return vec ? func_of(w4a16_dequant_kernel<OT, true, fp4::kModeNvfp4>)
             : func_of(w4a16_dequant_kernel<OT, false, fp4::kModeNvfp4>);
}

Launch simt_launch(const fp4::W4A16Problem& p, bool vec) {
  Launch l;
  const int rows = p.m == 1 ? 1 : kSimtRows;  // one row of x: no redundant passes
  l.func = p.mode == fp4::kModeMxfp4 ? simt_func_of_dtype<fp4::kModeMxfp4>(p.x_dtype, vec, rows)
                                     : simt_func_of_dtype<fp4::kModeNvfp4>(p.x_dtype, vec, rows);
  const int64_t gx = ceil_div(p.n, kSimtWarps);
  int64_t gy = ceil_div(p.m, rows);
  if (gy > 65535) gy = 65535;  // the kernel loops over the remaining rows of x
  if (gx > 0x7FFFFFFF) throw std::runtime_error("[W4A16Matmul] CUDA backend: N too large");
  l.grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), 1);
  l.block = dim3(kSimtWarps * 32, 1, 1);
  return l;
}

Launch dequant_launch(const DequantArgs& d, bool vec) {
  Launch l;
  l.func = d.out_dtype == fp4::kDtypeF32   ? dequant_func<float>(vec, d.mode)
           : d.out_dtype == fp4::kDtypeF16 ? dequant_func<__half>(vec, d.mode)
                                           : dequant_func<__nv_bfloat16>(vec, d.mode);
  const int64_t gx = ceil_div(ceil_div(d.k, 8), int64_t(kDequantThreads) * kDequantWords);
  const int64_t gy = d.n < 65535 ? d.n : 65535;
  l.grid = dim3(static_cast<unsigned>(gx < 65535 ? gx : 65535), static_cast<unsigned>(gy > 0 ? gy : 1), 1);
  l.block = dim3(kDequantThreads, 1, 1);
  return l;
}

Launch epilogue_launch(const fp4::W4A16Problem& p) {
  Launch l;
  l.func = func_of(w4a16_epilogue_kernel);
  l.grid = dim3(grid_for_elements(p.m * p.n), 1, 1);
  l.block = dim3(kElementwiseThreads, 1, 1);
  return l;
}

Launch strided_copy_launch(const StridedCopyArgs& c, int element_bytes) {
  Launch l;
  l.func = element_bytes == 4 ? func_of(strided_copy_kernel<uint32_t>) : func_of(strided_copy_kernel<uint16_t>);
  l.grid = dim3(grid_for_elements(c.elements), 1, 1);
  l.block = dim3(kElementwiseThreads, 1, 1);
  return l;
}

// ------------------------------------------------------------------------------------------
// wgmma path

bool wgmma_built() {
#if defined(MLX_FP4_WGMMA_BUILT)
  return true;
#else
  return false;
#endif
}

int64_t wgmma_padded_k(int64_t k) { return ceil_div(k, kWgmmaKUnit) * kWgmmaKUnit; }

namespace {

// The kernel instantiation of each tile of kWgmmaTileMs (the list is the only place tiles are named).
template <typename T, size_t... I>
CUfunction wgmma_func_t(int tile_m, std::index_sequence<I...>) {
  CUfunction f = nullptr;
  ((tile_m == kWgmmaTileMs[I] ? (f = func_of(w4a16_wgmma_kernel<T, kWgmmaTileMs[I]>)) : f), ...);
  if (!f) throw std::runtime_error("[W4A16Matmul] CUDA backend: no wgmma kernel for tile_m " + std::to_string(tile_m));
  return f;
}
template <typename T>
CUfunction wgmma_func_t(int tile_m) {
  return wgmma_func_t<T>(tile_m, std::make_index_sequence<std::size(kWgmmaTileMs)>{});
}
constexpr int kGroupTileM = fp4::cuda_gather_tiling::kWgmmaGroupTileRows;
CUfunction wgmma_grouped_func(int x_dtype) {
  return x_dtype == fp4::kDtypeF16 ? func_of(w4a16_wgmma_kernel<__half, kGroupTileM, true>)
                                   : func_of(w4a16_wgmma_kernel<__nv_bfloat16, kGroupTileM, true>);
}

// A 2D tensor map over rows of `row_bytes` (16-byte multiple) with boxes of box_inner x box_rows.
void encode_2d(CUtensorMap* map, CUtensorMapDataType type, const void* base, uint64_t inner, uint64_t rows,
               uint64_t row_bytes, uint32_t box_inner, uint32_t box_rows, CUtensorMapSwizzle swizzle) {
  const cuuint64_t dims[2] = {inner, rows};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_inner, box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  // Past the tensor's edges TMA writes zeros: ragged M, N and the K tail need no guards.
  const CUresult r = cuTensorMapEncodeTiled(map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    throw std::runtime_error("[W4A16Matmul] CUDA backend: cuTensorMapEncodeTiled failed (" + std::to_string(r) + ")");
  }
}

}  // namespace

Launch wgmma_permute_launch(const WgmmaPermuteArgs& pa, int x_dtype) {
  Launch l;
  l.func = x_dtype == fp4::kDtypeF16 ? func_of(w4a16_wgmma_permute_x_kernel<__half>)
                                     : func_of(w4a16_wgmma_permute_x_kernel<__nv_bfloat16>);
  l.grid = dim3(grid_for_elements(pa.m * (pa.kp / fp4::kValuesPerWord)), 1, 1);  // a thread per 16-byte run
  l.block = dim3(kElementwiseThreads, 1, 1);
  return l;
}

namespace {
// The three tensor maps: x_rows rows of xp, w_rows rows of the weights and of their scales.
void wgmma_maps(WgmmaArgs& args, const W4A16Args& a, const void* xp, int64_t x_rows, int64_t w_rows, int tile_m) {
  const fp4::W4A16Problem& p = a.p;
  const int64_t kp = wgmma_padded_k(p.k);
  args.a = a;
  args.k_stages = kp / wgmma_stage_k(tile_m);
  const CUtensorMapDataType xt =
      p.x_dtype == fp4::kDtypeF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  encode_2d(&args.x_map, xt, xp, kp, x_rows, kp * 2, kWgmmaXBoxK, tile_m, CU_TENSOR_MAP_SWIZZLE_128B);
  // Weight and scale maps end at K's last byte, not at the row stride: padding bytes of a row
  // (garbage nibbles, scale bytes past ceil(K / 16) that may decode to NaN) read as zeros. A
  // weight box is one part (64-byte rows, unswizzled), a scale box one K unit's 16 bytes.
  encode_2d(&args.w_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.w, fp4::packed_bytes_for_k(p.k), w_rows, p.w_row_bytes,
            kWgmmaPartK / fp4::kValuesPerByte, kWgmmaBlockRows, CU_TENSOR_MAP_SWIZZLE_NONE);
  encode_2d(&args.s_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.scales, fp4::scale_blocks_for_k(p.k), w_rows,
            p.scale_row_bytes, kWgmmaScaleBox, kWgmmaBlockRows, CU_TENSOR_MAP_SWIZZLE_NONE);
}
}  // namespace

void wgmma_prepare(WgmmaArgs& args, const W4A16Args& a, const void* xp, const WgmmaConfig& cfg) {
  wgmma_maps(args, a, xp, a.p.m, a.p.n, cfg.tile_m);
  args.splits = cfg.splits;
  args.multicast = cfg.multicast;
}

void wgmma_prepare_grouped(WgmmaArgs& args, const W4A16Args& a, const void* xp, int64_t rows, int64_t experts) {
  wgmma_maps(args, a, xp, rows, experts * a.p.n, kGroupTileM);
  args.splits = 1;
  args.multicast = 1;
}

Launch wgmma_grouped_launch(const fp4::W4A16Problem& p, int64_t max_tiles) {
  Launch l;
  l.func = wgmma_grouped_func(p.x_dtype);
  const int64_t gx = ceil_div(p.n, kWgmmaBlockRows);
  if (max_tiles > fp4::cuda_gather_tiling::kMaxGridY || gx > 0x7FFFFFFF) {
    throw std::runtime_error("[GatherW4A16Matmul] CUDA backend: problem too large for the grouped wgmma grid");
  }
  l.grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(max_tiles > 0 ? max_tiles : 1), 1);
  l.block = dim3(kWgmmaThreads, 1, 1);
  l.smem = static_cast<unsigned>(wgmma_smem_bytes(kGroupTileM));
  return l;
}

Launch wgmma_launch(const fp4::W4A16Problem& p, const WgmmaConfig& cfg) {
  Launch l;
  l.func = p.x_dtype == fp4::kDtypeF16 ? wgmma_func_t<__half>(cfg.tile_m) : wgmma_func_t<__nv_bfloat16>(cfg.tile_m);
  // The split-K blocks of one weight tile are consecutive in x, then the weight tiles of one
  // multicast group: one cluster (splits * multicast, 1, 1); the tiles rounded up to whole groups
  // (a tile past N reads zeros and stores nothing).
  if (cfg.splits * cfg.multicast > kWgmmaMaxClusterBlocks) {
    throw std::runtime_error("[W4A16Matmul] CUDA backend: wgmma cluster larger than the portable size");
  }
  const int64_t gx = ceil_div(ceil_div(p.n, kWgmmaBlockRows), cfg.multicast) * cfg.multicast * cfg.splits;
  const int64_t gy = ceil_div(p.m, cfg.tile_m);
  if (gy > 65535 || gx > 0x7FFFFFFF) {
    throw std::runtime_error("[W4A16Matmul] CUDA backend: problem too large for the wgmma grid");
  }
  l.grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), 1);
  l.block = dim3(kWgmmaThreads, 1, 1);
  l.smem = static_cast<unsigned>(wgmma_smem_bytes(cfg.tile_m));
  l.cluster = dim3(static_cast<unsigned>(cfg.splits * cfg.multicast), 1, 1);
  return l;
}

CUDA_KERNEL_NODE_PARAMS kernel_node_params(const Launch& l, void** params) {
  CUDA_KERNEL_NODE_PARAMS kp{};
  kp.func = l.func;
  kp.gridDimX = l.grid.x;
  kp.gridDimY = l.grid.y;
  kp.gridDimZ = l.grid.z;
  kp.blockDimX = l.block.x;
  kp.blockDimY = l.block.y;
  kp.blockDimZ = l.block.z;
  kp.sharedMemBytes = l.smem;
  kp.kernelParams = params;
  return kp;
}

cudaGraph_t cluster_kernel_graph(const Launch& l, void** params) {
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaGraphCreate(&g, 0);
  if (e != cudaSuccess) throw_cuda(e, "cudaGraphCreate");
  const CUDA_KERNEL_NODE_PARAMS kp = kernel_node_params(l, params);
  CUgraphNode node = nullptr;
  CUresult r = cuGraphAddKernelNode(&node, reinterpret_cast<CUgraph>(g), nullptr, 0, &kp);
  if (r == CUDA_SUCCESS) {
    CUlaunchAttributeValue attr{};
    attr.clusterDim.x = l.cluster.x;
    attr.clusterDim.y = l.cluster.y;
    attr.clusterDim.z = l.cluster.z;
    r = cuGraphKernelNodeSetAttribute(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &attr);
  }
  if (r != CUDA_SUCCESS) {
    cudaGraphDestroy(g);
    throw std::runtime_error("[W4A16Matmul] CUDA backend: cluster kernel graph node failed (" + std::to_string(r) +
                             ")");
  }
  return g;
}

void preload_kernels() {
  // With lazy module loading (the CUDA 12+ default) a kernel is loaded on first use, which costs
  // milliseconds; do it once for all of them instead of on the first call of each shape.
  for (int dt : {fp4::kDtypeBF16, fp4::kDtypeF16, fp4::kDtypeF32}) {
    fp4::W4A16Problem p{};
    p.m = p.n = p.k = 1;
    p.x_dtype = dt;
    for (bool vec : {true, false}) {
      for (int mode = 0; mode < fp4::kNumModes && dt != fp4::kDtypeF32; ++mode) {
        p.mode = mode;
        for (int mt : {1, 2, 4, 8})
          for (int rt : {1, 2})
            if (mt * rt <= 8) {
              tc_launch(p, TcConfig{mt, rt, 1}, vec, false);
              if (!vec || mt > kMaxStagedColTiles) continue;
              // The staged kernels take more than the default 48 KB of dynamic shared memory. One
              // K per stage shape: a single step, and kStagedSubSteps steps.
              for (int64_t k : {int64_t(kStepK), int64_t(kStepK) * kStagedSubSteps}) {
                p.k = k;
                const Launch l = tc_launch(p, TcConfig{mt, rt, kMaxWarpsPerBlock}, true, true);
                const CUresult r = cuFuncSetAttribute(l.func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                      static_cast<int>(l.smem));
                if (r != CUDA_SUCCESS) throw std::runtime_error("[W4A16Matmul] CUDA backend: cuFuncSetAttribute failed");
                if (mt == 1) {  // the deep variant, with its larger ring
                  const Launch d = tc_launch(p, TcConfig{mt, rt, kMaxStagedWarpsPerBlock}, true, true);
                  if (cuFuncSetAttribute(d.func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                         static_cast<int>(d.smem)) != CUDA_SUCCESS) {
                    throw std::runtime_error("[W4A16Matmul] CUDA backend: cuFuncSetAttribute failed");
                  }
                }
                // The batched and runs (mt = 1) and grouped (the widest tile) variants of the same tile.
                const int sub = staged_sub_steps(k);
                CUfunction variants[2] = {nullptr, nullptr};
                if (mt == 1) {
                  variants[0] = batched_staged_func_of(dt, mode, rt, sub, false);
                  variants[1] = batched_staged_func_of(dt, mode, rt, sub, true);
                }
                if (mt == kMaxStagedColTiles && rt == 2) variants[0] = grouped_staged_func_of(dt, mode, sub);
                for (CUfunction variant : variants) {
                  if (variant && cuFuncSetAttribute(variant, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                    static_cast<int>(l.smem)) != CUDA_SUCCESS) {
                    throw std::runtime_error("[W4A16Matmul] CUDA backend: cuFuncSetAttribute failed");
                  }
                }
              }
              p.k = 1;
            }
      }
      for (int mode = 0; mode < fp4::kNumModes; ++mode) {
        p.mode = mode;
        simt_launch(p, vec);
        p.m = 2;
        simt_launch(p, vec);
        p.m = 1;
        DequantArgs d{};
        d.n = d.k = 1;
        d.out_dtype = dt;
        d.mode = mode;
        dequant_launch(d, vec);
      }
      p.mode = fp4::kModeNvfp4;
    }
  }
  epilogue_launch(fp4::W4A16Problem{});
  if (wgmma_built()) {
    for (int dt : {fp4::kDtypeBF16, fp4::kDtypeF16}) {
      fp4::W4A16Problem p{};
      p.m = p.n = p.k = 1;
      p.x_dtype = dt;
      wgmma_permute_launch(WgmmaPermuteArgs{}, dt);
      // Split K x multicast runs as clusters of up to kWgmmaMaxClusterBlocks (portable: no opt-in).
      const auto allow_smem = [](const Launch& l) {
        const CUresult r = cuFuncSetAttribute(l.func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                              static_cast<int>(l.smem));
        if (r != CUDA_SUCCESS) throw std::runtime_error("[W4A16Matmul] CUDA backend: cuFuncSetAttribute failed");
      };
      for (int tm : kWgmmaTileMs) allow_smem(wgmma_launch(p, WgmmaConfig{tm, 1}));
      allow_smem(wgmma_grouped_launch(p, 1));
    }
  }
  strided_copy_launch(StridedCopyArgs{}, 2);
  strided_copy_launch(StridedCopyArgs{}, 4);
}

const float* device_constant_zero() {
  void* ptr = nullptr;
  const cudaError_t e = cudaGetSymbolAddress(&ptr, g_const_zero);
  if (e != cudaSuccess) throw_cuda(e, "cudaGetSymbolAddress");
  return static_cast<const float*>(ptr);
}

const float* device_constant_one() {
  void* ptr = nullptr;
  const cudaError_t e = cudaGetSymbolAddress(&ptr, g_const_one);
  if (e != cudaSuccess) throw_cuda(e, "cudaGetSymbolAddress");
  return static_cast<const float*>(ptr);
}

}  // namespace cuda
}  // namespace mlx_fp4
