// Hot loops, compiled once per instruction set (microkernel_*.cpp include microkernel.inc
// with different flags); w4a16_kernel.cpp picks one at run time.
//
// Weight decode works on "chunks": kVec packed bytes = 2 * kVec values of one weight row
// (kVec = floats per vector). A chunk decodes to two vectors, `lo` = the even k (low nibbles)
// and `hi` = the odd k (high nibbles), already multiplied by their E4M3 block scales. The
// activations are packed in the same "chunk-deinterleaved" k order (see xorder_index), so no
// shuffle back to natural order is needed; the reduction order per output stays fixed.
#pragma once
#include <cstdint>

namespace mlx_fp4::cpu {

// GEMV: y[r][n] = sum_k x[r][k] * w[n][k] for r < rows (<= kGemvMaxRows), n in [n0, n1).
struct GemvArgs {
  const uint8_t* w;        // packed weights, row stride ldw bytes
  int64_t ldw;
  const uint8_t* s;        // E4M3 scales, row stride lds bytes
  int64_t lds;
  int64_t k;               // reduction length
  const float* x;          // rows packed in chunk order, zero-padded to kp floats, row stride kp
  int64_t kp;              // k rounded up to whole chunks
  int rows;
  int64_t n0, n1;
  float* y;                // [rows][ldy]
  int64_t ldy;
  int mode;                // fp4::Mode of the scales
};

// GEMM panel decode: dst[i][kk] (row stride kGemmDepth) = scaled weight of row n0 + i at the
// chunk-ordered position k0 + kk, for i < nrows (rows >= nvalid are zero), kk < kc.
struct DecodeArgs {
  const uint8_t* w;
  int64_t ldw;
  const uint8_t* s;
  int64_t lds;
  int64_t k;
  int64_t n0;
  int nvalid, nrows;
  int64_t k0;  // a multiple of the chunk
  int kc;      // a multiple of the chunk, <= kGemmDepth
  float* dst;
  int mode;    // fp4::Mode of the scales
};

struct HotLoops {
  const char* name;
  int vector_floats;  // kVec: floats per vector register in this build
  int micro_rows2;    // weight rows of the 2-vector micro tile (2 * kVec activation rows)
  int micro_rows1;    // weight rows of the 1-vector micro tile (kVec activation rows) = 2 * micro_rows2
  void (*gemv)(const GemvArgs& a);
  void (*decode_panel)(const DecodeArgs& a);
  // c[i][j] += sum_kk w[i][kk] * x[kk][j] for i < micro_rows{nv}, j < nv * kVec; w row stride
  // kGemmDepth, x row stride nv * kVec, c row stride ldc.
  void (*micro2)(int kc, const float* w, const float* x, float* c, int64_t ldc);
  void (*micro1)(int kc, const float* w, const float* x, float* c, int64_t ldc);
  // v[j] = fp4::epilogue_apply(code, v[j], operand[j], p0, p1) for j < count (compiled per ISA
  // so that the polynomial ops vectorize).
  void (*epilogue_op)(int code, float* v, const float* operand, int64_t count, float p0, float p1);
};

// Position of k inside the chunk-deinterleaved order for chunks of 2 * vec values.
inline int64_t xorder_index(int64_t k, int vec) {
  const int64_t chunk = 2 * vec;
  const int64_t base = k - k % chunk;
  const int64_t j = k - base;
  return base + (j & 1) * vec + (j >> 1);
}

const HotLoops& hot_loops_generic();
#if defined(__x86_64__) || defined(_M_X64)
const HotLoops& hot_loops_avx2();
const HotLoops& hot_loops_avx512();
#endif
#if defined(__aarch64__)
const HotLoops& hot_loops_neon();
#endif

}  // namespace mlx_fp4::cpu
