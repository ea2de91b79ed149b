// Row-contiguous inputs for the CPU kernels. The ops hand x and the index arrays to the primitive
// as they are (no Contiguous node per call, which at decode is one more node per linear); a
// strided one is copied into rows here, by a task queued before the kernel's.
#pragma once
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlx_fp4 {
namespace mx = mlx::core;
namespace cpu {

// `a` itself when row-contiguous, else a row-contiguous copy that `enc` fills first and holds.
mx::array row_contiguous(const mx::array& a, mx::cpu::CommandEncoder& enc);

}  // namespace cpu
}  // namespace mlx_fp4
