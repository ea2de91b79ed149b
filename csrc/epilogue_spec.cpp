#include "epilogue_spec.h"

#include "shared/epilogue.h"

namespace mlx_fp4 {

const std::vector<EpilogueName>& epilogue_names() {
  static const std::vector<EpilogueName> names = {
      {"add", fp4::kEpiAdd, EpilogueArgs::kOperandOrFloat},
      {"mul", fp4::kEpiMul, EpilogueArgs::kOperandOrFloat},
      {"scale", fp4::kEpiScale, EpilogueArgs::kFloat},
      {"relu", fp4::kEpiRelu, EpilogueArgs::kNone},
      {"silu", fp4::kEpiSilu, EpilogueArgs::kNone},
      {"gelu", fp4::kEpiGelu, EpilogueArgs::kNone},
      {"gelu_approx", fp4::kEpiGeluApprox, EpilogueArgs::kNone},
      {"sigmoid", fp4::kEpiSigmoid, EpilogueArgs::kNone},
      {"tanh", fp4::kEpiTanh, EpilogueArgs::kNone},
      {"clamp", fp4::kEpiClamp, EpilogueArgs::kTwoFloats},
  };
  return names;
}

}  // namespace mlx_fp4
