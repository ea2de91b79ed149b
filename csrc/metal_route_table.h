// Measured route decisions of the Metal tuner (python/mlx_fp4/tuning.py), consulted by ops.cpp's
// metal_route before the static table (csrc/metal/w4a16_route.h) under MLX_FP4_METAL_ROUTE=auto,
// and by gather_ops.cpp (ours or mx.gather_qmm). Keyed by a shape bucket, N, K, x's dtype and the
// mode (gathered: also the experts and the sorted hint); the tuner fills it from its cache file
// or from timings on the device.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "metal/w4a16_route.h"

namespace mlx_fp4 {

// Rows of x per bucket: each M up to kTuneExactMaxM (the vector path's row counts, where the
// kernels change row by row), then powers of two (the GEMM's tiles change by doubling).
constexpr int64_t kTuneExactMaxM = 16;

inline int64_t metal_shape_bucket(int64_t m) {
  if (m <= kTuneExactMaxM) {
    return m;
  }
  int64_t b = kTuneExactMaxM;
  while (b < m) {
    b *= 2;
  }
  return b;
}

struct MetalRouteKey {
  int64_t bucket = 0;   // metal_shape_bucket of the rows of x (gathered: of all pairs' rows)
  int64_t n = 0;
  int64_t k = 0;
  int dtype = 0;        // fp4 operand dtype code of x (kDtypeF32 / F16 / BF16)
  int mode = 0;         // fp4::Mode
  int64_t experts = 0;  // gathered op: experts (0: the dense op)
  bool sorted = false;  // gathered op: the sorted-indices hint
  bool operator<(const MetalRouteKey& o) const {
    return std::tie(bucket, n, k, dtype, mode, experts, sorted) <
        std::tie(o.bucket, o.n, o.k, o.dtype, o.mode, o.experts, o.sorted);
  }
};

class MetalRouteTable {
 public:
  void set(const MetalRouteKey& key, fp4::MetalRoute route) {
    std::lock_guard<std::mutex> lock(mutex_);
    routes_[key] = route;
  }
  void erase(const MetalRouteKey& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    routes_.erase(key);
  }
  std::optional<fp4::MetalRoute> get(const MetalRouteKey& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = routes_.find(key);
    return it == routes_.end() ? std::nullopt : std::optional<fp4::MetalRoute>(it->second);
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    routes_.clear();
  }
  std::vector<std::pair<MetalRouteKey, fp4::MetalRoute>> entries() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return {routes_.begin(), routes_.end()};
  }

 private:
  mutable std::mutex mutex_;
  std::map<MetalRouteKey, fp4::MetalRoute> routes_;
};

// The process's table (one per process: decisions hold for its GPU).
inline MetalRouteTable& metal_route_table() {
  static MetalRouteTable table;
  return table;
}

}  // namespace mlx_fp4
