// A persistent worker pool: MLX runs a CPU stream on one thread, so the kernel fans out here.
// Jobs are serialized (one at a time); the calling thread works too.
#pragma once
#include <cstdint>
#include <functional>

namespace mlx_fp4::cpu {

// Threads used by the kernels: MLX_FP4_NUM_THREADS if set, else the hardware concurrency.
int num_threads();

// Runs fn(task) for task in [0, tasks) across the pool; returns when all are done.
void parallel_for(int64_t tasks, const std::function<void(int64_t)>& fn);

}  // namespace mlx_fp4::cpu
