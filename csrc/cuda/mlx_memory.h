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

// "mlx" when device_data goes through MLX's allocator, else "pool" (benchmarks record it).
const char* allocator_name();

}  // namespace cuda
}  // namespace mlx_fp4
