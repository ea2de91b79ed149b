// Hot loops, compiled once per instruction set (microkernel_*.cpp include microkernel.inc
// with different flags); w4a16_kernel.cpp picks one at run time.
#pragma once
#include <cstdint>

namespace mlx_fp4::cpu {

struct HotLoops {
  const char* name;
  int vector_floats;  // floats per vector register in this build
  // acc[r] = sum_k x[r][k] * w[k] over rows r < rows; w: one decoded, scaled row of kpad values
  // (kpad a multiple of 16); x rows padded with zeros to kpad, row stride ldx.
  void (*dot_rows)(const float* w, const float* x, int64_t ldx, int rows, int64_t kpad, float* acc);
  // c[i][j] += sum_k a[k][i] * b[k][j] for i < kMicroRows, j < 2 * vector_floats;
  // a packed [kc][kMicroRows], b packed with row stride ldb, c row stride ldc.
  void (*micro_tile)(int kc, const float* a, const float* b, int64_t ldb, float* c, int64_t ldc);
};

const HotLoops& hot_loops_generic();
#if defined(__x86_64__) || defined(_M_X64)
const HotLoops& hot_loops_avx2();
const HotLoops& hot_loops_avx512();
#endif

}  // namespace mlx_fp4::cpu
