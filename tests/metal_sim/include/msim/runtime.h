// metal_sim runtime interface used by the shim (metal_stdlib) and implemented in
// src/runtime.cpp: per-thread context, barriers, simdgroup collectives, threadgroup memory,
// kernel and signature registries (function constants, address_space_of: src/host.cpp). No
// Metal keyword macros here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <type_traits>
#include <utility>

#include "types.h"

namespace msim {

// Limits every Apple GPU family has (the production code reads the same numbers from
// csrc/shared/tiling_metal.h).
#ifndef METAL_SIM_MAX_TG_BYTES
#define METAL_SIM_MAX_TG_BYTES 32768
#endif
#ifndef METAL_SIM_MAX_THREADS
#define METAL_SIM_MAX_THREADS 1024
#endif
constexpr int kSimdWidth = 32;
constexpr uint32_t kQuadWidth = 4;

// Kinds of kernel parameter attributes (the prep step writes one per parameter).
enum AttrKind : int {
  kAttrBuffer = 0,
  kAttrThreadgroup,
  kAttrThreadPositionInGrid,
  kAttrThreadPositionInThreadgroup,
  kAttrThreadgroupPositionInGrid,
  kAttrThreadsPerThreadgroup,
  kAttrThreadgroupsPerGrid,
  kAttrThreadsPerGrid,
  kAttrThreadIndexInThreadgroup,
  kAttrThreadIndexInSimdgroup,
  kAttrSimdgroupIndexInThreadgroup,
  kAttrThreadsPerSimdgroup,
  kAttrSimdgroupsPerThreadgroup,
  kAttrThreadExecutionWidth,
  kAttrQuadgroupIndexInThreadgroup,
  kAttrThreadIndexInQuadgroup,
};

struct ParamAttr {
  int kind;
  int index;
};

struct ThreadCtx {
  uint32_t tid[3];        // thread_position_in_threadgroup
  uint32_t tg_pos[3];     // threadgroup_position_in_grid
  uint32_t tg_size[3];    // threads_per_threadgroup
  uint32_t grid_tgs[3];   // threadgroups_per_grid
  uint32_t index;         // thread_index_in_threadgroup
  uint32_t lane;          // thread_index_in_simdgroup
  uint32_t simdgroup;     // simdgroup_index_in_threadgroup
  uint32_t simdgroups;    // simdgroups_per_threadgroup
  uint32_t lanes_in_simdgroup;
};

// Current Metal thread (valid inside a kernel).
const ThreadCtx& ctx();

// Reports a kernel-side error with the current thread's coordinates, then exits the process.
[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// threadgroup_barrier: every live thread of the threadgroup at the same call site.
void barrier(const std::source_location& loc);

// One simdgroup collective: each lane publishes `slot`; the last lane to arrive calls
// compute(ctx, slots) with all 32 slots (lane order), while the others wait. Every lane of the
// simdgroup must arrive at the same call site.
using CollectiveFn = void (*)(void* user, void** slots, int lanes);
void collective(const char* what, const std::source_location& loc, void* slot, CollectiveFn fn,
                void* user);

// Threadgroup memory for `threadgroup T name[...]` declarations (prep rewrites them into calls
// of tg_var). Starts NaN-poisoned (all bytes 0xFF) in every threadgroup.
void* tg_alloc(int id, size_t size, size_t align);
template <class T>
inline T& tg_var(int id) {
  static_assert(sizeof(T) <= METAL_SIM_MAX_TG_BYTES,
                "metal_sim: a threadgroup variable exceeds the 32 KiB threadgroup memory");
  return *static_cast<T*>(tg_alloc(id, sizeof(T), alignof(T) < 16 ? 16 : alignof(T)));
}
// [[threadgroup(n)]] kernel arguments.
void* tg_param(int index);
// [[buffer(n)]] kernel arguments (checked: bound, and large enough for a reference).
void* buffer_arg(int index, size_t min_size);

// [[function_constant(n)]] values, set on the host before a dispatch; msl_prep rewrites each
// declaration into a reference to its slot (read at every use, like a specialized pipeline).
const void* function_constant_slot(int index);
template <class T>
inline const T& function_constant(int index) {
  static_assert(sizeof(T) <= 8, "metal_sim: function constants are scalars");
  return *static_cast<const T*>(function_constant_slot(index));
}

// Where an address points, for the cost counters (costmodel.py): the current Metal thread's
// stack (registers/private memory), a device buffer, a set_bytes buffer (constant), the
// threadgroup arena, or anything else (globals of the shim).
enum AddressSpace : int { kSpacePrivate, kSpaceDevice, kSpaceConstant, kSpaceThreadgroup,
                          kSpaceOther, kNumSpaces };
int address_space_of(const void* p);

// ---- kernel registry ----
using KernelThunk = void (*)(void* fn, const ParamAttr* sig, int nsig);
bool register_kernel_impl(const char* host_name, const char* base_name, void* fn,
                          KernelThunk thunk, int nparams);
bool register_signature(const char* base_name, const ParamAttr* sig, int n);
// [[max_total_threads_per_threadgroup(n)]] of a kernel (by base name).
bool register_max_threads(const char* base_name, int n);

template <class T>
inline T builtin_value(const uint32_t (&v)[3]) {
  using tr = vec_traits<T>;
  if constexpr (tr::is_vec) {
    T r{};
    for (int i = 0; i < tr::lanes && i < 3; ++i) r[i] = static_cast<typename tr::elem>(v[i]);
    return r;
  } else {
    static_assert(std::is_integral_v<T>, "metal_sim: built-in argument must be an integer");
    return static_cast<T>(v[0]);
  }
}

template <class T>
inline T builtin_scalar(uint32_t v) {
  const uint32_t a[3] = {v, 0u, 0u};
  return builtin_value<T>(a);
}

template <class T>
inline T make_arg(const ParamAttr& a) {
  if constexpr (std::is_pointer_v<T>) {
    // C-style casts: they also convert to the address-space-qualified pointers of the
    // address-space check build (see simbuild.check_address_spaces).
    if (a.kind == kAttrBuffer) return (T)(buffer_arg(a.index, 0));
    if (a.kind == kAttrThreadgroup) return (T)(tg_param(a.index));
    fail("pointer kernel parameter without [[buffer(n)]] or [[threadgroup(n)]]");
  } else if constexpr (std::is_reference_v<T>) {
    using U = std::remove_reference_t<T>;
    if (a.kind != kAttrBuffer) fail("reference kernel parameter without [[buffer(n)]]");
    return *(U*)(buffer_arg(a.index, sizeof(U)));
  } else {
    const ThreadCtx& c = ctx();
    uint32_t g[3];
    switch (a.kind) {
      case kAttrThreadPositionInGrid:
        for (int i = 0; i < 3; ++i) g[i] = c.tg_pos[i] * c.tg_size[i] + c.tid[i];
        return builtin_value<T>(g);
      case kAttrThreadPositionInThreadgroup: return builtin_value<T>(c.tid);
      case kAttrThreadgroupPositionInGrid: return builtin_value<T>(c.tg_pos);
      case kAttrThreadsPerThreadgroup: return builtin_value<T>(c.tg_size);
      case kAttrThreadgroupsPerGrid: return builtin_value<T>(c.grid_tgs);
      case kAttrThreadsPerGrid:
        for (int i = 0; i < 3; ++i) g[i] = c.grid_tgs[i] * c.tg_size[i];
        return builtin_value<T>(g);
      case kAttrThreadIndexInThreadgroup: return builtin_scalar<T>(c.index);
      case kAttrThreadIndexInSimdgroup: return builtin_scalar<T>(c.lane);
      case kAttrSimdgroupIndexInThreadgroup: return builtin_scalar<T>(c.simdgroup);
      case kAttrThreadsPerSimdgroup:
      case kAttrThreadExecutionWidth: return builtin_scalar<T>(kSimdWidth);
      case kAttrSimdgroupsPerThreadgroup: return builtin_scalar<T>(c.simdgroups);
      case kAttrQuadgroupIndexInThreadgroup: return builtin_scalar<T>(c.index / kQuadWidth);
      case kAttrThreadIndexInQuadgroup: return builtin_scalar<T>(c.index % kQuadWidth);
      default: fail("value kernel parameter without a supported built-in attribute");
    }
  }
}

template <class... Args, size_t... I>
inline void call_kernel(void (*f)(Args...), const ParamAttr* sig, std::index_sequence<I...>) {
  f(make_arg<Args>(sig[I])...);
}

template <class... Args>
inline void kernel_thunk(void* fn, const ParamAttr* sig, int nsig) {
  if (nsig != int(sizeof...(Args))) fail("signature table does not match the kernel");
  call_kernel(reinterpret_cast<void (*)(Args...)>(fn), sig, std::index_sequence_for<Args...>{});
}

template <class... Args>
inline bool register_kernel(const char* host_name, const char* base_name, void (*fn)(Args...)) {
  return register_kernel_impl(host_name, base_name, reinterpret_cast<void*>(fn),
                              &kernel_thunk<Args...>, int(sizeof...(Args)));
}

struct SignatureRegistrar {
  SignatureRegistrar(const char* base_name, const ParamAttr* sig, int n) {
    register_signature(base_name, sig, n);
  }
};

}  // namespace msim
