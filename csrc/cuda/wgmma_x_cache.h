// The permuted x of the last wgmma product on each stream, so that products reading the same x
// (an attention block's q/k/v, an MLP's gate/up) permute it once: in a Llama-3-8B prefill the
// permute node was the largest single item between us and dense bf16 (docs/wgmma.md, stop 32).
//
// Why a hit is safe: the entry holds x itself, so x's buffer can neither be freed and reused by
// another array nor donated to an in-place op (MLX donates only arrays nobody else holds); an
// equal pointer, shape and dtype therefore means the same bytes. xp is read by the later product
// through set_input_array, so MLX orders it after the permute node (same graph: by buffer; an
// earlier graph: by stream order), and each product adds xp as a temporary, so it outlives its use.
// Only one stream's own products share (the key holds the stream). MLX_FP4_CUDA_WGMMA_SHARE_X=0
// turns it off in the glue (A/B timing; the per-op benchmark times one product, permute included).
// Compiled by the C++ compiler (MLX's CUDA headers), as w4a16_matmul.cpp.
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "mlx/array.h"
#include "mlx/backend/cuda/utils.h"

namespace mlx_fp4 {
namespace cuda {

class WgmmaXCache {
 public:
  // The cached xp when `x` (row-contiguous, [m, k]) is the last x permuted on `stream_index`.
  std::optional<mlx::core::array> find(int stream_index, const mlx::core::array& x, int64_t m, int64_t k) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : entries_) {
      if (e.stream_index == stream_index && e.m == m && e.k == k && e.x.dtype() == x.dtype() &&
          mlx::core::gpu_ptr<void>(e.x) == mlx::core::gpu_ptr<void>(x)) {
        return e.xp;
      }
    }
    return std::nullopt;
  }

  // Remember x and its permutation xp as the last of `stream_index` (one entry per stream, so the
  // memory held is one x and one xp per stream, released by the stream's next wgmma product).
  void store(int stream_index, const mlx::core::array& x, const mlx::core::array& xp, int64_t m, int64_t k) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Entry& e : entries_) {
      if (e.stream_index == stream_index) {
        e = Entry{stream_index, m, k, x, xp};
        return;
      }
    }
    entries_.push_back(Entry{stream_index, m, k, x, xp});
  }

  // One cache per process, never destroyed: arrays released after MLX's allocator at exit would
  // call into a destroyed allocator.
  static WgmmaXCache& instance() {
    static WgmmaXCache* cache = new WgmmaXCache();
    return *cache;
  }

 private:
  struct Entry {
    int stream_index;
    int64_t m, k;
    mlx::core::array x, xp;
  };
  std::mutex mu_;
  std::vector<Entry> entries_;
};

}  // namespace cuda
}  // namespace mlx_fp4
