// Staged tensor-core kernel (K % 128 == 0, aligned rows): weights through a warp-private cp.async
// ring in shared memory. Included by w4a16_matmul.cu only.
#pragma once
#include "w4a16_device.cuh"

namespace mlx_fp4 {
namespace cuda {
namespace {

using namespace fp4::cuda_tiling;

// ------------------------------------------------------------------------------------------
// Staged tensor-core kernel: the same math and lane layout as w4a16_tc_kernel, for K % kStepK == 0
// with 16-byte aligned weight rows and 4-byte aligned scale rows (every step is full, no guards).
// The register prefetch of the kernel above keeps one step (2 KB per warp) in flight, too little
// to cover DRAM latency (ncu: 27% of DRAM bandwidth at M=1). Here each lane copies the bytes it
// will read itself (cp.async, so no barrier is needed) into a warp-private ring of kStages steps,
// kStages - 1 steps ahead, without holding registers; x (L2-resident) is prefetched one step ahead
// in registers.

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Bytes of one ring slot (one step of one warp): the weight bytes, then the scale bytes.
template <int RT>
__host__ __device__ constexpr int staged_slot_bytes() {
  return RT * 2 * 32 * (kLaneBytes + kStageScaleBytes);
}

template <typename T, int MT, int RT>
__global__ void __launch_bounds__(kMaxWarpsPerBlock * 32) w4a16_tc_staged_kernel(const W4A16Args a) {
  extern __shared__ __align__(16) uint8_t ring[];
  constexpr int kSlot = staged_slot_bytes<RT>();
  constexpr int kScaleOff = RT * 2 * 32 * kLaneBytes;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t M = a.p.m, N = a.p.n, K = a.p.k;
  const int64_t m_base = int64_t(blockIdx.x) * (kMmaCols * MT);
  const int64_t n_base = int64_t(blockIdx.y) * (kMmaRows * RT);

  const int64_t nsteps = K / kStepK;
  int64_t s_begin, s_end;
  warp_step_range(nsteps, warp, nwarps, s_begin, s_end);

  // Next bytes to copy: 16 weight bytes at k = 32t of each step; the 4 scale bytes holding this
  // lane's two (blocks 2t, 2t + 1 of the step's 8). Rows past N are clamped (never stored).
  const uint8_t* wsrc[RT][2];
  const uint8_t* ssrc[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int64_t n = n_base + rt * kMmaRows + g + 8 * h;
      n = n < N ? n : N - 1;
      wsrc[rt][h] = a.w + n * a.p.w_row_bytes + s_begin * (kStepK / 2) + t * kLaneBytes;
      ssrc[rt][h] = a.scales + n * a.p.scale_row_bytes + s_begin * (kStepK / fp4::kBlockSize) +
                    (t >> 1) * kStageScaleBytes;
    }
  const T* xsrc[MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    int64_t m = m_base + j * kMmaCols + g;
    m = m < M ? m : M - 1;
    xsrc[j] = static_cast<const T*>(a.x) + m * K + s_begin * kStepK + t * kLaneK;
  }

  __shared__ uint32_t s_scale[256];
  fill_scale_table<T>(s_scale);

  uint8_t* mine = ring + warp * (kStages * kSlot);
  const uint32_t mine_s = static_cast<uint32_t>(__cvta_generic_to_shared(mine));
  auto issue = [&](int slot) {
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = (rt * 2 + h) * 32 + lane;
        cp_async16(mine_s + slot * kSlot + i * kLaneBytes, wsrc[rt][h]);
        cp_async4(mine_s + slot * kSlot + kScaleOff + i * kStageScaleBytes, ssrc[rt][h]);
        wsrc[rt][h] += kStepK / 2;
        ssrc[rt][h] += kStepK / fp4::kBlockSize;
      }
  };
  auto load_x = [&](uint4 (&X)[MT][4]) {
#pragma unroll
    for (int j = 0; j < MT; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q) X[j][q] = load_cached16(xsrc[j] + 8 * q);
      xsrc[j] += kStepK;
    }
  };

  float acc[RT][MT][4];
  zero_acc<MT, RT>(acc);

  const int steps = static_cast<int>(s_end > s_begin ? s_end - s_begin : 0);
  // One commit group per step, empty past the end, so that "all but the newest kStages - 1
  // groups complete" always means "step i has landed".
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < steps) issue(i);
    cp_async_commit();
  }
  // x one step ahead in registers while that fits (MT <= 2); wider x tiles load at the step.
  constexpr bool kPrefetchX = MT <= 2;
  uint4 X[MT][4];
  if (kPrefetchX && steps > 0) load_x(X);
#pragma unroll 1
  for (int i = 0; i < steps; ++i) {
    const int slot = i % kStages;
    if (i + kStages - 1 < steps) issue((i + kStages - 1) % kStages);
    cp_async_commit();
    uint4 Xn[MT][4];
    if (!kPrefetchX) {
      load_x(X);
    } else if (i + 1 < steps) {
      load_x(Xn);
    }
    cp_async_wait<kStages - 1>();
    uint32_t w[RT][2][4];
    uint32_t sp[RT][2][2];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int idx = (rt * 2 + h) * 32 + lane;
        const uint4 v = *reinterpret_cast<const uint4*>(mine + slot * kSlot + idx * kLaneBytes);
        w[rt][h][0] = v.x;
        w[rt][h][1] = v.y;
        w[rt][h][2] = v.z;
        w[rt][h][3] = v.w;
        const uint32_t sc = *reinterpret_cast<const uint16_t*>(mine + slot * kSlot + kScaleOff +
                                                                idx * kStageScaleBytes + 2 * (t & 1));
        sp[rt][h][0] = s_scale[sc & 0xFFu];
        sp[rt][h][1] = s_scale[sc >> 8];
      }
    tc_step<T, MT, RT>(acc, w, sp, X);
    if (kPrefetchX) {
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) X[j][q] = Xn[j][q];
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with its ring: reuse it for the reduction
  static_assert(MT * 4 * 32 * sizeof(float) <= kStages * kSlot, "reduction must fit in the ring");
  tc_reduce_store<MT, RT>(a, acc, reinterpret_cast<float*>(ring), m_base, n_base);
}

}  // namespace
}  // namespace cuda
}  // namespace mlx_fp4
