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
  float hist[256];
  uint32_t prefix;
  float above;
};

// The largest threshold t with measure({v : key_v >= t, key_v >= floor}) >= target, where the measure of token v is
// 1 (kMass false: a count) or exp((x_v - mx) * inv_t) (a probability mass): four passes, one byte of the key each,
// from the most significant, each a 256-bin histogram of the candidates that share the bytes fixed so far.
template <bool kMass>
__device__ uint32_t radix_select(const float* x, int64_t vocab, uint32_t floor, float target, float mx, float inv_t,
                                 SampleShared& sh) {
  uint32_t prefix = 0, mask = 0;
  float above = 0.f;  // the measure of the candidates already known to lie above the prefix's range
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) sh.hist[i] = 0.f;
    __syncthreads();
    for (int64_t v = threadIdx.x; v < vocab; v += kThreads) {
      const uint32_t k = key_of(x[v]);
      if (k < floor || (k & mask) != prefix) continue;
      atomicAdd(&sh.hist[(k >> shift) & 255u], kMass ? __expf((x[v] - mx) * inv_t) : 1.f);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float cum = above;
      int chosen = -1, lowest = -1;
      for (int d = 255; d >= 0; --d) {
        const float w = sh.hist[d];
        if (w <= 0.f) continue;
        lowest = d;
        if (cum + w >= target) {
          chosen = d;
          break;
        }
        cum += w;
      }
      if (chosen < 0) {  // the target is not reached (rounding of a mass): keep every candidate
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
    floor = radix_select<false>(x, a.vocab, 0, static_cast<float>(a.top_k), mx, inv_t, sh);
  if (a.top_p < 1.f) {
    float z = 0.f;
    for (int64_t v = tid; v < a.vocab; v += kThreads)
      if (key_of(x[v]) >= floor) z += __expf((x[v] - mx) * inv_t);
    floor = radix_select<true>(x, a.vocab, floor, a.top_p * block_sum(z, sh.f), mx, inv_t, sh);
  }
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
