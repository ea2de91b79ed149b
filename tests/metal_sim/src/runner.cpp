// metal_sim host program: plays eval_gpu (csrc/metal/w4a16_matmul.cpp) on the CPU. It builds the
// launch with the production host code (csrc/metal/w4a16_dispatch.h: kernel choice, grid,
// Morton dims, params, bindings), binds guarded buffers like the Metal encoder, and runs the
// kernel compiled from the embedded MSL by the metal_sim shim.
//
//   runner run CASE_DIR        spec.txt + *.bin inputs -> out.bin, plan.txt
//   runner plan M N K X_DTYPE OUT_DTYPE [FORCE]       print the launch
//   runner route ARCH M N K X_IS_F32                   the static Metal route (w4a16_route.h)
//   runner morton LOG2_M LOG2_N                       print the tile of every threadgroup
//   runner abi                                        params layout, C++ vs MSL compilation
//   runner list                                       registered kernels
//   runner raw KERNEL GX TG SLOT:BYTES[:FILE] ...     run any kernel; prints slot 0 as floats
//                                                     (buffer placement: $MSIM_GUARD)
//   runner exec SPEC          run any kernel as a host program would: 3-D grid and threadgroup,
//                             buffers from files, outputs (NaN-poisoned) to files, function
//                             constants (MLX's kernels; tests/metal_sim/mlx_launch.py)
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "metal/w4a16_dispatch.h"
#include "metal/w4a16_route.h"
#include "msim/host.h"

extern "C" void msim_msl_abi(long* v) __attribute__((weak));

namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::cerr << "runner: cannot read " << path << "\n";
    std::exit(2);
  }
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

msim::Buffer* buffer_from(const std::vector<char>& bytes, const std::string& name, msim::Guard g) {
  msim::Buffer* b = msim::alloc_buffer(bytes.size(), name, g);
  if (!bytes.empty()) std::memcpy(b->data, bytes.data(), bytes.size());
  return b;
}

msim::Guard parse_guard(const std::string& name) {
  return name == "start" ? msim::Guard::kStart
       : name == "aligned" ? msim::Guard::kAligned16
                           : msim::Guard::kEnd;
}

void print_launch(const fp4::MetalLaunch& l, std::ostream& os) {
  const fp4::W4A16MetalParams& q = l.params;
  os << "kernel " << l.kernel_name << "\n"
     << "grid " << l.grid << "\n"
     << "threads " << l.threads << "\n"
     << "tiles " << q.tiles_m << " " << q.tiles_n << "\n"
     << "log2_grid " << q.log2_grid_m << " " << q.log2_grid_n << "\n"
     << "flags " << q.flags << "\n"
     << "pipeline " << l.pipeline_name << "\n"
     << "split " << q.split_k << " " << q.split_strips << "\n"
     << "bindings";
  for (int s = 0; s < fp4::kMetalNumBuffers; ++s) os << " " << l.binding[s];
  os << "\n";
}

fp4::MetalConfig parse_force(const std::string& s, bool* has) {
  fp4::MetalConfig c;
  *has = s != "auto" && fp4::metal_parse_override(s.c_str(), &c);
  return c;
}

int cmd_run(const std::string& dir) {
  std::ifstream spec(dir + "/spec.txt");
  if (!spec) {
    std::cerr << "runner: no spec.txt in " << dir << "\n";
    return 2;
  }
  fp4::W4A16Problem p{};
  std::string force = "auto", guard_name = "end";
  int workers = 0;
  std::string key;
  while (spec >> key) {
    if (key == "m") spec >> p.m;
    else if (key == "n") spec >> p.n;
    else if (key == "k") spec >> p.k;
    else if (key == "w_row_bytes") spec >> p.w_row_bytes;
    else if (key == "scale_row_bytes") spec >> p.scale_row_bytes;
    else if (key == "x_dtype") spec >> p.x_dtype;
    else if (key == "out_dtype") spec >> p.out_dtype;
    else if (key == "has_gs") spec >> p.has_global_scale;
    else if (key == "mode") spec >> p.mode;
    else if (key == "op") {
      fp4::EpilogueOp& op = p.ops[p.num_ops++];
      spec >> op.code >> op.operand >> op.p0 >> op.p1;
    } else if (key == "operand") {
      spec >> p.operand_kind[p.num_operands] >> p.operand_dtype[p.num_operands];
      ++p.num_operands;
    } else if (key == "force") spec >> force;
    else if (key == "guard") spec >> guard_name;
    else if (key == "workers") spec >> workers;
    else {
      std::cerr << "runner: unknown spec key " << key << "\n";
      return 2;
    }
  }
  const msim::Guard guard = parse_guard(guard_name);
  if (workers > 0) msim::set_workers(workers);

  // Inputs in the primitive's order: x, w, scales, [global scale], operands.
  std::vector<msim::Buffer*> inputs;
  inputs.push_back(buffer_from(read_file(dir + "/x.bin"), "x", guard));
  inputs.push_back(buffer_from(read_file(dir + "/w.bin"), "w", guard));
  inputs.push_back(buffer_from(read_file(dir + "/scales.bin"), "scales", guard));
  if (p.has_global_scale) {
    inputs.push_back(buffer_from(read_file(dir + "/gs.bin"), "global_scale", guard));
  }
  for (int i = 0; i < p.num_operands; ++i) {
    const std::string name = "operand" + std::to_string(i);
    inputs.push_back(buffer_from(read_file(dir + "/" + name + ".bin"), name, guard));
  }
  const size_t out_bytes = size_t(p.m) * size_t(p.n) * size_t(fp4::metal_dtype_size(p.out_dtype));
  msim::Buffer* out = msim::alloc_buffer(out_bytes, "out", guard);
  // Unwritten outputs read back as NaN.
  std::memset(out->data, 0xFF, out_bytes);

  if (p.m > 0 && p.n > 0) {
    bool has_force = false;
    const fp4::MetalConfig fc = parse_force(force, &has_force);
    fp4::MetalAddresses addr;
    addr.x = reinterpret_cast<uintptr_t>(inputs[0]->data);
    addr.w = reinterpret_cast<uintptr_t>(inputs[1]->data);
    addr.scales = reinterpret_cast<uintptr_t>(inputs[2]->data);
    addr.out = reinterpret_cast<uintptr_t>(out->data);
    const fp4::MetalLaunch l = fp4::metal_plan(p, addr, has_force ? &fc : nullptr);
    std::ofstream plan(dir + "/plan.txt");
    print_launch(l, plan);
    plan.close();
    msim::Encoder enc;
    for (int i = 0; i < l.num_constants; ++i) {
      const bool v = l.constants[i].value;
      enc.set_function_constant(l.constants[i].index, &v, sizeof v);
    }
    // Split-K partials: a temporary, NaN-poisoned like every unwritten buffer.
    msim::Buffer* partials = nullptr;
    if (l.split) {
      partials = msim::alloc_buffer(size_t(l.partial_bytes), "partials", guard);
      std::memset(partials->data, 0xFF, size_t(l.partial_bytes));
    }
    auto bind_all = [&]() {
      for (int s = 0; s < fp4::kMetalNumBuffers; ++s) {
        const int b = l.binding[s];
        if (b == fp4::kMetalBindOutput) {
          enc.set_buffer(out, s);
        } else if (b == fp4::kMetalBindParams) {
          enc.set_bytes(&l.params, sizeof(l.params), s);
        } else if (b == fp4::kMetalBindPartials) {
          enc.set_buffer(partials, s);
        } else {
          enc.set_buffer(inputs.at(size_t(b)), s);
        }
      }
    };
    bind_all();
    enc.dispatch_threadgroups(l.kernel_name, {l.grid, 1, 1}, {l.threads, 1, 1});
    if (l.split) {
      bind_all();
      enc.dispatch_threadgroups(l.reduce_kernel_name, {l.reduce_grid, 1, 1},
                                {l.reduce_threads, 1, 1});
    }
  }
  std::ofstream o(dir + "/out.bin", std::ios::binary);
  o.write(static_cast<const char*>(out->data), std::streamsize(out_bytes));
  return 0;
}

int cmd_plan(int argc, char** argv) {
  fp4::W4A16Problem p{};
  p.m = std::atoll(argv[2]);
  p.n = std::atoll(argv[3]);
  p.k = std::atoll(argv[4]);
  p.x_dtype = std::atoi(argv[5]);
  p.out_dtype = std::atoi(argv[6]);
  p.w_row_bytes = fp4::packed_bytes_for_k(p.k);
  p.scale_row_bytes = fp4::scale_blocks_for_k(p.k);
  bool has_force = false;
  const fp4::MetalConfig fc = parse_force(argc > 7 ? argv[7] : "auto", &has_force);
  const fp4::MetalLaunch l = fp4::metal_plan(p, fp4::MetalAddresses{}, has_force ? &fc : nullptr);
  print_launch(l, std::cout);
  return 0;
}

// The production route of ops.cpp's auto mode for a GPU architecture string ("applegpu_g16s").
int cmd_route(char** argv) {
  const fp4::AppleGpuId gpu = fp4::parse_apple_gpu_arch(argv[2]);
  const int64_t m = std::atoll(argv[3]), n = std::atoll(argv[4]), k = std::atoll(argv[5]);
  const bool f32 = std::atoi(argv[6]) != 0;
  static const char* const names[] = {"ours", "mlx", "cpu"};
  std::cout << "route " << names[int(fp4::metal_auto_route(gpu, m, n, k, f32))] << "\n"
            << "mlx_batch_limit " << fp4::mlx_qmv_batch_limit(gpu, n, k) << "\n"
            << "mlx_nax " << int(fp4::mlx_runs_nax(gpu, m, n, k, f32)) << "\n";
  return 0;
}

int cmd_morton(int lgm, int lgn) {
  const uint32_t total = uint32_t(1) << (lgm + lgn);
  for (uint32_t i = 0; i < total; ++i) {
    const fp4::MortonTile t = fp4::morton_decode(i, uint32_t(lgm), uint32_t(lgn));
    std::cout << t.m << " " << t.n << "\n";
  }
  return 0;
}

int cmd_abi() {
  using P = fp4::W4A16MetalParams;
  std::cout << "cpp " << sizeof(P) << " " << offsetof(P, flags) << " " << offsetof(P, operand_kind)
            << " " << offsetof(P, ops) << " " << sizeof(fp4::EpilogueOp) << " "
            << fp4::kMetalBufOperand0 << " " << fp4::kMetalNumBuffers << "\n";
  if (msim_msl_abi != nullptr) {
    long v[7];
    msim_msl_abi(v);
    std::cout << "msl";
    for (long x : v) std::cout << " " << x;
    std::cout << "\n";
  }
  return 0;
}

int cmd_raw(int argc, char** argv) {
  const std::string kernel = argv[2];
  const uint32_t gx = uint32_t(std::atoi(argv[3]));
  const uint32_t tg = uint32_t(std::atoi(argv[4]));
  const char* ge = std::getenv("MSIM_GUARD");
  const msim::Guard guard = parse_guard(ge != nullptr ? ge : "end");
  msim::Encoder enc;
  std::vector<msim::Buffer*> bufs;
  msim::Buffer* first = nullptr;
  for (int i = 5; i < argc; ++i) {
    std::string a = argv[i];
    const size_t c1 = a.find(':');
    const int slot = std::atoi(a.substr(0, c1).c_str());
    std::string rest = a.substr(c1 + 1);
    const size_t c2 = rest.find(':');
    const size_t bytes = size_t(std::atoll(rest.substr(0, c2).c_str()));
    msim::Buffer* b = msim::alloc_buffer(bytes, "slot" + std::to_string(slot), guard);
    std::memset(b->data, 0, bytes);
    if (c2 != std::string::npos) {
      const std::vector<char> d = read_file(rest.substr(c2 + 1));
      std::memcpy(b->data, d.data(), std::min(d.size(), bytes));
    }
    enc.set_buffer(b, slot);
    if (slot == 0) first = b;
    bufs.push_back(b);
  }
  enc.dispatch_threadgroups(kernel, {gx, 1, 1}, {tg, 1, 1});
  if (first != nullptr) {
    const float* f = static_cast<const float*>(first->data);
    for (size_t i = 0; i < first->size / sizeof(float); ++i) std::cout << f[i] << "\n";
  }
  return 0;
}

// Spec lines: kernel NAME | grid X Y Z | threads X Y Z | guard end|start|aligned |
// buffer SLOT PATH | output SLOT BYTES PATH | fc INDEX bool|int|uint|float VALUE |
// tgmem INDEX BYTES.
int cmd_exec(const std::string& spec_path) {
  std::ifstream spec(spec_path);
  if (!spec) {
    std::cerr << "runner: cannot read " << spec_path << "\n";
    return 2;
  }
  std::string kernel, key;
  msim::Dim3 grid, tg;
  msim::Guard guard = msim::Guard::kEnd;
  msim::Encoder enc;
  std::vector<std::pair<msim::Buffer*, std::string>> outputs;
  while (spec >> key) {
    if (key == "kernel") {
      spec >> kernel;
    } else if (key == "grid") {
      spec >> grid.x >> grid.y >> grid.z;
    } else if (key == "threads") {
      spec >> tg.x >> tg.y >> tg.z;
    } else if (key == "guard") {
      std::string g;
      spec >> g;
      guard = parse_guard(g);
    } else if (key == "buffer") {
      int slot;
      std::string path;
      spec >> slot >> path;
      enc.set_buffer(buffer_from(read_file(path), "buffer" + std::to_string(slot), guard), slot);
    } else if (key == "output") {
      int slot;
      size_t bytes;
      std::string path;
      spec >> slot >> bytes >> path;
      msim::Buffer* b = msim::alloc_buffer(bytes, "output" + std::to_string(slot), guard);
      std::memset(b->data, 0xFF, bytes);
      enc.set_buffer(b, slot);
      outputs.emplace_back(b, path);
    } else if (key == "fc") {
      int index;
      std::string type, value;
      spec >> index >> type >> value;
      uint64_t bits = 0;
      if (type == "bool") {
        const bool v = value == "1" || value == "true";
        std::memcpy(&bits, &v, sizeof v);
      } else if (type == "int" || type == "uint") {
        const int32_t v = int32_t(std::stoll(value));
        std::memcpy(&bits, &v, sizeof v);
      } else if (type == "float") {
        const float v = std::stof(value);
        std::memcpy(&bits, &v, sizeof v);
      } else {
        std::cerr << "runner: unknown function constant type " << type << "\n";
        return 2;
      }
      enc.set_function_constant(index, &bits, type == "bool" ? 1 : 4);
    } else if (key == "tgmem") {
      int index;
      size_t bytes;
      spec >> index >> bytes;
      enc.set_threadgroup_memory_length(bytes, index);
    } else {
      std::cerr << "runner: unknown exec key " << key << "\n";
      return 2;
    }
  }
  enc.dispatch_threadgroups(kernel, grid, tg);
  for (const auto& [b, path] : outputs) {
    std::ofstream o(path, std::ios::binary);
    o.write(static_cast<const char*>(b->data), std::streamsize(b->size));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: runner run|plan|morton|abi|list|raw ...\n";
    return 2;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "run" && argc == 3) return cmd_run(argv[2]);
    if (cmd == "plan" && argc >= 7) return cmd_plan(argc, argv);
    if (cmd == "route" && argc == 7) return cmd_route(argv);
    if (cmd == "morton" && argc == 4) return cmd_morton(std::atoi(argv[2]), std::atoi(argv[3]));
    if (cmd == "abi") return cmd_abi();
    if (cmd == "list") {
      for (const std::string& n : msim::kernel_names()) std::cout << n << "\n";
      return 0;
    }
    if (cmd == "raw" && argc >= 5) return cmd_raw(argc, argv);
    if (cmd == "exec" && argc == 3) return cmd_exec(argv[2]);
  } catch (const std::exception& e) {
    std::cerr << "runner: " << e.what() << "\n";
    return 3;
  }
  std::cerr << "runner: bad arguments\n";
  return 2;
}
