// Device buffers for the CUDA glue, from MLX's own allocator when it can be reached.
//
// MLX 0.32.4 allocates device memory for its kernels' outputs with cu::malloc_async (buffer cache,
// memory limit, mx.get_active_memory), but libmlx does not export it. Its ELF symbol table does
// name it, so mlx_memory.cpp looks it up once in the loaded libmlx.so file (checked against an
// exported symbol of the same file). Without it (a stripped libmlx, MLX_FP4_CUDA_ALLOC=pool), the
// fallback allocates from the stream-ordered pool and frees on a stream of its own.
#pragma once
#include "mlx/allocator.h"
#include "mlx/backend/cuda/device.h"

namespace mlx_fp4 {
namespace cuda {

// `bytes` of device memory for work encoded on `enc`; the Data frees it when the array lets go
// (MLX keeps every array an encoded node uses alive until the node has run).
mlx::core::allocator::Data device_data(size_t bytes, mlx::core::cu::CommandEncoder& enc);

// A temporary array of device memory from device_data: counted by mx.get_active_memory, and back
// in MLX's cache once the encoded work has run.
mlx::core::array device_array(const mlx::core::Shape& shape, mlx::core::Dtype dtype,
                              mlx::core::cu::CommandEncoder& enc);

// `a` itself when row-contiguous, else a row-major copy made by a node of ours (2- or 4-byte
// elements, at most fp4::kMaxStridedXDims dims): the ops add no Contiguous node for x or the
// indices on CUDA, since every graph node costs host time at each call. `op` names the caller.
mlx::core::array row_contiguous(const mlx::core::array& a, mlx::core::cu::CommandEncoder& enc, const char* op);

// "mlx" when device_data goes through MLX's allocator, else "pool" (benchmarks record it).
const char* allocator_name();

}  // namespace cuda
}  // namespace mlx_fp4
