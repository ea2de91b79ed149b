// Framework-free interface of the CUDA W4A16 kernels (w4a16_matmul.cu) and of the cuBLAS step
// (w4a16_cublas.cpp). No MLX here: the MLX glue (w4a16_matmul.cpp) and the standalone harness
// (kernel_harness.cu) both launch through these functions. Kernels are returned as CUfunction
// (cudaGetFuncBySymbol), because MLX's graph nodes reject the runtime handles of another cudart.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "../shared/w4a16_problem.h"
#include "w4a16_plan.h"

namespace mlx_fp4 {
namespace cuda {

// Everything a kernel reads, passed by value (about 300 bytes of kernel parameters).
struct W4A16Args {
  const void* x;                 // [M, K] in p.x_dtype
  const uint8_t* w;              // [N, w_row_bytes]
  const uint8_t* scales;         // [N, scale_row_bytes] E4M3 bytes
  const float* global_scale;     // device scalar, or null
  const void* operands[fp4::kMaxEpilogueOperands];
  void* out;                     // [M, N] in p.out_dtype
  fp4::W4A16Problem p;
  // Grid z as a batch of products (the gathered op's decode, tc_batched_launch): product z reads
  // expert batch_rhs[z] of w/scales (and its multiplier when per expert) and x matrix
  // batch_lhs[z], and writes out rows [z * m, z * m + m); out-of-range indices give NaN rows.
  // Null batch_rhs: one product.
  const uint32_t* batch_lhs;
  const uint32_t* batch_rhs;
  int64_t batch_x_matrices, batch_experts, w_batch_bytes, scale_batch_bytes;
  int global_scale_per_expert;
  // Grid x as the tiles of grouped products (the gathered op's prefill, tc_grouped_launch): tile i
  // is expert group_tiles[2i] from row group_tiles[2i + 1] of its rows group_start[e] * m ..
  // group_start[e + 1] * m of the sorted order (w/scales/multiplier moved as for batch_rhs); row r
  // of that order reads x row x_rows[r] and writes out row out_rows[r] (operands indexed by it).
  // Tiles past *group_num_tiles are idle. Null group_tiles: not grouped.
  const int32_t* group_tiles;
  const int32_t* group_start;
  const int32_t* group_num_tiles;
  const int32_t* x_rows;
  const int32_t* out_rows;
};

// The dequantize + dense GEMM path writes fp32 products here first when it cannot write `out`
// directly, then the epilogue kernel reads them.
struct EpilogueArgs {
  const float* acc;  // [M, N] fp32, global scale already applied when `scaled` is 1
  int scaled;
  W4A16Args a;
};

struct DequantArgs {
  const uint8_t* w;
  const uint8_t* scales;
  void* out;  // [N, K] in out_dtype, exact decode (no global scale)
  int64_t n, k, w_row_bytes, scale_row_bytes;
  int out_dtype;  // fp4::OperandDtype
  int mode;       // fp4::Mode of the scales (nvfp4 when left 0)
  // With a global scale (MLX amax): its decode multiplier is written to `multiplier` for cuBLAS's
  // device alpha, so that the graph keeps one node per product.
  const float* global_scale;
  float* multiplier;
};

// Row-contiguous copy of a strided array of 2- or 4-byte elements (element strides).
struct StridedCopyArgs {
  const void* src;
  void* dst;
  int64_t elements;
  int ndim;
  int64_t shape[fp4::kMaxStridedXDims];
  int64_t strides[fp4::kMaxStridedXDims];
};

struct Launch {
  CUfunction func = nullptr;
  dim3 grid;
  dim3 block;
  unsigned smem = 0;
  dim3 cluster{1, 1, 1};  // blocks per cluster (the wgmma kernel's split K x multicast); 1 = no cluster
};

// The device's SM count and architecture, read once per device; the first call also loads every
// kernel (preload_kernels). Defined by the MLX glue (w4a16_matmul.cpp).
DeviceInfo device_info(int device);

// The staged tensor-core kernel over grid z = `products` (W4A16Args::batch_*), with the tile the
// plan picks for one product of `p` and warps split over the whole grid (batched_tc_config;
// `tc_override` as there); func null when the plan would not take the staged kernel with one x
// tile for it (the caller then takes another kernel). `vec`: staged_loads_ok. `runs`:
// consecutive pairs of one expert as one product (runs_view; p.m == 1 only, else func null).
Launch tc_batched_launch(const fp4::W4A16Problem& p, const DeviceInfo& dev, bool vec, int64_t products,
                         bool runs = false, const char* tc_override = nullptr);
// The grouped staged tensor-core kernel over grid x = `max_tiles` tiles (W4A16Args::group_*) of
// kMaxStagedColTiles x 8 rows; `p` as for one expert (m = rows per pair), staged_loads_ok.
Launch tc_grouped_launch(const fp4::W4A16Problem& p, const DeviceInfo& dev, int64_t max_tiles);

// The wgmma kernel (sm_90a) reads x permuted per 256-wide K stage into a buffer of ours
// ([M, wgmma_padded_k(K)], x's dtype, zero past K) by TMA, next to the weights and scales.
struct WgmmaPermuteArgs {
  const void* x;  // [M, K]
  void* xp;       // [M, kp]
  int64_t m, k, kp;
  const int32_t* rows;  // null: row m of xp is x row m; else x row rows[m], zeros where negative
};
struct WgmmaArgs {
  CUtensorMap x_map, w_map, s_map;  // built by wgmma_prepare
  W4A16Args a;
  int64_t k_stages;  // kp / wgmma_stage_k(tile_m)
  int splits;        // blocks of one weight tile splitting K (WgmmaConfig::splits)
  int multicast;     // weight tiles sharing one multicast x tile (WgmmaConfig::multicast)
};

// Launch descriptions. Each throws std::runtime_error when the CUDA runtime fails.
Launch tc_launch(const fp4::W4A16Problem& p, const TcConfig& cfg, bool vec, bool staged);
Launch simt_launch(const fp4::W4A16Problem& p, bool vec);
Launch dequant_launch(const DequantArgs& d, bool vec);
Launch epilogue_launch(const fp4::W4A16Problem& p);
// wgmma path (Path::kWgmma): permute x into xp, then the kernel. wgmma_prepare fills `args` from
// `a` (tensor maps over xp, a.w, a.scales) and throws std::runtime_error when the driver rejects one.
int64_t wgmma_padded_k(int64_t k);
Launch wgmma_permute_launch(const WgmmaPermuteArgs& pa, int x_dtype);
void wgmma_prepare(WgmmaArgs& args, const W4A16Args& a, const void* xp, const WgmmaConfig& cfg);
Launch wgmma_launch(const fp4::W4A16Problem& p, const WgmmaConfig& cfg);
// The grouped wgmma kernel (the gathered op's prefill) over grid (weight-row tiles of one expert,
// `max_tiles` plan tiles of kWgmmaGroupTileRows rows). `a`: the grouped dense products of every
// expert (W4A16Args::group_*, experts stacked without gaps, p as for one expert); xp: the
// `rows` rows of the sorted order gathered and permuted (wgmma_permute_launch with a.x_rows).
void wgmma_prepare_grouped(WgmmaArgs& args, const W4A16Args& a, const void* xp, int64_t rows, int64_t experts);
Launch wgmma_grouped_launch(const fp4::W4A16Problem& p, int64_t max_tiles);
// A graph of the one kernel launch `l` with its cluster shape as a node attribute, for MLX's
// CommandEncoder::add_graph_node: a kernel node added directly keys MLX's graph cache as "K"
// whatever its cluster shape, and cudaGraphExecUpdate onto such a cached graph keeps the stale
// cluster shape (a later non-cluster kernel then never ran correctly). The caller destroys it.
cudaGraph_t cluster_kernel_graph(const Launch& l, void** params);
// The kernel node parameters of launch `l` (no cluster shape: a node attribute).
CUDA_KERNEL_NODE_PARAMS kernel_node_params(const Launch& l, void** params);
// True when this build holds the sm_90a wgmma kernel (MLX_FP4_WGMMA_BUILT); DeviceInfo::wgmma is
// this and compute capability 9.0.
bool wgmma_built();
Launch strided_copy_launch(const StridedCopyArgs& c, int element_bytes);
// Loads every kernel of this file into the current device's context (lazy loading otherwise
// loads each on its first launch, milliseconds each).
void preload_kernels();

// Dense GEMM on the dequantized weight through cuBLASLt (w4a16_cublas.cpp):
// c[M, N] = alpha * x[M, K] @ wd[N, K]^T, x and wd in `ab_dtype`, c in `c_dtype`, fp32 compute.
// alpha: device pointer (global scale) or null for 1. `workspace` may be null.
// Returns false with a message in `err` (256 chars) on failure.
bool cublas_gemm(void* handle, cudaStream_t stream, int64_t m, int64_t n, int64_t k, const void* x,
                 const void* wd, int ab_dtype, void* c, int c_dtype, const float* alpha_device,
                 void* workspace, size_t workspace_bytes, char* err);
// One cuBLASLt handle per device, created on first use; calls that set up a stream capture around
// cublas_gemm hold cublas_guard() so that captures of two threads do not interleave.
void* cublas_handle(int device, char* err);
std::unique_lock<std::mutex> cublas_guard();
// Device pointers to constants 0.0f and 1.0f (for cuBLAS device pointer mode).
const float* device_constant_zero();
const float* device_constant_one();

}  // namespace cuda
}  // namespace mlx_fp4
