// metal_sim host helper of the gathered (MoE) kernel: runs the production host code
// (csrc/metal/gather_dispatch.h) for one problem, as GatherW4A16Matmul::eval_gpu does.
//
//   gather_plan instantiations        the MSL lines eval_gpu may append (every dtype pair)
//   gather_plan plan SPEC OUT_DIR     spec.txt keys -> OUT_DIR/params.bin; prints the launch
//                                     (key "force": a fp4::GatherMetalKernel, 0 = the plan's)
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include "metal/gather_dispatch.h"

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "instantiations") {
    for (int x : {fp4::kDtypeF32, fp4::kDtypeF16, fp4::kDtypeBF16})
      for (int o : {fp4::kDtypeF32, fp4::kDtypeF16, fp4::kDtypeBF16}) {
        for (auto k : {fp4::GatherMetalKernel::kPairs, fp4::GatherMetalKernel::kRuns, fp4::GatherMetalKernel::kGemm}) {
          std::cout << fp4::gather_metal_instantiation(x, o, k);
        }
      }
    return 0;
  }
  if (cmd != "plan" || argc != 4) {
    std::cerr << "usage: gather_plan instantiations | plan SPEC OUT_DIR\n";
    return 2;
  }
  std::ifstream spec(argv[2]);
  fp4::GatherW4A16Problem g{};
  fp4::W4A16Problem& p = g.mm;
  // Scalar keys and where they go (ints of several widths: read as int64, then stored).
  int64_t global_scale_per_expert = 0, x_dtype = 0, out_dtype = 0, has_gs = 0, mode = 0, sorted = 0, force = 0;
  const std::map<std::string, int64_t*> fields = {
      {"pairs", &g.pairs}, {"x_batches", &g.x_batches}, {"experts", &g.experts}, {"m", &p.m}, {"n", &p.n},
      {"k", &p.k}, {"w_row_bytes", &p.w_row_bytes}, {"scale_row_bytes", &p.scale_row_bytes},
      {"per_expert", &global_scale_per_expert}, {"x_dtype", &x_dtype}, {"out_dtype", &out_dtype},
      {"has_gs", &has_gs}, {"mode", &mode}, {"sorted", &sorted}, {"force", &force}};
  std::string key;
  while (spec >> key) {
    if (auto it = fields.find(key); it != fields.end()) {
      spec >> *it->second;
    } else if (key == "op") {
      fp4::EpilogueOp& op = p.ops[p.num_ops++];
      spec >> op.code >> op.operand >> op.p0 >> op.p1;
    } else if (key == "operand") {
      spec >> p.operand_kind[p.num_operands] >> p.operand_dtype[p.num_operands];
      ++p.num_operands;
    } else {
      std::cerr << "gather_plan: unknown spec key " << key << "\n";
      return 2;
    }
  }
  g.global_scale_per_expert = int(global_scale_per_expert);
  g.sorted_rhs = int(sorted);
  p.x_dtype = int(x_dtype);
  p.out_dtype = int(out_dtype);
  p.has_global_scale = int(has_gs);
  p.mode = int(mode);  // fp4::Mode
  g.w_expert_bytes = p.n * p.w_row_bytes;
  g.scale_expert_bytes = p.n * p.scale_row_bytes;
  // force: fp4::GatherMetalKernel (0 = the plan's choice)
  const fp4::GatherMetalLaunch l =
      fp4::gather_metal_plan(g, fp4::MetalAddresses{}, static_cast<fp4::GatherMetalKernel>(force));
  std::ofstream params(std::string(argv[3]) + "/params.bin", std::ios::binary);
  params.write(reinterpret_cast<const char*>(&l.params), sizeof(l.params));
  std::cout << "kernel " << l.kernel_name << "\ngrid " << l.grid_x << " " << l.grid_y << "\nthreads " << l.threads
            << "\nconstants";
  for (int i = 0; i < l.num_constants; ++i) std::cout << " " << l.constants[i].index << ":" << int(l.constants[i].value);
  std::cout << "\nbinding";
  for (int b : l.binding) std::cout << " " << b;
  std::cout << "\n";
  return 0;
}
