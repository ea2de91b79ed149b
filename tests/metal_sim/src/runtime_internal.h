// metal_sim runtime internals shared by src/runtime.cpp (fibers, scheduler, fault handlers) and
// src/host.cpp (buffers, encoder, dispatch): worker state, registries, buffer registry.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <source_location>
#include <string>
#include <vector>

#include <ucontext.h>

#include "msim/host.h"
#include "msim/runtime.h"

// Context switch: hand-written on x86-64 (src/runtime.cpp), ucontext elsewhere. It decides the
// layout of Fiber and Worker, so every translation unit must see the same value.
#if defined(__x86_64__)
#define MSIM_ASM_FIBERS 1
#else
#define MSIM_ASM_FIBERS 0
#endif

namespace msim::detail {

constexpr size_t kPage = 4096;
constexpr size_t kFiberStack = 128 * 1024;
constexpr size_t kArenaBytes = 2 * METAL_SIM_MAX_TG_BYTES;

enum FiberState { kRunnable = 0, kWaitBarrier, kWaitSimd, kDone };

struct Fiber {
  void* sp = nullptr;
  char* stack_map = nullptr;  // guard page + stack
#if !MSIM_ASM_FIBERS
  ucontext_t uc;
#endif
  int state = kRunnable;
  ThreadCtx ctx{};
};

struct Simdgroup {
  int lanes = 0;
  int arrived = 0;
  int exited = 0;
  const char* what = nullptr;
  std::source_location loc;
  void* slots[kSimdWidth] = {};
  CollectiveFn fn = nullptr;
  void* user = nullptr;
};

struct KernelEntry {
  std::string base;
  void* fn;
  KernelThunk thunk;
  int nparams;
};

struct BoundBuffer {
  void* ptr = nullptr;
  size_t size = 0;
  bool bound = false;
};

struct Dispatch {
  const KernelEntry* kernel = nullptr;
  const std::vector<ParamAttr>* sig = nullptr;
  std::string host_name;
  BoundBuffer buffers[32];
  size_t tg_lengths[32] = {};
  Dim3 grid, tg;
};

struct Worker {
  std::vector<Fiber> fibers;
  void* sched_sp = nullptr;
#if !MSIM_ASM_FIBERS
  ucontext_t sched_uc;
#endif
  int current = -1;
  int nthreads = 0;
  int done = 0;
  int barrier_arrived = 0;
  std::source_location barrier_loc;
  std::vector<Simdgroup> sgs;
  char* arena = nullptr;
  size_t arena_used = 0;
  struct Var {
    int id;
    size_t off, size;
  };
  std::vector<Var> vars;
  size_t tg_param_off[32] = {};
  const Dispatch* d = nullptr;
  char* altstack = nullptr;
  bool reverse = false;  // MSIM_SCHEDULE=reverse
  int lo = 0;            // no runnable fiber below lo (forward schedule)
  int hi = 0;            // no runnable fiber above hi (reverse schedule)

  void wake(int i) {
    fibers[i].state = kRunnable;
    if (i < lo) lo = i;
    if (i > hi) hi = i;
  }
};

inline std::map<std::string, KernelEntry>& kernels() {
  static std::map<std::string, KernelEntry> m;
  return m;
}
inline std::map<std::string, int>& max_threads() {
  static std::map<std::string, int> m;
  return m;
}

inline std::map<std::string, std::vector<ParamAttr>>& signatures() {
  static std::map<std::string, std::vector<ParamAttr>> m;
  return m;
}

inline thread_local Worker* tls_worker = nullptr;
inline int g_workers = 0;

// Buffers, for fault diagnosis.
inline std::mutex g_buf_mutex;
inline std::vector<Buffer*> g_buffers;
inline Buffer* g_buf_snapshot[4096];
inline std::atomic<int> g_buf_count{0};

// src/runtime.cpp
void run_threadgroup(Worker* w, const Dispatch& d, uint32_t linear);
void install_handlers();
void setup_altstack(Worker* w);

}  // namespace msim::detail
