// metal_sim host API: guarded device buffers (with their registry, for fault diagnosis),
// function constants, the encoder and dispatch_threadgroups (threadgroups on a few OS threads).
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>

#include "msim/host.h"
#include "msim/runtime.h"
#include "runtime_internal.h"

namespace msim {

using namespace detail;

// ---------------------------------------------------------------------------------------------
// Host API

Buffer* alloc_buffer(size_t size, const std::string& name, Guard guard) {
  install_handlers();
  const size_t data_bytes = guard == Guard::kEnd ? size : (size + 15) & ~size_t(15);
  const size_t body = (data_bytes + kPage - 1) / kPage * kPage;
  const size_t total = body + 2 * kPage;
  void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    std::fprintf(stderr, "METAL_SIM ERROR: cannot map buffer %s\n", name.c_str());
    std::_Exit(70);
  }
  char* base = static_cast<char*>(m);
  mprotect(base, kPage, PROT_NONE);
  mprotect(base + kPage + body, kPage, PROT_NONE);
  auto* b = new Buffer;
  b->name = name;
  b->size = size;
  b->map = m;
  b->map_size = total;
  if (guard == Guard::kStart) {
    b->data = base + kPage;
  } else {
    b->data = base + kPage + body - data_bytes;
  }
  if (guard == Guard::kAligned16) {
    std::memset(static_cast<char*>(b->data) + size, 0xFF, data_bytes - size);
  }
  std::lock_guard<std::mutex> lock(g_buf_mutex);
  g_buffers.push_back(b);
  const int i = g_buf_count.load();
  if (i < 4096) {
    g_buf_snapshot[i] = b;
    g_buf_count.store(i + 1);
  }
  return b;
}

void free_buffer(Buffer* b) {
  if (b == nullptr) return;
  std::lock_guard<std::mutex> lock(g_buf_mutex);
  const int count = g_buf_count.load();
  for (int i = 0; i < count; ++i) {
    if (g_buf_snapshot[i] == b) g_buf_snapshot[i] = nullptr;
  }
  munmap(b->map, b->map_size);
  delete b;
}

int address_space_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  Worker* w = tls_worker;
  if (w != nullptr) {
    const uintptr_t arena = reinterpret_cast<uintptr_t>(w->arena);
    if (a >= arena && a < arena + kArenaBytes) return kSpaceThreadgroup;
    const uintptr_t stack = reinterpret_cast<uintptr_t>(w->fibers[w->current].stack_map);
    if (a >= stack && a < stack + kPage + kFiberStack) return kSpacePrivate;
  }
  const int count = g_buf_count.load();
  for (int i = 0; i < count; ++i) {
    const Buffer* b = g_buf_snapshot[i];
    if (b == nullptr) continue;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(b->data);
    if (a >= begin && a < begin + b->size) {
      return b->name.rfind("set_bytes(", 0) == 0 ? kSpaceConstant : kSpaceDevice;
    }
  }
  return kSpaceOther;
}

namespace {
Dispatch g_next;  // bindings of the encoder being filled
constexpr int kFunctionConstants = 1024;
alignas(8) uint64_t g_function_constants[kFunctionConstants];
}  // namespace

const void* function_constant_slot(int index) {
  if (index < 0 || index >= kFunctionConstants) {
    fail("function_constant(%d) out of the simulated range", index);
  }
  return &g_function_constants[index];
}

Encoder::Encoder() {
  g_next = Dispatch{};
  std::memset(g_function_constants, 0, sizeof g_function_constants);
}

void Encoder::set_function_constant(int index, const void* data, size_t size) {
  if (index < 0 || index >= kFunctionConstants || size > 8) {
    fail("set_function_constant(%d, %zu bytes) out of range", index, size);
  }
  g_function_constants[index] = 0;
  std::memcpy(&g_function_constants[index], data, size);
}

Encoder::~Encoder() {
  for (Buffer* b : owned_) free_buffer(b);
}

void Encoder::set_buffer(Buffer* b, int index, size_t offset) {
  if (index < 0 || index >= 32) fail("set_buffer index %d out of range", index);
  g_next.buffers[index] = BoundBuffer{static_cast<char*>(b->data) + offset, b->size - offset, true};
}

void Encoder::set_bytes(const void* data, size_t size, int index) {
  Buffer* b = alloc_buffer(size, "set_bytes(" + std::to_string(index) + ")", Guard::kEnd);
  std::memcpy(b->data, data, size);
  owned_.push_back(b);
  set_buffer(b, index, 0);
}

void Encoder::set_threadgroup_memory_length(size_t length, int index) {
  if (index < 0 || index >= 32) fail("threadgroup memory index %d out of range", index);
  g_next.tg_lengths[index] = length;
}

void set_workers(int n) { g_workers = n; }

void Encoder::dispatch_threadgroups(const std::string& host_name, Dim3 grid, Dim3 tg) {
  install_handlers();
  auto it = kernels().find(host_name);
  if (it == kernels().end()) fail("no kernel registered as '%s'", host_name.c_str());
  auto sit = signatures().find(it->second.base);
  if (sit == signatures().end()) {
    fail("no signature table for kernel '%s' (base %s)", host_name.c_str(),
         it->second.base.c_str());
  }
  if (int(sit->second.size()) != it->second.nparams) {
    fail("signature table of %s has %zu entries, kernel has %d parameters", host_name.c_str(),
         sit->second.size(), it->second.nparams);
  }
  const uint64_t threads = uint64_t(tg.x) * tg.y * tg.z;
  if (threads == 0 || threads > METAL_SIM_MAX_THREADS) {
    fail("threadgroup of %llu threads: Metal allows 1 to %d", (unsigned long long)threads,
         METAL_SIM_MAX_THREADS);
  }
  auto mt = max_threads().find(it->second.base);
  if (mt != max_threads().end() && threads > uint64_t(mt->second)) {
    fail("kernel %s: threadgroup of %llu threads exceeds its "
         "[[max_total_threads_per_threadgroup(%d)]]", host_name.c_str(),
         (unsigned long long)threads, mt->second);
  }
  for (const ParamAttr& a : sit->second) {
    if (a.kind == kAttrBuffer && (a.index < 0 || a.index >= 32 || !g_next.buffers[a.index].bound)) {
      fail("kernel %s: [[buffer(%d)]] is not bound", host_name.c_str(), a.index);
    }
  }
  Dispatch d = g_next;
  d.kernel = &it->second;
  d.sig = &sit->second;
  d.host_name = host_name;
  d.grid = grid;
  d.tg = tg;
  const uint64_t total = uint64_t(grid.x) * grid.y * grid.z;
  int nw = g_workers;
  if (nw <= 0) {
    const char* e = std::getenv("MSIM_WORKERS");
    nw = e != nullptr ? std::atoi(e) : 2;
  }
  if (nw < 1) nw = 1;
  if (uint64_t(nw) > total) nw = int(total == 0 ? 1 : total);
  std::atomic<uint64_t> next{0};
  auto body = [&]() {
    Worker w;
    const char* sched = std::getenv("MSIM_SCHEDULE");
    w.reverse = sched != nullptr && std::strcmp(sched, "reverse") == 0;
    tls_worker = &w;
    setup_altstack(&w);
    w.d = &d;
    w.arena = static_cast<char*>(std::aligned_alloc(64, kArenaBytes));
    for (;;) {
      const uint64_t i = next.fetch_add(1);
      if (i >= total) break;
      run_threadgroup(&w, d, uint32_t(i));
    }
    for (Fiber& f : w.fibers) {
      if (f.stack_map != nullptr) munmap(f.stack_map, kFiberStack + kPage);
    }
    std::free(w.arena);
    stack_t ss;
    std::memset(&ss, 0, sizeof ss);
    ss.ss_flags = SS_DISABLE;
    sigaltstack(&ss, nullptr);
    std::free(w.altstack);
    tls_worker = nullptr;
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < nw; ++i) pool.emplace_back(body);
  body();
  for (std::thread& t : pool) t.join();
  g_next = Dispatch{};
}

bool has_kernel(const std::string& host_name) { return kernels().count(host_name) != 0; }

std::vector<std::string> kernel_names() {
  std::vector<std::string> v;
  for (const auto& kv : kernels()) v.push_back(kv.first);
  return v;
}

}  // namespace msim
