#include "ringtrain/model/cuda/sample_kernels.h"

#include <climits>

#include "ringtrain/core/hashed_normal.h"
#include "ringtrain/model/cuda/kernel_util.cuh"

namespace ringtrain::model::cuda {
namespace {

template <int V>
__global__ void copy_rows_kernel(bf16* dst, const int32_t* dst_index, const bf16* src, const int32_t* src_index,
                                 int64_t n, int64_t row_elems) {
  const int64_t packs = row_elems / V, total = n * packs;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx / packs, p = idx % packs;
    const int64_t d = dst_index ? dst_index[i] : i, s = src_index ? src_index[i] : i;
    if constexpr (V == 8) {
      *reinterpret_cast<uint4*>(dst + d * row_elems + p * 8) =
          *reinterpret_cast<const uint4*>(src + s * row_elems + p * 8);
    } else {
      dst[d * row_elems + p] = src[s * row_elems + p];
    }
  }
}

__global__ void decode_step_rows_kernel(int32_t* positions, int32_t* slots, int32_t* used, const int32_t* prompt_len,
                                        const int32_t* finished, int64_t rows, int64_t step, int64_t capacity) {
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b >= rows) return;
  const int64_t p = prompt_len[b] + step;
  positions[b] = static_cast<int32_t>(p), slots[b] = static_cast<int32_t>(b * capacity + p);
  used[b] = finished[b] ? 1 : static_cast<int32_t>(p + 1);
}

constexpr int kThreads = 1024, kWarps = kThreads / 32;

// The larger value, then the lower index.
struct ArgMax {
  float v;
  int i;
};
__device__ inline ArgMax better(ArgMax a, ArgMax b) { return b.v > a.v || (b.v == a.v && b.i < a.i) ? b : a; }

__device__ ArgMax block_argmax(ArgMax x, ArgMax* sm) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int off = 16; off > 0; off /= 2)
    x = better(x, {__shfl_xor_sync(0xffffffffu, x.v, off), __shfl_xor_sync(0xffffffffu, x.i, off)});
  if (lane == 0) sm[warp] = x;
  __syncthreads();
  if (warp == 0) {
    x = lane < kWarps ? sm[lane] : ArgMax{-INFINITY, INT_MAX};
#pragma unroll
    for (int off = 16; off > 0; off /= 2)
      x = better(x, {__shfl_xor_sync(0xffffffffu, x.v, off), __shfl_xor_sync(0xffffffffu, x.i, off)});
    if (lane == 0) sm[0] = x;
  }
  __syncthreads();
  const ArgMax r = sm[0];
  __syncthreads();
  return r;
}

__device__ float block_sum(float x, float* sm) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  x = warp_sum(x);
  if (lane == 0) sm[warp] = x;
  __syncthreads();
  if (warp == 0) {
    x = warp_sum(lane < kWarps ? sm[lane] : 0.f);
    if (lane == 0) sm[0] = x;
  }
  __syncthreads();
  const float r = sm[0];
  __syncthreads();
  return r;
}

// Order-preserving: a < b as floats (no NaN) exactly when key(a) < key(b) as unsigned integers.
__device__ inline uint32_t key_of(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct SampleShared {
  ArgMax arg[kWarps];
  float f[kWarps];
  unsigned long long hist[256];
  uint32_t prefix;
  unsigned long long above;
};

// A token's measure in the radix select, as an integer so that the histogram's atomic sums do not depend on the
// order of the additions (float atomics would let two runs of one row keep different sets when the top-p crossing
// lies within rounding of a bin boundary): 1 for a count, or the mass exp((x - mx) * inv_t) in (0, 1] in units of
// 2^-40, at least one unit, so that every candidate weighs something (vocab * 2^40 < 2^64 for any vocab < 2^24).
template <bool kMass>
__device__ inline unsigned long long measure(float x, float mx, float inv_t) {
  if constexpr (!kMass) return 1;
  return max(1ull, __float2ull_rn(__expf((x - mx) * inv_t) * 0x1p40f));
}

// The largest threshold t with measure({v : key_v >= t, key_v >= floor}) >= target: the top-k count `goal` (kMass
// false), or the share `goal` of the candidates' total mass (kMass true, top-p). Four passes, one byte of the key
// each, from the most significant, each a 256-bin histogram of the candidates that share the bytes fixed so far.
template <bool kMass>
__device__ uint32_t radix_select(const float* x, int64_t vocab, uint32_t floor, double goal, float mx, float inv_t,
                                 SampleShared& sh) {
  uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0;  // the measure of the candidates already known to lie above the prefix's range
  unsigned long long target = kMass ? 0 : static_cast<unsigned long long>(goal);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) sh.hist[i] = 0;
    __syncthreads();
    // Every lane of a warp takes part in each round (a lane without a candidate has bin 256): the lanes with one bin
    // add their measures (in two 20-bit halves, whose sums over 32 lanes fit 32 bits) and one of them adds the sum
    // to the bin, which also spares the few bins that take almost every candidate in the first passes the
    // contention of one atomic per token.
    for (int64_t v0 = 0; v0 < vocab; v0 += kThreads) {
      const int64_t v = v0 + threadIdx.x;
      uint32_t bin = 256;
      unsigned long long m = 0;
      if (v < vocab) {
        const uint32_t k = key_of(x[v]);
        if (k >= floor && (k & mask) == prefix) bin = (k >> shift) & 255u, m = measure<kMass>(x[v], mx, inv_t);
      }
      const uint32_t peers = __match_any_sync(0xffffffffu, bin);
      const uint32_t hi = __reduce_add_sync(peers, static_cast<uint32_t>(m >> 20));
      const uint32_t lo = __reduce_add_sync(peers, static_cast<uint32_t>(m & 0xFFFFFu));
      if (bin < 256 && threadIdx.x % 32 == __ffs(peers) - 1)
        atomicAdd(&sh.hist[bin], (static_cast<unsigned long long>(hi) << 20) + lo);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      if (kMass && shift == 24) {  // the first histogram holds every candidate: the top-p target is a share of it
        unsigned long long total = 0;
        for (int d = 0; d < 256; ++d) total += sh.hist[d];
        target = static_cast<unsigned long long>(ceil(goal * static_cast<double>(total)));
      }
      unsigned long long cum = above;
      int chosen = -1, lowest = -1;
      for (int d = 255; d >= 0; --d) {
        const unsigned long long w = sh.hist[d];
        if (w == 0) continue;
        lowest = d;
        if (cum + w >= target) {
          chosen = d;
          break;
        }
        cum += w;
      }
      if (chosen < 0) {  // the target is not reached (a share rounded up past the total): keep every candidate
        chosen = lowest < 0 ? 0 : lowest;
        cum = above;
        for (int d = 255; d > chosen; --d) cum += sh.hist[d];
      }
      sh.prefix = prefix | (static_cast<uint32_t>(chosen) << shift);
      sh.above = cum;
    }
    __syncthreads();
    prefix = sh.prefix, above = sh.above, mask |= 255u << shift;
    __syncthreads();
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(SampleArgs a) {
  __shared__ SampleShared sh;
  const int64_t row = blockIdx.x;
  const float* x = a.logits + row * a.vocab;
  const int tid = threadIdx.x;

  ArgMax best{-INFINITY, INT_MAX};
  bool nan = false;
  for (int64_t v = tid; v < a.vocab; v += kThreads) {
    const float xv = x[v];
    if (isnan(xv)) nan = true;
    else best = better(best, {xv, static_cast<int>(v)});
  }
  nan = __syncthreads_or(nan);
  best = block_argmax(best, sh.arg);
  const bool bad = nan || !isfinite(best.v);
  if (bad) {
    if (tid == 0) a.token[row] = 0, a.logprob[row] = a.sampling_logprob[row] = 0.f, a.status[row] = nan ? 1 : 2;
    return;
  }
  const float mx = best.v;
  float s = 0.f;
  for (int64_t v = tid; v < a.vocab; v += kThreads) s += __expf(x[v] - mx);
  const float lse = mx + logf(block_sum(s, sh.f));
  if (a.temperature == 0.f || a.top_k == 1) {
    if (tid == 0) a.token[row] = best.i, a.logprob[row] = mx - lse, a.sampling_logprob[row] = 0.f, a.status[row] = 0;
    return;
  }
  const float inv_t = 1.f / a.temperature;
  uint32_t floor = 0;
  if (a.top_k > 0 && a.top_k < a.vocab)
    floor = radix_select<false>(x, a.vocab, 0, static_cast<double>(a.top_k), mx, inv_t, sh);
  if (a.top_p < 1.f) floor = radix_select<true>(x, a.vocab, floor, a.top_p, mx, inv_t, sh);
  const uint64_t base = splitmix64(splitmix64(splitmix64(a.seed) ^ a.sample_ids[row]) ^ static_cast<uint64_t>(a.step));
  ArgMax pick{-INFINITY, INT_MAX};
  float z = 0.f;
  for (int64_t v = tid; v < a.vocab; v += kThreads) {
    const float xv = x[v];
    if (key_of(xv) < floor) continue;
    const float scaled = (xv - mx) * inv_t;
    z += __expf(scaled);
    const uint64_t h = splitmix64(base ^ static_cast<uint64_t>(v));
    const float u = (static_cast<float>(h >> 40) + 0.5f) * 0x1.0p-24f;  // in (0, 1)
    pick = better(pick, {scaled - logf(-logf(u)), static_cast<int>(v)});
  }
  pick = block_argmax(pick, sh.arg);
  z = block_sum(z, sh.f);
  if (tid == 0) {
    const float xt = x[pick.i];
    a.token[row] = pick.i, a.logprob[row] = xt - lse, a.sampling_logprob[row] = (xt - mx) * inv_t - logf(z);
    a.status[row] = 0;
  }
}

}  // namespace

void copy_rows(cudaStream_t s, bf16* dst, const int32_t* dst_index, const bf16* src, const int32_t* src_index,
               int64_t n, int64_t row_elems) {
  if (n == 0 || row_elems == 0) return;
  constexpr int threads = 256;
  if (row_elems % 8 == 0 && all_aligned(16, dst, src)) {
    copy_rows_kernel<8><<<grid_for(n * row_elems / 8, threads), threads, 0, s>>>(dst, dst_index, src, src_index, n,
                                                                                 row_elems);
  } else {
    copy_rows_kernel<1><<<grid_for(n * row_elems, threads), threads, 0, s>>>(dst, dst_index, src, src_index, n,
                                                                            row_elems);
  }
  RT_CUDA_CHECK_LAUNCH("copy_rows_kernel n=", n, " row=", row_elems);
}

void decode_step_rows(cudaStream_t s, int32_t* positions, int32_t* slots, int32_t* used, const int32_t* prompt_len,
                      const int32_t* finished, int64_t rows, int64_t step, int64_t capacity) {
  if (rows == 0) return;
  constexpr int threads = 128;
  decode_step_rows_kernel<<<static_cast<unsigned>((rows + threads - 1) / threads), threads, 0, s>>>(
      positions, slots, used, prompt_len, finished, rows, step, capacity);
  RT_CUDA_CHECK_LAUNCH("decode_step_rows_kernel rows=", rows);
}

void sample_rows(cudaStream_t s, const SampleArgs& a) {
  if (a.rows == 0) return;
  sample_kernel<<<static_cast<unsigned>(a.rows), kThreads, 0, s>>>(a);
  RT_CUDA_CHECK_LAUNCH("sample_kernel rows=", a.rows, " vocab=", a.vocab);
}

}  // namespace ringtrain::model::cuda
