// The timing part of kernel_harness.cu (included there, inside its anonymous namespace, after the
// check helpers; same translation unit): kernel time per path and tile as CUDA graphs with weight
// copies rotated past the L2, the dense cuBLASLt baseline and the HBM copy in the same run.
#pragma once

// ----------------------------------------------------------------------------------------------
// Timing

struct BenchShape {
  int64_t n, k;
};

// One shape's timing data: random weight + scale bytes in enough copies to exceed the L2 (> 400 MB,
// cycled so no product finds its weights cached), MXFP4 scales for the same weights (dsm, E8M0
// per 32), 3 dense bf16 copies for the cuBLASLt baseline, and x / output / scratch buffers for up
// to `maxm` rows. Shared by run_bench and run_wgmma_bench.
struct BenchData {
  int64_t N, K, wrb, srb, srb_mx;
  int copies;
  std::vector<DevBuf*> dw, ds, dsm, dd;
  DevBuf dx, dout, wd, acc;
  BenchData(int64_t n, int64_t k, int64_t maxm, std::mt19937& rng, cudaStream_t s)
      : N(n), K(k), wrb(k / 2), srb(k / 16), srb_mx(k / fp4::kMxfp4BlockSize),
        copies(int(std::max<int64_t>(2, (400LL << 20) / int64_t(n * (k / 2) + n * (k / 16)) + 1))),
        dx(maxm * k * 2), dout(maxm * n * 4), wd(n * k * 2), acc(maxm * n * 4) {
    std::vector<uint8_t> hw(N * wrb), hs(N * srb), hsm(N * srb_mx);
    for (auto& b : hw) b = uint8_t(rng());
    for (auto& b : hs) b = uint8_t(0x30 + rng() % 16);
    for (auto& b : hsm) b = uint8_t(fp4::kE8M0Bias - 8 + rng() % 16);
    for (int c = 0; c < copies; ++c) {
      dw.push_back(new DevBuf(hw.size()));
      ds.push_back(new DevBuf(hs.size()));
      dsm.push_back(new DevBuf(hsm.size()));
      CK(cudaMemcpy(dw.back()->p, hw.data(), hw.size(), cudaMemcpyHostToDevice));
      CK(cudaMemcpy(ds.back()->p, hs.data(), hs.size(), cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dsm.back()->p, hsm.data(), hsm.size(), cudaMemcpyHostToDevice));
    }
    constexpr int kDenseCopies = 3;  // 2 bytes per weight: 3 copies exceed the L2
    for (int c = 0; c < kDenseCopies; ++c) {
      dd.push_back(new DevBuf(N * K * 2));
      DequantArgs d{static_cast<const uint8_t*>(dw[0]->p), static_cast<const uint8_t*>(ds[0]->p), dd.back()->p,
                    N, K, wrb, srb, fp4::kDtypeBF16};
      launch(dequant_launch(d, true), &d, s);
    }
    std::vector<uint8_t> hx(maxm * K * 2);
    for (int64_t i = 0; i < maxm * K; ++i) host_store(hx, fp4::kDtypeBF16, i, float(int(rng() % 200) - 100) / 100.0f);
    CK(cudaMemcpy(dx.p, hx.data(), hx.size(), cudaMemcpyHostToDevice));
  }
  // `a` reading weight copy c (the NVFP4 scales).
  W4A16Args with_copy(W4A16Args a, int c) const {
    a.w = static_cast<const uint8_t*>(dw[c]->p);
    a.scales = static_cast<const uint8_t*>(ds[c]->p);
    return a;
  }
  ~BenchData() {
    for (auto* v : {&dw, &ds, &dsm, &dd}) {
      for (auto* b : *v) delete b;
    }
  }
  BenchData(const BenchData&) = delete;
  BenchData& operator=(const BenchData&) = delete;
};

// Best of `runs` CUDA-event timings of `work()` on stream s, in microseconds.
template <typename W>
double best_event_us(W work, int runs, cudaStream_t s) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    CK(cudaEventRecord(e0, s));
    work();
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    best = std::min(best, 1e3 * ms);
  }
  CK(cudaGetLastError());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return best;
}

// Times `fn(copy_index)` over rotating copies; returns microseconds per call (min of 3 runs).
// The calls are captured into one CUDA graph first, so that the time is the kernels' own (the
// host's launch cost, ~3 us per cudaLaunchKernel here, stays out); what remains between two
// kernels of a graph is printed once as "launch floor" (empty kernels). Warm-up calls run before
// the capture (lazy loading, cuBLASLt's algorithm query).
template <typename F>
double time_us(F fn, int copies, int iters, cudaStream_t s) {
  for (int i = 0; i < 2; ++i) fn(i % copies);
  CK(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < iters; ++i) fn(i % copies);
  CK(cudaStreamEndCapture(s, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, s));  // the graph's own first launch uploads it
  const double us = best_event_us([&] { CK(cudaGraphLaunch(exec, s)); }, 3, s) / iters;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return us;
}

__global__ void empty_kernel() {}

// MXFP4 on the same weights: the planned path and tiles (both tensor-core kernels up to M = 64),
// SIMT for M <= 16 and dequantize + cuBLASLt from M = 16, as "<path>-mxfp4" rows.
template <typename Run, typename Report>
void bench_mxfp4_row(const fp4::W4A16Problem& p, int copies, int iters, Run run, Report report, cudaStream_t s) {
  const Plan plan = plan_w4a16(p, g_dev, true, true, nullptr, nullptr);
  std::printf("bench,%lldx%lld,M=%lld,plan-mxfp4,%s,tc=%d/%d/%d\n", (long long)p.n, (long long)p.k, (long long)p.m,
              path_name(plan.path), plan.tc.mt, plan.tc.rt, plan.tc.kw);
  char name[32];
  std::snprintf(name, sizeof name, "%d/%d/%d", plan.tc.mt, plan.tc.rt, plan.tc.kw);
  const double bytes = double(p.n) * double(p.w_row_bytes + p.scale_row_bytes);
  if (p.m <= fp4::cuda_tiling::kStagedTcMaxM) {
    for (bool staged : {true, false}) {
      g_staged = staged;
      report(staged ? "tc-staged-mxfp4" : "tc-mxfp4", name,
             time_us([&](int c) { run(Path::kTensorCore, plan.tc, c); }, copies, iters, s), bytes);
    }
    g_staged = true;
  }
  if (p.m <= 16) {
    report("simt-mxfp4", "-", time_us([&](int c) { run(Path::kSimt, plan.tc, c); }, copies, iters, s), bytes);
  }
  if (p.m >= 16) {
    report("dequant+gemm-mxfp4", "-", time_us([&](int c) { run(Path::kDequantGemm, plan.tc, c); }, copies, iters, s),
           bytes);
  }
}

void run_bench(bool quick, bool small, bool mid) {
  std::vector<BenchShape> shapes = {{8192, 8192}, {14336, 4096}, {4096, 14336}};
  std::vector<int64_t> ms = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
  if (quick) ms = {1, 8, 16, 32, 64, 256, 512, 2048, 8192};
  if (small) ms = {1, 8, 16, 32};
  if (mid) ms = {32, 48, 64, 96, 128, 192, 256};
  cudaStream_t s;  // not the legacy default stream: that one cannot be captured
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("bench,launch_floor,us=%.2f\n", time_us([&](int) { empty_kernel<<<132, 128, 0, s>>>(); }, 1, 40, s));
  // HBM copy bandwidth (read + write), outside a graph (a captured copy runs as a slower node;
  // 1 GiB copies have no launch cost to hide).
  {
    DevBuf a(size_t(1) << 30), b(size_t(1) << 30);
    const double best =
        best_event_us([&] { CK(cudaMemcpyAsync(b.p, a.p, a.bytes, cudaMemcpyDeviceToDevice, s)); }, 5, s);
    std::printf("bench,copy,GBps=%.1f\n", 2.0 * a.bytes / best / 1e3);
  }
  std::mt19937 rng(7);
  for (const auto& sh : shapes) {
    BenchData data(sh.n, sh.k, ms.back(), rng, s);
    const int64_t N = data.N, K = data.K, wrb = data.wrb, srb = data.srb;
    const int copies = data.copies;
    const size_t wbytes = N * wrb + N * srb;
    auto &dw = data.dw, &ds = data.ds, &dsm = data.dsm, &dd = data.dd;
    DevBuf &dx = data.dx, &dout = data.dout, &wd = data.wd, &acc = data.acc;
    for (int64_t M : ms) {
      const fp4::W4A16Problem p = bf16_problem(M, N, K, wrb, srb);
      W4A16Args a{};
      a.x = dx.p;
      a.out = dout.p;
      a.p = p;
      auto with_copy = [&](int c) { return data.with_copy(a, c); };
      // The same weights with MXFP4 scales (E8M0 per 32).
      auto with_copy_mx = [&](int c) {
        W4A16Args b = with_copy(c);
        b.scales = static_cast<const uint8_t*>(dsm[c]->p);
        b.p.mode = fp4::kModeMxfp4;
        b.p.scale_row_bytes = data.srb_mx;
        return b;
      };
      const double flops = 2.0 * M * N * K;
      const double qbytes = double(wbytes);
      const int iters = M >= 2048 ? 5 : 20;
      // wGBps: the quantized weight bytes (packed values + scales; MXFP4 rows pass theirs) per time.
      auto report = [&](const char* what, const char* cfg, double us, double bytes = 0) {
        std::printf("bench,%lldx%lld,M=%lld,%s,%s,us=%.2f,TFLOPs=%.1f,wGBps=%.0f\n", (long long)N, (long long)K,
                    (long long)M, what, cfg, us, flops / us / 1e6, (bytes > 0 ? bytes : qbytes) / us / 1e3);
      };
      // Dense bf16 baseline.
      double dense = time_us(
          [&](int c) {
            char err[256];
            if (!cublas_gemm(g_lt, s, M, N, K, dx.p, dd[c]->p, fp4::kDtypeBF16, dout.p, fp4::kDtypeBF16, nullptr,
                             g_ws->p, kWsBytes, err)) {
              std::fprintf(stderr, "%s\n", err);
              std::exit(2);
            }
          },
          int(dd.size()), iters, s);
      report("dense_bf16", "-", dense);
      const Plan plan = plan_w4a16(p, g_dev, true, true, nullptr, nullptr);
      std::printf("bench,%lldx%lld,M=%lld,plan,%s,tc=%d/%d/%d\n", (long long)N, (long long)K, (long long)M,
                  path_name(plan.path), plan.tc.mt, plan.tc.rt, plan.tc.kw);
      if (M <= 256) {
        // --mid: the staged kernel past M = 32, in x tiles of 32 rows (its widest).
        const int mt = mid ? fp4::cuda_tiling::kMaxStagedColTiles : M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : 8;
        std::vector<TcConfig> cfgs;
        if (!mid) cfgs.push_back(plan.tc);
        if (!quick) {
          for (int rt : {1, 2})
            for (int kw : {2, 4, 8}) {
              if (mt * rt > 8) continue;
              cfgs.push_back(TcConfig{mt, rt, kw});
            }
        }
        for (bool staged : {true, false}) {
          if (mid && !staged) continue;
          g_staged = staged;
          for (const auto& cfg : cfgs) {
            double us = time_us([&](int c) { run_path(Path::kTensorCore, cfg, with_copy(c), nullptr, nullptr, s); },
                                copies, iters, s);
            char name[32];
            std::snprintf(name, sizeof name, "%d/%d/%d", cfg.mt, cfg.rt, cfg.kw);
            report(staged ? "tc-staged" : "tc", name, us);
          }
        }
        g_staged = true;
      }
      if (M <= 16) {
        double us = time_us([&](int c) { run_path(Path::kSimt, plan.tc, with_copy(c), nullptr, nullptr, s); }, copies,
                            iters, s);
        report("simt", "-", us);
      }
      if (M >= 16) {
        double us = time_us(
            [&](int c) { run_path(Path::kDequantGemm, plan.tc, with_copy(c), wd.p, static_cast<float*>(acc.p), s); },
            copies, iters, s);
        report("dequant+gemm", "-", us);
        DequantArgs d{static_cast<const uint8_t*>(dw[0]->p), static_cast<const uint8_t*>(ds[0]->p), wd.p, N, K,
                      wrb, srb, fp4::kDtypeBF16};
        double dq = time_us(
            [&](int c) {
              d.w = static_cast<const uint8_t*>(dw[c]->p);
              d.scales = static_cast<const uint8_t*>(ds[c]->p);
              launch(dequant_launch(d, true), &d, s);
            },
            copies, iters, s);
        report("dequant_only", "-", dq);
      }
      bench_mxfp4_row(with_copy_mx(0).p, copies, iters, [&](Path path, const TcConfig& cfg, int c) {
        run_path(path, cfg, with_copy_mx(c), wd.p, static_cast<float*>(acc.p), s);
      }, report, s);
      std::fflush(stdout);
    }
  }
}

// --decode: the staged kernel at M = 1 on Llama-3-8B's products (its decode step: gate / up, q / o,
// k / v, down, lm_head), the plan's tile and every (rt, kw) up to the deep variant's 16 warps, so
// the M = 1 split of K can be chosen per shape (benchmarks/notes/cuda.md, stop 45).
void run_decode_bench() {
  const std::vector<BenchShape> shapes = {{14336, 4096}, {4096, 4096}, {1024, 4096}, {4096, 14336}, {128256, 4096}};
  constexpr int64_t kDecodeM = 1;
  constexpr int kIters = 20;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("bench,launch_floor,us=%.2f\n", time_us([&](int) { empty_kernel<<<132, 128, 0, s>>>(); }, 1, 40, s));
  std::mt19937 rng(7);
  g_staged = true;
  for (const auto& sh : shapes) {
    BenchData data(sh.n, sh.k, kDecodeM, rng, s);
    const fp4::W4A16Problem p = bf16_problem(kDecodeM, data.N, data.K, data.wrb, data.srb);
    W4A16Args a{};
    a.x = data.dx.p;
    a.out = data.dout.p;
    a.p = p;
    const double wbytes = double(data.N) * double(data.wrb + data.srb);
    const Plan plan = plan_w4a16(p, g_dev, true, true, nullptr, nullptr);
    std::vector<TcConfig> cfgs = {plan.tc};
    for (int rt : {1, 2})
      for (int kw : {1, 2, 4, 8, 16}) cfgs.push_back(TcConfig{1, rt, kw});
    for (size_t i = 0; i < cfgs.size(); ++i) {
      const TcConfig& cfg = cfgs[i];
      const double us = time_us(
          [&](int c) { run_path(Path::kTensorCore, cfg, data.with_copy(a, c), nullptr, nullptr, s); },
          data.copies, kIters, s);
      std::printf("decode,%lldx%lld,%s,%d/%d/%d,us=%.2f,wGBps=%.0f\n", (long long)data.N, (long long)data.K,
                  i == 0 ? "plan" : "tile", cfg.mt, cfg.rt, cfg.kw, us, wbytes / us / 1e3);
    }
    std::fflush(stdout);
  }
  CK(cudaStreamDestroy(s));
}

// A few launches of chosen kernels on 8192 x 8192, for a profiler (ncu -k regex:...).
void run_profile() {
  const int64_t N = 8192, K = 8192, wrb = K / 2, srb = K / 16;
  constexpr int64_t kMaxM = 128;  // the wgmma launches below
  DevBuf dw(N * wrb), ds(N * srb), dx(kMaxM * K * 2), dout(kMaxM * N * 4), wd(N * K * 2);
  CK(cudaMemset(dw.p, 0x35, dw.bytes));
  CK(cudaMemset(ds.p, 0x38, ds.bytes));
  CK(cudaMemset(dx.p, 0x3c, dx.bytes));
  for (int64_t M : {1, 16}) {
    const fp4::W4A16Problem p = bf16_problem(M, N, K, wrb, srb);
    const W4A16Args a = device_args(p, dx, dw, ds, dout);
    const Plan plan = plan_w4a16(p, g_dev, true, true, nullptr, nullptr);
    for (bool staged : {true, false}) {
      g_staged = staged;
      for (int i = 0; i < 2; ++i) run_path(Path::kTensorCore, plan.tc, a, nullptr, nullptr, 0);
    }
    g_staged = true;
    if (M == 1) {
      for (int i = 0; i < 2; ++i) run_path(Path::kSimt, plan.tc, a, nullptr, nullptr, 0);
      DequantArgs d{a.w, a.scales, wd.p, N, K, wrb, srb, fp4::kDtypeBF16};
      for (int i = 0; i < 2; ++i) launch(dequant_launch(d, true), &d, 0);
    }
  }
  // The wgmma kernel at its planned tiles, for `ncu -k regex:wgmma_kernel` (its stall reasons:
  // docs/wgmma.md, "Where the time goes").
  for (int64_t M : {int64_t(64), kMaxM}) {
    if (!g_dev.wgmma) break;
    const fp4::W4A16Problem p = bf16_problem(M, N, K, wrb, srb);
    const W4A16Args a = device_args(p, dx, dw, ds, dout);
    const Plan plan = plan_w4a16(p, g_dev, true, true, nullptr, nullptr, true);
    for (int i = 0; i < 2; ++i) run_wgmma(plan.wg, a, 0);
  }
  // The kernel's fixed cost: one wave of the same blocks (N = 8192: 64 weight tiles, M = 128 in
  // two 64-row x tiles, no split) over 1, 4 and 16 stages of K; ncu's durations against the
  // stage count give the per-stage time and the intercept (benchmarks/notes/wgmma.md).
  constexpr int64_t kFixedCostM = 128;
  constexpr int64_t kStage = fp4::cuda_tiling::kWgmmaKUnit;
  for (int64_t k : {kStage, 4 * kStage, 16 * kStage}) {
    if (!g_dev.wgmma) break;
    const fp4::W4A16Problem p = bf16_problem(kFixedCostM, N, k, k / 2, k / 16);
    const W4A16Args a = device_args(p, dx, dw, ds, dout);
    for (int i = 0; i < 2; ++i) run_wgmma(WgmmaConfig{fp4::cuda_tiling::kWgmmaTileMMid, 1}, a, 0);
  }
  CK(cudaDeviceSynchronize());
}
