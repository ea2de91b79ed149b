// metal_sim runtime: runs every Metal thread of a threadgroup as a fiber so that barriers and
// simdgroup collectives behave like lockstep hardware, and checks what hardware does not:
// divergent barriers and collectives, returns before a barrier, deadlocks, threadgroup memory
// and thread limits, out-of-bounds device accesses (guard pages), misaligned typed accesses
// (-fsanitize=alignment traps, reported here). Threadgroups run in parallel on a few OS threads.
#include <atomic>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <dlfcn.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "msim/host.h"
#include "msim/runtime.h"
#include "runtime_internal.h"

// ---------------------------------------------------------------------------------------------
// Context switch. x86-64: a hand-written switch (callee-saved registers, MXCSR, x87 control
// word); about 5x faster than swapcontext, which makes a syscall per switch.
#if MSIM_ASM_FIBERS
extern "C" void msim_ctx_switch(void** save_sp, void* load_sp);
extern "C" void msim_fiber_trampoline();
asm(R"(
.text
.globl msim_ctx_switch
.type msim_ctx_switch,@function
msim_ctx_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size msim_ctx_switch, .-msim_ctx_switch
.globl msim_fiber_trampoline
.type msim_fiber_trampoline,@function
msim_fiber_trampoline:
  movq %r12, %rdi
  callq *%r13
  ud2
.size msim_fiber_trampoline, .-msim_fiber_trampoline
.section .note.GNU-stack,"",@progbits
.text
)");
#endif

// float -> bfloat (round to nearest even, quiet NaN). clang calls this libgcc/compiler-rt
// helper for __bf16 conversions; libgcc 12 (Debian bookworm) lacks it.
extern "C" __attribute__((weak)) __bf16 __truncsfbf2(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t h;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    h = uint16_t((u >> 16) | 0x40u);
  } else {
    h = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  __bf16 b;
  std::memcpy(&b, &h, 2);
  return b;
}

namespace msim {
namespace detail {
namespace {

Fiber& cur_fiber() { return tls_worker->fibers[tls_worker->current]; }

bool same_site(const std::source_location& a, const std::source_location& b) {
  return a.line() == b.line() && a.column() == b.column() &&
         std::strcmp(a.file_name(), b.file_name()) == 0;
}

void describe_thread(char* out, size_t n) {
  Worker* w = tls_worker;
  if (w == nullptr || w->d == nullptr || w->fibers.empty()) {
    std::snprintf(out, n, "(host code)");
    return;
  }
  if (w->current < 0) {
    const ThreadCtx& c0 = w->fibers[0].ctx;
    std::snprintf(out, n, "kernel %s, threadgroup (%u,%u,%u)", w->d->host_name.c_str(),
                  c0.tg_pos[0], c0.tg_pos[1], c0.tg_pos[2]);
    return;
  }
  const ThreadCtx& c = w->fibers[w->current].ctx;
  std::snprintf(out, n,
                "kernel %s, threadgroup (%u,%u,%u), thread %u (simdgroup %u, lane %u)",
                w->d->host_name.c_str(), c.tg_pos[0], c.tg_pos[1], c.tg_pos[2], c.index,
                c.simdgroup, c.lane);
}

void yield_to_scheduler() {
  Worker* w = tls_worker;
  Fiber& f = cur_fiber();
#if MSIM_ASM_FIBERS
  msim_ctx_switch(&f.sp, w->sched_sp);
#else
  swapcontext(&f.uc, &w->sched_uc);
#endif
}

void switch_to_fiber(Worker* w, int i) {
  w->current = i;
  Fiber& f = w->fibers[i];
#if MSIM_ASM_FIBERS
  msim_ctx_switch(&w->sched_sp, f.sp);
#else
  swapcontext(&w->sched_uc, &f.uc);
#endif
  w->current = -1;
}

void fiber_main(Fiber* f) {
  Worker* w = tls_worker;
  const Dispatch* d = w->d;
  d->kernel->thunk(d->kernel->fn, d->sig->data(), int(d->sig->size()));
  // The thread returned.
  if (w->barrier_arrived > 0) {
    fail("thread returned while %d thread(s) wait at threadgroup_barrier (%s:%u): early return "
         "before a barrier",
         w->barrier_arrived, w->barrier_loc.file_name(), w->barrier_loc.line());
  }
  Simdgroup& g = w->sgs[f->ctx.simdgroup];
  if (g.arrived > 0) {
    fail("lane returned while %d lane(s) wait in %s (%s:%u): divergent simdgroup collective",
         g.arrived, g.what, g.loc.file_name(), g.loc.line());
  }
  g.exited++;
  f->state = kDone;
  w->done++;
  yield_to_scheduler();
  std::abort();  // never resumed
}

#if !MSIM_ASM_FIBERS
void fiber_main_uc(unsigned lo, unsigned hi) {
  fiber_main(reinterpret_cast<Fiber*>((uintptr_t(hi) << 32) | uintptr_t(lo)));
}
#endif

void init_fiber(Fiber& f) {
  if (f.stack_map == nullptr) {
    void* m = mmap(nullptr, kFiberStack + kPage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "METAL_SIM ERROR: cannot map a fiber stack\n");
      std::_Exit(70);
    }
    mprotect(m, kPage, PROT_NONE);  // overflow guard
    f.stack_map = static_cast<char*>(m);
  }
  char* top = f.stack_map + kPage + kFiberStack;
#if MSIM_ASM_FIBERS
  // Frame popped by msim_ctx_switch: [mxcsr|fpcw] r15 r14 r13 r12 rbx rbp ret.
  uint64_t* sp = reinterpret_cast<uint64_t*>(top) - 8;
  const uint32_t mxcsr = 0x1F80u;
  const uint16_t fpcw = 0x037Fu;
  std::memcpy(&sp[0], &mxcsr, 4);
  std::memcpy(reinterpret_cast<char*>(&sp[0]) + 4, &fpcw, 2);
  sp[1] = 0;                                               // r15
  sp[2] = 0;                                               // r14
  sp[3] = reinterpret_cast<uint64_t>(&fiber_main);         // r13: entry
  sp[4] = reinterpret_cast<uint64_t>(&f);                  // r12: argument
  sp[5] = 0;                                               // rbx
  sp[6] = 0;                                               // rbp
  sp[7] = reinterpret_cast<uint64_t>(&msim_fiber_trampoline);
  f.sp = sp;
#else
  getcontext(&f.uc);
  f.uc.uc_stack.ss_sp = f.stack_map + kPage;
  f.uc.uc_stack.ss_size = kFiberStack;
  f.uc.uc_link = nullptr;
  const uintptr_t p = reinterpret_cast<uintptr_t>(&f);
  makecontext(&f.uc, reinterpret_cast<void (*)()>(&fiber_main_uc), 2, unsigned(p & 0xffffffffu),
              unsigned(p >> 32));
#endif
  f.state = kRunnable;
}

[[noreturn]] void deadlock(Worker* w) {
  char buf[2048];
  int n = std::snprintf(buf, sizeof buf, "deadlock: no thread can run;");
  if (w->barrier_arrived > 0) {
    n += std::snprintf(buf + n, sizeof buf - n, " %d thread(s) wait at threadgroup_barrier %s:%u;",
                       w->barrier_arrived, w->barrier_loc.file_name(), w->barrier_loc.line());
  }
  for (size_t s = 0; s < w->sgs.size() && n < 1800; ++s) {
    const Simdgroup& g = w->sgs[s];
    if (g.arrived > 0) {
      n += std::snprintf(buf + n, sizeof buf - n, " simdgroup %zu: %d lane(s) wait in %s %s:%u;", s,
                         g.arrived, g.what, g.loc.file_name(), g.loc.line());
    }
  }
  w->current = -1;
  fail("%s", buf);
}

}  // namespace

void run_threadgroup(Worker* w, const Dispatch& d, uint32_t linear) {
  const uint32_t gx = d.grid.x, gy = d.grid.y;
  const uint32_t tgx = linear % gx, tgy = (linear / gx) % gy, tgz = linear / (gx * gy);
  const int n = int(d.tg.x * d.tg.y * d.tg.z);
  w->nthreads = n;
  w->done = 0;
  w->barrier_arrived = 0;
  const int nsg = (n + kSimdWidth - 1) / kSimdWidth;
  w->sgs.assign(size_t(nsg), Simdgroup{});
  for (int s = 0; s < nsg; ++s) {
    w->sgs[s].lanes = (s + 1) * kSimdWidth <= n ? kSimdWidth : n - s * kSimdWidth;
  }
  // Threadgroup memory starts NaN-poisoned: a read before any write shows as NaN (or -1).
  std::memset(w->arena, 0xFF, kArenaBytes);
  w->vars.clear();
  w->arena_used = 0;
  for (int i = 0; i < 32; ++i) {
    if (d.tg_lengths[i] > 0) {
      w->arena_used = (w->arena_used + 15) & ~size_t(15);
      w->tg_param_off[i] = w->arena_used;
      w->arena_used += d.tg_lengths[i];
    }
  }
  if (w->arena_used > METAL_SIM_MAX_TG_BYTES) {
    fail("[[threadgroup(n)]] lengths total %zu bytes, above the %d-byte threadgroup memory",
         w->arena_used, METAL_SIM_MAX_TG_BYTES);
  }
  if (w->fibers.size() < size_t(n)) w->fibers.resize(size_t(n));
  for (int i = 0; i < n; ++i) {
    Fiber& f = w->fibers[i];
    init_fiber(f);
    ThreadCtx& c = f.ctx;
    c.tid[0] = uint32_t(i) % d.tg.x;
    c.tid[1] = (uint32_t(i) / d.tg.x) % d.tg.y;
    c.tid[2] = uint32_t(i) / (d.tg.x * d.tg.y);
    c.tg_pos[0] = tgx;
    c.tg_pos[1] = tgy;
    c.tg_pos[2] = tgz;
    c.tg_size[0] = d.tg.x;
    c.tg_size[1] = d.tg.y;
    c.tg_size[2] = d.tg.z;
    c.grid_tgs[0] = d.grid.x;
    c.grid_tgs[1] = d.grid.y;
    c.grid_tgs[2] = d.grid.z;
    c.index = uint32_t(i);
    c.lane = uint32_t(i % kSimdWidth);
    c.simdgroup = uint32_t(i / kSimdWidth);
    c.simdgroups = uint32_t(nsg);
    c.lanes_in_simdgroup = uint32_t(w->sgs[i / kSimdWidth].lanes);
  }
  // Schedule: always run the lowest-numbered runnable thread (MSIM_SCHEDULE=reverse: the
  // highest). A simdgroup thus runs ahead of the others until a threadgroup barrier stops it,
  // which exposes missing barriers in both directions (reads of data not yet written: NaN
  // poison; overwrites of data still needed: wrong values).
  w->lo = 0;
  w->hi = n - 1;
  while (w->done < n) {
    int pick = -1;
    if (!w->reverse) {
      for (int i = w->lo; i < n; ++i) {
        if (w->fibers[i].state == kRunnable) {
          pick = i;
          break;
        }
      }
      w->lo = pick < 0 ? n : pick;
    } else {
      for (int i = w->hi; i >= 0; --i) {
        if (w->fibers[i].state == kRunnable) {
          pick = i;
          break;
        }
      }
      w->hi = pick;
    }
    if (pick < 0) deadlock(w);
    switch_to_fiber(w, pick);
  }
}

namespace {

std::atomic<bool> g_handlers_installed{false};

void print_fault_buffer(int fd, uintptr_t addr) {
  const int count = g_buf_count.load();
  for (int i = 0; i < count; ++i) {
    Buffer* b = g_buf_snapshot[i];
    if (b == nullptr) continue;
    const uintptr_t map = reinterpret_cast<uintptr_t>(b->map);
    const uintptr_t begin = reinterpret_cast<uintptr_t>(b->data);
    const uintptr_t end = begin + b->size;
    if (addr >= map && addr < map + b->map_size) {
      char msg[512];
      int n;
      if (addr >= end) {
        n = std::snprintf(msg, sizeof msg,
                          "  out-of-bounds device access: byte %zu of buffer '%s', which has %zu "
                          "bytes (past the end)\n",
                          size_t(addr - begin), b->name.c_str(), b->size);
      } else if (addr < begin) {
        n = std::snprintf(msg, sizeof msg,
                          "  out-of-bounds device access %zu byte(s) before the start of buffer "
                          "'%s' (%zu bytes)\n",
                          size_t(begin - addr), b->name.c_str(), b->size);
      } else {
        n = std::snprintf(msg, sizeof msg, "  fault inside buffer '%s'?\n", b->name.c_str());
      }
      (void)!write(fd, msg, size_t(n));
      return;
    }
  }
}

void on_fault(int sig, siginfo_t* si, void* uc_void) {
  char msg[1024];
  const uintptr_t addr = reinterpret_cast<uintptr_t>(si->si_addr);
  uintptr_t pc = 0;
#if defined(__x86_64__)
  pc = uintptr_t(static_cast<ucontext_t*>(uc_void)->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  pc = uintptr_t(static_cast<ucontext_t*>(uc_void)->uc_mcontext.pc);
#endif
  char who[256];
  describe_thread(who, sizeof who);
  const char* what = sig == SIGILL ? "SIGILL (trap: a misaligned typed access caught by "
                                     "-fsanitize=alignment, or __builtin_trap)"
                   : sig == SIGBUS ? "SIGBUS"
                   : sig == SIGFPE ? "SIGFPE"
                                   : "SIGSEGV";
  Dl_info info{};
  uintptr_t base = 0;
  if (dladdr(reinterpret_cast<void*>(pc), &info) != 0) base = uintptr_t(info.dli_fbase);
  int n = std::snprintf(msg, sizeof msg,
                        "METAL_SIM ERROR: %s at address 0x%lx\n  in %s\n  pc=0x%lx "
                        "(module offset 0x%lx)\n",
                        what, (unsigned long)addr, who, (unsigned long)pc,
                        (unsigned long)(pc - base));
  (void)!write(2, msg, size_t(n));
  if (sig == SIGSEGV || sig == SIGBUS) print_fault_buffer(2, addr);
  Worker* w = tls_worker;
  if (w != nullptr && w->current >= 0) {
    const uintptr_t s = reinterpret_cast<uintptr_t>(w->fibers[w->current].stack_map);
    if (addr >= s && addr < s + kPage) {
      const char* o = "  fiber stack overflow (kernel frame too large for metal_sim)\n";
      (void)!write(2, o, std::strlen(o));
    }
  }
  std::_Exit(66);
}

}  // namespace

void install_handlers() {
  if (g_handlers_installed.exchange(true)) return;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = &on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
  sigaction(SIGILL, &sa, nullptr);
  sigaction(SIGFPE, &sa, nullptr);
}

void setup_altstack(Worker* w) {
  const size_t sz = 64 * 1024;
  w->altstack = static_cast<char*>(std::malloc(sz));
  stack_t ss;
  ss.ss_sp = w->altstack;
  ss.ss_size = sz;
  ss.ss_flags = 0;
  sigaltstack(&ss, nullptr);
}

}  // namespace detail

using namespace detail;

// ---------------------------------------------------------------------------------------------
// Kernel-side API

const ThreadCtx& ctx() {
  Worker* w = tls_worker;
  if (w == nullptr || w->current < 0) {
    std::fprintf(stderr, "METAL_SIM ERROR: Metal function called outside a kernel\n");
    std::_Exit(67);
  }
  return w->fibers[w->current].ctx;
}

void fail(const char* fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char who[256];
  describe_thread(who, sizeof who);
  std::fprintf(stderr, "METAL_SIM ERROR: %s\n  in %s\n", msg, who);
  std::fflush(stderr);
  std::_Exit(65);
}

void barrier(const std::source_location& loc) {
  Worker* w = tls_worker;
  if (w->done > 0) {
    fail("threadgroup_barrier at %s:%u reached after %d thread(s) of the threadgroup returned: "
         "early return before a barrier",
         loc.file_name(), loc.line(), w->done);
  }
  if (w->barrier_arrived == 0) {
    w->barrier_loc = loc;
  } else if (!same_site(loc, w->barrier_loc)) {
    fail("divergent barrier: this thread is at %s:%u while %d thread(s) wait at %s:%u",
         loc.file_name(), loc.line(), w->barrier_arrived, w->barrier_loc.file_name(),
         w->barrier_loc.line());
  }
  if (++w->barrier_arrived == w->nthreads) {
    w->barrier_arrived = 0;
    for (int i = 0; i < w->nthreads; ++i) {
      if (w->fibers[i].state == kWaitBarrier) w->wake(i);
    }
    return;
  }
  cur_fiber().state = kWaitBarrier;
  yield_to_scheduler();
}

void collective(const char* what, const std::source_location& loc, void* slot, CollectiveFn fn,
                void* user) {
  Worker* w = tls_worker;
  Fiber& f = cur_fiber();
  Simdgroup& g = w->sgs[f.ctx.simdgroup];
  if (g.exited > 0) {
    fail("%s at %s:%u with %d lane(s) of the simdgroup returned: divergent simdgroup collective "
         "(not supported by metal_sim)",
         what, loc.file_name(), loc.line(), g.exited);
  }
  if (g.arrived == 0) {
    g.what = what;
    g.loc = loc;
    g.fn = fn;
    g.user = user;
  } else if (!same_site(loc, g.loc) || std::strcmp(what, g.what) != 0) {
    fail("divergent simdgroup collective: %s at %s:%u while %d lane(s) wait in %s at %s:%u", what,
         loc.file_name(), loc.line(), g.arrived, g.what, g.loc.file_name(), g.loc.line());
  }
  g.slots[f.ctx.lane] = slot;
  if (++g.arrived == g.lanes) {
    g.arrived = 0;
    g.fn(g.user, g.slots, g.lanes);
    const int first = int(f.ctx.simdgroup) * kSimdWidth;
    for (int i = first; i < first + g.lanes; ++i) {
      if (w->fibers[i].state == kWaitSimd) w->wake(i);
    }
    return;
  }
  f.state = kWaitSimd;
  yield_to_scheduler();
}

void* tg_alloc(int id, size_t size, size_t align) {
  Worker* w = tls_worker;
  for (const Worker::Var& v : w->vars) {
    if (v.id == id) {
      if (v.size != size) fail("threadgroup variable %d changed size", id);
      return w->arena + v.off;
    }
  }
  const size_t off = (w->arena_used + align - 1) & ~(align - 1);
  if (off + size > METAL_SIM_MAX_TG_BYTES) {
    fail("threadgroup memory exceeds %d bytes: %zu bytes used, declaration %d needs %zu more",
         METAL_SIM_MAX_TG_BYTES, w->arena_used, id, size);
  }
  w->vars.push_back({id, off, size});
  w->arena_used = off + size;
  return w->arena + off;
}

void* tg_param(int index) {
  Worker* w = tls_worker;
  if (index < 0 || index >= 32 || w->d->tg_lengths[index] == 0) {
    fail("[[threadgroup(%d)]] argument has no set_threadgroup_memory_length", index);
  }
  return w->arena + w->tg_param_off[index];
}

void* buffer_arg(int index, size_t min_size) {
  Worker* w = tls_worker;
  if (index < 0 || index >= 32 || !w->d->buffers[index].bound) {
    fail("[[buffer(%d)]] is not bound", index);
  }
  const BoundBuffer& b = w->d->buffers[index];
  if (b.size < min_size) {
    fail("[[buffer(%d)]] has %zu bytes but the kernel reads a %zu-byte object", index, b.size,
         min_size);
  }
  return b.ptr;
}

bool register_kernel_impl(const char* host_name, const char* base_name, void* fn,
                          KernelThunk thunk, int nparams) {
  kernels()[host_name] = KernelEntry{base_name, fn, thunk, nparams};
  return true;
}

bool register_max_threads(const char* base_name, int n) {
  max_threads()[base_name] = n;
  return true;
}

bool register_signature(const char* base_name, const ParamAttr* sig, int n) {
  signatures()[base_name] = std::vector<ParamAttr>(sig, sig + n);
  return true;
}

}  // namespace msim
