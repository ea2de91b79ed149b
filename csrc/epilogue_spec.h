// Python-facing names of the epilogue ops and how many arguments each takes.
#pragma once
#include <string>
#include <vector>

namespace mlx_fp4 {

enum class EpilogueArgs { kNone, kOperandOrFloat, kFloat, kTwoFloats };

struct EpilogueName {
  const char* name;
  int code;  // fp4::EpilogueCode
  EpilogueArgs args;
};

const std::vector<EpilogueName>& epilogue_names();

}  // namespace mlx_fp4
