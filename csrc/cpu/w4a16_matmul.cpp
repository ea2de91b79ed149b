// W4A16Matmul::eval_cpu: binds MLX buffers and queues the CPU kernel on the stream's thread.
#include "../primitives.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "strided_rows.h"
#include "w4a16_kernel.h"

namespace mlx_fp4 {

void W4A16Matmul::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  const fp4::W4A16Problem p = problem(inputs, out);
  auto& enc = mx::cpu::get_command_encoder(stream());
  const mx::array x = cpu::row_contiguous(inputs[kInputX], enc);
  cpu::Buffers b{};
  b.x = x.data<void>();
  b.w = inputs[kInputW].data<uint8_t>();
  b.scales = inputs[kInputScales].data<uint8_t>();
  b.global_scale = has_global_scale() ? inputs[kInputFirstOptional].data<float>() : nullptr;
  for (int i = 0; i < p.num_operands; ++i) {
    b.operands[i] = inputs[operand_input_index(i)].data<void>();
  }
  b.out = out.data<void>();
  for (const auto& in : inputs) enc.set_input_array(in);
  enc.set_output_array(out);
  // Inputs stay alive until the queued task has run (MLX holds their buffers).
  enc.dispatch([p, b]() { cpu::run_w4a16(p, b); });
}

}  // namespace mlx_fp4
