// The losses on the device (train/device_loss.h): the per-token arithmetic is losses.cpp's (train/loss_math.h), in
// fp64.
//
// Sums over a microbatch run in one block of kReduceThreads threads: thread t takes the entries t, t + kReduceThreads,
// ... in order and a fixed shared-memory tree adds the threads, so the result depends on the shapes alone. A
// microbatch holds at most a few hundred thousand tokens: one block walks them in tens of microseconds, against a
// forward and backward of tens of milliseconds.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/cuda/elements.cuh"
#include "ringtrain/train/cuda/loss_kernels.h"
#include "ringtrain/train/loss_math.h"

namespace ringtrain::train::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kReduceThreads = 512;
constexpr int kMaxSums = 8;  // the loss and up to seven metrics

int grid_for(int64_t n) { return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65535)); }

__device__ bool counted(const DeviceMicro& m, int64_t b, int64_t p) {
  return p > 0 && m.sample_mask[b] != 0 && m.token_mask[b * m.seq + p] != 0;
}

// out[k] = Σ of v[k] over the block's threads (kReduceThreads of them), written by thread 0.
template <int K>
__device__ void block_sums(const double (&v)[K], double* out) {
  __shared__ double sh[kReduceThreads];
  for (int k = 0; k < K; ++k) {
    sh[threadIdx.x] = v[k];
    __syncthreads();
    for (int half = kReduceThreads / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) sh[threadIdx.x] += sh[threadIdx.x + half];
      __syncthreads();
    }
    if (threadIdx.x == 0) out[k] = sh[0];
    __syncthreads();
  }
}

__global__ void gather_kernel(DeviceSource src, const int64_t* rows, const int64_t* lengths, int64_t batch,
                              int64_t seq, DType out_dtype, void* out, unsigned long long* first_bad) {
  const int64_t n = batch * seq, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t b = i / seq, p = i % seq;
    const bool inside = p < lengths[b];
    const int64_t at = rows[b] * src.row_stride + p * src.col_stride;
    const double v = inside ? ringtrain::cuda::load_any(src.data, src.dtype, at) : 0.0;
    switch (out_dtype) {
      case DType::I32: static_cast<int32_t*>(out)[i] = static_cast<int32_t>(v); break;
      case DType::U8:
        static_cast<uint8_t*>(out)[i] = v != 0.0;
        if (first_bad && inside && v != 0.0 && v != 1.0) atomicMin(first_bad, static_cast<unsigned long long>(i));
        break;
      default: static_cast<float*>(out)[i] = static_cast<float>(v); break;
    }
  }
}

// One block per row: row_count[b] = the row's counted tokens.
__global__ void row_count_kernel(DeviceMicro m, double* row_count) {
  const int64_t b = blockIdx.x;
  double c[1] = {0};
  for (int64_t p = threadIdx.x; p < m.seq; p += kReduceThreads) c[0] += counted(m, b, p);
  block_sums(c, row_count + b);
}

__global__ void count_kernel(DeviceMicro m, bool dpo, const double* row_count, double* counts) {
  __shared__ unsigned long long bad_pair;
  if (threadIdx.x == 0) bad_pair = ~0ull;
  __syncthreads();
  double v[4] = {0, 0, 0, 0};
  for (int64_t b = threadIdx.x; b < m.batch; b += kReduceThreads) {
    v[kTokens] += row_count[b];
    v[kSequences] += m.sample_mask[b] != 0;
  }
  if (dpo)
    for (int64_t pair = threadIdx.x; pair < m.batch / 2; pair += kReduceThreads) {
      const bool chosen = m.sample_mask[2 * pair] != 0, rejected = m.sample_mask[2 * pair + 1] != 0;
      if (chosen != rejected) atomicMin(&bad_pair, static_cast<unsigned long long>(pair));
      if (!chosen) continue;
      v[kPairs] += 1;
      v[kChosenTokens] += row_count[2 * pair];
    }
  block_sums(v, counts);
  if (threadIdx.x == 0) counts[kBadPair] = bad_pair == ~0ull ? -1.0 : static_cast<double>(bad_pair);
}

__global__ void row_scale_kernel(DeviceMicro m, bool sequence_mean, double global_tokens, double global_sequences,
                                 const double* row_count, double* row_scale) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= m.batch) return;
  if (!sequence_mean)
    row_scale[b] = 1.0 / global_tokens;
  else
    row_scale[b] = row_count[b] > 0 ? 1.0 / (row_count[b] * global_sequences) : 0.0;
}

// The clipped PG's per-token inputs at entry i of the microbatch.
__device__ PGToken pg_at(const DeviceMicro& m, const ClippedPGConfig& cfg, int64_t i, double cur, double* weight) {
  const double prev = m.prev[i];
  const double ref = cfg.kl_beta == 0 ? 0.0 : static_cast<double>(m.ref[i]);
  *weight = m.gen ? importance_weight(prev, static_cast<double>(m.gen[i])) : 1.0;
  return pg_token(cur, prev, m.advantages[i], ref, *weight, cfg);
}

__global__ void token_gradient_kernel(LossKind kind, ClippedPGConfig cfg, DeviceMicro m, const double* row_scale,
                                      const float* logprobs, const int32_t* seq_pos, int64_t n, float* d) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  const int64_t b = seq_pos[2 * k], p = seq_pos[2 * k + 1];
  if (b < 0 || !counted(m, b, p)) {
    d[k] = 0.f;
    return;
  }
  const double scale = row_scale[b];
  if (kind == LossKind::NLL) {
    d[k] = static_cast<float>(-scale);
    return;
  }
  double w = 1;
  d[k] = static_cast<float>(pg_at(m, cfg, b * m.seq + p, logprobs[k], &w).grad * scale);
}

__global__ void token_loss_kernel(LossKind kind, ClippedPGConfig cfg, DeviceMicro m, const double* row_scale,
                                  const float* logprobs, const float* entropy, double* sums) {
  // loss, clip, dual clip, approx kl, ratio, ref kl, importance weight, entropy
  double v[kMaxSums] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t n = m.batch * m.seq;
  for (int64_t i = threadIdx.x; i < n; i += kReduceThreads) {
    const int64_t b = i / m.seq, p = i % m.seq;
    if (!counted(m, b, p)) continue;
    const double cur = logprobs[i], scale = row_scale[b];
    if (kind == LossKind::NLL) {
      v[0] -= cur * scale;
      continue;
    }
    double w = 1;
    const PGToken t = pg_at(m, cfg, i, cur, &w);
    v[0] += t.loss * scale;
    v[1] += t.clipped;
    v[2] += t.dual_clipped;
    v[3] += approx_kl_term(cur, static_cast<double>(m.prev[i]));
    v[4] += exp(cur - static_cast<double>(m.prev[i]));
    v[5] += t.kl;
    v[6] += w;
    if (entropy) v[7] += entropy[i];
  }
  double total[kMaxSums];
  block_sums(v, total);
  if (threadIdx.x != 0) return;
  sums[0] = total[0];
  if (kind == LossKind::NLL) return;
  int k = 1;
  for (int j = 1; j <= 4; ++j) sums[k++] = total[j];
  if (m.ref && cfg.kl_beta != 0) sums[k++] = total[5];
  if (m.gen) sums[k++] = total[6];
  if (entropy) sums[k++] = total[7];
}

// One block per row: scratch[3b] = Σ counted (logπ - logπ_ref), scratch[3b + 1] = Σ counted logπ.
__global__ void dpo_row_kernel(DeviceMicro m, const float* logprobs, double* scratch) {
  const int64_t b = blockIdx.x;
  double v[2] = {0, 0};
  for (int64_t p = threadIdx.x; p < m.seq; p += kReduceThreads) {
    if (!counted(m, b, p)) continue;
    const int64_t i = b * m.seq + p;
    v[0] += static_cast<double>(logprobs[i]) - static_cast<double>(m.ref[i]);
    v[1] += logprobs[i];
  }
  double total[2];
  block_sums(v, total);
  if (threadIdx.x == 0) scratch[3 * b] = total[0], scratch[3 * b + 1] = total[1];
}

// One block: the pairs' loss and metric sums, and scratch[3b + 2] = d(loss)/d(logπ) for row b's counted tokens.
__global__ void dpo_pair_kernel(DPOConfig cfg, DeviceMicro m, double pairs, double* scratch, double* sums) {
  double v[6] = {0, 0, 0, 0, 0, 0};  // loss, accuracy, margin, chosen reward, rejected reward, chosen nll
  for (int64_t pair = threadIdx.x; pair < m.batch / 2; pair += kReduceThreads) {
    const int64_t bc = 2 * pair, br = 2 * pair + 1;
    scratch[3 * bc + 2] = scratch[3 * br + 2] = 0;
    if (m.sample_mask[bc] == 0) continue;
    const double rc = scratch[3 * bc], rr = scratch[3 * br], z = cfg.beta * (rc - rr);
    v[0] += softplus(-z) / pairs;
    const double dz = -sigmoid(-z) * cfg.beta / pairs;
    double g = dz;
    if (cfg.nll_coef != 0) {
      v[0] -= cfg.nll_coef * scratch[3 * bc + 1] / pairs;
      g -= cfg.nll_coef / pairs;
      v[5] -= scratch[3 * bc + 1];
    }
    scratch[3 * bc + 2] = isnan(z) ? nan("") : g;
    scratch[3 * br + 2] = isnan(z) ? nan("") : -dz;
    v[1] += rc > rr;
    v[2] += rc - rr;
    v[3] += rc;
    v[4] += rr;
  }
  double total[6];
  block_sums(v, total);
  if (threadIdx.x != 0) return;
  for (int k = 0; k < 5; ++k) sums[k] = total[k];
  if (cfg.nll_coef != 0) sums[5] = total[5];
}

__global__ void dpo_grad_kernel(DeviceMicro m, const double* scratch, float* d) {
  const int64_t n = m.batch * m.seq, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t b = i / m.seq, p = i % m.seq;
    d[i] = counted(m, b, p) ? static_cast<float>(scratch[3 * b + 2]) : 0.f;
  }
}

class CudaLossKernels final : public DeviceLossKernels {
 public:
  void gather_padded(const DeviceSource& src, const int64_t* rows, const int64_t* lengths, int64_t batch, int64_t seq,
                     DType out_dtype, void* out, int64_t* first_bad) const override {
    if (batch * seq == 0) return;
    gather_kernel<<<grid_for(batch * seq), kThreads>>>(src, rows, lengths, batch, seq, out_dtype, out,
                                                       reinterpret_cast<unsigned long long*>(first_bad));
    RT_CUDA_CHECK_LAUNCH("the loss inputs' gather");
  }

  void count(const DeviceMicro& m, bool dpo, double* row_count, double* counts) const override {
    if (m.batch > 0) {
      row_count_kernel<<<static_cast<unsigned>(m.batch), kReduceThreads>>>(m, row_count);
      RT_CUDA_CHECK_LAUNCH("the loss's row counts");
    }
    count_kernel<<<1, kReduceThreads>>>(m, dpo, row_count, counts);
    RT_CUDA_CHECK_LAUNCH("the loss's counts");
  }

  void row_scales(const LossConfig& cfg, const DeviceMicro& m, const ValidCounts& global, const double* row_count,
                  double* row_scale) const override {
    if (m.batch == 0) return;
    const bool sequence_mean = cfg.kind == LossKind::ClippedPG && cfg.pg.aggregation == Aggregation::SequenceMean;
    row_scale_kernel<<<grid_for(m.batch), kThreads>>>(m, sequence_mean, global.tokens, global.sequences, row_count,
                                                      row_scale);
    RT_CUDA_CHECK_LAUNCH("the loss's row scales");
  }

  void token_gradient(const LossConfig& cfg, const DeviceMicro& m, const double* row_scale, const float* logprobs,
                      const int32_t* seq_pos, int64_t n, float* d) const override {
    if (n == 0) return;
    token_gradient_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads>>>(
        cfg.kind, cfg.pg, m, row_scale, logprobs, seq_pos, n, d);
    RT_CUDA_CHECK_LAUNCH("the loss's token gradient");
  }

  void token_loss(const LossConfig& cfg, const DeviceMicro& m, const double* row_scale, const float* logprobs,
                  const float* entropy, double* sums) const override {
    token_loss_kernel<<<1, kReduceThreads>>>(cfg.kind, cfg.pg, m, row_scale, logprobs, entropy, sums);
    RT_CUDA_CHECK_LAUNCH("the loss's value");
  }

  void dpo(const DPOConfig& cfg, const DeviceMicro& m, const DPOCounts& global, const float* logprobs,
           float* d_logprobs, double* sums, double* scratch) const override {
    if (m.batch > 0) {
      dpo_row_kernel<<<static_cast<unsigned>(m.batch), kReduceThreads>>>(m, logprobs, scratch);
      RT_CUDA_CHECK_LAUNCH("DPO's rewards");
    }
    dpo_pair_kernel<<<1, kReduceThreads>>>(cfg, m, global.pairs, scratch, sums);
    RT_CUDA_CHECK_LAUNCH("DPO's pairs");
    if (m.batch * m.seq == 0) return;
    dpo_grad_kernel<<<grid_for(m.batch * m.seq), kThreads>>>(m, scratch, d_logprobs);
    RT_CUDA_CHECK_LAUNCH("DPO's gradient");
  }
};

}  // namespace

const DeviceLossKernels* loss_kernels() {
  static const CudaLossKernels kernels;
  return &kernels;
}

}  // namespace ringtrain::train::cuda
