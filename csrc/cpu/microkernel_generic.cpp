// Portable build of the hot loops (16-byte vectors: SSE2 on x86-64, NEON on arm64).
#include <algorithm>
#define MK_NS generic
#define MK_VEC_BYTES 16
#define MK_MICRO_ROWS 6
#define MK_NAME "generic-128"
#define MK_GEMV_LINE_UNROLL 2
#include "microkernel.inc"

namespace mlx_fp4::cpu {
const HotLoops& hot_loops_generic() { return generic::hot_loops(); }
}  // namespace mlx_fp4::cpu
