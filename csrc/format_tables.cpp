// Decode tables built once from the shared decode functions.
#include "format_tables.h"

#include <vector>

#include "errors.h"
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
mx::array e8m0_table() { return table(kE4M3Codes, fp4::e8m0_to_float); }
mx::array scale_table(int mode) { return mode == fp4::kModeMxfp4 ? e8m0_table() : e4m3_table(); }

int parse_mode(const std::string& mode, const char* op) {
  if (mode == "nvfp4") return fp4::kModeNvfp4;
  if (mode == "mxfp4") return fp4::kModeMxfp4;
  throw_invalid("[", op, "] mode must be 'nvfp4' or 'mxfp4' but got '", mode, "'.");
}

const char* mode_name(int mode) { return mode == fp4::kModeMxfp4 ? "mxfp4" : "nvfp4"; }

void check_mode_config(int mode, std::optional<int> group_size, std::optional<int> bits, const char* op) {
  const int want = fp4::block_size(mode);
  if (group_size && *group_size != want) {
    throw_invalid("[", op, "] group_size must be ", want, " for mode '", mode_name(mode), "' but got ", *group_size,
                  ".");
  }
  if (bits && *bits != fp4::kNibbleBits) {
    throw_invalid("[", op, "] bits must be ", fp4::kNibbleBits, " for mode '", mode_name(mode), "' but got ", *bits,
                  ".");
  }
}

void check_no_global_scale(int mode, bool has_global_scale, const char* op) {
  if (mode == fp4::kModeMxfp4 && has_global_scale) {
    throw_invalid("[", op, "] global_scale is only supported for mode 'nvfp4'; mxfp4 has no tensor scale (as in "
                  "mx.quantize) but got one.");
  }
}

}  // namespace mlx_fp4
