// Argument handling shared by the op entry points (w4a16_matmul in ops.cpp, the gathered op in
// gather_ops.cpp): one set of epilogue checks and operand canonicalization for both.
#pragma once
#include <utility>
#include <vector>

#include "mlx_fp4.h"

namespace mlx_fp4 {

bool is_supported_float(mx::Dtype d);

// `a` as is when it is evaluated and row-contiguous, or a pending output of our own matmuls (a
// fresh row-contiguous buffer on every backend); else behind a Contiguous node.
mx::array contiguous_input(const mx::array& a, mx::StreamOrDevice s);

// x or an index array for a primitive: as is on the CPU and on MLX's CUDA backend, whose glue
// makes rows of a strided one itself (cpu::row_contiguous, cuda::row_contiguous); elsewhere
// (Metal) contiguous_input.
mx::array rows_input(const mx::array& a, mx::StreamOrDevice s);

// Classify and canonicalize one epilogue operand against the output shape: returns the
// fp4::OperandKind and the contiguous operand ([], [N], out[:-1] + [1], out). `kOp` names the
// op in error messages.
std::pair<int, mx::array> canonical_operand(
    const mx::array& t, const mx::Shape& out_shape, int index, mx::StreamOrDevice s, const char* kOp);

// The chain's length, op codes and operand count against the kernel limits.
void check_epilogue(const std::vector<EpilogueSpec>& epilogue, const char* kOp);
// The chain's length alone (the bindings check it before parsing any op).
void check_epilogue_length(size_t ops, const char* kOp);

// One epilogue op in fp32 MLX ops (the reference path and the vjp).
mx::array apply_op_ops(const mx::array& v, const EpilogueSpec& op, mx::StreamOrDevice s);

}  // namespace mlx_fp4
