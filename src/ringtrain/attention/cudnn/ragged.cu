#include "ringtrain/attention/cudnn/ragged.h"

#include "ringtrain/attention/cuda/cuda_util.h"

namespace ringtrain::attention::cudnn {
namespace {

__global__ void metadata_kernel(const int32_t* cu_q, const int32_t* cu_kv, int64_t batch, int64_t q_elems,
                                int64_t kv_elems, int32_t* seq_q, int32_t* seq_kv, int32_t* off_q, int32_t* off_kv) {
  for (int64_t b = threadIdx.x; b <= batch; b += blockDim.x) {
    off_q[b] = static_cast<int32_t>(cu_q[b] * q_elems);
    off_kv[b] = static_cast<int32_t>(cu_kv[b] * kv_elems);
    if (b < batch) {
      seq_q[b] = cu_q[b + 1] - cu_q[b];
      seq_kv[b] = cu_kv[b + 1] - cu_kv[b];
    }
  }
}

// One block per (sequence, head); to_lse chooses the direction.
__global__ void stats_kernel(float* stats, const int32_t* cu_q, int64_t heads, int64_t s_max, float* lse,
                             int64_t lse_hs, int64_t lse_rs, bool to_lse) {
  const int64_t b = blockIdx.x / heads, h = blockIdx.x % heads;
  const int64_t start = cu_q[b], len = cu_q[b + 1] - cu_q[b];
  float* srow = stats + (b * heads + h) * s_max;
  for (int64_t i = threadIdx.x; i < len && i < s_max; i += blockDim.x) {
    float* l = lse + h * lse_hs + (start + i) * lse_rs;
    if (to_lse) *l = srow[i];
    else srow[i] = *l;
  }
}

}  // namespace

void ragged_metadata(cudaStream_t s, const int32_t* cu_q, const int32_t* cu_kv, int64_t batch, int64_t q_token_elems,
                     int64_t kv_token_elems, int32_t* seq_q, int32_t* seq_kv, int32_t* off_q, int32_t* off_kv) {
  metadata_kernel<<<1, 256, 0, s>>>(cu_q, cu_kv, batch, q_token_elems, kv_token_elems, seq_q, seq_kv, off_q, off_kv);
  RT_CUDA_CHECK_LAUNCH("ragged metadata_kernel");
}

void stats_to_lse(cudaStream_t s, const float* stats, const int32_t* cu_q, int64_t batch, int64_t heads, int64_t s_max,
                  float* lse, int64_t lse_head_stride, int64_t lse_row_stride) {
  if (batch * heads == 0) return;
  stats_kernel<<<static_cast<unsigned>(batch * heads), 256, 0, s>>>(const_cast<float*>(stats), cu_q, heads, s_max, lse,
                                                                    lse_head_stride, lse_row_stride, true);
  RT_CUDA_CHECK_LAUNCH("stats_kernel");
}

void lse_to_stats(cudaStream_t s, const float* lse, int64_t lse_head_stride, int64_t lse_row_stride,
                  const int32_t* cu_q, int64_t batch, int64_t heads, int64_t s_max, float* stats) {
  if (batch * heads == 0) return;
  stats_kernel<<<static_cast<unsigned>(batch * heads), 256, 0, s>>>(stats, cu_q, heads, s_max, const_cast<float*>(lse),
                                                                    lse_head_stride, lse_row_stride, false);
  RT_CUDA_CHECK_LAUNCH("stats_kernel");
}

}  // namespace ringtrain::attention::cudnn
