// Tensor-core kernel with one step of register prefetch (any K; guarded loads when not kVec), for
// either scale format.
// Included by w4a16_matmul.cu and (for its step functions) gather_w4a16_tc.cuh.
#pragma once
#include "w4a16_device.cuh"

namespace mlx_fp4 {
namespace cuda {
namespace {

using namespace fp4::cuda_tiling;

template <typename T, int MT, int RT, int Mode>
struct TcFrag {
  uint32_t w[RT][2][4];                       // [row tile][row g / g+8][word]
  uint32_t sc[RT][2][TcLane<Mode>::kScales];  // scale bytes [row tile][row][block]
};

// One K step's weight words and scale bytes of this lane (rows wrow/srow; guarded loads past K
// unless kVec and the step is whole: scale bytes past K's blocks are never read, since a padded
// row's extra bytes may hold anything, NaN codes included, and 0 x NaN poisons the sum).
// Shared by the dense and the grouped (MoE) kernels.
template <typename T, int MT, int RT, bool kVec, int Mode>
__device__ __forceinline__ void tc_load_frag(int64_t s, int t, const uint8_t* const (&wrow)[RT][2],
                                             const uint8_t* const (&srow)[RT][2], int64_t K,
                                             TcFrag<T, MT, RT, Mode>& f) {
  using Lane = TcLane<Mode>;
  const int64_t kbytes = (K + 1) / 2;
  const int64_t blocks = fp4::scale_blocks_for_k(K, Mode);
  const int64_t kb = s * kStepK + Lane::k0(t);  // k of this lane's word 0
  const int64_t b0 = kb / 2;                    // its first byte
  const int64_t blk0 = Lane::block0(s, t);      // first scale block
  const bool full = kVec && (s * kStepK + kStepK <= K);
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (full) {
        if constexpr (Lane::kMx) {
#pragma unroll
          for (int q = 0; q < 4; ++q) f.w[rt][h][q] = load_stream4(wrow[rt][h] + b0 + q * (Lane::kQStride / 2));
        } else {
          const uint4 v = load_stream16(wrow[rt][h] + b0);
          f.w[rt][h][0] = v.x;
          f.w[rt][h][1] = v.y;
          f.w[rt][h][2] = v.z;
          f.w[rt][h][3] = v.w;
        }
#pragma unroll
        for (int b = 0; b < Lane::kScales; ++b) f.sc[rt][h][b] = __ldg(srow[rt][h] + blk0 + b);
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint32_t word = 0;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int64_t b = b0 + q * (Lane::kQStride / 2) + i;
            const uint32_t byte = b < kbytes ? uint32_t(__ldg(wrow[rt][h] + b)) : 0u;
            word |= byte << (8 * i);
          }
          f.w[rt][h][q] = word;
        }
#pragma unroll
        for (int b = 0; b < Lane::kScales; ++b) {
          f.sc[rt][h][b] = blk0 + b < blocks ? uint32_t(__ldg(srow[rt][h] + blk0 + b)) : 0u;
        }
      }
    }
  }
}

// One K step on the tensor cores: x rows xrow at this lane's k, the block scales from the table,
// accumulated into acc.
template <typename T, int MT, int RT, bool kVec, int Mode>
__device__ __forceinline__ void tc_compute_step(int64_t s, int t, const T* const (&xrow)[MT], int64_t K,
                                                const uint32_t* s_scale, const TcFrag<T, MT, RT, Mode>& f,
                                                float (&acc)[RT][MT][4]) {
  using Lane = TcLane<Mode>;
  const int64_t kb = s * kStepK + Lane::k0(t);
  const bool full = kVec && (s * kStepK + kStepK <= K);
  uint32_t sp[RT][2][Lane::kScales];  // block scales from the table [row tile][row][block]
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int b = 0; b < Lane::kScales; ++b) sp[rt][h][b] = s_scale[f.sc[rt][h][b]];
  uint4 X[MT][4];
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int64_t kq = kb + q * Lane::kQStride;
      if (full) {
        X[j][q] = load_cached16(xrow[j] + kq);
      } else {
        uint32_t r[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t k0 = kq + 2 * e;
          const uint16_t* xp = reinterpret_cast<const uint16_t*>(xrow[j]);
          const uint32_t lo = k0 < K ? uint32_t(xp[k0]) : 0u;
          const uint32_t hi = k0 + 1 < K ? uint32_t(xp[k0 + 1]) : 0u;
          r[e] = lo | (hi << 16);
        }
        X[j][q] = make_uint4(r[0], r[1], r[2], r[3]);
      }
    }
  tc_step<T, MT, RT, Mode>(acc, f.w, sp, X);
}

// Mode: fp4::Mode (TcLane: where a lane's k values and scale blocks lie).
template <typename T, int MT, int RT, bool kVec, int Mode>
__global__ void __launch_bounds__(kMaxWarpsPerBlock * 32) w4a16_tc_kernel(const W4A16Args a) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t M = a.p.m, N = a.p.n, K = a.p.k;
  const int64_t wrb = a.p.w_row_bytes, srb = a.p.scale_row_bytes;
  const int64_t m_base = int64_t(blockIdx.x) * (kMmaCols * MT);
  const int64_t n_base = int64_t(blockIdx.y) * (kMmaRows * RT);

  const uint8_t* wrow[RT][2];
  const uint8_t* srow[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int64_t n = n_base + rt * kMmaRows + g + 8 * h;
      n = n < N ? n : N - 1;
      wrow[rt][h] = a.w + n * wrb;
      srow[rt][h] = a.scales + n * srb;
    }
  }
  const T* xrow[MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    int64_t m = m_base + j * kMmaCols + g;
    m = m < M ? m : M - 1;
    xrow[j] = static_cast<const T*>(a.x) + m * K;
  }

  __shared__ uint32_t s_scale[kScaleTableSize];
  fill_scale_table<T, Mode>(s_scale);

  const int64_t nsteps = (K + kStepK - 1) / kStepK;
  int64_t s_begin, s_end;
  warp_step_range(nsteps, warp, nwarps, s_begin, s_end);

  float acc[RT][MT][4];
  zero_acc<MT, RT>(acc);

  auto load_frag = [&](int64_t s, TcFrag<T, MT, RT, Mode>& f) {
    tc_load_frag<T, MT, RT, kVec, Mode>(s, t, wrow, srow, K, f);
  };
  auto compute = [&](int64_t s, const TcFrag<T, MT, RT, Mode>& f) {
    tc_compute_step<T, MT, RT, kVec, Mode>(s, t, xrow, K, s_scale, f, acc);
  };

  // Weights of step s+1 are loaded while step s is computed; the L2::256B hint of the loads
  // already brings the next steps of each row into L2. The step loop stays rolled: the unrolled
  // body is large and instruction-cache misses were the main stall (ncu) with three copies of it.
  if (s_begin < s_end) {
    TcFrag<T, MT, RT, Mode> cur;
    load_frag(s_begin, cur);
#pragma unroll 1
    for (int64_t s = s_begin; s < s_end; ++s) {
      TcFrag<T, MT, RT, Mode> nxt;
      if (s + 1 < s_end) load_frag(s + 1, nxt);
      compute(s, cur);
      cur = nxt;
    }
  }

  __shared__ float red[kMaxWarpsPerBlock * RT * MT * 4 * 32];
  tc_reduce_store<MT, RT>(a, a, acc, red, m_base, n_base, tc_acc_scale(Mode));
}

}  // namespace
}  // namespace cuda
}  // namespace mlx_fp4
