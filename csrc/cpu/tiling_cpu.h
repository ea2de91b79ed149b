// CPU blocking. The vector width and register tile come from the build variant (microkernel.inc).
#pragma once

namespace mlx_fp4::cpu {

// Rows up to this use the GEMV path (weights streamed once for all rows, decoded in registers).
constexpr int kGemvMaxRows = 8;
// GEMV: activation rows per pass over a task's weight rows (measured, cold 4096^2: M=8 as two passes
// of 4 took 2.7-3.0 ms, one pass of 8 3.6 ms; as passes of 4, M=16 did not beat the GEMM path).
constexpr int kGemvPassRows = 4;
// GEMM: depth of one decoded weight panel (floats per panel row; a compile-time row stride of the
// micro kernel). A multiple of every chunk size (2 * kVec <= 32).
constexpr int kGemmDepth = 256;
// GEMM: target weight rows per task / decoded panel (kGemmDepth x this x 4 bytes stays in L2;
// small enough for dynamic load balance across threads).
constexpr int kGemmPanelRows = 224;
// GEMM: activation rows packed and processed per pass (bounds the packed-x buffer).
constexpr int kGemmChunkRows = 512;
// GEMV: weight rows per task (tasks are handed out dynamically).
constexpr int kGemvTaskRows = 64;
// GEMV: how far ahead of the decode each weight row is prefetched (bytes; a few DRAM latencies).
constexpr int kGemvPrefetchBytes = 512;
// The prefetch granule: one prefetch per cache line of a weight row.
constexpr int kCacheLineBytes = 64;

}  // namespace mlx_fp4::cpu
