// metal_sim cost counters, linked only into the counting runners that costmodel.py builds.
// costmodel.py rewrites the kernels' LLVM IR to call msim_count_block at the start of every
// basic block and msim_count_mem before every load and store; at exit the totals go to
// $MSIM_COUNT_OUT as "block ID COUNT" and "mem SPACE STORE ACCESSES BYTES" lines.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "msim/runtime.h"

namespace {

constexpr uint32_t kMaxBlocks = 1u << 18;

struct Counts {
  std::vector<uint64_t> blocks = std::vector<uint64_t>(kMaxBlocks, 0);
  uint64_t accesses[msim::kNumSpaces][2] = {};
  uint64_t bytes[msim::kNumSpaces][2] = {};
};

// Never destroyed: the totals are written by a static destructor.
std::mutex& counts_mutex() {
  static std::mutex* m = new std::mutex();
  return *m;
}
std::vector<Counts*>& all_counts() {
  static std::vector<Counts*>* v = new std::vector<Counts*>();
  return *v;
}

// One Counts per OS thread (fibers of a threadgroup run on one OS thread), summed at exit.
Counts& mine() {
  thread_local Counts* c = nullptr;
  if (c == nullptr) {
    c = new Counts();
    std::lock_guard<std::mutex> lock(counts_mutex());
    all_counts().push_back(c);
  }
  return *c;
}

struct Dump {
  ~Dump() {
    const char* path = std::getenv("MSIM_COUNT_OUT");
    if (path == nullptr) return;
    FILE* f = std::fopen(path, "w");
    if (f == nullptr) return;
    std::lock_guard<std::mutex> lock(counts_mutex());
    for (uint32_t b = 0; b < kMaxBlocks; ++b) {
      uint64_t n = 0;
      for (const Counts* c : all_counts()) n += c->blocks[b];
      if (n != 0) std::fprintf(f, "block %u %llu\n", b, (unsigned long long)n);
    }
    for (int s = 0; s < msim::kNumSpaces; ++s) {
      for (int st = 0; st < 2; ++st) {
        uint64_t n = 0, bytes = 0;
        for (const Counts* c : all_counts()) {
          n += c->accesses[s][st];
          bytes += c->bytes[s][st];
        }
        std::fprintf(f, "mem %d %d %llu %llu\n", s, st, (unsigned long long)n,
                     (unsigned long long)bytes);
      }
    }
    std::fclose(f);
  }
} g_dump;

}  // namespace

extern "C" void msim_count_block(uint32_t id) {
  if (id >= kMaxBlocks) msim::fail("cost counter block id %u out of range", id);
  ++mine().blocks[id];
}

extern "C" void msim_count_mem(const void* p, uint32_t bytes, uint32_t is_store) {
  const int s = msim::address_space_of(p);
  Counts& c = mine();
  ++c.accesses[s][is_store != 0];
  c.bytes[s][is_store != 0] += bytes;
}

namespace {
// The widest load or store one Metal thread issues (a 16-byte vector): a block copy of more bytes
// counts one access per 16 bytes.
constexpr uint64_t kMaxAccessBytes = 16;

void count_block_access(const void* p, uint64_t bytes, int is_store) {
  const int s = msim::address_space_of(p);
  Counts& c = mine();
  c.accesses[s][is_store] += (bytes + kMaxAccessBytes - 1) / kMaxAccessBytes;
  c.bytes[s][is_store] += bytes;
}
}  // namespace

// llvm.memcpy / memmove (src != null) and memset (src == null): clang's lowering of struct and
// array copies, e.g. MLX's 16-byte x loads, counted as the loads and stores they are.
extern "C" void msim_count_copy(const void* dst, const void* src, uint64_t bytes) {
  if (bytes == 0) return;
  if (src != nullptr) count_block_access(src, bytes, 0);
  count_block_access(dst, bytes, 1);
}
