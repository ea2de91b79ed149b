// Prints the CUDA backend's kernel choice (csrc/cuda/w4a16_plan.h, no CUDA needed) for problems read
// from stdin, one per line:
//   plan N K M dtype(bf16|f16|f32) vec(0|1) staged(0|1) [path_override|-] [tc_override|-] [wgmma(0|1)]
//        [wgmma_override|-]
//     -> "path mt rt kw staged tile_m splits multicast"   (path: simt | tc | dequant | wgmma)
//   plan_mxfp4 ...: the same for MXFP4 scales
//   loads K w_row_bytes scale_row_bytes x_addr w_addr s_addr
//     -> "vector staged wgmma"           (vector_loads_ok, staged_loads_ok, wgmma_loads_ok)
//   loads_mxfp4 ...: the same for MXFP4 scales (E8M0 per 32)
//   gather_wgmma rows experts
//     -> "ok max_tiles"                  (gather_wgmma_rows_ok, tiles of kWgmmaGroupTileRows)
//   batched N K M products [tc_override|-]
//     -> "mt rt kw"                      (batched_tc_config: the gathered op's batched pair kernel)
//   gather_decode k
//     -> "shape min_k rows_per_block pairs_max_rows" (kDecodePlannedShape, its decode_min_k and
//        decode_rows_per_block, kPairsMaxRows)
// Used by tests/test_cuda_plan.py; the device is an H200 (132 SMs, sm_90, the wgmma kernel built).
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>

#include "cuda/w4a16_plan.h"
#include "shared/gather_tiling_cuda.h"

namespace {

using namespace mlx_fp4::cuda;

int dtype_code(const std::string& s) {
  if (s == "f32") return fp4::kDtypeF32;
  if (s == "f16") return fp4::kDtypeF16;
  return fp4::kDtypeBF16;
}

const char* path_name(Path p) {
  return p == Path::kWgmma ? "wgmma" : p == Path::kTensorCore ? "tc" : p == Path::kSimt ? "simt" : "dequant";
}

}  // namespace

int main() {
  const DeviceInfo h200{132, 9, 0, true};
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string what;
    in >> what;
    fp4::W4A16Problem p{};
    if (what == "plan" || what == "plan_mxfp4") {
      p.mode = what == "plan" ? fp4::kModeNvfp4 : fp4::kModeMxfp4;
      std::string dt, path_o = "-", tc_o = "-", wg_o = "-";
      int vec = 0, staged = 0, wgmma = 0;
      in >> p.n >> p.k >> p.m >> dt >> vec >> staged >> path_o >> tc_o >> wgmma >> wg_o;
      p.x_dtype = dtype_code(dt);
      const Plan plan = plan_w4a16(p, h200, vec != 0, staged != 0, path_o == "-" ? nullptr : path_o.c_str(),
                                   tc_o == "-" ? nullptr : tc_o.c_str(), wgmma != 0,
                                   wg_o == "-" ? nullptr : wg_o.c_str());
      std::cout << path_name(plan.path) << ' ' << plan.tc.mt << ' ' << plan.tc.rt << ' ' << plan.tc.kw << ' '
                << int(plan.staged) << ' ' << plan.wg.tile_m << ' ' << plan.wg.splits << ' ' << plan.wg.multicast
                << '\n';
    } else if (what == "loads" || what == "loads_mxfp4") {
      p.mode = what == "loads" ? fp4::kModeNvfp4 : fp4::kModeMxfp4;
      uintptr_t x = 0, w = 0, s = 0;
      in >> p.k >> p.w_row_bytes >> p.scale_row_bytes >> x >> w >> s;
      const auto* xp = reinterpret_cast<const void*>(x);
      const auto* wp = reinterpret_cast<const void*>(w);
      const auto* sp = reinterpret_cast<const void*>(s);
      std::cout << int(vector_loads_ok(p, xp, wp)) << ' ' << int(staged_loads_ok(p, xp, wp, sp)) << ' '
                << int(wgmma_loads_ok(p, wp, sp)) << '\n';
    } else if (what == "gather_wgmma") {
      namespace gt = fp4::cuda_gather_tiling;
      int64_t rows = 0, experts = 0;
      in >> rows >> experts;
      std::cout << int(gt::gather_wgmma_rows_ok(rows, experts)) << ' '
                << gt::max_tc_tiles(experts, rows, gt::kWgmmaGroupTileRows) << '\n';
    } else if (what == "batched") {
      int64_t products = 0;
      std::string tc_o = "-";
      in >> p.n >> p.k >> p.m >> products >> tc_o;
      p.x_dtype = fp4::kDtypeBF16;
      const Plan one = plan_w4a16(p, h200, true, true, nullptr, nullptr);
      const TcConfig c = batched_tc_config(p, h200, one.tc, products, tc_o == "-" ? nullptr : tc_o.c_str());
      std::cout << c.mt << ' ' << c.rt << ' ' << c.kw << '\n';
    } else if (what == "gather_decode") {
      namespace gt = fp4::cuda_gather_tiling;
      int64_t k = 0;
      in >> k;
      (void)k;  // the plan's shape is the same at every K
      const int shape = gt::kDecodePlannedShape;
      std::cout << shape << ' ' << gt::decode_min_k(gt::kDecodeShapes[shape]) << ' '
                << gt::decode_rows_per_block(gt::kDecodeShapes[shape]) << ' ' << int(gt::kPairsMaxRows) << '\n';
    } else {
      std::cout << "?\n";
    }
  }
  return 0;
}
