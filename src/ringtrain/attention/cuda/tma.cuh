// Hopper (sm_90a) producer/consumer plumbing of the warp-specialised flash forward: mbarriers, bulk-tensor (TMA)
// copies that complete on them, cp.async copies tracked by them (for tiles TMA cannot zero-fill), and the
// per-warpgroup register reallocation.
//
// A stage of a shared-memory ring has two barriers. `full` (1 arrival) completes when the producer's copies into
// the stage have landed: the producer arrives with the byte count it expects (TMA) or the copies arrive for it
// (cp.async). `empty` (one arrival per consumer warp) completes when every consumer warp has finished reading the
// stage. Waits are on phase parity: use k of a stage waits `full` for parity (k / stages) & 1, and the producer's
// k-th refill waits `empty` for the opposite parity, which a fresh barrier satisfies at once.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace ringtrain::attention::cuda::tma {

__device__ __forceinline__ void barrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA) and to the other threads after a block barrier.
__device__ __forceinline__ void barrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// An arrival by the threads for which `pred` holds, as one predicated instruction: a branch around it, between a
// wgmma and its wait, makes the compiler serialise the wgmma pipeline.
__device__ __forceinline__ void arrive_if(uint32_t bar, bool pred) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
      "r"(static_cast<int>(pred))
      : "memory");
}
// The producer's arrival on a `full` barrier, announcing the bytes its TMA copies will deliver.
__device__ __forceinline__ void arrive_expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Announces bytes that TMA copies will deliver to the barrier's current phase, without arriving.
__device__ __forceinline__ void expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Box (c0, c1, c2, c3) of a 4-D tensor map into shared memory; the bytes complete on `bar`. Coordinates outside the
// tensor read as zeros.
__device__ __forceinline__ void load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                        int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}],"
      " [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// Box (c0, c1, c2, c3) of a 4-D tensor map from shared memory (written through the generic proxy: fence first),
// in this thread's bulk group; coordinates outside the tensor are not written.
__device__ __forceinline__ void store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
               : "memory");
}
// Closes this thread's bulk group and waits until its stores have read their shared memory (which may then be
// reused or freed; the global writes complete on their own).
__device__ __forceinline__ void store_commit_and_wait_read() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// One arrival on `bar` once every cp.async this thread issued before has landed (the barrier's pending count is
// raised first, so the copies add no arrival of their own to its expected count).
__device__ __forceinline__ void arrive_when_copied(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// This thread's warpgroup as a warp-uniform value (a shuffle from lane 0), so that the compiler gives each branch of
// a role split the registers its setmaxnreg sets.
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0); }

// Register reallocation between warpgroups: the producer gives registers back, the consumers take them. Needs a
// register cap at entry (__launch_bounds__(threads, 1)).
template <int N>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Barrier arrival without waiting (bar.sync's other half): `threads` counts the waiters and the arrivers.
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace ringtrain::attention::cuda::tma
