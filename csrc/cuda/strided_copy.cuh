// Row-contiguous copy of a strided x (a transposed or sliced view), so that W4A16Matmul needs no
// Contiguous node in the graph for x on CUDA (each graph node costs host time at every call).
// Included by w4a16_matmul.cu only.
#pragma once
#include "../shared/tiling_cuda.h"
#include "w4a16_kernels.h"

namespace mlx_fp4 {
namespace cuda {
namespace {

using namespace fp4::cuda_tiling;

// Element i of the row-major output reads the source at sum_d index_d(i) * strides[d].
template <typename T>
__global__ void __launch_bounds__(kElementwiseThreads) strided_copy_kernel(const StridedCopyArgs c) {
  const T* src = static_cast<const T*>(c.src);
  T* dst = static_cast<T*>(c.dst);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < c.elements;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rest = i, offset = 0;
    for (int d = c.ndim - 1; d >= 0; --d) {
      offset += (rest % c.shape[d]) * c.strides[d];
      rest /= c.shape[d];
    }
    dst[i] = src[offset];
  }
}

}  // namespace
}  // namespace cuda
}  // namespace mlx_fp4
