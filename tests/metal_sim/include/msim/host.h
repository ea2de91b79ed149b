// metal_sim host API, shaped like a Metal compute encoder: guarded device buffers,
// set_buffer / set_bytes / set_threadgroup_memory_length, dispatch_threadgroups. Plain C++: the
// host translation unit never sees the Metal shim.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace msim {

// Where a device buffer sits relative to its guard pages (PROT_NONE). kEnd: the last byte is
// followed by a guard page, so any read or write past the end faults; the start has only the
// alignment of the size. kStart: the first byte follows a guard page (reads before the start
// fault); 16-byte aligned. kAligned16: 16-byte aligned start, up to 15 slack bytes after the end
// filled with 0xFF, then the guard page.
enum class Guard { kEnd, kStart, kAligned16 };

struct Buffer {
  void* data = nullptr;
  size_t size = 0;
  std::string name;
  void* map = nullptr;
  size_t map_size = 0;
};

Buffer* alloc_buffer(size_t size, const std::string& name, Guard guard);
void free_buffer(Buffer* b);

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

class Encoder {
 public:
  Encoder();
  ~Encoder();
  void set_buffer(Buffer* b, int index, size_t offset = 0);
  // Copies the bytes into a guarded buffer of exactly that size.
  void set_bytes(const void* data, size_t size, int index);
  void set_threadgroup_memory_length(size_t length, int index);
  // Value of [[function_constant(index)]] (a scalar of `size` <= 8 bytes) for the dispatches
  // that follow; MTLFunctionConstantValues of the pipeline on a real GPU.
  void set_function_constant(int index, const void* data, size_t size);
  // Runs the kernel registered under `host_name` to completion.
  void dispatch_threadgroups(const std::string& host_name, Dim3 grid, Dim3 threadgroup);

 private:
  std::vector<Buffer*> owned_;
};

bool has_kernel(const std::string& host_name);
std::vector<std::string> kernel_names();
// Number of OS threads that run threadgroups in parallel (default: MSIM_WORKERS or 2).
void set_workers(int n);

}  // namespace msim
