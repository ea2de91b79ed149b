// Standalone check and timing of the CUDA gathered (MoE) kernels, without MLX
// (scripts/gpu_check.sh step moe builds it):
//   check: the pair GEMV (SIMT, and batched dense tensor cores), plan + GEMV and plan + tensor cores
//          (register-prefetch, staged, and on sm_90a wgmma) against a double-precision host sum of the exact
//          decoded weights (fp4_format.h), sorted / unsorted / repeated experts, M > 1, ragged K,
//          per-expert multipliers, out-of-range pairs (NaN rows);
//   bench: Qwen3-30B-A3B expert shapes (128 experts, top-8; 768 x 2048 and 2048 x 768), kernel
//          time of each kernel choice (with the plan where it has one) in a CUDA graph with fresh routing per call, next to the read rate
//          of a load-only kernel over the same active experts' bytes.
// Usage: gather_kernel_harness [check] [bench [sweep]] [profile]; sweep adds every tile of the batched
// pair kernel at the points where the rule takes it. Exit code 1 on a failed check.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gather_w4a16_kernels.h"

using namespace mlx_fp4::cuda;

namespace {

// Stops on the first CUDA error, naming the call.
void check_cuda(cudaError_t e, const char* call, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "gather_kernel_harness.cu:%d %s: %s\n", line, call, cudaGetErrorString(e));
  std::exit(2);
}
#define CK(x) check_cuda((x), #x, __LINE__)


int g_failures = 0;

template <typename T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  CK(cudaMalloc(&d, std::max<size_t>(1, h.size() * sizeof(T))));
  if (!h.empty()) CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

DeviceInfo g_dev;
bool g_sweep = false;  // bench: also every tile of the batched pair kernel ("sweep")
// The batched pair kernel's tiles as MLX_FP4_CUDA_GATHER_TC names them: one product's split, then "mt,rt,kw".
constexpr const char* kPairTiles[] = {"product", "1,1,1", "1,1,2", "1,1,4", "1,1,8",
                                      "1,2,1",   "1,2,2", "1,2,4", "1,2,8"};

// The harness's kernel choices: the glue's (gather_kernel_for), with the pair GEMV as the decode
// GEMV, the SIMT kernel, the batched dense tensor-core kernel and the three grouped tensor-core
// kernels (wgmma forced where it can run: elsewhere the glue's next choice runs under its name).
enum class Kind { kDecode, kPairs, kPairsTc, kPairsRuns, kGemv, kTc, kTcStaged, kTcWgmma };

// The glue's choice for `a` (gather_kernel_for, gather_pair_launch, then gather_tc_for's rows
// rule for wgmma).
Kind kind_of(const GatherArgs& a) {
  const fp4::GatherW4A16Problem& g = a.g;
  const GatherKernel k = gather_kernel_for(g);
  if (k == GatherKernel::kPairs) {
    const PairKernel pk = gather_pair_launch(a, vector_loads_ok(g.mm, a.x, a.w), g_dev).kernel;
    return pk == PairKernel::kRunsTc      ? Kind::kPairsRuns
           : pk == PairKernel::kBatchedTc ? Kind::kPairsTc
           : pk == PairKernel::kDecode    ? Kind::kDecode
                                          : Kind::kPairs;
  }
  if (k != GatherKernel::kTc) return Kind::kGemv;
  const bool wgmma = g_dev.wgmma && fp4::cuda_gather_tiling::gather_wgmma_rows_ok(fp4::gather_out_rows(g), g.experts);
  return wgmma ? Kind::kTcWgmma : Kind::kTcStaged;
}

template <typename Args>
void run(const Launch& l, Args& a, cudaStream_t s) {
  void* params[] = {&a};
  if (cuLaunchKernel(l.func, l.grid.x, l.grid.y, l.grid.z, l.block.x, l.block.y, l.block.z, l.smem,
                     reinterpret_cast<CUstream>(s), params, nullptr) != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuLaunchKernel failed\n");
    std::exit(2);
  }
}

// One random problem on the device: bf16 x [batches, m, k], experts [e, n, k/2 bytes], fp32 out.
struct Problem {
  fp4::GatherW4A16Problem g{};
  std::vector<uint16_t> x;  // bf16 bits
  std::vector<uint8_t> w, s;
  std::vector<uint32_t> lhs, rhs;
  std::vector<float> gs, mult;
  GatherArgs a{};
  int32_t* ws = nullptr;
  void* xp = nullptr;  // the grouped wgmma kernel's gathered, permuted x

  Problem(int64_t e, int64_t n, int64_t k, int64_t m, int64_t batches, std::vector<uint32_t> l,
          std::vector<uint32_t> r, bool per_expert, std::mt19937& rng)
      : lhs(std::move(l)), rhs(std::move(r)) {
    fp4::W4A16Problem& p = g.mm;
    p.m = m, p.n = n, p.k = k;
    p.w_row_bytes = fp4::packed_bytes_for_k(k);
    p.scale_row_bytes = fp4::scale_blocks_for_k(k);
    p.x_dtype = fp4::kDtypeBF16;
    p.out_dtype = fp4::kDtypeF32;
    p.has_global_scale = 1;
    g.pairs = static_cast<int64_t>(lhs.size());
    g.x_batches = batches;
    g.experts = e;
    g.w_expert_bytes = n * p.w_row_bytes;
    g.scale_expert_bytes = n * p.scale_row_bytes;
    g.global_scale_per_expert = per_expert ? 1 : 0;
    std::uniform_int_distribution<int> byte(0, 255), scale(0x18, 0x47);
    std::normal_distribution<float> normal;
    x.resize(batches * m * k);
    for (auto& v : x) {
      const __nv_bfloat16 b = __float2bfloat16_rn(normal(rng));
      std::memcpy(&v, &b, 2);
    }
    w.resize(e * g.w_expert_bytes);
    for (auto& v : w) v = static_cast<uint8_t>(byte(rng));
    if (k % 2) {  // padding nibbles past K stay 0
      for (int64_t row = 0; row < e * n; ++row) w[row * p.w_row_bytes + p.w_row_bytes - 1] &= 0x0F;
    }
    s.resize(e * g.scale_expert_bytes);
    for (auto& v : s) v = static_cast<uint8_t>(scale(rng));
    // The kernels take MLX's global scale (amax); the reference uses its decode multiplier.
    gs.resize(per_expert ? e : 1);
    mult.resize(gs.size());
    for (size_t i = 0; i < gs.size(); ++i) {
      gs[i] = std::uniform_real_distribution<float>(0.5f, 2.0f)(rng) * fp4::kGlobalScaleDenominator;
      mult[i] = fp4::decode_multiplier(gs[i]);
    }
  }

  Kind kernel = Kind::kGemv;
  int decode_shape = -1;  // the decode GEMV's kDecodeShapes index (-1: kDecodePlannedShape)
  const char* pair_tc = nullptr;  // the batched pair kernel's tile (MLX_FP4_CUDA_GATHER_TC's values)

  // Uploads the inputs and the workspace; `k` picks the kernel.
  void upload(Kind k) {
    a.x = to_device(x);
    a.w = to_device(w);
    a.scales = to_device(s);
    a.lhs = to_device(lhs);
    a.rhs = to_device(rhs);
    a.global_scale = to_device(gs);
    CK(cudaMalloc(&a.out, std::max<int64_t>(1, fp4::gather_out_rows(g) * g.mm.n) * sizeof(float)));
    const int64_t words = fp4::cuda_gather_tiling::plan_workspace_words(g.experts, g.pairs, fp4::gather_out_rows(g));
    CK(cudaMalloc(&ws, words * sizeof(int32_t)));
    CK(cudaMalloc(&xp, std::max<int64_t>(1, fp4::gather_out_rows(g) * wgmma_padded_k(g.mm.k)) * sizeof(uint16_t)));
    a.workspace = ws;
    a.g = g;
    use(k);
  }

  void use(Kind k) {
    kernel = k;
    // The glue's rule (gather_tc_for); "tc" is the register-prefetch kernel forced.
    const bool tc = k == Kind::kTc || k == Kind::kTcStaged || k == Kind::kTcWgmma;
    const GatherWgmma wg = k == Kind::kTcWgmma && g_dev.wgmma ? kWgmmaForced : kWgmmaOff;
    a.use_tc = tc ? gather_tc_for(a, k != Kind::kTc, wg) : kTcNone;
    a.tile_rows = gather_tile_rows(a.use_tc);
  }

  // The launches of the MLX glue (gather_w4a16_matmul.cpp) for the chosen kernel; the pair kinds
  // force their pair kernel as MLX_FP4_CUDA_GATHER_PAIRS does (the rule's order where it cannot run).
  void launch(cudaStream_t st) {
    const bool vec = vector_loads_ok(g.mm, a.x, a.w);
    if (kernel == Kind::kDecode || kernel == Kind::kPairs || kernel == Kind::kPairsTc || kernel == Kind::kPairsRuns) {
      const PairKernel forced = kernel == Kind::kDecode    ? PairKernel::kDecode
                                : kernel == Kind::kPairs   ? PairKernel::kSimt
                                : kernel == Kind::kPairsTc ? PairKernel::kBatchedTc
                                                           : PairKernel::kRunsTc;
      const PairLaunch l = gather_pair_launch(a, vec, g_dev, int(forced), decode_shape, pair_tc);
      if (l.kernel == PairKernel::kBatchedTc || l.kernel == PairKernel::kRunsTc) {
        W4A16Args b = batched_args(a);
        run(l.launch, b, st);
      } else {
        run(l.launch, a, st);
      }
      return;
    }
    run(gather_plan_launch(g), a, st);
    if (a.use_tc == kTcWgmma) {
      W4A16Args b = grouped_args(a);
      const int64_t rows = fp4::gather_out_rows(g);
      WgmmaPermuteArgs pa{a.x, xp, rows, g.mm.k, wgmma_padded_k(g.mm.k), b.x_rows};
      run(wgmma_permute_launch(pa, g.mm.x_dtype), pa, st);
      WgmmaArgs wa;
      wgmma_prepare_grouped(wa, b, xp, rows, g.experts);
      run(wgmma_grouped_launch(g.mm, fp4::cuda_gather_tiling::max_tc_tiles(g.experts, rows, a.tile_rows)), wa, st);
      return;
    }
    if (a.use_tc == kTcStaged) {
      W4A16Args b = grouped_args(a);
      run(tc_grouped_launch(g.mm, g_dev, fp4::cuda_gather_tiling::max_tc_tiles(g.experts, fp4::gather_out_rows(g))), b,
          st);
      return;
    }
    run(a.use_tc ? gather_tc_launch(g, vec) : gather_gemv_launch(g, vec), a, st);
  }

  ~Problem() {
    for (const void* p : {a.x, static_cast<const void*>(a.w), static_cast<const void*>(a.scales),
                          static_cast<const void*>(a.lhs), static_cast<const void*>(a.rhs),
                          static_cast<const void*>(a.global_scale), static_cast<const void*>(a.out),
                          static_cast<const void*>(ws), static_cast<const void*>(xp)}) {
      if (p) cudaFree(const_cast<void*>(p));
    }
  }
};

float bf16_value(uint16_t bits) {
  uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Double sum over exact decoded weights; NaN rows for out-of-range pairs.
const char* kernel_name(Kind k) {
  return k == Kind::kDecode       ? "decode"
         : k == Kind::kPairs      ? "pairs"
         : k == Kind::kPairsTc    ? "pairs-tc"
         : k == Kind::kPairsRuns  ? "pairs-runs"
         : k == Kind::kTc         ? "tc"
         : k == Kind::kTcStaged   ? "tc-staged"
         : k == Kind::kTcWgmma    ? "tc-wgmma"
                                  : "gemv";
}
constexpr Kind kKernels[] = {Kind::kDecode, Kind::kPairs,    Kind::kPairsTc,  Kind::kPairsRuns,
                             Kind::kGemv,   Kind::kTc,       Kind::kTcStaged, Kind::kTcWgmma};
constexpr int kNumKernels = sizeof(kKernels) / sizeof(kKernels[0]);

void check(const std::string& name, Problem& pr, Kind kernel, int decode_shape = -1) {
  pr.decode_shape = decode_shape;
  pr.upload(kernel);
  pr.launch(0);
  CK(cudaDeviceSynchronize());
  const auto& g = pr.g;
  const int64_t M = g.mm.m, N = g.mm.n, K = g.mm.k;
  std::vector<float> out(fp4::gather_out_rows(g) * N);
  CK(cudaMemcpy(out.data(), pr.a.out, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  int64_t bad = 0;
  for (int64_t p = 0; p < g.pairs; ++p) {
    const bool ok = pr.lhs[p] < uint32_t(g.x_batches) && pr.rhs[p] < uint32_t(g.experts);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t n = 0; n < N; ++n) {
        const float got = out[(p * M + r) * N + n];
        if (!ok) {
          bad += !std::isnan(got);
          continue;
        }
        const int64_t e = pr.rhs[p];
        double acc = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          const uint8_t byte = pr.w[e * g.w_expert_bytes + n * g.mm.w_row_bytes + k / 2];
          const double wv = fp4::e2m1_to_float(k % 2 ? byte >> 4 : byte & 0xF) *
                            fp4::e4m3_to_float(pr.s[e * g.scale_expert_bytes + n * g.mm.scale_row_bytes + k / 16]);
          const double xv = bf16_value(pr.x[(pr.lhs[p] * M + r) * K + k]);
          acc += xv * wv;
          mag += std::fabs(xv * wv);
        }
        const double c = pr.mult[g.global_scale_per_expert ? e : 0];
        const double tol = 4 * K * 6e-8 * mag * c + 1e-30;
        bad += !(std::fabs(got - acc * c) <= tol);
      }
  }
  const bool decode_ran = decode_shape < 0 || gather_decode_ok(pr.a, vector_loads_ok(g.mm, pr.a.x, pr.a.w), decode_shape);
  const bool ran = (kernel != Kind::kTcWgmma || pr.a.use_tc == kTcWgmma) && decode_ran;
  const std::string label = decode_shape < 0 ? kernel_name(kernel) : "decode-s" + std::to_string(decode_shape);
  std::printf("check %-32s %-8s%s pairs %4lld  %s\n", name.c_str(), label.c_str(), ran ? "" : " (n/a)",
              (long long)g.pairs, bad ? "FAILED" : "ok");
  if (bad) {
    std::printf("  %lld bad outputs\n", (long long)bad);
    ++g_failures;
  }
}

std::vector<uint32_t> iota_u32(int64_t n, uint32_t div = 1) {
  std::vector<uint32_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = uint32_t(i / div);
  return v;
}

std::vector<uint32_t> random_experts(int64_t n, int64_t e, bool sorted, std::mt19937& rng) {
  std::vector<uint32_t> v(n);
  for (auto& x : v) x = std::uniform_int_distribution<uint32_t>(0, uint32_t(e - 1))(rng);
  if (sorted) std::sort(v.begin(), v.end());
  if (n > 1) v[1] = v[0];  // a repeated expert
  return v;
}

void run_checks() {
  std::mt19937 rng(7);
  for (Kind tc : kKernels) {
    {
      Problem p(8, 64, 256, 1, 12, iota_u32(24, 2), random_experts(24, 8, false, rng), true, rng);
      check("decode top-2 unsorted", p, tc);
    }
    {
      Problem p(3, 40, 96, 1, 70, iota_u32(70), random_experts(70, 3, true, rng), false, rng);
      check("sorted, large groups", p, tc);
    }
    {
      Problem p(4, 33, 17, 3, 5, random_experts(9, 5, false, rng), random_experts(9, 4, false, rng), true, rng);
      check("lhs, M = 3, K = 17", p, tc);
    }
    {
      std::vector<uint32_t> l = iota_u32(6), r = random_experts(6, 4, false, rng);
      l[2] = 99, r[4] = 7;  // out of range: NaN rows, nothing read
      Problem p(4, 24, 128, 1, 6, l, r, true, rng);
      check("out-of-range pairs", p, tc);
    }
    {
      std::vector<uint32_t> l = iota_u32(6, 3), r = random_experts(6, 5, false, rng);
      r[3] = 5;  // out of range
      // The decode GEMV: K >= 2048 with a partial last group (65 chunks), rows past N.
      Problem p(5, 37, 2080, 1, 2, l, r, true, rng);
      check("decode GEMV, K = 2080, N = 37", p, tc);
    }
    {
      // The grouped staged kernel's shape: K % 128 == 0, groups over several 32-row tiles with a
      // partial last one, M = 3 rows per pair, x matrices through lhs, N = 72 (a partial weight tile).
      Problem p(3, 72, 384, 3, 40, random_experts(40, 4, false, rng), random_experts(40, 3, true, rng), true, rng);
      check("grouped tiles, M = 3, K = 384", p, tc);
    }
    {
      // The grouped wgmma kernel's shape (K % 256 == 0): 64-row tiles over groups of 2 rows per
      // pair through lhs, N = 200 (the second weight tile runs into the next expert's rows, which
      // are never stored), per-expert multipliers, an out-of-range pair.
      std::vector<uint32_t> l = random_experts(150, 40, false, rng), r = random_experts(150, 3, true, rng);
      r[149] = 3;
      Problem p(3, 200, 512, 2, 40, l, r, true, rng);
      check("grouped 64-row tiles, K = 512", p, tc);
    }
    {
      // Runs of one expert (the runs kernel: K % 128 == 0, one row of x per pair): sorted pairs over
      // 3 experts, runs longer than a block's 8 rows and crossing its windows, x rows through lhs,
      // an out-of-range expert and an out-of-range x matrix inside runs, per-expert multipliers.
      std::vector<uint32_t> l = random_experts(45, 45, false, rng), r = random_experts(45, 3, true, rng);
      r[13] = 3, l[30] = 45;
      Problem p(3, 40, 256, 1, 45, l, r, true, rng);
      check("runs of one expert, K = 256", p, tc);
    }
    {
      // Unsorted, one row per pair, K = 768 (3 stages), one multiplier.
      Problem p(5, 136, 768, 1, 400, iota_u32(400), random_experts(400, 5, false, rng), false, rng);
      check("grouped unsorted, K = 768", p, tc);
    }
  }
  // Every tile of the batched pair kernel, both forms: K = 2048 (16 steps over 1-8 warps), N = 40
  // (a partial row tile), sorted pairs with an out-of-range expert and x matrix.
  for (Kind kind : {Kind::kPairsTc, Kind::kPairsRuns})
    for (const char* tile : kPairTiles) {
      std::vector<uint32_t> l = random_experts(20, 20, false, rng), r = random_experts(20, 4, true, rng);
      r[7] = 4, l[12] = 20;
      Problem p(4, 40, 2048, 1, 20, l, r, true, rng);
      p.pair_tc = tile;
      check(std::string("pair tile ") + tile + ", K = 2048", p, kind);
    }
  // Every decode GEMV shape forced: a partial last step (K = 2080: 65 chunks) with rows past N and
  // an out-of-range pair; K = 3072 (several steps) with N = 50; K = 768 (the down projection).
  for (int shape = 0; shape < fp4::cuda_gather_tiling::kNumDecodeShapes; ++shape) {
    {
      std::vector<uint32_t> l = iota_u32(6, 3), r = random_experts(6, 5, false, rng);
      r[3] = 5;
      Problem p(5, 37, 2080, 1, 2, l, r, true, rng);
      check("decode shapes, K = 2080, N = 37", p, Kind::kDecode, shape);
    }
    {
      Problem p(6, 50, 3072, 1, 2, iota_u32(8, 4), random_experts(8, 6, false, rng), false, rng);
      check("decode shapes, K = 3072, N = 50", p, Kind::kDecode, shape);
    }
    {
      Problem p(4, 24, 768, 1, 3, iota_u32(6, 2), random_experts(6, 4, false, rng), true, rng);
      check("decode shapes, K = 768, N = 24", p, Kind::kDecode, shape);
    }
  }
}

__global__ void read_kernel(const uint4* const* rows, int64_t n_rows, int64_t row_words, uint32_t* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_rows * row_words;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(rows[i / row_words] + i % row_words);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads
}

template <typename F>
double graph_us(F fn, int iters, cudaStream_t s) {
  fn(0);
  CK(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < iters; ++i) fn(i);
  CK(cudaStreamEndCapture(s, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float best = 1e30f;
  for (int r = 0; r < 3; ++r) {
    CK(cudaEventRecord(e0, s));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    best = std::min(best, ms);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return 1e3 * best / iters;
}

void run_bench() {
  constexpr int kExperts = 128, kTop = 8, kRoutings = 16;
  std::mt19937 rng(11);
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  std::printf("bench,n,k,tokens,kernel,us,active_MB,GBps,read_only_GBps,pct_of_read\n");
  for (auto [n, k] : {std::pair<int64_t, int64_t>{768, 2048}, {2048, 768}}) {
    for (int64_t tokens : {1, 2, 4, 8, 16, 512, 2048}) {
      const int64_t pairs = tokens * kTop;
      const bool sorted = pairs >= 64;
      // Routings: distinct top-8 experts per token; prefill sorted by expert as mlx-lm does.
      std::vector<std::vector<uint32_t>> routes(kRoutings);
      for (auto& r : routes) {
        for (int64_t t = 0; t < tokens; ++t) {
          std::vector<uint32_t> perm(kExperts);
          std::iota(perm.begin(), perm.end(), 0u);
          std::shuffle(perm.begin(), perm.end(), rng);
          r.insert(r.end(), perm.begin(), perm.begin() + kTop);
        }
        if (sorted) std::sort(r.begin(), r.end());
      }
      Problem p(kExperts, n, k, 1, sorted ? pairs : tokens, sorted ? iota_u32(pairs) : iota_u32(pairs, kTop),
                routes[0], true, rng);
      p.g.sorted_rhs = sorted ? 1 : 0;  // mlx-lm's hint
      p.upload(Kind::kGemv);
      const Kind planned = kind_of(p.a);
      std::vector<uint32_t*> d_routes;
      for (auto& r : routes) d_routes.push_back(to_device(r));
      // Every kernel at every point (the plan's crossovers come from these lines).
      double us_of[kNumKernels];
      for (int kk = 0; kk < kNumKernels; ++kk) {
        p.use(kKernels[kk]);
        us_of[kk] = graph_us([&](int i) {
          p.a.rhs = d_routes[i % kRoutings];
          p.launch(st);
        }, 2 * kRoutings, st);
      }
      // Active bytes (mean over routings) and the read-only rate over the same experts' rows,
      // rotating over the same routings (so neither run finds its experts in L2 from the last).
      double active = 0;
      std::vector<const uint4**> d_rows;
      std::vector<int64_t> n_rows;
      for (auto& r : routes) {
        std::vector<uint32_t> u(r);
        std::sort(u.begin(), u.end());
        u.erase(std::unique(u.begin(), u.end()), u.end());
        active += double(u.size()) * (p.g.w_expert_bytes + p.g.scale_expert_bytes) / kRoutings;
        std::vector<const uint4*> rows;
        for (uint32_t e : u)
          for (int64_t row = 0; row < n; ++row)
            rows.push_back(reinterpret_cast<const uint4*>(p.a.w + e * p.g.w_expert_bytes + row * p.g.mm.w_row_bytes));
        d_rows.push_back(to_device(rows));
        n_rows.push_back(static_cast<int64_t>(rows.size()));
      }
      uint32_t* sink = to_device(std::vector<uint32_t>(1));
      const int64_t row_words = p.g.mm.w_row_bytes / 16;
      const double read_us = graph_us([&](int i) {
        read_kernel<<<1024, 256, 0, st>>>(d_rows[i % kRoutings], n_rows[i % kRoutings], row_words, sink);
      }, 2 * kRoutings, st);
      const double mean_rows = std::accumulate(n_rows.begin(), n_rows.end(), 0.0) / kRoutings;
      const double read_gbps = mean_rows * p.g.mm.w_row_bytes / read_us / 1e3;
      // Every decode GEMV shape where it runs this point (kDecodePlannedShape was picked from these lines).
      for (int shape = 0; shape < fp4::cuda_gather_tiling::kNumDecodeShapes && tokens <= 16; ++shape) {
        p.use(Kind::kDecode);
        p.decode_shape = shape;
        if (!gather_decode_ok(p.a, vector_loads_ok(p.g.mm, p.a.x, p.a.w), shape)) continue;
        const double us = graph_us([&](int i) {
          p.a.rhs = d_routes[i % kRoutings];
          p.launch(st);
        }, 2 * kRoutings, st);
        std::printf("bench,%lld,%lld,%lld,decode-s%d,%.2f,%.2f,%.0f,%.0f,%.0f%%\n", (long long)n, (long long)k,
                    (long long)tokens, shape, us, active / 1e6, active / us / 1e3, read_gbps,
                    100 * (active / us / 1e3) / read_gbps);
      }
      p.decode_shape = -1;
      // The batched pair kernel's tiles (rt, kw) and one product's split, where the rule takes it.
      const bool pair_tc = planned == Kind::kPairsTc || planned == Kind::kPairsRuns;
      for (const char* tile : kPairTiles) {
        if (!g_sweep || !pair_tc) break;
        p.use(planned);
        p.pair_tc = tile;
        const double us = graph_us([&](int i) {
          p.a.rhs = d_routes[i % kRoutings];
          p.launch(st);
        }, 2 * kRoutings, st);
        std::printf("bench,%lld,%lld,%lld,%s %s,%.2f,%.2f,%.0f,%.0f,%.0f%%\n", (long long)n, (long long)k,
                    (long long)tokens, kernel_name(planned), tile, us, active / 1e6, active / us / 1e3, read_gbps,
                    100 * (active / us / 1e3) / read_gbps);
      }
      p.pair_tc = nullptr;
      for (int kk = 0; kk < kNumKernels; ++kk) {
        const double gbps = active / us_of[kk] / 1e3;
        std::printf("bench,%lld,%lld,%lld,%s%s,%.2f,%.2f,%.0f,%.0f,%.0f%%\n", (long long)n, (long long)k,
                    (long long)tokens, kernel_name(kKernels[kk]), kKernels[kk] == planned ? " (plan)" : "", us_of[kk],
                    active / 1e6, gbps, read_gbps, 100 * gbps / read_gbps);
      }
      for (auto* d : d_routes) cudaFree(d);
      for (auto* d : d_rows) cudaFree(d);
      cudaFree(sink);
      p.a.rhs = nullptr;  // freed above (routes[0] copy is separate)
    }
  }
  cudaStreamDestroy(st);
}

// One launch of each kernel on the 512-token prefill shape (768 x 2048), for a profiler
// (ncu --kernel-name regex:gather_ ... gather_kernel_harness profile).
void run_profile() {
  constexpr int64_t kExperts = 128, kTop = 8, kTokens = 512, kPairs = kTokens * kTop;
  std::mt19937 rng(5);
  std::vector<uint32_t> r;
  for (int64_t t = 0; t < kTokens; ++t) {
    std::vector<uint32_t> perm(kExperts);
    std::iota(perm.begin(), perm.end(), 0u);
    std::shuffle(perm.begin(), perm.end(), rng);
    r.insert(r.end(), perm.begin(), perm.begin() + kTop);
  }
  std::sort(r.begin(), r.end());
  Problem p(kExperts, 768, 2048, 1, kPairs, iota_u32(kPairs), r, true, rng);
  p.upload(Kind::kTc);
  for (Kind k : kKernels) {
    p.use(k);
    p.launch(0);
  }
  CK(cudaDeviceSynchronize());
}

}  // namespace

int main(int argc, char** argv) {
  bool do_check = argc == 1, do_bench = false, do_profile = false;
  for (int i = 1; i < argc; ++i) {
    do_check |= std::strcmp(argv[i], "check") == 0;
    do_bench |= std::strcmp(argv[i], "bench") == 0;
    do_profile |= std::strcmp(argv[i], "profile") == 0;
    g_sweep |= std::strcmp(argv[i], "sweep") == 0;
  }
  int dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&g_dev.sm_count, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&g_dev.cc_major, cudaDevAttrComputeCapabilityMajor, dev));
  CK(cudaDeviceGetAttribute(&g_dev.cc_minor, cudaDevAttrComputeCapabilityMinor, dev));
  g_dev.wgmma = wgmma_built() && g_dev.cc_major == 9 && g_dev.cc_minor == 0;
  preload_kernels();  // the staged kernels' shared-memory attribute
  if (do_check) run_checks();
  if (do_bench) run_bench();
  if (do_profile) run_profile();
  if (g_failures) std::printf("%d checks FAILED\n", g_failures);
  return g_failures ? 1 : 0;
}
