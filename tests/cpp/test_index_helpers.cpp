// Index arithmetic of csrc/shared/w4a16_problem.h past 2^31 elements: the helpers and the
// problem fields are int64, so offsets of [M, N] operands with M * N > 2^31, weight byte offsets
// n * w_row_bytes > 2^31 and packed sizes of huge K do not wrap. Header-only: no MLX needed.
//   g++ -std=c++17 -Icsrc tests/cpp/test_index_helpers.cpp -o /tmp/t && /tmp/t
// (tests/test_adversarial.py compiles and runs it; run_sanitizers.sh runs it under each build.)
#include <cstdint>
#include <cstdio>
#include <type_traits>

#include "shared/w4a16_problem.h"

static int failures = 0, checks = 0;
#define CHECK(cond)                                              \
  do {                                                           \
    ++checks;                                                    \
    if (!(cond)) {                                               \
      ++failures;                                                \
      std::fprintf(stderr, "FAIL line %d: %s\n", __LINE__, #cond); \
    }                                                            \
  } while (0)

int main() {
  using fp4::operand_offset;
  static_assert(std::is_same_v<decltype(operand_offset(0, 0, 0, 0)), int64_t>, "int64 offsets");
  static_assert(std::is_same_v<decltype(fp4::W4A16Problem::m), int64_t>, "m is int64");
  static_assert(std::is_same_v<decltype(fp4::W4A16Problem::n), int64_t>, "n is int64");
  static_assert(std::is_same_v<decltype(fp4::W4A16Problem::k), int64_t>, "k is int64");
  static_assert(std::is_same_v<decltype(fp4::W4A16Problem::w_row_bytes), int64_t>, "int64");
  static_assert(std::is_same_v<decltype(fp4::W4A16Problem::scale_row_bytes), int64_t>, "int64");
  static_assert(std::is_same_v<decltype(fp4::packed_bytes_for_k(0)), int64_t>, "int64");
  static_assert(std::is_same_v<decltype(fp4::scale_blocks_for_k(0)), int64_t>, "int64");
  const int64_t two31 = int64_t(1) << 31, two32 = int64_t(1) << 32;
  // Full operand [M, N] with M * N = 2.8e9 > 2^31: the last element and the element at 2^31.
  const int64_t M = 70000, N = 40000;
  CHECK(operand_offset(fp4::kOperandFull, M - 1, N - 1, N) == M * N - 1);
  CHECK(operand_offset(fp4::kOperandFull, two31 / N, two31 % N, N) == two31);
  CHECK(operand_offset(fp4::kOperandFull, two31 / N, two31 % N - 1, N) == two31 - 1);
  // Output of 2 rows x (2^30 + 8) columns (the large run of test_adversarial.py).
  const int64_t n_big = (int64_t(1) << 30) + 8;
  CHECK(operand_offset(fp4::kOperandFull, 1, n_big - 1, n_big) == 2 * n_big - 1);
  CHECK(operand_offset(fp4::kOperandFull, 1, n_big - 1, n_big) > two31);
  // Row / column / scalar kinds ignore the other index, even when it is huge.
  CHECK(operand_offset(fp4::kOperandRow, 3 * two31, 7, N) == 3 * two31);
  CHECK(operand_offset(fp4::kOperandCol, 99, two31 + 5, two32) == two31 + 5);
  CHECK(operand_offset(fp4::kOperandScalar, M, N, N) == 0);
  // Packed geometry of huge K.
  CHECK(fp4::packed_bytes_for_k(2 * two32 + 1) == two32 + 1);
  CHECK(fp4::packed_words_for_k(8 * two31 + 1) == two31 + 1);
  CHECK(fp4::scale_blocks_for_k(16 * two31 + 1) == two31 + 1);
  CHECK(fp4::packed_bytes_for_k(1) == 1 && fp4::packed_words_for_k(1) == 1 && fp4::scale_blocks_for_k(1) == 1);
  // The kernel's byte / element offsets from Problem fields: n * w_row_bytes, row * k.
  fp4::W4A16Problem p{};
  p.n = n_big;
  p.k = 3;
  p.w_row_bytes = fp4::packed_bytes_for_k(p.k);
  CHECK((p.n - 1) * p.w_row_bytes == 2 * (n_big - 1));
  CHECK((p.n - 1) * p.w_row_bytes > two31);
  p.m = (int64_t(1) << 27) + 1;
  p.k = 17;
  CHECK((p.m - 1) * p.k + p.k - 1 == p.m * 17 - 1);
  CHECK(p.m * p.k > two31);
  std::printf("index helpers: %d checks, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
