// The MXFP4 checks of kernel_harness.cu (included there, inside its anonymous namespace, after
// check_case; same translation unit): E8M0 scales per 32 values on every path against the float64
// reference. The exact decode covers every E8M0 code (2^-127, 2^127, NaN) on both tensor-core
// kernels; the cases cover ragged M/N/K, K % 32 != 0 tails, padded rows, both staged stage shapes
// (4- and 8-byte scale copies), gpt-oss's K = 2880 (K % 128 == 64) and epilogue chains, with
// scales from 2^-127 to 2^93 mixed in a row (random_scale) and a NaN scale in row 3.
#pragma once

void run_mxfp4_checks(bool quick, std::mt19937& rng) {
  for (int dt : {fp4::kDtypeBF16, fp4::kDtypeF16})
    for (int64_t k : {32, 128, 256}) check_exact_decode(dt, fp4::kModeMxfp4, k);
  constexpr int kMx = fp4::kModeMxfp4;
  const int bf = fp4::kDtypeBF16, f16 = fp4::kDtypeF16, f32 = fp4::kDtypeF32;
  const std::vector<Case> cases = {
      {1, 64, 256, bf, bf, false, 0, 0, kMx},       // staged, stages of two steps
      {5, 200, 1000, bf, f32, false, 1, 0, kMx},    // K % 32 == 8, rows not 16-byte: guarded loads
      {16, 128, 512, f16, f16, false, 2, 0, kMx},
      {33, 77, 333, bf, bf, false, 3, 0, kMx},      // odd K, not vector
      {3, 50, 17, f16, f32, false, 0, 0, kMx},      // one partial block
      {2, 40, 1, bf, f32, false, 0, 0, kMx},        // K = 1
      {70, 300, 2048, bf, bf, false, 2, 0, kMx},    // several M tiles (MT = 8 when forced)
      {9, 96, 520, bf, f16, false, 1, 12, kMx},     // padded rows, vector loads, partial last step
      {8, 1024, 4096, bf, bf, false, 0, 0, kMx},
      {4, 64, 264, f32, f32, false, 1, 0, kMx},     // SIMT / dequantize only
      {3, 136, 1024, bf, bf, false, 1, 16, kMx},    // staged, padded rows, N % 32 != 0
      {24, 100, 768, f16, bf, false, 2, 0, kMx},
      {1, 2048, 8192, bf, f32, false, 0, 0, kMx},   // long K
      {64, 200, 1024, bf, bf, false, 2, 0, kMx},    // staged, x tiles of 32 rows
      {5, 72, 384, bf, bf, false, 1, 16, kMx},      // staged, stages of one step (4-byte scale copies)
      {40, 160, 1152, f16, bf, false, 0, 0, kMx},
      {7, 96, 2880, bf, bf, false, 0, 0, kMx},      // gpt-oss K: register kernel, last step half full
      {12, 64, 2880, f16, f16, false, 3, 0, kMx},
      {1, 96, 100, bf, bf, false, 1, 0, kMx},       // K % 32 == 4
  };
  for (const auto& c : cases) check_all_paths(c, quick, rng);
}
