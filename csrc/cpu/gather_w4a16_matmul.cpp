// GatherW4A16Matmul::eval_cpu: binds MLX buffers and queues the gathered CPU kernel on the
// stream's thread.
#include "../gather_primitive.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "gather_w4a16_kernel.h"
#include "strided_rows.h"

namespace mlx_fp4 {

void GatherW4A16Matmul::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  const fp4::GatherW4A16Problem g = problem(inputs, out);
  auto& enc = mx::cpu::get_command_encoder(stream());
  const mx::array x = cpu::row_contiguous(inputs[kGatherX], enc);
  const mx::array lhs = cpu::row_contiguous(inputs[kGatherLhs], enc);
  const mx::array rhs = cpu::row_contiguous(inputs[kGatherRhs], enc);
  cpu::GatherBuffers b{};
  b.x = x.data<void>();
  b.w = inputs[kGatherW].data<uint8_t>();
  b.scales = inputs[kGatherScales].data<uint8_t>();
  b.lhs = lhs.data<uint32_t>();
  b.rhs = rhs.data<uint32_t>();
  b.global_scale = has_global_scale() ? inputs[kGatherFirstOptional].data<float>() : nullptr;
  for (int i = 0; i < g.mm.num_operands; ++i) b.operands[i] = inputs[operand_input_index(i)].data<void>();
  b.out = out.data<void>();
  for (const auto& in : inputs) enc.set_input_array(in);
  enc.set_output_array(out);
  // Inputs stay alive until the queued task has run (MLX holds their buffers).
  // Lazy indices are first readable in this task, and it must not throw for them: MLX 0.32.4 has
  // already marked `out` and its views evaluated, keeps the error on the stream rather than on
  // them, re-raises it at whichever later call checks the stream first (maybe an unrelated one,
  // maybe none) and can leak a task count doing so. So bad pairs get NaN rows instead.
  enc.dispatch([g, b]() { cpu::run_gather_w4a16(g, b); });
}

}  // namespace mlx_fp4
