// Staged tensor-core kernel (K % 128 == 0, aligned rows): weights through a warp-private cp.async
// ring in shared memory, for either scale format. Included by w4a16_matmul.cu only.
#pragma once
#include "w4a16_device.cuh"

namespace mlx_fp4 {
namespace cuda {
namespace {

using namespace fp4::cuda_tiling;

// cp.async: global -> shared without registers; .cg keeps weights out of L1 (read once).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
// Four 8 x 16-byte matrices of shared memory, row addresses from lanes 8j .. 8j + 7 for matrix j:
// lane l receives bytes 4 * (l % 4) .. +3 of row l / 4 of each matrix (register j).
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// ------------------------------------------------------------------------------------------
// Staged tensor-core kernel: the same math and lane layout as w4a16_tc_kernel, for K % kStepK == 0
// with 16-byte aligned weight rows and scale rows aligned to their copy (every stage is full, no
// guards). The register prefetch of w4a16_tc_kernel keeps one step (2 KB per warp) in flight, too
// little to cover DRAM latency. Here each warp copies its weight and scale bytes (cp.async) into
// a private ring of kStages stages in shared memory, kStages - 1 stages ahead, without holding
// registers; x (L2-resident) is prefetched one step ahead in registers.
//  - A stage is SUB steps of one weight-row tile group: per row SUB * 64 weight bytes and SUB * 8
//    (NVFP4) or SUB * 4 (MXFP4) scale bytes. The copies are warp-wide runs of consecutive bytes of a
//    row (SUB * 4 lanes per row), and the scale bytes of a row and stage are one copy (16 bytes for
//    NVFP4 when SUB == 2): the 4-byte scale copies of one lane per row and step cost a fifth of the
//    load-only bandwidth (measured, NVFP4).
//  - Lanes read bytes other lanes copied, hence a __syncwarp after each wait.
//  - The 16-byte chunks are XOR-swizzled per row so that the reads are free of bank conflicts:
//    NVFP4 (16-byte reads, 8 lanes a phase: rows g, g + 1, chunks t): odd rows take the other half
//    of 128 bytes (SUB == 2); MXFP4 reads word t of chunk q of rows g (TcLane) with one ldmatrix
//    per 8 rows (matrix q = chunk q of the 8 rows), so the 8 rows take 8 distinct 16-byte bank groups.

// Bytes per weight row and per scale row of one stage of `sub` steps, and of one ring slot (one
// stage of one warp with `rt` row tiles): the weight rows, then their scale bytes.
__host__ __device__ constexpr int staged_row_bytes(int sub) { return sub * kStepK / fp4::kValuesPerByte; }
__host__ __device__ constexpr int staged_scale_bytes(int sub, int mode) { return sub * stage_scale_bytes_per_step(mode); }
__host__ __device__ constexpr int staged_slot_bytes(int rt, int sub, int mode) {
  return rt * kMmaRows * (staged_row_bytes(sub) + staged_scale_bytes(sub, mode));
}
// XOR of the 16-byte chunk index of row `row` (see above; rows of 64 bytes when SUB == 1 share a
// 128-byte bank line in pairs).
template <int SUB, int Mode>
__device__ __forceinline__ int staged_swizzle(int row) {
  if constexpr (Mode == fp4::kModeMxfp4) return SUB == 2 ? (row & 7) : ((row >> 1) & 3);
  return SUB == 2 ? (row & 1) << 2 : 0;  // chunk index ^ 4 on odd rows: the other half of 128 bytes
}

// The products of one launch: one, a batch over grid z (W4A16Args::batch_*, the gathered op's
// decode), the same batch with runs of one expert merged (runs_view; one row of x per pair), or
// grouped tiles over grid x (W4A16Args::group_*, the gathered op's prefill).
enum StagedProducts : int { kStagedOne = 0, kStagedBatched = 1, kStagedGrouped = 2, kStagedRuns = 3 };

// kMaxWarps: the launch bounds. The deep variant (kMaxStagedWarpsPerBlock, one x tile, one product)
// is its own instantiation so that the others keep the register budget of 256-thread blocks.
template <typename T, int MT, int RT, int SUB, int Mode, int kProducts = kStagedOne, int kMaxWarps = kMaxWarpsPerBlock>
__global__ void __launch_bounds__(kMaxWarps * 32) w4a16_tc_staged_kernel(const W4A16Args args) {
  using Lane = TcLane<Mode>;
  constexpr bool kGrouped = kProducts == kStagedGrouped;
  constexpr bool kRuns = kProducts == kStagedRuns;
  constexpr bool kMappedX = kGrouped || kRuns;  // x rows through x_rows
  extern __shared__ __align__(16) uint8_t ring[];
  W4A16Args view;  // this block's product when batched or grouped (unused otherwise)
  bool live = true, dead = kProducts == kStagedBatched;  // dead: not live and owning NaN rows (batched: always)
  if constexpr (kProducts == kStagedBatched) view = batch_view(args, live);
  if constexpr (kGrouped) view = group_view(args, live);
  if constexpr (kRuns) view = runs_view<kMmaCols * MT>(args, live, dead);
  const W4A16Args& a = kProducts != kStagedOne ? view : args;
  if (!live) {  // uniform per block, before any barrier
    if (dead) batch_fill_nan(a);
    return;
  }
  constexpr int kRows = kMmaRows * RT;               // weight rows of the warp
  constexpr int kRowBytes = staged_row_bytes(SUB);
  constexpr int kScaleBytes = staged_scale_bytes(SUB, Mode);
  constexpr int kStepScaleBytes = stage_scale_bytes_per_step(Mode);
  constexpr int kLanesPerRow = kRowBytes / kLaneBytes;
  constexpr int kRowsPerCopy = 32 / kLanesPerRow;
  constexpr int kWeightCopies = kRows / kRowsPerCopy;  // copy instructions per stage
  constexpr int kSlot = staged_slot_bytes(RT, SUB, Mode);
  constexpr int kScaleOff = kRows * kRowBytes;
  static_assert(kRows <= 32, "one scale copy per row and lane");
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t M = a.p.m, N = a.p.n, K = a.p.k;
  const int64_t m_base = kMappedX ? 0 : int64_t(blockIdx.x) * (kMmaCols * MT);  // one tile of mapped rows
  const int64_t n_base = int64_t(blockIdx.y) * kRows;

  int64_t s_begin, s_end;
  warp_step_range(K / (kStepK * SUB), warp, nwarps, s_begin, s_end);

  uint8_t* mine = ring + warp * (kStages * kSlot);
  const uint32_t mine_s = static_cast<uint32_t>(__cvta_generic_to_shared(mine));
  // Copy sources and ring offsets. Rows past N are clamped (loaded, never stored).
  const uint8_t* wsrc[kWeightCopies];
  uint32_t wdst[kWeightCopies];
#pragma unroll
  for (int i = 0; i < kWeightCopies; ++i) {
    const int r = i * kRowsPerCopy + lane / kLanesPerRow;
    const int c = lane % kLanesPerRow;
    const int64_t n = n_base + r < N ? n_base + r : N - 1;
    wsrc[i] = a.w + n * a.p.w_row_bytes + s_begin * kRowBytes + c * kLaneBytes;
    wdst[i] = mine_s + r * kRowBytes + (c ^ staged_swizzle<SUB, Mode>(r)) * kLaneBytes;
  }
  const int srow = lane < kRows ? lane : kRows - 1;
  const int64_t sn = n_base + srow < N ? n_base + srow : N - 1;
  const uint8_t* ssrc = a.scales + sn * a.p.scale_row_bytes + s_begin * kScaleBytes;
  const uint32_t sdst = mine_s + kScaleOff + srow * kScaleBytes;
  const T* xsrc[MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    int64_t m = m_base + j * kMmaCols + g;
    m = m < M ? m : M - 1;
    if constexpr (kMappedX) m = a.x_rows[m];
    xsrc[j] = static_cast<const T*>(a.x) + m * K + s_begin * SUB * kStepK + Lane::k0(t);
  }

  __shared__ uint32_t s_scale[kScaleTableSize];

  auto issue = [&](int slot) {
#pragma unroll
    for (int i = 0; i < kWeightCopies; ++i) {
      cp_async16(wdst[i] + slot * kSlot, wsrc[i]);
      wsrc[i] += kRowBytes;
    }
    if (lane < kRows) {
      if constexpr (kScaleBytes == 16) {
        cp_async16(sdst + slot * kSlot, ssrc);
      } else if constexpr (kScaleBytes == 8) {
        cp_async8(sdst + slot * kSlot, ssrc);
      } else {
        static_assert(kScaleBytes == 4, "scale copies of 4, 8 or 16 bytes");
        cp_async4(sdst + slot * kSlot, ssrc);
      }
    }
    ssrc += kScaleBytes;
  };
  auto load_x = [&](uint4 (&X)[MT][4]) {
#pragma unroll
    for (int j = 0; j < MT; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q) X[j][q] = load_cached16(xsrc[j] + q * Lane::kQStride);
      xsrc[j] += kStepK;
    }
  };

  float acc[RT][MT][4];
  zero_acc<MT, RT>(acc);

  const int stages = static_cast<int>(s_end > s_begin ? s_end - s_begin : 0);
  // One commit group per stage, empty past the end, so that "all but the newest kStages - 2
  // groups complete" always means "stage i has landed".
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < stages) issue(i);
    cp_async_commit();
  }
  // The scale table while the first stages are in flight: a decode block lives for about one
  // DRAM latency, which filling the table first would add to.
  fill_scale_table<T, Mode>(s_scale);
  // x one step ahead in registers while that fits (MT <= 2); wider x tiles load at the step.
  constexpr bool kPrefetchX = MT <= 2;
  uint4 X[MT][4];
  if (kPrefetchX && stages > 0) load_x(X);
#pragma unroll 1
  for (int i = 0; i < stages; ++i) {
    cp_async_wait<kStages - 2>();
    __syncwarp();  // stage i is in the ring for all lanes; all lanes are done with stage i - 1
    if (i + kStages - 1 < stages) issue((i + kStages - 1) % kStages);
    cp_async_commit();
    const uint8_t* slot = mine + (i % kStages) * kSlot;
    const uint32_t slot_s = mine_s + (i % kStages) * kSlot;
#pragma unroll
    for (int s = 0; s < SUB; ++s) {
      uint4 Xn[MT][4];
      if (!kPrefetchX) {
        load_x(X);
      } else if (s + 1 < SUB || i + 1 < stages) {
        load_x(Xn);
      }
      uint32_t w[RT][2][4];
      uint32_t sp[RT][2][Lane::kScales];
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = rt * kMmaRows + g + 8 * h;
          const uint8_t* sr = slot + kScaleOff + r * kScaleBytes + s * kStepScaleBytes;
          constexpr int kChunksPerStep = kStepK / fp4::kValuesPerByte / kLaneBytes;
          if constexpr (Lane::kMx) {
            // Word q: bytes 4t .. 4t + 3 of block q (chunk q of the step) of row g: matrix q of an
            // ldmatrix whose row l % 8 is row rt * 16 + 8h + l % 8 of the slot. Then the row's 4 scale bytes.
            const int lr = rt * kMmaRows + 8 * h + (lane & 7);
            const int chunk = (s * kChunksPerStep + (lane >> 3)) ^ staged_swizzle<SUB, Mode>(lr);
            ldmatrix_x4(slot_s + lr * kRowBytes + chunk * kLaneBytes, w[rt][h]);
            const uint32_t sc = *reinterpret_cast<const uint32_t*>(sr);
#pragma unroll
            for (int b = 0; b < Lane::kScales; ++b) sp[rt][h][b] = s_scale[(sc >> (8 * b)) & 0xFFu];
          } else {
            const int chunk = (s * kChunksPerStep + t) ^ staged_swizzle<SUB, Mode>(r);
            const uint4 v = *reinterpret_cast<const uint4*>(slot + r * kRowBytes + chunk * kLaneBytes);
            w[rt][h][0] = v.x;
            w[rt][h][1] = v.y;
            w[rt][h][2] = v.z;
            w[rt][h][3] = v.w;
            // This lane's two blocks of 16 (2t, 2t + 1 of the step's 8).
            const uint32_t sc = *reinterpret_cast<const uint16_t*>(sr + 2 * t);
            sp[rt][h][0] = s_scale[sc & 0xFFu];
            sp[rt][h][1] = s_scale[sc >> 8];
          }
        }
      tc_step<T, MT, RT, Mode>(acc, w, sp, X);
      if (kPrefetchX) {
#pragma unroll
        for (int j = 0; j < MT; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) X[j][q] = Xn[j][q];
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with its ring: reuse it for the reduction
  static_assert(MT * RT * 4 * 32 * sizeof(float) <= kStages * kSlot, "reduction must fit in the ring");
  const int64_t chain_row0 = kProducts == kStagedBatched ? batch_chain_row0(args) : kRuns ? int64_t(blockIdx.z) : 0;
  tc_reduce_store<MT, RT, kGrouped>(a, args, acc, reinterpret_cast<float*>(ring), m_base, n_base, tc_acc_scale(Mode),
                                    chain_row0);
}

}  // namespace
}  // namespace cuda
}  // namespace mlx_fp4
