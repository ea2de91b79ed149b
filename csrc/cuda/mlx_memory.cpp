// Device buffers for the CUDA glue (see mlx_memory.h): MLX's cu::malloc_async found through
// libmlx's ELF symbol table, else the stream-ordered pool with frees on a stream of our own.
#include "mlx_memory.h"

#include "mlx/backend/cuda/utils.h"
#include "w4a16_kernels.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

namespace mlx_fp4 {
namespace cuda {
namespace {

namespace mx = mlx::core;
using MallocAsync = mx::allocator::Data (*)(size_t, mx::cu::CommandEncoder&);

// Itanium-mangled names: mlx::core::cu::malloc_async(size_t, CommandEncoder&) (hidden) and
// mlx::core::allocator::allocator() (exported, the anchor that proves we read the loaded file).
constexpr const char* kMallocAsync = "_ZN3mlx4core2cu12malloc_asyncEmRNS1_14CommandEncoderE";
constexpr const char* kAnchor = "_ZN3mlx4core9allocator9allocatorEv";
constexpr int kMaxDevices = 64;

// Values of two symbols in the .symtab of the ELF file at `path` (0 when absent).
struct SymtabHits {
  uint64_t target = 0;
  uint64_t anchor = 0;
};

SymtabHits read_symtab(const char* path) {
  SymtabHits hits;
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return hits;
  struct stat st{};
  void* map = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_size > static_cast<off_t>(sizeof(Elf64_Ehdr))) {
    map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  }
  close(fd);
  if (map == MAP_FAILED) return hits;
  const auto* base = static_cast<const uint8_t*>(map);
  const size_t size = static_cast<size_t>(st.st_size);
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
  // Every offset is checked against the file size: a truncated or foreign file yields no hit.
  const bool elf64 = std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == ELFCLASS64 &&
                     eh->e_shentsize == sizeof(Elf64_Shdr) && eh->e_shoff < size &&
                     eh->e_shnum <= (size - eh->e_shoff) / sizeof(Elf64_Shdr);
  const auto* sh = elf64 ? reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff) : nullptr;
  for (int i = 0; sh && i < eh->e_shnum; ++i) {
    if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum) continue;
    const Elf64_Shdr& strs = sh[sh[i].sh_link];
    if (sh[i].sh_offset > size || sh[i].sh_size > size - sh[i].sh_offset || strs.sh_offset > size ||
        strs.sh_size > size - strs.sh_offset) {
      continue;
    }
    const auto* syms = reinterpret_cast<const Elf64_Sym*>(base + sh[i].sh_offset);
    const char* names = reinterpret_cast<const char*>(base + strs.sh_offset);
    const size_t count = sh[i].sh_size / sizeof(Elf64_Sym);
    for (size_t j = 0; j < count && !(hits.target && hits.anchor); ++j) {
      if (ELF64_ST_TYPE(syms[j].st_info) != STT_FUNC || syms[j].st_name >= strs.sh_size) continue;
      const char* name = names + syms[j].st_name;
      const size_t room = strs.sh_size - syms[j].st_name;
      if (!hits.target && strnlen(name, room) < room && std::strcmp(name, kMallocAsync) == 0) {
        hits.target = syms[j].st_value;
      } else if (!hits.anchor && strnlen(name, room) < room && std::strcmp(name, kAnchor) == 0) {
        hits.anchor = syms[j].st_value;
      }
    }
  }
  munmap(map, size);
  return hits;
}

MallocAsync resolve_malloc_async() {
  const char* env = std::getenv("MLX_FP4_CUDA_ALLOC");
  if (env && std::strcmp(env, "pool") == 0) return nullptr;
  void* anchor = reinterpret_cast<void*>(&mx::allocator::allocator);
  Dl_info info{};
  if (!dladdr(anchor, &info) || !info.dli_fname || !info.dli_fbase) return nullptr;
  const SymtabHits hits = read_symtab(info.dli_fname);
  const auto load_base = reinterpret_cast<uintptr_t>(info.dli_fbase);
  // The anchor's file offset must match where it is loaded, or this is not the file in memory.
  if (!hits.target || !hits.anchor || load_base + hits.anchor != reinterpret_cast<uintptr_t>(anchor)) {
    return nullptr;
  }
  return reinterpret_cast<MallocAsync>(load_base + hits.target);
}

MallocAsync mlx_malloc_async() {
  static const MallocAsync fn = resolve_malloc_async();
  return fn;
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("[W4A16Matmul] CUDA backend: ") + what + " failed: " +
                             cudaGetErrorString(e));
  }
}

// Fallback frees go to a stream that never captures, as MLX's own allocator does: a free that
// lands in another thread's capture of the compute stream would become a graph node.
cudaStream_t free_stream(int device) {
  static std::mutex mu;
  static cudaStream_t streams[kMaxDevices] = {};
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0 || device >= kMaxDevices) return nullptr;
  if (!streams[device]) {
    int current = 0;
    check_cuda(cudaGetDevice(&current), "cudaGetDevice");
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check_cuda(cudaSetDevice(current), "cudaSetDevice");
  }
  return streams[device];
}

void free_pool_buffer(mx::allocator::Buffer b) {
  auto* cb = static_cast<mx::cu::CudaBuffer*>(b.ptr());
  if (cb->data && cb->device >= 0) {
    cudaFreeAsync(cb->data, free_stream(cb->device));
  } else if (cb->data) {
    // MLX moved it to unified memory for a host read (device = -1): managed or pinned host memory.
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, cb->data) == cudaSuccess && attr.type == cudaMemoryTypeHost) {
      cudaFreeHost(cb->data);
    } else {
      cudaFree(cb->data);
    }
  }
  delete cb;
}

mx::allocator::Data pool_data(size_t bytes, mx::cu::CommandEncoder& enc) {
  const int device = enc.device().cuda_device();
  void* ptr = nullptr;
  if (bytes > 0) {
    free_stream(device);  // created before any capture can be open on this thread
    check_cuda(cudaMallocAsync(&ptr, bytes, enc.stream()), "cudaMallocAsync");
  }
  auto* buf = new mx::cu::CudaBuffer{ptr, bytes, bytes > 0 ? device : -1};
  return mx::allocator::Data(mx::allocator::Buffer(buf), free_pool_buffer);
}

}  // namespace

mx::allocator::Data device_data(size_t bytes, mx::cu::CommandEncoder& enc) {
  if (MallocAsync fn = mlx_malloc_async()) return fn(bytes, enc);
  return pool_data(bytes, enc);
}

const char* allocator_name() { return mlx_malloc_async() ? "mlx" : "pool"; }

mx::array device_array(const mx::Shape& shape, mx::Dtype dtype, mx::cu::CommandEncoder& enc) {
  mx::array a(shape, dtype, nullptr, {});
  a.set_data(device_data(a.nbytes(), enc));
  return a;
}

mx::array row_contiguous(const mx::array& a, mx::cu::CommandEncoder& enc, const char* op) {
  if (a.flags().row_contiguous) return a;
  if (a.ndim() > fp4::kMaxStridedXDims || (a.itemsize() != 2 && a.itemsize() != 4)) {
    throw std::runtime_error(std::string("[") + op + "] CUDA backend: a strided input of " + std::to_string(a.ndim()) +
                             " dims with " + std::to_string(a.itemsize()) + "-byte elements (at most " +
                             std::to_string(fp4::kMaxStridedXDims) + " dims of 2- or 4-byte elements)");
  }
  mx::array rows = device_array(a.shape(), a.dtype(), enc);
  StridedCopyArgs c{};
  c.src = mx::gpu_ptr<void>(a);
  c.dst = mx::gpu_ptr<void>(rows);
  c.elements = static_cast<int64_t>(a.size());
  c.ndim = static_cast<int>(a.ndim());
  for (int d = 0; d < c.ndim; ++d) {
    c.shape[d] = a.shape(d);
    c.strides[d] = a.strides()[d];
  }
  enc.set_input_array(a);
  enc.set_output_array(rows);
  const Launch l = strided_copy_launch(c, static_cast<int>(a.itemsize()));
  enc.add_kernel_node_ex(l.func, l.grid, l.block, {}, l.smem, c);
  enc.add_temporary(rows);
  return rows;
}

}  // namespace cuda
}  // namespace mlx_fp4
