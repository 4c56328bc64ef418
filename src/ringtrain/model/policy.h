// One interface over the CPU model (model.h, fp32 or fp64) and the GPU model (cuda/gpu_model.h, bf16 weights with
// fp32 gradients): scoring, the backward of a per-token weight on the logprobs, and the flat weight and gradient
// buffers by Hugging Face name, with context parallelism inside. Nothing above model/ branches on the device: it
// makes a Policy with make_policy / load_policy and calls it.
//
// Under context parallelism every rank of the cp group makes its own Policy over the same communicator and calls it
// with the same sequences; each rank computes its zigzag shard and every rank gets the whole results back.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/core/tensor.h"
#include "ringtrain/cp/cp_attention.h"
#include "ringtrain/model/hf_config.h"
#include "ringtrain/model/model.h"
#include "ringtrain/model/params.h"

namespace ringtrain::model {

struct SamplerOptions;  // generate.h
class DeviceSampler;

struct PolicyOptions {
  Device device = Device::cpu();
  // The compute dtype: F32 or F64 on the CPU (F64 for gradient checks), BF16 on a GPU.
  DType dtype = DType::F32;
  ModelOptions model;          // the model's attention allow-list and activation checkpointing
  int64_t logprob_chunk = 0;   // tokens per LM-head chunk; 0 = the device's default
  // The context-parallel group (null or size 1: no CP). Not owned; it must outlive the policy.
  comm::Communicator* cp_group = nullptr;
  cp::CpConfig cp;
};

// Token sequences of one microbatch, each whole (under CP every rank of the group passes the same ones).
struct TokenBatch {
  std::vector<std::vector<int32_t>> sequences;
  // The forward's layout; the scores and gradients are the same either way (up to rounding). Padded: [B, S_max],
  // every sequence padded to the longest. Packed: the sequences back to back in one row, positions restarting in
  // each and attention kept within each (THD with cu_seqlens), so nothing is computed on padding.
  bool packed = false;
};

// Token sequences read where they lie, so that a caller's CUDA tensor stays on its GPU: sequence i of the batch is
// row rows[i] of the integer [R, C] view `ids` (I32 or I64, any strides), its first lengths[i] entries.
struct TokenRows {
  TensorView ids;
  std::vector<int64_t> rows, lengths;
  bool packed = false;  // as TokenBatch::packed
};

// Per sequence, in token order: logprobs[b][p] = log P(seq[p] | seq[<p]), with logprobs[b][0] = 0; entropy[b][p] the
// entropy of the distribution that predicted token p (0 at p = 0), only when asked for. fp32 whatever the policy's
// dtype (an F64 policy's scores are rounded).
struct TokenScores {
  std::vector<std::vector<float>> logprobs;
  std::vector<std::vector<float>> entropy;
};

// d(loss)/d(logprobs[seq][pos]) from that token's logprob alone: the gradient of a token-local loss (one whose
// gradient at a token depends on no other token's logprob). Called only for scored tokens (pos >= 1).
using TokenGradient = std::function<double(int64_t seq, int64_t pos, float logprob)>;

// d(loss)/d(logprob) of a token-local loss evaluated on the policy's device (train/ gives it its loss kernels), for
// DeviceRowsTraining: for n of the policy's scored rows, logprobs[k] and seq_pos[2k], seq_pos[2k + 1] = the row's
// sequence (an index into TokenRows::rows; -1 where the row scores nothing) and position, all in device memory;
// d[k] is written. Enqueued on the legacy default stream.
class DeviceTokenGradient {
 public:
  virtual ~DeviceTokenGradient() = default;
  virtual void operator()(const float* logprobs, const int32_t* seq_pos, int64_t n, float* d) const = 0;
};

// Training from token rows on the policy's GPU (a train step whose batch lies there): the scores are written into
// device views and the gradients read from them, so that no per-token value crosses to the host. The views are
// score_into's (float32 of ids' shape, contiguous, on the policy's device), and the results are score()'s and
// backward()'s. Work is enqueued on the legacy default stream; a view's values are ready for kernels after it.
class DeviceRowsTraining {
 public:
  virtual ~DeviceRowsTraining() = default;
  // score_into(batch, logprobs, entropy) keeping what backward_rows() needs, as score(..., for_backward = true).
  virtual void score_rows_for_backward(const TokenRows& batch, const TensorView& logprobs,
                                       const TensorView& entropy) = 0;
  // After it: adds the gradient of Σ d_logprobs[rows[i], p] · logprob(i, p) over the scored tokens.
  virtual void backward_rows(const TensorView& d_logprobs) = 0;
  // Both for a token-local loss in one pass, as score_and_backward: `grad` is called chunk by chunk inside the LM
  // head with the chunk's logprobs on the device.
  virtual void score_and_backward_rows(const TokenRows& batch, const DeviceTokenGradient& grad,
                                       const TensorView& logprobs, const TensorView& entropy) = 0;
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual const ModelConfig& config() const = 0;
  // Hugging Face names and shapes; its specs()' order is the order of params() / set_params().
  virtual const ParamLayout& layout() const = 0;
  virtual Device device() const = 0;
  virtual DType dtype() const = 0;

  // Scores every sequence of the batch (not empty, no empty sequence, token ids inside the vocabulary), all in one
  // forward (padded to the longest, or packed: TokenBatch::packed). With for_backward the activations backward()
  // needs are kept, for one backward() before the next score(). with_entropy adds the per-token entropy, computed
  // inside the chunked LM head.
  virtual TokenScores score(const TokenBatch& batch, bool for_backward, bool with_entropy = false) = 0;
  // After score(batch, true): adds into the gradients the gradient of sum_b sum_p d_logprobs[b][p] * logprobs[b][p]
  // (under CP, this rank's share: the sum over the cp group is the gradient). d_logprobs has the shape of the
  // scores (checked); entry 0 of each sequence is ignored. Without a score(..., true) since the last backward, an
  // error.
  virtual void backward(const std::vector<std::vector<float>>& d_logprobs) = 0;
  // score(batch, true, with_entropy) then backward(d) with d[b][p] = grad(b, p, logprobs[b][p]), in one call, for a
  // token-local loss. The GPU policy applies `grad` chunk by chunk inside the LM head while the chunk's logits are at
  // hand, so the backward does not recompute them (one LM-head GEMM of three less per step); the gradients and
  // scores are those of the two calls. Under CP each rank calls `grad` for the tokens it scores.
  virtual TokenScores score_and_backward(const TokenBatch& batch, const TokenGradient& grad, bool with_entropy);

  // score(batch, false, with_entropy) written into float32 [R, C] views of ids' shape (contiguous, on any device):
  // the logprob of sequence i's token p, 1 <= p < lengths[i], at [rows[i], p] of `logprobs`, its entropy likewise in
  // `entropy` when that has data; nothing else is written. Token ids are checked as score() checks them (on their
  // device). The GPU policy reads ids on its GPU in place and writes views there without a host round trip; other
  // cases copy the rows to the host. Complete when it returns.
  virtual void score_into(const TokenRows& batch, const TensorView& logprobs, const TensorView& entropy);

  // The flat buffers the optimizer works on, in the policy's own element order (not necessarily layout()'s): the
  // compute weights (F32/F64 on the CPU, BF16 on a GPU) and the gradients (F32, or F64 when dtype() is F64), both on
  // device(). Every Hugging Face tensor is one contiguous slice of them, starting at flat_offsets()[i] for
  // layout().specs()[i].
  virtual TensorView weights() = 0;
  virtual TensorView grads() = 0;
  virtual const std::vector<int64_t>& flat_offsets() const = 0;
  // Makes every gradient zero before the first backward of a step (on a GPU without a pass over them: grads() then
  // clears what no backward has written since).
  virtual void zero_grads() = 0;
  // Asks the next backward (backward(), score_and_backward() or DeviceRowsTraining's) to also leave Σ g² over
  // grads(), as that backward leaves them, in *device_result (one fp64 in device() memory), computed beside the
  // backward where the policy can overlap the two: for a step's last backward when no reduction of the gradients
  // follows. False where the policy has no such overlap (the CPU policies): the caller sums grads() itself.
  // zero_grads() withdraws the request.
  virtual bool sum_grad_squares_in_next_backward(double* device_result);

  // Host values in layout() order (fp32; fp64 for an F64 policy is rounded), and the way back in.
  virtual std::vector<float> params() const = 0;
  virtual void set_params(const std::vector<float>& values) = 0;
  virtual std::vector<float> grads_by_layout() const = 0;
  // One tensor by Hugging Face name; an unknown name is an error naming it.
  std::vector<float> param(const std::string& name) const;
  std::vector<float> grad(const std::string& name) const;

  // A sampler that decodes on the policy's device with its weights read in place, for Sampler(policy) (generate.h);
  // null when the policy has none (the CPU policies: Sampler decodes on the host). It is a view of the policy, valid
  // while the policy lives; a generate() ends any score(..., for_backward = true) still waiting for its backward.
  virtual std::unique_ptr<DeviceSampler> make_device_sampler(const SamplerOptions& options);

  // Training from rows on the policy's device, or null where the policy has none (the CPU policies: their batches
  // are host memory already). A view of the policy, valid while it lives.
  virtual DeviceRowsTraining* device_rows_training() { return nullptr; }
};

std::unique_ptr<Policy> make_policy(const ModelConfig& config, const std::vector<float>& params,
                                    const PolicyOptions& options);
// The same over weights shared read-only with other policies of this process (in-process ranks): an fp32 CPU policy
// reads them in place until its weights are written (weights(), set_params(): then it takes its own copy), so ranks
// that only score hold one copy between them. Other policies copy them as above.
std::unique_ptr<Policy> make_policy(const ModelConfig& config, std::shared_ptr<const std::vector<float>> params,
                                    const PolicyOptions& options);
// config.json + safetensors from a checkpoint folder.
std::unique_ptr<Policy> load_policy(const std::filesystem::path& dir, const PolicyOptions& options);

}  // namespace ringtrain::model
