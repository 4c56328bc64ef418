#include "ringtrain/model/cuda/gpu_logprobs.h"

#include <algorithm>

#include "ringtrain/core/error.h"
#include "ringtrain/model/logprobs.h"

namespace ringtrain::model::cuda {
namespace {

void check_targets(const int32_t* targets, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i)
    RT_CHECK(targets[i] < vocab, "logprobs: target token id ", targets[i], " at row ", i,
             " is outside the vocabulary [0, ", vocab, ")");
}

Tensor upload_i32(const int32_t* host, int64_t n, Device device) {
  Tensor t = Tensor::empty({n}, DType::I32, device);
  copy(t, contiguous_view(const_cast<int32_t*>(host), DType::I32, Device::cpu(), {n}));
  return t;
}

}  // namespace

int64_t default_logprob_chunk(int64_t vocab) {
  RT_CHECK(vocab > 0, "logprobs: vocabulary size must be positive, got ", vocab);
  // fp32 logits; the backward's bf16 dlogits are written over them
  const int64_t rows = std::max<int64_t>(1, kLogprobChunkBytes / (int64_t{sizeof(float)} * vocab));
  return rows > 64 ? rows / 64 * 64 : rows;
}

void token_logprobs(Gemm& gemm, float* out, const bf16* hidden, const bf16* lm_head, const int32_t* targets,
                    int64_t n, int64_t hidden_dim, int64_t vocab, int64_t chunk_tokens, float* entropy) {
  RT_CHECK(chunk_tokens > 0, "logprobs: chunk size must be positive, got ", chunk_tokens);
  const int64_t rows = std::min(n, chunk_tokens);
  int device = 0;
  cudaGetDevice(&device);
  const Tensor logits = Tensor::empty({rows, vocab}, DType::F32, Device::cuda(device));
  const Tensor lse = Tensor::empty({rows}, DType::F32, Device::cuda(device));
  for (int64_t c0 = 0; c0 < n; c0 += chunk_tokens) {
    const int64_t m = std::min(chunk_tokens, n - c0);
    gemm.linear_forward_f32(logits.ptr<float>(), hidden + c0 * hidden_dim, lm_head, m, hidden_dim, vocab);
    logprob_rows(gemm.stream(), out + c0, lse.ptr<float>(), logits.ptr<float>(), targets + c0, m, vocab,
                 entropy ? entropy + c0 : nullptr);
  }
}

// Per chunk: the logits, their log-softmax (into `logprobs` at the chunk's rows, or a scratch when null),
// d(loss)/d(logprob) from `row_grads`, dlogits over the logits, and the LM head's two backward GEMMs.
void token_logprobs_and_device_backward(Gemm& gemm, float* logprobs, float* entropy, bf16* d_hidden,
                                        GradSlot d_lm_head, const DeviceChunkGradient& row_grads, const bf16* hidden,
                                        const bf16* lm_head, const int32_t* targets, int64_t n, int64_t hidden_dim,
                                        int64_t vocab, int64_t chunk_tokens) {
  RT_CHECK(chunk_tokens > 0, "logprobs: chunk size must be positive, got ", chunk_tokens);
  const int64_t rows = std::min(n, chunk_tokens);
  int device = 0;
  cudaGetDevice(&device);
  const Device dev = Device::cuda(device);
  const Tensor logits = Tensor::empty({rows, vocab}, DType::F32, dev);
  const Tensor lse = Tensor::empty({rows}, DType::F32, dev);
  const Tensor chunk_logprobs = logprobs ? Tensor() : Tensor::empty({rows}, DType::F32, dev);
  for (int64_t c0 = 0; c0 < n; c0 += chunk_tokens) {
    const int64_t m = std::min(chunk_tokens, n - c0);
    const bf16* h = hidden + c0 * hidden_dim;
    float* lp = logprobs ? logprobs + c0 : chunk_logprobs.ptr<float>();
    gemm.linear_forward_f32(logits.ptr<float>(), h, lm_head, m, hidden_dim, vocab);
    logprob_rows(gemm.stream(), lp, lse.ptr<float>(), logits.ptr<float>(), targets + c0, m, vocab,
                 entropy ? entropy + c0 : nullptr);
    const bf16* dlogits = logprob_rows_backward_in_place(gemm.stream(), logits.ptr<float>(), lse.ptr<float>(),
                                                         targets + c0, row_grads(c0, m, lp), m, vocab);
    gemm.linear_backward(d_hidden + c0 * hidden_dim, /*accumulate_dx=*/false, d_lm_head.data,
                         /*accumulate_dw=*/!(d_lm_head.fresh && c0 == 0), nullptr, dlogits, h, lm_head, m, hidden_dim,
                         vocab, /*dy_ld=*/2 * vocab);
  }
  if (n == 0 && d_lm_head.fresh)  // no chunk wrote it
    gemm.linear_backward(nullptr, false, d_lm_head.data, false, nullptr, nullptr, nullptr, nullptr, 0, hidden_dim,
                         vocab);
}


void token_logprobs_backward(Gemm& gemm, bf16* d_hidden, GradSlot d_lm_head, const float* d_logprobs,
                             const bf16* hidden, const bf16* lm_head, const int32_t* targets, int64_t n,
                             int64_t hidden_dim, int64_t vocab, int64_t chunk_tokens, float* logprobs) {
  token_logprobs_and_device_backward(
      gemm, logprobs, nullptr, d_hidden, d_lm_head, [&](int64_t c0, int64_t, const float*) { return d_logprobs + c0; },
      hidden, lm_head, targets, n, hidden_dim, vocab, chunk_tokens);
}

void token_logprobs_and_backward(Gemm& gemm, float* logprobs, float* entropy, bf16* d_hidden, GradSlot d_lm_head,
                                 const ChunkGradient& grad, const bf16* hidden, const bf16* lm_head,
                                 const int32_t* targets, int64_t n, int64_t hidden_dim, int64_t vocab,
                                 int64_t chunk_tokens) {
  int device = 0;
  cudaGetDevice(&device);
  const Device dev = Device::cuda(device);
  const int64_t rows = std::min(n, chunk_tokens);
  const Tensor d_rows = Tensor::empty({std::max<int64_t>(rows, 0)}, DType::F32, dev);
  std::vector<float> host_logprobs(static_cast<size_t>(std::max<int64_t>(rows, 0))), host_grads(host_logprobs.size());
  // the copies are ordered after the chunk's kernels on the model's stream and complete when they return
  const auto row_grads = [&](int64_t c0, int64_t m, const float* lp) -> const float* {
    copy(contiguous_view(host_logprobs.data(), DType::F32, Device::cpu(), {m}),
         contiguous_view(const_cast<float*>(lp), DType::F32, dev, {m}));
    grad(c0, std::span<const float>(host_logprobs.data(), static_cast<size_t>(m)),
         std::span<float>(host_grads.data(), static_cast<size_t>(m)));
    copy(contiguous_view(d_rows.ptr<float>(), DType::F32, dev, {m}),
         contiguous_view(host_grads.data(), DType::F32, Device::cpu(), {m}));
    return d_rows.ptr<float>();
  };
  token_logprobs_and_device_backward(gemm, logprobs, entropy, d_hidden, d_lm_head, row_grads, hidden, lm_head,
                                     targets, n, hidden_dim, vocab, chunk_tokens);
}

std::vector<float> model_row_logprobs(GpuModel& model, const int32_t* tokens, const int32_t* positions,
                                      const int32_t* targets, int64_t batch, int64_t seqlen,
                                      SequenceAttention& attention, int64_t chunk_tokens, bool for_backward) {
  const ModelConfig& c = model.config();
  const int64_t n = batch * seqlen;
  check_targets(targets, n, c.vocab);
  const bf16* hidden = model.forward(tokens, positions, batch, seqlen, attention, for_backward);
  const Tensor targets_dev = upload_i32(targets, n, model.device());
  const Tensor rows = Tensor::empty({n}, DType::F32, model.device());
  token_logprobs(model.gemm(), rows.ptr<float>(), hidden, model.lm_head(), targets_dev.ptr<int32_t>(), n, c.hidden,
                 c.vocab, chunk_tokens);
  std::vector<float> out(static_cast<size_t>(n));
  copy(contiguous_view(out.data(), DType::F32, Device::cpu(), {n}), rows);
  return out;
}

void model_row_logprobs_backward(GpuModel& model, const int32_t* targets, const float* d_rows,
                                 SequenceAttention& attention, int64_t chunk_tokens) {
  const ModelConfig& c = model.config();
  const int64_t n = model.tokens();
  check_targets(targets, n, c.vocab);
  const Tensor targets_dev = upload_i32(targets, n, model.device());
  const Tensor d_rows_dev = Tensor::empty({n}, DType::F32, model.device());
  copy(d_rows_dev, contiguous_view(const_cast<float*>(d_rows), DType::F32, Device::cpu(), {n}));
  const Tensor d_hidden = Tensor::empty({n, c.hidden}, DType::BF16, model.device());
  token_logprobs_backward(model.gemm(), d_hidden.ptr<bf16>(), model.lm_head_grad(), d_rows_dev.ptr<float>(),
                          model.hidden(), model.lm_head(), targets_dev.ptr<int32_t>(), n, c.hidden, c.vocab,
                          chunk_tokens);
  model.backward(d_hidden.ptr<bf16>(), attention);
}

std::vector<float> sequence_logprobs(GpuModel& model, const std::vector<int32_t>& ids, SequenceAttention& attention,
                                     int64_t chunk_tokens, bool for_backward) {
  RT_CHECK(!ids.empty(), "logprobs: empty sequence");
  const std::vector<int32_t> targets = next_token_targets(ids), positions = iota_positions(ids.size());
  const int64_t S = static_cast<int64_t>(ids.size());
  const std::vector<float> rows = model_row_logprobs(model, ids.data(), positions.data(), targets.data(), 1, S,
                                                     attention, chunk_tokens, for_backward);
  std::vector<float> out(ids.size(), 0.f);  // row i scores token i + 1
  for (int64_t i = 0; i + 1 < S; ++i) out[i + 1] = rows[i];
  return out;
}

void sequence_logprobs_backward(GpuModel& model, const std::vector<int32_t>& ids, const std::vector<float>& d_logprobs,
                                SequenceAttention& attention, int64_t chunk_tokens) {
  RT_CHECK(d_logprobs.size() == ids.size(), "logprobs backward: ", d_logprobs.size(), " gradients for ", ids.size(),
           " tokens");
  const std::vector<int32_t> targets = next_token_targets(ids);
  std::vector<float> d_rows(ids.size(), 0.f);
  for (size_t i = 0; i + 1 < ids.size(); ++i) d_rows[i] = d_logprobs[i + 1];
  model_row_logprobs_backward(model, targets.data(), d_rows.data(), attention, chunk_tokens);
}

}  // namespace ringtrain::model::cuda
