// Dense GEMM step of the large-M path (dequantize W, then a cuBLASLt matmul), framework-free so that
// the MLX glue and the standalone harness share it. cuBLASLt rather than cuBLAS: libmlx already
// needs libcublasLt.so.13 (not libcublas.so.13), so the same copy is found at run time.
#include <cublasLt.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>

#include "w4a16_kernels.h"

namespace mlx_fp4 {
namespace cuda {
namespace {

constexpr int kMaxDevices = 64;
std::mutex g_handle_mutex;
std::mutex g_call_mutex;
cublasLtHandle_t g_handles[kMaxDevices] = {};

// Heuristic choice per (handle, m, n, k, types, workspace, device alpha, operand alignments): the
// query costs host time, and an algorithm chosen for 256-byte aligned operands may need that
// alignment (an offset view of x can be only 2-byte aligned).
using AlgoKey = std::tuple<void*, int64_t, int64_t, int64_t, int, int, size_t, int, uint32_t, uint32_t, uint32_t>;

// cuBLASLt's default assumption, and the largest alignment it asks about.
constexpr uint32_t kMaxAlignment = 256;

// Largest power of two (up to 256) that divides the address.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = kMaxAlignment;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}
std::map<AlgoKey, cublasLtMatmulAlgo_t> g_algos;
std::mutex g_algo_mutex;

cudaDataType_t cuda_type(int dtype) {
  switch (dtype) {
    case fp4::kDtypeF32: return CUDA_R_32F;
    case fp4::kDtypeF16: return CUDA_R_16F;
    default: return CUDA_R_16BF;
  }
}

bool fail(char* err, const char* what, int status) {
  if (err) std::snprintf(err, 256, "%s failed with status %d", what, status);
  return false;
}

// Owns the cuBLASLt descriptors of one call.
struct LtCall {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtCall() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

}  // namespace

void* cublas_handle(int device, char* err) {
  if (device < 0 || device >= kMaxDevices) {
    fail(err, "cublas_handle (device index)", device);
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_handle_mutex);
  if (!g_handles[device]) {
    cublasLtHandle_t h = nullptr;
    const cublasStatus_t st = cublasLtCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS) {
      fail(err, "cublasLtCreate", static_cast<int>(st));
      return nullptr;
    }
    g_handles[device] = h;  // never destroyed: lives until the process exits
  }
  return g_handles[device];
}

std::unique_lock<std::mutex> cublas_guard() { return std::unique_lock<std::mutex>(g_call_mutex); }

bool cublas_gemm(void* handle, cudaStream_t stream, int64_t m, int64_t n, int64_t k, const void* x,
                 const void* wd, int ab_dtype, void* c, int c_dtype, const float* alpha_device,
                 void* workspace, size_t workspace_bytes, char* err) {
  auto h = static_cast<cublasLtHandle_t>(handle);
  const cudaDataType_t ab = cuda_type(ab_dtype);
  const cudaDataType_t ct = cuda_type(c_dtype);
  if (!workspace) workspace_bytes = 0;
  LtCall call;
  cublasStatus_t st = cublasLtMatmulDescCreate(&call.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (st != CUBLAS_STATUS_SUCCESS) return fail(err, "cublasLtMatmulDescCreate", st);
  // Row-major out[M, N] = x[M, K] wd[N, K]^T is column-major out^T[N, M] = op_T(wd) * x^T,
  // with wd seen as column-major [K, N] and x as column-major [K, M].
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t));
  cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n));
  const cublasLtPointerMode_t mode = alpha_device ? CUBLASLT_POINTER_MODE_DEVICE : CUBLASLT_POINTER_MODE_HOST;
  cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof(mode));
  if ((st = cublasLtMatrixLayoutCreate(&call.a, ab, k, n, k)) != CUBLAS_STATUS_SUCCESS ||
      (st = cublasLtMatrixLayoutCreate(&call.b, ab, k, m, k)) != CUBLAS_STATUS_SUCCESS ||
      (st = cublasLtMatrixLayoutCreate(&call.c, ct, n, m, n)) != CUBLAS_STATUS_SUCCESS) {
    return fail(err, "cublasLtMatrixLayoutCreate", st);
  }

  cublasLtMatmulAlgo_t algo;
  const uint32_t align_a = alignment_of(wd), align_b = alignment_of(x), align_c = alignment_of(c);
  const AlgoKey key{h, m, n, k, ab_dtype, c_dtype, workspace_bytes, alpha_device ? 1 : 0, align_a, align_b, align_c};
  bool cached = false;
  {
    std::lock_guard<std::mutex> lock(g_algo_mutex);
    auto it = g_algos.find(key);
    if (it != g_algos.end()) {
      algo = it->second;
      cached = true;
    }
  }
  if (!cached) {
    if ((st = cublasLtMatmulPreferenceCreate(&call.pref)) != CUBLAS_STATUS_SUCCESS) {
      return fail(err, "cublasLtMatmulPreferenceCreate", st);
    }
    cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                         sizeof(workspace_bytes));
    // Split-K partial sums in fp32 only: with the default mask, small ragged problems (M=7, K=15)
    // got an algorithm that reduces in the bf16 output type (errors of 2 bf16 ulps, GPU tests).
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                         sizeof(schemes));
    // A = wd, B = x, C = D = c (see the layouts above).
    cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                         sizeof(align_a));
    cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                         sizeof(align_b));
    cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                         sizeof(align_c));
    cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                         sizeof(align_c));
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    st = cublasLtMatmulAlgoGetHeuristic(h, call.desc, call.a, call.b, call.c, call.c, call.pref, 1, &result, &count);
    if (st != CUBLAS_STATUS_SUCCESS || count == 0) return fail(err, "cublasLtMatmulAlgoGetHeuristic", st);
    algo = result.algo;
    std::lock_guard<std::mutex> lock(g_algo_mutex);
    g_algos.emplace(key, algo);
  }

  const float one = 1.0f, zero = 0.0f;
  const void* alpha = alpha_device ? static_cast<const void*>(alpha_device) : &one;
  const void* beta = alpha_device ? static_cast<const void*>(device_constant_zero()) : &zero;
  st = cublasLtMatmul(h, call.desc, alpha, wd, call.a, x, call.b, beta, c, call.c, c, call.c, &algo, workspace,
                      workspace_bytes, stream);
  if (st != CUBLAS_STATUS_SUCCESS) return fail(err, "cublasLtMatmul", st);
  return true;
}

}  // namespace cuda
}  // namespace mlx_fp4
