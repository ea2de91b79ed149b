#include "strided_rows.h"

#include <cstring>
#include <vector>

#include "mlx/allocator.h"

namespace mlx_fp4 {
namespace cpu {
namespace {

// Copies every element of a strided array (element strides, any rank) into dense rows.
void copy_strided(const char* src, char* dst, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                  size_t itemsize) {
  const int nd = static_cast<int>(shape.size());
  int64_t total = 1;
  for (int64_t d : shape) total *= d;
  if (total == 0) return;
  std::vector<int64_t> idx(nd, 0);
  for (int64_t i = 0; i < total; ++i) {
    int64_t off = 0;
    for (int d = 0; d < nd; ++d) off += idx[d] * strides[d];
    std::memcpy(dst + i * itemsize, src + off * static_cast<int64_t>(itemsize), itemsize);
    for (int d = nd - 1; d >= 0 && ++idx[d] == shape[d]; --d) idx[d] = 0;
  }
}

}  // namespace

mx::array row_contiguous(const mx::array& a, mx::cpu::CommandEncoder& enc) {
  if (a.flags().row_contiguous) return a;
  mx::array rows(a.shape(), a.dtype(), nullptr, {});
  rows.set_data(mx::allocator::malloc(rows.nbytes()));
  std::vector<int64_t> shape(a.shape().begin(), a.shape().end());
  std::vector<int64_t> strides(a.strides().begin(), a.strides().end());
  const char* src = a.data<char>();
  char* dst = rows.data<char>();
  const size_t itemsize = a.itemsize();
  enc.set_input_array(a);
  enc.set_output_array(rows);
  enc.dispatch([=]() { copy_strided(src, dst, shape, strides, itemsize); });
  enc.add_temporary(rows);
  return rows;
}

}  // namespace cpu
}  // namespace mlx_fp4
