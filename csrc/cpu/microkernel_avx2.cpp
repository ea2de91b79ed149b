// AVX2 + FMA build of the hot loops (compiled with -mavx2 -mfma; chosen only when the CPU has both).
#define MK_NS avx2
#define MK_VEC_BYTES 32
#define MK_NAME "avx2-fma"
#include "microkernel.inc"

namespace mlx_fp4::cpu {
const HotLoops& hot_loops_avx2() { return avx2::hot_loops(); }
}  // namespace mlx_fp4::cpu
