// AVX-512F build of the hot loops (compiled with -mavx512f -mfma; chosen only when the CPU has it).
#define MK_NS avx512
#define MK_VEC_BYTES 64
#define MK_NAME "avx512f"
#include "microkernel.inc"

namespace mlx_fp4::cpu {
const HotLoops& hot_loops_avx512() { return avx512::hot_loops(); }
}  // namespace mlx_fp4::cpu
