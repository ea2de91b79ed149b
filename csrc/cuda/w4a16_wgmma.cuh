// wgmma kernel (sm_90a only; other targets compile empty bodies and the plan never picks it there):
// weights decoded from FP4 + E4M3 in registers straight into the A operand of wgmma m64nNk16, x
// (permuted, see below) as the shared-memory B operand, both copied by TMA. Included by
// w4a16_matmul.cu only.
//
// Block: warpgroup 0 is the producer (one thread issues the TMA copies of each stage: x, weight
// and scale tiles, into a ring of stages completing on mbarriers); warpgroups 1..kWgmmaConsumers
// each own kWgmmaRows weight rows and all tile_m x rows of the block (the wgmma D = W x^T tile).
// setmaxnreg moves registers from the producer to the consumers. Split K: the `splits` blocks of
// one weight tile (consecutive blockIdx.x) take consecutive K ranges and the first adds the
// others' accumulators from their shared memory (DSMEM) in rank order, so the sum is
// deterministic. Then global scale, epilogue, cast. Multicast: `multicast` consecutive weight
// tiles share one x tile; each of their blocks copies 1/multicast of every x stage and the TMA
// multicast writes it into all of them, which cuts the L2 reads of x (the largest operand of a
// stage: 32 KB of x against 18 KB of weights and scales at 64 x rows). A cluster is the
// splits x multicast blocks along x (as MLX's graph cache expects), rank = tile_in_group *
// splits + split; a slot is refilled only once every block of the group has released it.
//
// Lane layout. The decode of one 32-bit word of 8 nibbles (fp4_word) gives the pairs (j, j + 4),
// j = 0..3; wgmma wants lane t of a warp to hold A columns (2t, 2t + 1) and (2t + 8, 2t + 9) of a
// 16-wide slice. K runs in parts of kWgmmaPartK = 128 (8 slices, one set of A registers): lane t
// takes the 32 values at 32t .. 32t + 31 of each of its two rows (g, g + 8), one 16-byte load: word
// r (k = 32t + 8r) feeds slices 2r (pairs 0, 1) and 2r + 1 (pairs 2, 3). So slice s = 2r + h,
// column 2t + e (+ 8c) reads k = 32t + 8r + 2h + c + 4e: x is permuted into that order once per
// call (w4a16_wgmma_permute_x_kernel), the weights stay in MLX's layout.
//
// Stages. A stage of the ring is wgmma_stage_k(tile_m) of K: two parts (kWgmmaKUnit) for tiles up
// to 96 rows, one for the 128- and 256-row tiles, whose rings then hold 5 and 3 stages (a 2-stage
// ring starved the 128-row tile: 1.25-1.45x slower than 3, docs/wgmma.md). Each part's weights are their own
// TMA box of 64-byte rows (unswizzled: a quarter warp's 16-byte reads hit distinct banks); a
// stage's scales are the 16-byte box of its K unit (TMA's minimum box and, found on the H200, an
// inner coordinate that must be 16-byte aligned: a box at 8 bytes faulted), which two 128-K
// stages both load.
#pragma once
#include <cooperative_groups.h>
#include <cuda.h>

#include <type_traits>

#include "w4a16_device.cuh"
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "w4a16_wgmma_mma.cuh"
#endif

namespace mlx_fp4 {
namespace cuda {
namespace {

using namespace fp4::cuda_tiling;

// Bytes of one stage of the ring: x (tile_m rows of wgmma_stage_k 16-bit values), the weight rows
// of each part (kWgmmaPartK / 2 bytes each) and a scale box per row; all multiples of 1024
// (128-byte swizzle atoms of x).
__host__ __device__ constexpr int wgmma_x_stage_bytes(int tile_m) { return tile_m * wgmma_stage_k(tile_m) * 2; }
__host__ __device__ constexpr int wgmma_w_part_bytes() { return kWgmmaBlockRows * kWgmmaPartK / fp4::kValuesPerByte; }
__host__ __device__ constexpr int wgmma_w_stage_bytes(int tile_m) {
  return wgmma_w_part_bytes() * (wgmma_stage_k(tile_m) / kWgmmaPartK);
}
__host__ __device__ constexpr int wgmma_s_stage_bytes() { return kWgmmaBlockRows * kWgmmaScaleBox; }
__host__ __device__ constexpr int wgmma_stage_bytes(int tile_m) {
  return wgmma_x_stage_bytes(tile_m) + wgmma_w_stage_bytes(tile_m) + wgmma_s_stage_bytes();
}
constexpr int kWgmmaAlign = 1024;  // 128-byte swizzle atoms: 8 rows of 128 bytes
__host__ __device__ constexpr int wgmma_stages(int tile_m) {
  return (kWgmmaSmemBytes - kWgmmaAlign) / wgmma_stage_bytes(tile_m) < kWgmmaMaxStages
             ? (kWgmmaSmemBytes - kWgmmaAlign) / wgmma_stage_bytes(tile_m)
             : kWgmmaMaxStages;
}
__host__ __device__ constexpr int wgmma_smem_bytes(int tile_m) {
  return wgmma_stages(tile_m) * wgmma_stage_bytes(tile_m) + kWgmmaAlign;
}

// Position `pos` (0..kWgmmaPartK - 1) of a permuted part holds x at this k offset of the part (see top).
__host__ __device__ __forceinline__ int wgmma_permuted_k(int pos) {
  const int s = pos >> 4, c = (pos >> 3) & 1, t = (pos >> 1) & 3, e = pos & 1;
  return kLaneK * t + fp4::kValuesPerWord * (s >> 1) + 2 * (s & 1) + c + 4 * e;
}

// x -> xp: one thread writes 8 consecutive permuted values (16 bytes); zeros past K. With a row
// map (the grouped kernel), row m of xp is x row rows[m] (zeros where negative).
template <typename T>
__global__ void w4a16_wgmma_permute_x_kernel(const WgmmaPermuteArgs pa) {
  constexpr int kChunk = 8;
  const int64_t chunks_per_row = pa.kp / kChunk;
  const T* x = static_cast<const T*>(pa.x);
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < pa.m * chunks_per_row;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = idx / chunks_per_row;
    const int64_t src = pa.rows ? int64_t(pa.rows[m]) : m;
    const int64_t p0 = (idx % chunks_per_row) * kChunk;
    const int64_t part_k = p0 / kWgmmaPartK * kWgmmaPartK;
    const int pos = static_cast<int>(p0 - part_k);
    uint16_t v[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const int64_t k = part_k + wgmma_permuted_k(pos + i);
      const T xv = k < pa.k && src >= 0 ? x[src * pa.k + k] : T(0.0f);
      v[i] = reinterpret_cast<const uint16_t&>(xv);
    }
    uint4 out;
    out.x = v[0] | (uint32_t(v[1]) << 16);
    out.y = v[2] | (uint32_t(v[3]) << 16);
    out.z = v[4] | (uint32_t(v[5]) << 16);
    out.w = v[6] | (uint32_t(v[7]) << 16);
    *reinterpret_cast<uint4*>(static_cast<T*>(pa.xp) + m * pa.kp + p0) = out;
  }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// ------------------------------------------------------------------------------------------
// sm_90a primitives: mbarriers, TMA, wgmma fences, register reallocation.

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// Arrive on the barrier at the same shared-memory offset in block `rank` of the cluster.
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, unsigned rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  }
}
// 2D TMA tile copy global -> shared (this block), completing on `bar`. c0: inner coordinate.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}
// The same copy into the same shared-memory offset of every block in `mask` (cluster ranks),
// completing on the barrier at `bar`'s offset in each of them.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                                      uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;"
      ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar)), "h"(mask)
      : "memory");
}
// A consumer warp's release of a slot to every block of its multicast group (remote arrives). Out
// of line: each arrive compiles to a fenced sequence (MEMBAR.ALL.GPU, ERRBAR, CGAERRBAR) that would
// otherwise sit, per peer, in the K loop's code, which multicast 1 never runs.
__device__ __noinline__ void mbar_release_group(uint64_t* bar, unsigned mcast, unsigned splits, unsigned split) {
  for (unsigned peer = 0; peer < mcast; ++peer) mbar_arrive_cluster(bar, peer * splits + split);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across the asynchronous wgmma.
template <int N>
__device__ __forceinline__ void wgmma_pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Descriptor of a K-major B tile in shared memory with the 128-byte swizzle: rows of 128 bytes,
// 8-row atoms 1024 bytes apart (stride byte offset), leading byte offset unused (1).
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr) {
  constexpr uint64_t kLeading = 1, kStride = kWgmmaAlign >> 4, kSwizzle128 = 1;
  return uint64_t((addr & 0x3FFFF) >> 4) | (kLeading << 16) | (kStride << 32) | (kSwizzle128 << 62);
}

// A operands of the 8 slices of a part for this lane: rows r0 and r0 + 8 of the part's weight
// tile (rows of kWgmmaPartK / 2 bytes), the lane's 16 bytes (4 words) of each, block scales from
// the table. sc0 / sc1: the lane's 2 scale bytes (blocks 2t, 2t + 1 of the part) of rows r0, r0 + 8.
template <typename T>
__device__ __forceinline__ void wgmma_decode_part(uint32_t (&A)[8][4], const uint8_t* w, int r0, int t, uint32_t sc0,
                                                  uint32_t sc1, const uint32_t* s_scale) {
  using Mma = Mma16<T>;
  constexpr int kRowBytes = kWgmmaPartK / fp4::kValuesPerByte;
  const uint4 v0 = *reinterpret_cast<const uint4*>(w + r0 * kRowBytes + t * kLaneBytes);
  const uint4 v1 = *reinterpret_cast<const uint4*>(w + (r0 + 8) * kRowBytes + t * kLaneBytes);
  const uint32_t w0[4] = {v0.x, v0.y, v0.z, v0.w};
  const uint32_t w1[4] = {v1.x, v1.y, v1.z, v1.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    // Word q starts at k = 32t + 8q: the lane's scale byte q / 2.
    const int sb = 8 * (q >> 1);
    const uint32_t s0 = s_scale[(sc0 >> sb) & 0xFFu];
    const uint32_t s1 = s_scale[(sc1 >> sb) & 0xFFu];
    uint32_t p0[4], p1[4];
    fp4_word<T>(w0[q], p0);
    fp4_word<T>(w1[q], p1);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      A[2 * q + h][0] = Mma::mul(p0[2 * h], s0);      // row g, columns 2t, 2t + 1
      A[2 * q + h][1] = Mma::mul(p1[2 * h], s1);      // row g + 8
      A[2 * q + h][2] = Mma::mul(p0[2 * h + 1], s0);  // row g, columns 2t + 8, 2t + 9
      A[2 * q + h][3] = Mma::mul(p1[2 * h + 1], s1);
    }
  }
}

// One part of a stage: 8 wgmma over slices 8 * part .. 8 * part + 7 of the stage's x tile (TMA
// boxes of kWgmmaXBoxK values; a slice is 32 bytes into its box's 128-byte rows).
// x_desc: the descriptor of the stage's x tile; a slice's is that plus its byte offset / 16 (the
// address field's unit; shared addresses stay below 2^18, so the sum never carries out of it).
template <typename T, int TM>
__device__ __forceinline__ void wgmma_issue_part(float (&acc)[TM / 2], const uint32_t (&A)[8][4], uint64_t x_desc,
                                                 int part) {
  constexpr int kSlicesPerBox = kWgmmaXBoxK / kWgmmaSliceK;
  constexpr int kSliceBytes = kWgmmaSliceK * 2;
  wgmma_fence();
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int s = 8 * part + i;
    const uint32_t offset = (s / kSlicesPerBox) * (TM * kWgmmaXBoxK * 2) + (s % kSlicesPerBox) * kSliceBytes;
    wgmma_rs<T, TM>(acc, A[i], x_desc + (offset >> 4));
  }
  wgmma_commit();
}
// Row stride (floats) of the staged output tile: 4 floats of padding put the rows 2t of a lane
// quad (t = 0..3) in different banks.
constexpr int kWgmmaTileStride = kWgmmaBlockRows + 4;

// The consumer threads only (named barrier 1; the producer warps may have left).
__device__ __forceinline__ void wgmma_consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kWgmmaConsumers * 128) : "memory");
}

// Columns one thread takes in the output loop: one 16-byte store of 16-bit outputs.
constexpr int kWgmmaOutVec = sizeof(uint4) / sizeof(uint16_t);
constexpr int kFloatsPerVec = sizeof(float4) / sizeof(float);

// kWgmmaOutVec floats of a staged tile row (this block's or a peer's, 16-byte aligned) into v, or
// added to v in that order.
__device__ __forceinline__ void wgmma_tile_run(const float* src, float (&v)[kWgmmaOutVec], bool add) {
#pragma unroll
  for (int q = 0; q < kWgmmaOutVec / kFloatsPerVec; ++q) {
    const float4 f = reinterpret_cast<const float4*>(src)[q];
    const float g[kFloatsPerVec] = {f.x, f.y, f.z, f.w};
#pragma unroll
    for (int e = 0; e < kFloatsPerVec; ++e) v[kFloatsPerVec * q + e] = add ? v[kFloatsPerVec * q + e] + g[e] : g[e];
  }
}

// kWgmmaOutVec outputs at element i (a multiple of kWgmmaOutVec of a 16-byte aligned array) in
// 16-byte stores, rounded as store_from_float rounds.
__device__ __forceinline__ void store_run(void* out, int dtype, int64_t i, const float (&v)[kWgmmaOutVec]) {
  if (dtype == fp4::kDtypeF32) {
    float4* dst = reinterpret_cast<float4*>(static_cast<float*>(out) + i);
#pragma unroll
    for (int q = 0; q < kWgmmaOutVec / kFloatsPerVec; ++q)
      dst[q] = make_float4(v[kFloatsPerVec * q], v[kFloatsPerVec * q + 1], v[kFloatsPerVec * q + 2], v[kFloatsPerVec * q + 3]);
    return;
  }
  uint32_t w[kWgmmaOutVec / 2];
#pragma unroll
  for (int e = 0; e < kWgmmaOutVec / 2; ++e) {
    if (dtype == fp4::kDtypeF16) {
      const __half2 h = __floats2half2_rn(v[2 * e], v[2 * e + 1]);
      w[e] = reinterpret_cast<const uint32_t&>(h);
    } else {
      const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
      w[e] = reinterpret_cast<const uint32_t&>(b);
    }
  }
  *reinterpret_cast<uint4*>(static_cast<uint8_t*>(out) + i * fp4::dtype_bytes(dtype)) = make_uint4(w[0], w[1], w[2], w[3]);
}

// D fragment -> tile: register 4j + c holds weight row r0 (+ 8 when c & 2), x row 8j + 2t + (c & 1).
template <int TM>
__device__ __forceinline__ void wgmma_stage_tile(const float (&acc)[TM / 2], float* tile, int r0, int t) {
#pragma unroll
  for (int j = 0; j < TM / 8; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c)
      tile[(8 * j + 2 * t + (c & 1)) * kWgmmaTileStride + r0 + ((c & 2) ? 8 : 0)] = acc[4 * j + c];
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// kGrouped: grid y is the plan's tiles of TM rows of one expert (W4A16Args::group_*, no split
// K, no multicast): x rows from the tile's first in the gathered, permuted xp (sorted order), the
// expert's weight rows from maps over all experts' rows, stores through out_rows. Rows of the next
// expert or group that a tile's copies cover are computed and never stored.
template <typename T, int TM, bool kGrouped = false>
__global__ void __launch_bounds__(kWgmmaThreads, 1) w4a16_wgmma_kernel(const __grid_constant__ WgmmaArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kStages = wgmma_stages(TM);
  constexpr int kStageBytes = wgmma_stage_bytes(TM);
  constexpr int kXBytes = wgmma_x_stage_bytes(TM);
  constexpr int kWBytes = wgmma_w_stage_bytes(TM);
  constexpr int kStageK = wgmma_stage_k(TM);
  constexpr int kParts = kStageK / kWgmmaPartK;         // parts (sets of A registers) per stage
  constexpr int kUnitStages = kWgmmaKUnit / kStageK;   // stages per K unit (one scale box)
  constexpr int kConsumerWarps = kWgmmaConsumers * 4;
  constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128 * 40 + 256 * 232 <= 64K registers
  constexpr int kWgmmaXBoxes = kStageK / kWgmmaXBoxK;
  static_assert(kStages >= 2, "the ring needs two stages");
  static_assert(kParts == 1 || kParts == 2, "the consumers' loop runs two parts per pass");
  static_assert(TM * kWgmmaTileStride * 4 <= kStages * kStageBytes, "the output tile must fit in the ring");
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages];
  __shared__ uint32_t s_scale[256];
  // Aligned by an offset from smem_raw (not through an integer): the compiler keeps knowing the
  // pointer is shared memory and emits LDS, not generic loads with 64-bit address arithmetic.
  uint8_t* smem = smem_raw + (kWgmmaAlign - smem_addr(smem_raw) % kWgmmaAlign) % kWgmmaAlign;
  const W4A16Args& a = args.a;
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const unsigned splits = static_cast<unsigned>(args.splits);
  const unsigned mcast = static_cast<unsigned>(args.multicast);
  const bool clustered = splits * mcast > 1;
  const int64_t tile = blockIdx.x / splits;
  const int64_t n_base = tile * kWgmmaBlockRows;
  // x rows [m_base, m_base + TM) of the copies, of which the first m_rows are stored; weight rows
  // from w_base + n_base of the maps.
  int64_t m_base = int64_t(blockIdx.y) * TM, m_rows = a.p.m - m_base, w_base = 0;
  const float* multiplier = a.global_scale;
  if constexpr (kGrouped) {
    bool live = true;
    const GroupTile gt = group_tile(a, blockIdx.y, live);
    if (!live) return;  // uniform per block, before any barrier (no cluster when grouped)
    m_base = gt.row0;
    m_rows = gt.rows;
    w_base = gt.expert * a.p.n;
    multiplier = expert_multiplier(a, gt.expert);
  }
  const unsigned split = blockIdx.x % splits;
  const unsigned group_pos = static_cast<unsigned>(tile % mcast);  // rank = group_pos * splits + split
  // Splits cut K at whole units (k_stages is a multiple of kUnitStages: K is padded to
  // kWgmmaKUnit), so every block runs an even number of parts.
  const int64_t units = args.k_stages / kUnitStages;
  const int64_t st_begin = units * split / splits * kUnitStages;
  const int nst = static_cast<int>(units * (split + 1) / splits * kUnitStages - st_begin);
  uint16_t group_mask = 0;  // the ranks sharing this block's x tile and K range
  for (unsigned peer = 0; peer < mcast; ++peer) group_mask |= uint16_t(1u << (peer * splits + split));

  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], kConsumerWarps * static_cast<int>(mcast));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  fill_scale_table<T>(s_scale);  // ends with __syncthreads: barriers and table visible

  namespace cg = cooperative_groups;
  // Peers copy into this block's ring and arrive on its barriers: all must be initialized first.
  if (mcast > 1) cg::this_cluster().sync();
  const int warp = (tid / 32) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  if (wg == 0) {
    // Producer. The accumulators live in the consumers' branch only: a value live across this
    // branch would have to fit the producer's few registers (it went to local memory).
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    if (tid == 0) {
#pragma unroll 1
      for (int i = 0; i < nst; ++i) {
        const int slot = i % kStages;
        if (i >= kStages) mbar_wait(&empty[slot], ((i / kStages) - 1) & 1);
        uint8_t* base = smem + slot * kStageBytes;
        const int st = static_cast<int>(st_begin + i);
        // The whole stage lands here (peers multicast their share of x): expect all of it.
        mbar_expect_tx(&full[slot], kStageBytes);
#pragma unroll
        for (int j = 0; j < kWgmmaXBoxes; ++j) {
          // Box j comes from group position j % mcast (two boxes and 4 peers: two copy none).
          uint8_t* dst = base + j * (TM * kWgmmaXBoxK * 2);
          const int c0 = st * kStageK + j * kWgmmaXBoxK;
          if (mcast == 1) {
            tma_load_2d(dst, &args.x_map, &full[slot], c0, static_cast<int>(m_base));
          } else if (unsigned(j) % mcast == group_pos) {
            tma_load_2d_multicast(dst, &args.x_map, &full[slot], c0, static_cast<int>(m_base), group_mask);
          }
        }
#pragma unroll
        for (int part = 0; part < kParts; ++part)
          tma_load_2d(base + kXBytes + part * wgmma_w_part_bytes(), &args.w_map, &full[slot],
                      (st * kParts + part) * (kWgmmaPartK / fp4::kValuesPerByte), static_cast<int>(w_base + n_base));
        tma_load_2d(base + kXBytes + kWBytes, &args.s_map, &full[slot], st / kUnitStages * kWgmmaScaleBox,
                    static_cast<int>(w_base + n_base));
      }
    }
    if (clustered) {  // the barriers of the consumers' reduction and exit below
      __syncthreads();
      cg::this_cluster().sync();
      cg::this_cluster().sync();
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
  const int r0 = (wg - 1) * kWgmmaRows + warp * 16 + g;  // this lane's first weight row in the tile
  float acc[TM / 2];
#pragma unroll
  for (int i = 0; i < TM / 2; ++i) acc[i] = 0.0f;
  // Part j decodes into A[j % 2] while part j - 1's wgmma run from the other set; after issuing,
  // it waits for part j - 1's group (one group in flight), and when that part ended its stage,
  // releases the stage's slot. Parts come in pairs (sub = 0, kParts - 1: compile-time, so no
  // branch sits between the wgmma: a conditional one made ptxas serialize them, C7513).
  int slot = 0, prev_slot = kStages - 1;
  uint32_t phase = 0, sc0 = 0, sc1 = 0;
  const uint8_t* base = smem;
  const auto run_part = [&](int j, uint32_t (&A)[8][4], auto sub_c) {
    constexpr int sub = decltype(sub_c)::value;  // the part's index in its stage
    if constexpr (sub == 0) {
      mbar_wait(&full[slot], phase);
      __syncwarp();  // the wgmma instructions below are warp-aligned: reconverge after the spin
      base = smem + slot * kStageBytes;
      // The lane's 2 scale bytes per part of rows r0 and r0 + 8 (both parts' when kParts = 2):
      // the stage's 8 bytes per part sit at (its index in the K unit) x 8 of the unit's box.
      constexpr int kPartScaleBytes = kWgmmaPartK / fp4::kBlockSize;
      const int unit_part = (j / kParts % kUnitStages) * kParts;
      const uint8_t* sc = base + kXBytes + kWBytes + unit_part * kPartScaleBytes + 2 * t;
      const auto scale_pair = [&](int row, int part) {  // 2-byte aligned: rows of 16 bytes, even offsets
        return uint32_t(*reinterpret_cast<const uint16_t*>(sc + row * kWgmmaScaleBox + part * kPartScaleBytes));
      };
      sc0 = scale_pair(r0, 0);
      sc1 = scale_pair(r0 + 8, 0);
      if constexpr (kParts == 2) {
        sc0 |= scale_pair(r0, 1) << 16;
        sc1 |= scale_pair(r0 + 8, 1) << 16;
      }
    }
    wgmma_decode_part<T>(A, base + kXBytes + sub * wgmma_w_part_bytes(), r0, t, sc0 >> (16 * sub),
                         sc1 >> (16 * sub), s_scale);
    wgmma_pin<TM / 2>(acc);
    wgmma_issue_part<T, TM>(acc, A, wgmma_desc(smem_addr(base)), sub);
    wgmma_wait<1>();  // part j - 1 is done: its A set may be overwritten
    wgmma_pin<TM / 2>(acc);
    if constexpr (sub == 0) {
      // Part j - 1 ended the previous stage: its slot can be refilled.
      if (j > 0 && lane == 0) {
        uint64_t* bar = &empty[prev_slot];
        if (mcast == 1) {
          mbar_arrive(bar);
        } else {
          mbar_release_group(bar, mcast, splits, split);
        }
      }
      __syncwarp();
    }
    if constexpr (sub == kParts - 1) {  // the ring position as counters: kStages need not be a power of 2
      prev_slot = slot;
      if (++slot == kStages) {
        slot = 0;
        phase ^= 1u;
      }
    }
  };
  uint32_t A0[8][4], A1[8][4];
#pragma unroll 1
  for (int j = 0; j < nst * kParts; j += 2) {
    run_part(j, A0, std::integral_constant<int, 0>{});
    run_part(j + 1, A1, std::integral_constant<int, kParts - 1>{});
  }
  wgmma_wait<0>();
  wgmma_pin<TM / 2>(acc);

  // The epilogue runs on a copy of the tile in shared memory (the ring, now unused), not on the
  // registers: a loop over runs of kWgmmaOutVec columns rather than TM / 2 unrolled copies of the
  // epilogue chain (whose code missed the instruction cache: a third of the warp samples at
  // M = 128, ncu), consecutive threads storing consecutive runs. Split K: every split stages its tile and
  // split 0 adds the others' (DSMEM) in rank order, so the sum is deterministic.
  float* out_tile = reinterpret_cast<float*>(smem);
  const int ct = tid - 128;
  if (clustered) {
    __syncthreads();  // every consumer is done with the ring (the producer joins this one)
  } else {
    wgmma_consumer_sync();
  }
  wgmma_stage_tile<TM>(acc, out_tile, r0, t);
  if (clustered) {
    cg::this_cluster().sync();
  } else {
    wgmma_consumer_sync();
  }
  if (split == 0) {
    const unsigned rank = clustered ? cg::this_cluster().block_rank() : 0;
    const float gs = a.p.has_global_scale ? fp4::decode_multiplier(*multiplier) : 1.0f;
    // Whole 16-byte stores when every run of kWgmmaOutVec columns starts 16-byte aligned.
    const bool vec_ok = a.p.n % kWgmmaOutVec == 0 && reinterpret_cast<uintptr_t>(a.out) % sizeof(uint4) == 0;
    constexpr int kRuns = kWgmmaBlockRows / kWgmmaOutVec;  // runs of columns per tile row
    for (int idx = ct; idx < TM * kRuns; idx += kWgmmaConsumers * 128) {
      const int mi = idx / kRuns, col = idx % kRuns * kWgmmaOutVec;  // row of the tile, first weight row
      const int64_t n0 = n_base + col;
      if (mi >= m_rows || n0 >= a.p.n) continue;
      float v[kWgmmaOutVec];
      wgmma_tile_run(out_tile + mi * kWgmmaTileStride + col, v, false);
      for (unsigned r = 1; r < splits; ++r)
        wgmma_tile_run(cg::this_cluster().map_shared_rank(out_tile, rank + r) + mi * kWgmmaTileStride + col, v, true);
      const int64_t m = kGrouped ? int64_t(a.out_rows[m_base + mi]) : m_base + mi;
      if (vec_ok && n0 + kWgmmaOutVec <= a.p.n) {
#pragma unroll
        for (int e = 0; e < kWgmmaOutVec; ++e) v[e] = finish(a, v[e] * kTcAccScale, m, n0 + e, gs);
        store_run(a.out, a.p.out_dtype, m * a.p.n + n0, v);
      } else {
        // Columns past N: no epilogue either (its operands end at N).
#pragma unroll
        for (int e = 0; e < kWgmmaOutVec; ++e)
          if (n0 + e < a.p.n)
            store_from_float(a.out, a.p.out_dtype, m * a.p.n + n0 + e, finish(a, v[e] * kTcAccScale, m, n0 + e, gs));
      }
    }
  }
  // Every block waits for the cluster before leaving: peers may still arrive on its barriers or
  // read its tile.
  if (clustered) cg::this_cluster().sync();
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace
}  // namespace cuda
}  // namespace mlx_fp4
