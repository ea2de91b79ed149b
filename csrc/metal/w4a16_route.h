// Where the dense op runs on an Apple GPU under MLX_FP4_METAL_ROUTE=auto (csrc/ops.cpp,
// metal_route): our kernels, MLX's own kernel (mx.quantized_matmul on the same bytes), or the
// CPU. Framework-free so that the metal_sim cost model (tests/metal_sim/costmodel.py) reads the
// production table. docs/metal.md, "Routing", gives the reasons; keep the two in step.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <string>

namespace fp4 {

enum class MetalRoute : int { kOurs = 0, kMlx = 1, kCpu = 2 };

// An Apple GPU as MLX's device_info names it: "applegpu_g16s" -> generation 16, size 's'
// (MLX's letters: 'g' base, 's' Pro, 'c' Max, 'd' Ultra). Generation 0: not an Apple GPU.
struct AppleGpuId {
  int generation = 0;
  char size = '\0';
};

inline AppleGpuId parse_apple_gpu_arch(const std::string& arch) {
  const std::string prefix = "applegpu_g";
  AppleGpuId id;
  if (arch.rfind(prefix, 0) == 0 && arch.size() > prefix.size()) {
    id.generation = std::atoi(arch.c_str() + prefix.size());
    id.size = arch.back();
  }
  return id;
}

constexpr int kAppleSiliconMinGen = 13;  // M1 = applegpu_g13: Apple7 (simdgroup_matrix, bfloat)
constexpr int kNaxMinGen = 17;           // MLX's is_nax_available(): generation >= 17 (M5)
constexpr int kNaxKAlign = 64;           // MLX's qmm_nax condition on K

// MLX's vector/matrix crossover on M (quantized.cpp get_qmv_batch_limit, MLX main at 846d176,
// the host source the simulator's MLX launches follow; tests/metal_sim/mlx_kernels.py has the
// same table and a test compares the two). K = D, N = O.
inline int mlx_qmv_batch_limit(AppleGpuId gpu, int64_t n, int64_t k) {
  auto pick = [&](int small, int mid, int large) {
    return (k <= 2048 && n <= 2048) ? small : (k <= 4096 && n <= 4096) ? mid : large;
  };
  if (gpu.generation >= kNaxMinGen && gpu.size != 'd') return pick(33, 25, 13);
  if (gpu.generation >= 15 && gpu.size != 'd') return pick(13, 15, 13);
  if (gpu.size == 'd') return pick(32, 18, 12);
  return gpu.generation >= 13 ? pick(14, 10, 6) : pick(18, 12, 10);
}

// Whether mx.quantized_matmul runs MLX's NAX kernel (M5 neural accelerators, macOS >= 26.2):
// its matrix path (M >= the batch limit) on a NAX GPU, K % 64 == 0, half or bfloat x.
inline bool mlx_runs_nax(AppleGpuId gpu, int64_t m, int64_t n, int64_t k, bool x_is_f32) {
  return gpu.generation >= kNaxMinGen && m >= mlx_qmv_batch_limit(gpu, n, k) &&
      k % kNaxKAlign == 0 && !x_is_f32;
}

// The static table (used when the measured tuner is off or has no entry for the shape):
// - the CPU below Apple7 (no simdgroup_matrix, no bfloat; e.g. the paravirtual GPU of macOS VMs);
// - MLX where it runs its NAX kernel: our simdgroup-matrix GEMM cannot reach the accelerators;
// - ours everywhere else: the cost model (benchmarks/results/metal/cost_model.json) has our
//   kernels at or below MLX's choice at every counted M on M1-M4 and on M5 outside NAX.
inline MetalRoute metal_auto_route(AppleGpuId gpu, int64_t m, int64_t n, int64_t k, bool x_is_f32) {
  if (gpu.generation < kAppleSiliconMinGen) return MetalRoute::kCpu;
  if (mlx_runs_nax(gpu, m, n, k, x_is_f32)) return MetalRoute::kMlx;
  return MetalRoute::kOurs;
}

}  // namespace fp4
