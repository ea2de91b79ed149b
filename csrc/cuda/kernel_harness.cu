// Standalone check and timing of the CUDA kernels, without MLX (scripts/gpu_check.sh builds it):
//   correctness: every path (tc, simt, dequant + cuBLASLt) and x/out dtype against a float64 host
//                reference, ragged shapes, epilogue chains, and an exact decode test over all
//                (byte, scale) pairs with identity x;
//   timing:      kernel time by CUDA events on rotated weight copies (more bytes than the L2), for
//                each path and tensor-core configuration, next to dense bf16 cuBLASLt.
// Usage: kernel_harness [check] [bench] [profile] [graph-probe] [--quick] [--small] [--mid] [--wgmma] [--decode]. Prints CSV-like lines;
// exit code 1 on a failure. The wgmma kernel's checks and bench: kernel_harness_wgmma.h.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "../shared/tiling_cuda.h"
#include "w4a16_kernels.h"

using namespace mlx_fp4::cuda;

#define CK(x)                                                                                    \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)

namespace {

int g_failures = 0;
DeviceInfo g_dev;


size_t dtype_size(int d) { return d == fp4::kDtypeF32 ? 4 : 2; }

void host_store(std::vector<uint8_t>& buf, int dtype, size_t i, float v) {
  if (dtype == fp4::kDtypeF32) {
    std::memcpy(&buf[i * 4], &v, 4);
  } else if (dtype == fp4::kDtypeF16) {
    __half h = __float2half_rn(v);
    std::memcpy(&buf[i * 2], &h, 2);
  } else {
    __nv_bfloat16 b = __float2bfloat16_rn(v);
    std::memcpy(&buf[i * 2], &b, 2);
  }
}

float host_load(const std::vector<uint8_t>& buf, int dtype, size_t i) {
  if (dtype == fp4::kDtypeF32) {
    float v;
    std::memcpy(&v, &buf[i * 4], 4);
    return v;
  }
  if (dtype == fp4::kDtypeF16) {
    __half h;
    std::memcpy(&h, &buf[i * 2], 2);
    return __half2float(h);
  }
  __nv_bfloat16 b;
  std::memcpy(&b, &buf[i * 2], 2);
  return __bfloat162float(b);
}

struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n = 0) { alloc(n); }
  void alloc(size_t n) {
    bytes = n;
    if (n) CK(cudaMalloc(&p, n));
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

// One product's arguments over device buffers: no epilogue, no global scale.
W4A16Args device_args(const fp4::W4A16Problem& p, const DevBuf& x, const DevBuf& w, const DevBuf& s,
                      const DevBuf& out) {
  W4A16Args a{};
  a.x = x.p;
  a.w = static_cast<const uint8_t*>(w.p);
  a.scales = static_cast<const uint8_t*>(s.p);
  a.out = out.p;
  a.p = p;
  return a;
}

CUresult launch_cluster(const Launch& l, void** params, cudaStream_t s);  // kernel_harness_wgmma.h

CUresult launch_result(const Launch& l, void* args, cudaStream_t s) {
  void* params[] = {args};
  return l.cluster.x * l.cluster.y * l.cluster.z > 1
             ? launch_cluster(l, params, s)
             : cuLaunchKernel(l.func, l.grid.x, l.grid.y, l.grid.z, l.block.x, l.block.y, l.block.z, l.smem,
                              reinterpret_cast<CUstream>(s), params, nullptr);
}

void launch(const Launch& l, void* args, cudaStream_t s) {
  const CUresult r = launch_result(l, args, s);
  if (r != CUDA_SUCCESS) {
    const char* msg = nullptr;
    cuGetErrorString(r, &msg);
    std::fprintf(stderr, "cuLaunchKernel: %s\n", msg ? msg : "?");
    std::exit(2);
  }
}

void* g_lt = nullptr;
bool g_staged = true;  // use the staged tensor-core kernel where it applies (staged_loads_ok)
DevBuf* g_ws = nullptr;
DevBuf* g_mult = nullptr;  // the dequant path's decode multiplier (cuBLAS's device alpha)
constexpr size_t kWsBytes = size_t(32) << 20;

// A bf16-in, bf16-out problem (the timing and profiling shapes).
fp4::W4A16Problem bf16_problem(int64_t m, int64_t n, int64_t k, int64_t wrb, int64_t srb) {
  fp4::W4A16Problem p{};
  p.m = m;
  p.n = n;
  p.k = k;
  p.w_row_bytes = wrb;
  p.scale_row_bytes = srb;
  p.x_dtype = fp4::kDtypeBF16;
  p.out_dtype = fp4::kDtypeBF16;
  return p;
}

// The wgmma path (kernel_harness_wgmma.h): scratch for permuted x, the forced configuration.
DevBuf* g_xp = nullptr;
const WgmmaConfig* g_wg = nullptr;
bool run_wgmma(const WgmmaConfig& cfg, const W4A16Args& a, cudaStream_t s);  // false: not launched (reported)

// One product by the given path into a.out (device pointers in a). For dequant: wd/acc scratch.
void run_path(Path path, const TcConfig& cfg, W4A16Args a, void* wd, float* acc, cudaStream_t s) {
  const fp4::W4A16Problem& p = a.p;
  const bool vec = vector_loads_ok(p, a.x, a.w);
  if (path == Path::kWgmma) {
    run_wgmma(g_wg ? *g_wg : plan_w4a16(p, g_dev, vec, false, nullptr, nullptr, true).wg, a, s);
  } else if (path == Path::kTensorCore) {
    launch(tc_launch(p, cfg, vec, g_staged && staged_loads_ok(p, a.x, a.w, a.scales)), &a, s);
  } else if (path == Path::kSimt) {
    launch(simt_launch(p, vec), &a, s);
  } else {
    DequantArgs d{a.w, a.scales, wd, p.n, p.k, p.w_row_bytes, p.scale_row_bytes, p.x_dtype, p.mode,
                  a.global_scale, a.global_scale ? static_cast<float*>(g_mult->p) : nullptr};
    launch(dequant_launch(d, vec), &d, s);
    const bool direct = p.num_ops == 0 && (p.out_dtype == p.x_dtype || p.out_dtype == fp4::kDtypeF32);
    char err[256] = {0};
    if (!cublas_gemm(g_lt, s, p.m, p.n, p.k, a.x, wd, p.x_dtype, direct ? a.out : acc,
                     direct ? p.out_dtype : fp4::kDtypeF32, d.multiplier, g_ws->p, kWsBytes, err)) {
      std::fprintf(stderr, "cublas: %s\n", err);
      std::exit(2);
    }
    if (!direct) {
      EpilogueArgs e{};
      e.acc = acc;
      e.scaled = 1;
      e.a = a;
      launch(epilogue_launch(p), &e, s);
    }
  }
}

const char* path_name(Path p) {
  return p == Path::kWgmma ? "wgmma" : p == Path::kTensorCore ? "tc" : p == Path::kSimt ? "simt" : "dequant";
}
const char* dtype_name(int d) { return d == fp4::kDtypeF32 ? "f32" : d == fp4::kDtypeF16 ? "f16" : "bf16"; }

// ----------------------------------------------------------------------------------------------
// Correctness

struct Case {
  int64_t m, n, k;
  int x_dtype, out_dtype;
  bool gs;
  int epi;  // 0 none, 1 bias+silu, 2 residual add + mul row + clamp, 3 gelu + scale
  int64_t w_pad = 0;  // extra bytes per weight row (random: nibbles past K are garbage)
  int64_t s_pad = 0;  // extra bytes per scale row (NaN codes: a kernel must never read them)
  int mode = fp4::kModeNvfp4;  // MXFP4 cases: kernel_harness_mxfp4.h
};

// A random scale byte of the mode. NVFP4: E4M3 codes between 2^-4 and 2^3 (sign mostly positive), a
// few zero/subnormal. MXFP4: E8M0 codes 2^-7 .. 2^7, a few extreme ones: 2^-127 (the fp32
// subnormal) .. 2^-118, and with bf16/fp32 x up to 2^93 (products and sums stay finite in fp32 and
// bf16; fp16 x: the dequantize path's fp16 weights would overflow).
uint8_t random_scale(int mode, int x_dtype, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  if (mode == fp4::kModeMxfp4) {
    const int r = byte(rng);
    if (r < 8) return uint8_t(byte(rng) % 10);
    if (r < 12 && x_dtype != fp4::kDtypeF16) return uint8_t(200 + byte(rng) % 21);
    return uint8_t(fp4::kE8M0Bias - 7 + byte(rng) % 15);
  }
  int e = 3 + byte(rng) % 8, m = byte(rng) % 8;
  int code = (e << 3) | m;
  if (byte(rng) < 8) code = byte(rng) % 8;  // zero and subnormals
  if (byte(rng) < 16) code |= 0x80;
  return uint8_t(code);
}

// v rounded to the out dtype (the reference's overflow to +-Inf).
double round_to_dtype(double v, int dtype) {
  std::vector<uint8_t> b(4);
  host_store(b, dtype, 0, float(v));
  return host_load(b, dtype, 0);
}

void check_case(const Case& c, Path path, const TcConfig* cfg_override, std::mt19937& rng) {
  fp4::W4A16Problem p{};
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.w_row_bytes = (c.k + 1) / 2 + c.w_pad;
  p.scale_row_bytes = fp4::scale_blocks_for_k(c.k, c.mode) + c.s_pad;
  p.x_dtype = c.x_dtype;
  p.out_dtype = c.out_dtype;
  p.has_global_scale = c.gs ? 1 : 0;
  p.mode = c.mode;
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint8_t> w(p.n * p.w_row_bytes), sc(p.n * p.scale_row_bytes);
  for (auto& b : w) b = uint8_t(byte(rng));
  for (auto& s : sc) s = random_scale(c.mode, c.x_dtype, rng);
  // Padding scale bytes past K hold NaN codes of the format.
  const uint8_t nan_code = c.mode == fp4::kModeMxfp4 ? uint8_t(fp4::kE8M0NaN) : uint8_t(0x7F);
  const int64_t blocks = fp4::scale_blocks_for_k(c.k, c.mode);
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t b = blocks; b < p.scale_row_bytes; ++b) sc[n * p.scale_row_bytes + b] = nan_code;
  // MXFP4: an E8M0 NaN scale (0xFF) in row 3 poisons that row only.
  if (c.mode == fp4::kModeMxfp4 && p.n > 3) sc[3 * p.scale_row_bytes + (blocks - 1) / 2] = fp4::kE8M0NaN;
  const size_t xs = dtype_size(c.x_dtype), os = dtype_size(c.out_dtype);
  std::vector<uint8_t> x(p.m * p.k * xs);
  for (int64_t i = 0; i < p.m * p.k; ++i) host_store(x, c.x_dtype, i, nd(rng));
  // The kernels take MLX's global scale (amax); the reference uses its decode multiplier.
  const float gs_amax = 33.0f;
  const float gsv = fp4::decode_multiplier(gs_amax);

  // Epilogue operands.
  std::vector<std::vector<uint8_t>> ops_host;
  auto add_operand = [&](int kind, int dtype) {
    int64_t count = kind == fp4::kOperandScalar ? 1 : kind == fp4::kOperandCol ? p.n : kind == fp4::kOperandRow ? p.m : p.m * p.n;
    std::vector<uint8_t> v(count * dtype_size(dtype));
    for (int64_t i = 0; i < count; ++i) host_store(v, dtype, i, nd(rng));
    p.operand_kind[p.num_operands] = kind;
    p.operand_dtype[p.num_operands] = dtype;
    ops_host.push_back(v);
    return p.num_operands++;
  };
  auto add_op = [&](int code, int operand, float p0 = 0, float p1 = 0) {
    p.ops[p.num_ops++] = fp4::EpilogueOp{code, operand, p0, p1};
  };
  if (c.epi == 1) {
    add_op(fp4::kEpiAdd, add_operand(fp4::kOperandCol, fp4::kDtypeBF16));
    add_op(fp4::kEpiSilu, -1);
  } else if (c.epi == 2) {
    add_op(fp4::kEpiAdd, add_operand(fp4::kOperandFull, fp4::kDtypeF32));
    add_op(fp4::kEpiMul, add_operand(fp4::kOperandRow, fp4::kDtypeF16));
    add_op(fp4::kEpiClamp, -1, -1.5f, 2.0f);
  } else if (c.epi == 3) {
    add_op(fp4::kEpiGelu, -1);
    add_op(fp4::kEpiScale, -1, 0.5f);
    add_op(fp4::kEpiAdd, -1, 0.25f);  // constant operand
    add_op(fp4::kEpiAdd, add_operand(fp4::kOperandScalar, fp4::kDtypeF32));
  }

  // Reference (float64 accumulation) and the bound on the accumulated magnitude.
  std::vector<double> ref(p.m * p.n), mag(p.m * p.n);
  std::vector<float> wdec(p.n * p.k);
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t k = 0; k < p.k; ++k) {
      uint32_t b = w[n * p.w_row_bytes + k / 2];
      uint32_t code = (k & 1) ? (b >> 4) : (b & 0xF);
      wdec[n * p.k + k] =
          fp4::e2m1_to_float(code) * fp4::scale_to_float(c.mode, sc[n * p.scale_row_bytes + k / fp4::block_size(c.mode)]);
    }
  for (int64_t m = 0; m < p.m; ++m)
    for (int64_t n = 0; n < p.n; ++n) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < p.k; ++k) {
        double t = double(host_load(x, c.x_dtype, m * p.k + k)) * wdec[n * p.k + k];
        s += t;
        a += std::fabs(t);
      }
      float v = float(s) * (c.gs ? gsv : 1.0f);
      for (int i = 0; i < p.num_ops; ++i) {
        const auto& op = p.ops[i];
        float operand = op.p0;
        if (op.operand >= 0) {
          operand = host_load(ops_host[op.operand], p.operand_dtype[op.operand],
                              fp4::operand_offset(p.operand_kind[op.operand], m, n, p.n));
        }
        v = fp4::epilogue_apply(op.code, v, operand, op.p0, op.p1);
      }
      ref[m * p.n + n] = v;
      mag[m * p.n + n] = a * (c.gs ? gsv : 1.0);
    }

  // Device buffers (w with a guard: its allocation ends exactly at the last byte).
  DevBuf dx(x.size()), dw(w.size()), ds(sc.size()), dout(p.m * p.n * os), dgs(4);
  CK(cudaMemcpy(dx.p, x.data(), x.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw.p, w.data(), w.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(ds.p, sc.data(), sc.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dgs.p, &gs_amax, 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(dout.p, 0xFF, dout.bytes));
  std::vector<DevBuf*> dops;
  W4A16Args a{};
  for (size_t i = 0; i < ops_host.size(); ++i) {
    dops.push_back(new DevBuf(ops_host[i].size()));
    CK(cudaMemcpy(dops.back()->p, ops_host[i].data(), ops_host[i].size(), cudaMemcpyHostToDevice));
    a.operands[i] = dops.back()->p;
  }
  a.x = dx.p;
  a.w = static_cast<const uint8_t*>(dw.p);
  a.scales = static_cast<const uint8_t*>(ds.p);
  a.global_scale = c.gs ? static_cast<const float*>(dgs.p) : nullptr;
  a.out = dout.p;
  a.p = p;
  DevBuf wd(p.n * p.k * xs), acc(p.m * p.n * 4);
  const Plan plan = plan_w4a16(p, g_dev, vector_loads_ok(p, a.x, a.w),
                               g_staged && staged_loads_ok(p, a.x, a.w, a.scales), nullptr, nullptr,
                               wgmma_loads_ok(p, a.w, a.scales));
  const TcConfig cfg = cfg_override ? *cfg_override : plan.tc;
  run_path(path, cfg, a, wd.p, static_cast<float*>(acc.p), 0);
  CK(cudaDeviceSynchronize());
  std::vector<uint8_t> out(dout.bytes);
  CK(cudaMemcpy(out.data(), dout.p, out.size(), cudaMemcpyDeviceToHost));

  // Error per element, normalized: |y - ref| <= out rounding + accumulation error.
  const double out_eps = c.out_dtype == fp4::kDtypeF32 ? 1.0 / (1 << 22) : c.out_dtype == fp4::kDtypeF16 ? 1.0 / (1 << 10) : 1.0 / (1 << 7);
  const double acc_eps = 1.0 / (1 << 16);  // fp32 (tensor-core) accumulation over K terms
  double worst = 0;
  int64_t worst_i = 0;
  for (int64_t i = 0; i < p.m * p.n; ++i) {
    const double y = host_load(out, c.out_dtype, i);
    const double tol = out_eps * std::fabs(ref[i]) + acc_eps * (mag[i] + 1.0) * 4 + 1e-30;
    double e = std::fabs(y - ref[i]) / tol;
    const double r_out = round_to_dtype(ref[i], c.out_dtype);
    if (std::isinf(y) || std::isinf(r_out)) e = y == r_out ? 0.0 : 1e30;  // overflow in the out dtype
    if (std::isnan(y) != std::isnan(ref[i])) e = 1e30;
    if (std::isnan(y) && std::isnan(ref[i])) e = 0.0;
    if (e > worst) {
      worst = e;
      worst_i = i;
    }
  }
  const bool ok = worst <= 1.0;
  if (!ok) ++g_failures;
  const bool staged = path == Path::kTensorCore && g_staged && staged_loads_ok(p, a.x, a.w, a.scales);
  const WgmmaConfig wg = g_wg ? *g_wg : plan.wg;
  std::printf("check,%s%s,%s,x=%s,out=%s,M=%lld,N=%lld,K=%lld,gs=%d,epi=%d,pad=%lld/%lld,tc=%d/%d/%d,wg=%d/%d/%d,worst=%.3g,%s",
              staged ? "tc-staged" : path_name(path), c.mode == fp4::kModeMxfp4 ? "-mxfp4" : "", ok ? "ok" : "FAIL",
              dtype_name(c.x_dtype), dtype_name(c.out_dtype), (long long)c.m,
              (long long)c.n, (long long)c.k, int(c.gs), c.epi, (long long)c.w_pad, (long long)c.s_pad, cfg.mt, cfg.rt, cfg.kw,
              path == Path::kWgmma ? wg.tile_m : 0, path == Path::kWgmma ? wg.splits : 0,
              path == Path::kWgmma ? wg.multicast : 0, worst, ok ? "\n" : "");
  if (!ok) {
    std::printf(" at m=%lld n=%lld y=%.8g ref=%.8g\n", (long long)(worst_i / p.n), (long long)(worst_i % p.n),
                host_load(out, c.out_dtype, worst_i), ref[worst_i]);
  }
  for (auto* d : dops) delete d;
}

// Exact decode: x = identity rows (M = K), so y[m, n] = decode(w[n, m]) * scale[n, m / block] exactly,
// over about all (byte, scale) pairs: NVFP4 E4M3 without its NaN codes; MXFP4 every E8M0 code (0xFF
// NaN, 2^-127 subnormal, 6 * 2^127 overflowing to Inf in fp32 as on the host). A NaN scale makes
// its whole row NaN, as in dequantize-then-matmul (x's zeros times the block's NaN weights). Every
// tensor-core kernel that applies (K = 32: register prefetch; 128 and 256: also staged, 1 and 2
// steps a stage).
void check_exact_decode(int x_dtype, int mode = fp4::kModeNvfp4, int64_t K = fp4::kNvfp4BlockSize) {
  const int64_t N = 4096, M = K;
  const int64_t wrb = std::max<int64_t>(16, K / 2);  // K = 16: a padded row (vector path), bytes 8..15 unused
  const int64_t srb = K / fp4::block_size(mode);
  fp4::W4A16Problem p{};
  p.m = M;
  p.n = N;
  p.k = K;
  p.w_row_bytes = wrb;
  p.scale_row_bytes = srb;
  p.x_dtype = x_dtype;
  p.out_dtype = fp4::kDtypeF32;
  p.mode = mode;
  std::vector<uint8_t> w(N * wrb), sc(N * srb), x(M * K * 2);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < wrb; ++j) w[n * wrb + j] = uint8_t((n * 8 + j * 37) & 0xFF);
    for (int64_t b = 0; b < srb; ++b) {
      int code = int((n * 37 + n / 256 + b * 101) & 0xFF);
      if (mode == fp4::kModeNvfp4 && (code & 0x7F) == 0x7F) code = 0x38;
      sc[n * srb + b] = uint8_t(code);
    }
  }
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) host_store(x, x_dtype, m * K + k, m == k ? 1.0f : 0.0f);
  DevBuf dx(x.size()), dw(w.size()), ds(sc.size()), dout(M * N * 4);
  CK(cudaMemcpy(dx.p, x.data(), x.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw.p, w.data(), w.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(ds.p, sc.data(), sc.size(), cudaMemcpyHostToDevice));
  const W4A16Args a = device_args(p, dx, dw, ds, dout);
  const bool staged_ok = staged_loads_ok(p, a.x, a.w, a.scales);
  int bad = 0, runs = 0;
  for (bool staged : {false, true}) {
    if (staged && !staged_ok) continue;
    g_staged = staged;
    for (int mt : {1, 2, 4}) {
      if (mt * fp4::cuda_tiling::kMmaCols > M && mt > 1) continue;
      TcConfig cfg{mt, 1, 1};
      CK(cudaMemset(dout.p, 0, dout.bytes));
      run_path(Path::kTensorCore, cfg, a, nullptr, nullptr, 0);
      CK(cudaDeviceSynchronize());
      ++runs;
      std::vector<float> out(M * N);
      CK(cudaMemcpy(out.data(), dout.p, out.size() * 4, cudaMemcpyDeviceToHost));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          uint32_t b = w[n * wrb + m / 2];
          uint32_t code = (m & 1) ? (b >> 4) : (b & 0xF);
          const uint8_t s = sc[n * srb + m / fp4::block_size(mode)];
          bool nan_row = false;
          for (int64_t blk = 0; blk < srb; ++blk) nan_row |= std::isnan(fp4::scale_to_float(mode, sc[n * srb + blk]));
          float r = nan_row ? NAN : fp4::e2m1_to_float(code) * fp4::scale_to_float(mode, s);
          float y = out[m * N + n];
          if (!(y == r || (std::isnan(y) && std::isnan(r)))) {
            if (bad < 5) std::printf("  decode mismatch x=%s staged=%d mt=%d m=%lld n=%lld code=%u scale=0x%02x y=%g ref=%g\n",
                                     dtype_name(x_dtype), int(staged), mt, (long long)m, (long long)n, code, s, y, r);
            ++bad;
          }
        }
    }
  }
  g_staged = true;
  if (bad) ++g_failures;
  std::printf("check,tc-exact-decode%s,%s,x=%s,K=%lld,staged=%d,runs=%d,mismatches=%d\n",
              mode == fp4::kModeMxfp4 ? "-mxfp4" : "", bad ? "FAIL" : "ok", dtype_name(x_dtype), (long long)K,
              int(staged_ok), runs, bad);
}

// One case on every path: both tensor-core kernels (the staged one where it applies, the other as
// its fallback; every tile unless quick) for 16-bit x, SIMT and dequantize + cuBLASLt.
void check_all_paths(const Case& c, bool quick, std::mt19937& rng) {
  const bool half_x = c.x_dtype != fp4::kDtypeF32;
  for (bool staged : {true, false}) {
    if (!half_x) break;
    g_staged = staged;
    check_case(c, Path::kTensorCore, nullptr, rng);
    if (!quick) {
      for (int rt : {1, 2})
        for (int kw : {1, 2, 3, 4, 8, 16}) {
          TcConfig cfg{c.m <= 8 ? 1 : c.m <= 16 ? 2 : c.m <= 32 ? 4 : 8, rt, kw};
          if (cfg.mt * cfg.rt > 8) continue;
          if (kw > fp4::cuda_tiling::tc_max_warps(staged, cfg.mt)) continue;  // 16: the deep variant only
          check_case(c, Path::kTensorCore, &cfg, rng);
        }
    }
  }
  g_staged = true;
  check_case(c, Path::kSimt, nullptr, rng);
  check_case(c, Path::kDequantGemm, nullptr, rng);
}

#include "kernel_harness_mxfp4.h"

void run_checks(bool quick) {
  std::mt19937 rng(1234);
  check_exact_decode(fp4::kDtypeBF16);
  check_exact_decode(fp4::kDtypeF16);
  std::vector<Case> cases = {
      {1, 64, 256, fp4::kDtypeBF16, fp4::kDtypeBF16, false, 0},
      {5, 200, 1000, fp4::kDtypeBF16, fp4::kDtypeF32, true, 1},
      {16, 128, 512, fp4::kDtypeF16, fp4::kDtypeF16, true, 2},
      {33, 77, 333, fp4::kDtypeBF16, fp4::kDtypeBF16, false, 3},   // ragged: odd K, not vector
      {3, 50, 17, fp4::kDtypeF16, fp4::kDtypeF32, false, 0},       // K = 17
      {2, 40, 1, fp4::kDtypeBF16, fp4::kDtypeF32, true, 0},        // K = 1
      {70, 300, 2048, fp4::kDtypeBF16, fp4::kDtypeBF16, true, 2},  // MT = 8, several M tiles
      {9, 96, 520, fp4::kDtypeBF16, fp4::kDtypeF16, false, 1, 12}, // padded rows, K % 128 != 0
      {8, 1024, 4096, fp4::kDtypeBF16, fp4::kDtypeBF16, false, 0},
      {4, 64, 264, fp4::kDtypeF32, fp4::kDtypeF32, true, 1},
      {300, 64, 256, fp4::kDtypeF32, fp4::kDtypeBF16, false, 3},
      // Staged tensor-core kernel (K % 256 == 0, stages of two steps): padded rows and N % 32 != 0,
      // warps with fewer stages than others or none (3 and 10 stages over kw warps), a long K.
      {3, 136, 1024, fp4::kDtypeBF16, fp4::kDtypeBF16, true, 1, 16},
      {24, 100, 768, fp4::kDtypeF16, fp4::kDtypeBF16, false, 2},
      {1, 2048, 8192, fp4::kDtypeBF16, fp4::kDtypeF32, true, 0},
      {13, 520, 2560, fp4::kDtypeF16, fp4::kDtypeF16, false, 1},
      // M in (32, 64]: the staged kernel with several x tiles of 32 rows (automatic choice).
      {64, 200, 1024, fp4::kDtypeBF16, fp4::kDtypeBF16, true, 2},
      {50, 96, 512, fp4::kDtypeF16, fp4::kDtypeF32, false, 1, 16},
      // Staged kernel with stages of one step (K % 128 == 0, K % 256 != 0: 8-byte scale copies).
      {5, 72, 384, fp4::kDtypeBF16, fp4::kDtypeBF16, true, 1, 16},
      {40, 160, 1152, fp4::kDtypeF16, fp4::kDtypeBF16, false, 0},
      {2, 1000, 4992, fp4::kDtypeBF16, fp4::kDtypeF32, true, 2},
  };
  for (const auto& c : cases) check_all_paths(c, quick, rng);
  run_mxfp4_checks(quick, rng);
}

#include "kernel_harness_bench.h"

}  // namespace

#include "kernel_harness_wgmma.h"

int main(int argc, char** argv) {
  bool check = false, bench = false, quick = false, profile = false, small = false, mid = false, wgmma = false;
  bool decode = false;
  bool graph_probe = false;  // kernel_harness_wgmma.h: run_wgmma_graph_probe (info, run last)
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "graph-probe")) graph_probe = true;
    if (!std::strcmp(argv[i], "profile")) profile = true;
    if (!std::strcmp(argv[i], "check")) check = true;
    if (!std::strcmp(argv[i], "bench")) bench = true;
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--small")) small = true;  // bench: M <= 32 only, every tile choice
    if (!std::strcmp(argv[i], "--mid")) mid = true;      // bench: M = 32..256, staged kernel vs dequant
    if (!std::strcmp(argv[i], "--wgmma")) wgmma = true;  // wgmma only: its checks; bench M = 32..1024 vs the rest
    if (!std::strcmp(argv[i], "--decode")) decode = true;  // bench: M = 1 on Llama-3-8B's products, every split
  }
  if (!check && !bench && !profile && !graph_probe) check = bench = true;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // every line reaches a log even when a run is cut short
  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  CK(cudaDeviceGetAttribute(&g_dev.sm_count, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&g_dev.cc_major, cudaDevAttrComputeCapabilityMajor, 0));
  CK(cudaDeviceGetAttribute(&g_dev.cc_minor, cudaDevAttrComputeCapabilityMinor, 0));
  g_dev.wgmma = wgmma_built() && g_dev.cc_major == 9 && g_dev.cc_minor == 0;
  std::printf("device,sm=%d,cc=%d.%d,wgmma=%d\n", g_dev.sm_count, g_dev.cc_major, g_dev.cc_minor, int(g_dev.wgmma));
  char err[256] = {0};
  g_lt = cublas_handle(0, err);
  if (!g_lt) {
    std::fprintf(stderr, "%s\n", err);
    return 2;
  }
  g_ws = new DevBuf(kWsBytes);
  g_mult = new DevBuf(sizeof(float));
  preload_kernels();  // also raises the staged kernels' dynamic shared memory limit
  if (profile) run_profile();
  if (check && !wgmma) run_checks(quick);
  if (check && g_dev.wgmma) run_wgmma_checks();
  if (bench && wgmma && g_dev.wgmma) run_wgmma_bench();
  if (bench && decode) run_decode_bench();
  if (bench && !wgmma && !decode) run_bench(quick, small, mid);
  if (graph_probe && g_dev.wgmma) run_wgmma_graph_probe();
  std::printf("failures,%d\n", g_failures);
  return g_failures ? 1 : 0;
}
