// CPU W4A16 kernel entry: framework-free apart from the problem struct.
#pragma once
#include "../shared/w4a16_problem.h"

namespace mlx_fp4::cpu {

struct Buffers {
  const void* x;          // [m, k] rows, x_dtype
  const uint8_t* w;       // [n, w_row_bytes]
  const uint8_t* scales;  // [n, scale_row_bytes]
  const float* global_scale;  // 1 value, or nullptr
  const void* operands[fp4::kMaxEpilogueOperands];
  void* out;  // [m, n] rows, out_dtype
};

void run_w4a16(const fp4::W4A16Problem& p, const Buffers& b);

// The hot loops picked for this CPU (shared with the gathered kernel).
struct HotLoops;
const HotLoops& hot_loops();

// Name of the hot-loop build picked for this CPU ("avx512f", "avx2-fma", "neon", "generic-128").
const char* hot_loops_name();

// The blocking that build runs with (reported by cpu_info() and in the bench JSON).
struct CpuTiles {
  int vector_floats;             // floats per vector register
  int micro_rows2, micro_rows1;  // GEMM register tile heights (2- and 1-vector activation groups)
  int gemm_depth, gemm_panel_rows, gemv_pass_rows, gemv_task_rows;
};
CpuTiles cpu_tiles();

}  // namespace mlx_fp4::cpu
