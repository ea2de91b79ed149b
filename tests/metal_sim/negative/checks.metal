// Planted bugs for the metal_sim negative tests (test_metal_sim_checks.py): every kernel but the
// controls breaks one rule that the simulator must catch. Dispatched with 64-thread groups.
#include <metal_stdlib>
using namespace metal;

// Control: each thread writes its index to threadgroup memory; after the barrier it reads the
// value of the mirrored thread. out[i] = 63 - i.
[[kernel]] void reverse_ok(
    device float* out [[buffer(0)]],
    ushort tid [[thread_index_in_threadgroup]]) {
  threadgroup float tile[64];
  tile[tid] = float(tid);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = tile[63 - tid];
}

// Declares at most 32 threads per threadgroup: dispatched with 64, pipeline creation would fail.
[[max_total_threads_per_threadgroup(32)]] [[kernel]] void capped_at_32(
    device float* out [[buffer(0)]],
    ushort tid [[thread_index_in_threadgroup]]) {
  out[tid] = float(tid);
}

// Missing barrier: threads run ahead and read slots not yet written (NaN-poisoned).
[[kernel]] void reverse_missing_barrier(
    device float* out [[buffer(0)]],
    ushort tid [[thread_index_in_threadgroup]]) {
  threadgroup float tile[64];
  tile[tid] = float(tid);
  out[tid] = tile[63 - tid];
}

// Out-of-bounds read: the last thread reads one element past the end of `in`.
[[kernel]] void read_past_end(
    device float* out [[buffer(0)]],
    device const float* in [[buffer(1)]],
    uint gid [[thread_position_in_grid]]) {
  out[gid] = in[gid + 1];
}

// Out-of-bounds read before the start of `in` (thread 0 reads in[-1]).
[[kernel]] void read_before_start(
    device float* out [[buffer(0)]],
    device const float* in [[buffer(1)]],
    uint gid [[thread_position_in_grid]]) {
  out[gid] = in[int(gid) - 1];
}

// Divergent barrier: half the threadgroup waits at one barrier, half at another.
[[kernel]] void divergent_barrier(
    device float* out [[buffer(0)]],
    ushort tid [[thread_index_in_threadgroup]]) {
  if (tid < 32) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  } else {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  out[tid] = 1.0f;
}

// Early return before a barrier that the rest of the threadgroup reaches.
[[kernel]] void early_return(
    device float* out [[buffer(0)]],
    ushort tid [[thread_index_in_threadgroup]]) {
  if (tid == 5) {
    return;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = 1.0f;
}

// Control: the whole threadgroup returns before the barrier (allowed).
[[kernel]] void uniform_early_return(
    device float* out [[buffer(0)]],
    uint tg [[threadgroup_position_in_grid]],
    ushort tid [[thread_index_in_threadgroup]]) {
  if (tg == 1) {
    return;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = 1.0f;
}

// Deadlock: half a simdgroup enters a reduction, the other half waits at a barrier.
[[kernel]] void deadlock(
    device float* out [[buffer(0)]],
    ushort tid [[thread_index_in_threadgroup]],
    ushort lane [[thread_index_in_simdgroup]]) {
  float v = float(tid);
  if (lane < 16) {
    v = simd_sum(v);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = v;
}

// Divergent collective: lanes of one simdgroup reduce at two different call sites.
[[kernel]] void divergent_collective(
    device float* out [[buffer(0)]],
    ushort tid [[thread_index_in_threadgroup]],
    ushort lane [[thread_index_in_simdgroup]]) {
  float v = float(tid);
  if (lane < 16) {
    v = simd_sum(v);
  } else {
    v = simd_max(v);
  }
  out[tid] = v;
}

// Control: simdgroup reduction and matrix multiply, checked by the test.
[[kernel]] void simd_ok(
    device float* out [[buffer(0)]],
    ushort tid [[thread_index_in_threadgroup]],
    ushort lane [[thread_index_in_simdgroup]]) {
  out[tid] = simd_sum(float(lane)) + simd_shuffle_xor(float(lane), 1u);
}

// Threadgroup memory above 32 KiB in total (each array alone fits): caught when allocated.
[[kernel]] void threadgroup_memory_overflow(
    device float* out [[buffer(0)]],
    ushort tid [[thread_index_in_threadgroup]]) {
  threadgroup float a[4096];
  threadgroup float b[4160];
  a[tid] = 1.0f;
  b[tid] = 2.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = a[tid] + b[tid];
}

// Misaligned typed load: a uint2 read at an address that is not 8-byte aligned.
[[kernel]] void misaligned_load(
    device float* out [[buffer(0)]],
    device const uchar* in [[buffer(1)]],
    uint gid [[thread_position_in_grid]]) {
  const uint2 v = *((device const uint2*)(in + 8 * gid + 1));
  out[gid] = float(v.x);
}
