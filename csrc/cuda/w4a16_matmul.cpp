// W4A16Matmul::eval_gpu for MLX's CUDA backend: binds MLX buffers, allocates the output in device
// memory, and adds the kernels of w4a16_matmul.cu to MLX's CUDA graph as CUfunction nodes.
// Paths (plan_w4a16): tensor-core kernel, SIMT kernel, wgmma kernel (sm_90a), or dequantize +
// cuBLAS (+ epilogue kernel).
// Compiled by the C++ compiler (MLX's CUDA headers need fmt, see fmt_shim/), never by nvcc.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "../primitives.h"
#include "mlx/backend/cuda/device.h"
#include "mlx/backend/cuda/utils.h"
#include "mlx_memory.h"
#include "w4a16_kernels.h"
#include "wgmma_x_cache.h"

namespace mlx_fp4 {

// Every mode: every kernel but wgmma takes both scale formats (the plan keeps MXFP4 off wgmma).
bool gpu_kernel_supports_mode(int mode, int64_t) { return mode == fp4::kModeNvfp4 || mode == fp4::kModeMxfp4; }

namespace {

namespace cu = mx::cu;
using cuda::Launch;
using cuda::Path;

// cuBLAS workspace per dequantize + GEMM call (its recommendation for Hopper).
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("[W4A16Matmul] CUDA backend: ") + what + " failed: " +
                             cudaGetErrorString(e));
  }
}

mx::Dtype dtype_of_code(int code) {
  return code == fp4::kDtypeF32 ? mx::float32 : code == fp4::kDtypeF16 ? mx::float16 : mx::bfloat16;
}

const char* env_or_null(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

template <typename Args>
void add_node(cu::CommandEncoder& enc, const Launch& l, Args& args) {
  enc.add_kernel_node_ex(l.func, l.grid, l.block, l.cluster, l.smem, args);
}

// The wgmma kernel with split K runs as clusters. MLX keys its graph cache on node types only
// ("K" for any kernel node added directly), and cudaGraphExecUpdate does not carry a change of
// cluster shape over (MLX's subgraph_to_key says so): a later graph of the same topology, e.g.
// MLX's divide for the global scale + our tensor-core kernel, updated onto a cached permute +
// split wgmma graph, produced garbage (the 12 failed forced-wgmma tests of docs/cuda.md). So a
// cluster launch goes in as a child graph under a key of its own naming the cluster shape: updates
// then only happen between nodes of one cluster shape. (MLX's own kernel nodes never carry a
// cluster shape; its clustered kernels come as captured child graphs, keyed the same way.)
void add_wgmma_node(cu::CommandEncoder& enc, const Launch& l, cuda::WgmmaArgs& args) {
  if (l.cluster.x * l.cluster.y * l.cluster.z <= 1) {
    add_node(enc, l, args);  // no cluster: an ordinary kernel node
    return;
  }
  void* params[] = {&args};
  std::unique_ptr<CUgraph_st, cudaError_t (*)(cudaGraph_t)> graph(cuda::cluster_kernel_graph(l, params),
                                                                  cudaGraphDestroy);
  const std::string key = "(Kwgmma" + std::to_string(l.cluster.x) + "x" + std::to_string(l.cluster.y) + "x" +
                          std::to_string(l.cluster.z) + ")";
  enc.add_graph_node(graph.get(), key, true);  // the child graph is cloned: ours is destroyed here
}

}  // namespace

namespace cuda {

DeviceInfo device_info(int device) {
  static std::mutex mu;
  static DeviceInfo cache[64];
  static bool have[64] = {};
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0 || device >= 64) return {};
  if (!have[device]) {
    DeviceInfo d;
    check_cuda(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&d.cc_minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
    d.wgmma = wgmma_built() && d.cc_major == 9 && d.cc_minor == 0;
    preload_kernels();
    cache[device] = d;
    have[device] = true;
  }
  return cache[device];
}

}  // namespace cuda

void W4A16Matmul::eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  auto& enc = cu::get_command_encoder(stream());
  out.set_data(cuda::device_data(out.nbytes(), enc));
  const fp4::W4A16Problem p = problem(inputs, out);
  if (p.m == 0 || p.n == 0) {
    return;
  }

  const mx::array x = cuda::row_contiguous(inputs[kInputX], enc, "W4A16Matmul");
  cuda::W4A16Args a{};
  a.x = mx::gpu_ptr<void>(x);
  a.w = mx::gpu_ptr<uint8_t>(inputs[kInputW]);
  a.scales = mx::gpu_ptr<uint8_t>(inputs[kInputScales]);
  a.global_scale = has_global_scale() ? mx::gpu_ptr<float>(inputs[kInputFirstOptional]) : nullptr;
  for (int i = 0; i < p.num_operands; ++i) {
    a.operands[i] = mx::gpu_ptr<void>(inputs[operand_input_index(i)]);
  }
  a.out = mx::gpu_ptr<void>(out);
  a.p = p;

  const int device = enc.device().cuda_device();
  static const char* path_env = env_or_null("MLX_FP4_CUDA_PATH");
  static const char* tc_env = env_or_null("MLX_FP4_CUDA_TC");
  const bool vec = cuda::vector_loads_ok(p, a.x, a.w);
  // MLX_FP4_CUDA_STAGED=0 keeps the register-prefetch tensor-core kernel (tests, A/B timing).
  static const char* staged_env = env_or_null("MLX_FP4_CUDA_STAGED");
  const bool staged = !(staged_env && !std::strcmp(staged_env, "0")) && cuda::staged_loads_ok(p, a.x, a.w, a.scales);
  static const char* wgmma_env = env_or_null("MLX_FP4_CUDA_WGMMA");
  const cuda::Plan plan = cuda::plan_w4a16(p, cuda::device_info(device), vec, staged, path_env, tc_env,
                                           cuda::wgmma_loads_ok(p, a.w, a.scales), wgmma_env);

  if (plan.path == Path::kWgmma) {
    // x permuted into a temporary (the kernel's k order), unless the stream's last wgmma product
    // read the same x (wgmma_x_cache.h), then the wgmma kernel over it.
    const int64_t kp = cuda::wgmma_padded_k(p.k);
    auto& cache = cuda::WgmmaXCache::instance();
    static const char* share_env = env_or_null("MLX_FP4_CUDA_WGMMA_SHARE_X");  // "0": off
    const bool share = !(share_env && !std::strcmp(share_env, "0"));
    std::optional<mx::array> hit = share ? cache.find(stream().index, x, p.m, p.k) : std::nullopt;
    mx::array xp = hit ? *hit : cuda::device_array({static_cast<int>(p.m), static_cast<int>(kp)}, x.dtype(), enc);
    if (!hit) {
      cuda::WgmmaPermuteArgs pa{a.x, mx::gpu_ptr<void>(xp), p.m, p.k, kp};
      enc.set_input_array(x);
      enc.set_output_array(xp);
      add_node(enc, cuda::wgmma_permute_launch(pa, p.x_dtype), pa);
    }
    cuda::WgmmaArgs wa;
    cuda::wgmma_prepare(wa, a, mx::gpu_ptr<void>(xp), plan.wg);
    enc.set_input_array(xp);
    for (const auto& in : inputs) enc.set_input_array(in);
    enc.set_output_array(out);
    add_wgmma_node(enc, cuda::wgmma_launch(p, plan.wg), wa);
    enc.add_temporary(xp);
    // Remembered only once both nodes are in: a throw above leaves no entry for a permutation that may not run.
    if (share && !hit) cache.store(stream().index, x, xp, p.m, p.k);
    return;
  }

  if (plan.path == Path::kTensorCore || plan.path == Path::kSimt) {
    for (const auto& in : inputs) enc.set_input_array(in);
    enc.set_input_array(x);
    enc.set_output_array(out);
    const Launch l = plan.path == Path::kTensorCore ? cuda::tc_launch(p, plan.tc, vec, plan.staged) : cuda::simt_launch(p, vec);
    add_node(enc, l, a);
    return;
  }

  // Large M: exact decode of W into x's dtype, dense GEMM in cuBLAS with fp32 accumulation.
  mx::array wd = cuda::device_array({static_cast<int>(p.n), static_cast<int>(p.k)}, x.dtype(), enc);
  std::optional<mx::array> mult;
  if (has_global_scale()) mult = cuda::device_array({1}, mx::float32, enc);
  cuda::DequantArgs d{a.w,      a.scales,          mx::gpu_ptr<void>(wd), p.n, p.k, p.w_row_bytes,
                      p.scale_row_bytes, p.x_dtype, p.mode, a.global_scale,
                      mult ? mx::gpu_ptr<float>(*mult) : nullptr};
  const bool dq_vec = vec && reinterpret_cast<uintptr_t>(d.out) % 16 == 0;
  enc.set_input_array(inputs[kInputW]);
  enc.set_input_array(inputs[kInputScales]);
  if (mult) enc.set_input_array(inputs[kInputFirstOptional]);
  enc.set_output_array(wd);
  if (mult) enc.set_output_array(*mult);
  add_node(enc, cuda::dequant_launch(d, dq_vec), d);

  // cuBLAS writes the output itself when no epilogue op is left and it can cast to out's dtype.
  const bool direct = p.num_ops == 0 && (p.out_dtype == p.x_dtype || p.out_dtype == fp4::kDtypeF32);
  mx::array acc = direct ? out : cuda::device_array({static_cast<int>(p.m), static_cast<int>(p.n)}, mx::float32, enc);
  mx::array ws = cuda::device_array({static_cast<int>(kCublasWorkspaceBytes)}, mx::uint8, enc);
  enc.set_input_array(wd);
  enc.set_input_array(x);
  if (mult) enc.set_input_array(*mult);
  enc.set_output_array(acc);
  char err[256] = {0};
  bool ok = false;
  if (void* handle = cuda::cublas_handle(device, err)) {
    // The guard releases the lock also when the capture or the call throws.
    const auto lock = cuda::cublas_guard();
    auto capture = enc.capture_context();
    ok = cuda::cublas_gemm(handle, enc.stream(), p.m, p.n, p.k, a.x, d.out, p.x_dtype, mx::gpu_ptr<void>(acc),
                           direct ? p.out_dtype : fp4::kDtypeF32, mult ? d.multiplier : nullptr, mx::gpu_ptr<void>(ws),
                           kCublasWorkspaceBytes, err);
    capture.discard = !ok;
  }
  if (!ok) {
    throw std::runtime_error(std::string("[W4A16Matmul] CUDA backend: ") + err);
  }
  enc.add_temporary(wd);
  enc.add_temporary(ws);
  if (mult) enc.add_temporary(*mult);
  if (!direct) {
    cuda::EpilogueArgs e{};
    e.acc = mx::gpu_ptr<float>(acc);
    e.scaled = 1;
    e.a = a;
    enc.set_input_array(acc);
    for (int i = 0; i < p.num_operands; ++i) enc.set_input_array(inputs[operand_input_index(i)]);
    enc.set_output_array(out);
    add_node(enc, cuda::epilogue_launch(p), e);
    enc.add_temporary(acc);
  }
}

}  // namespace mlx_fp4
