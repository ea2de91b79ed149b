// Prints the MSL instantiation lines eval_gpu would append to the embedded source, for every
// kernel specialization (or for the names given as arguments): the sim compiles exactly these.
#include <iostream>
#include <set>
#include <string>

#include "metal/w4a16_dispatch.h"

int main(int argc, char** argv) {
  std::set<std::string> only(argv + 1, argv + argc);
  const int dtypes[] = {fp4::kDtypeF32, fp4::kDtypeF16, fp4::kDtypeBF16};
  for (const fp4::MetalConfig& c : fp4::metal_all_configs()) {
    for (int x : dtypes) {
      for (int o : dtypes) {
        const std::string name = fp4::metal_kernel_name(c, x, o);
        if (only.empty() || only.count(name)) std::cout << fp4::metal_instantiation(c, x, o);
      }
    }
  }
  for (int o : dtypes) {
    const std::string name = fp4::metal_reduce_kernel_name(o);
    if (only.empty() || only.count(name)) std::cout << fp4::metal_reduce_instantiation(o);
  }
  return 0;
}
