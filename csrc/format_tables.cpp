// Decode tables built once from the shared decode functions.
#include "format_tables.h"

#include <vector>

#include "shared/fp4_format.h"

namespace mlx_fp4 {

namespace {
constexpr int kE2M1Codes = 16;
constexpr int kE4M3Codes = 256;

mx::array table(int codes, float (*decode)(uint32_t)) {
  std::vector<float> values(codes);
  for (int c = 0; c < codes; ++c) {
    values[c] = decode(static_cast<uint32_t>(c));
  }
  return mx::array(values.begin(), {codes}, mx::float32);
}
}  // namespace

mx::array e2m1_table() { return table(kE2M1Codes, fp4::e2m1_to_float); }
mx::array e4m3_table() { return table(kE4M3Codes, fp4::e4m3_to_float); }

}  // namespace mlx_fp4
