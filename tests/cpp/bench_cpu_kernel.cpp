// Micro benchmark of the CPU kernel alone (csrc/cpu/*.cpp, no MLX runtime, no Python), for A/B
// work on the hot loops: wall-clock best-of-reps, or deterministic instruction counts under
// callgrind. Built by tools/cpu_kernel_bench.sh; not a test (the Python bench is the reference).
//   bench_cpu_kernel M N K [reps]    (MLX_FP4_CPU_ISA / MLX_FP4_NUM_THREADS pick build / threads)
// Prints one line: hot-loop build, shape, best ms, GFLOP/s, and a checksum of the output bits
// (equal checksums across thread counts = bit-identical results).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/w4a16_kernel.h"
#include "shared/w4a16_problem.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s M N K [reps]\n", argv[0]);
    return 2;
  }
  const int64_t m = std::atoll(argv[1]), n = std::atoll(argv[2]), k = std::atoll(argv[3]);
  const int reps = argc > 4 ? std::atoi(argv[4]) : 5;
  fp4::W4A16Problem p{};
  p.m = m;
  p.n = n;
  p.k = k;
  p.w_row_bytes = fp4::packed_bytes_for_k(k);
  p.scale_row_bytes = fp4::scale_blocks_for_k(k);
  p.x_dtype = fp4::kDtypeF32;
  p.out_dtype = fp4::kDtypeF32;

  std::mt19937 rng(1);
  std::vector<uint8_t> w(static_cast<size_t>(n * p.w_row_bytes)), s(static_cast<size_t>(n * p.scale_row_bytes));
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  // E4M3 codes 0x30..0x3F: scales 1..1.875 (finite, no NaN codes).
  for (auto& b : s) b = static_cast<uint8_t>(0x30 + rng() % 16);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(m * k)), y(static_cast<size_t>(m * n));
  for (auto& v : x) v = nd(rng);

  mlx_fp4::cpu::Buffers b{};
  b.x = x.data();
  b.w = w.data();
  b.scales = s.data();
  b.out = y.data();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    mlx_fp4::cpu::run_w4a16(p, b);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (ms < best) best = ms;
  }
  uint64_t sum = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &y[i], sizeof(bits));
    sum = sum * 1000003u + bits;
  }
  std::printf("%s M=%lld N=%lld K=%lld best_ms=%.3f gflops=%.1f checksum=%016llx\n", mlx_fp4::cpu::hot_loops_name(),
              static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), best,
              2.0 * m * n * k / best / 1e6, static_cast<unsigned long long>(sum));
  return 0;
}
