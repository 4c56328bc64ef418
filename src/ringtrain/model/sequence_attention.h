// How the model's causal self-attention reaches the attention layer. The model hands this rank's tokens as
// dense BSHD views (q [B, S_local, Hq, D], k/v [B, S_local, Hkv, D], o like q, lse fp32 [B, Hq, S_local]);
// one rank calls attention::forward/backward directly, context parallelism (cp/) runs a ring over ranks.
// Either way the call goes through the backend selection under the caller's scopes. Packed documents come as one
// row (B = 1) holding them back to back; their attention sees each document alone.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ringtrain/attention/params.h"
#include "ringtrain/core/tensor.h"

namespace ringtrain::model {

class SequenceAttention {
 public:
  virtual ~SequenceAttention() = default;
  // Length of the longest sequence any token attends within: the whole sequence whose shard of `local_seqlen`
  // tokens this rank holds, or the longest packed document.
  virtual int64_t total_seqlen(int64_t local_seqlen) const = 0;
  // `window`: the layer's sliding window (a query sees its `window` most recent keys, AttnParams::window), 0: none.
  virtual void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                       const TensorView& lse, int64_t window) = 0;
  // dq, dk, dv overwritten.
  virtual void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                        const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, int64_t window) = 0;
};


// The whole sequence on this rank: causal (top-left) attention through attention::forward / backward.
std::unique_ptr<SequenceAttention> make_local_attention();

// Documents of doc_lens tokens (each > 0) back to back in one row of their total length on this rank: causal
// attention within each document, as one packed (THD) call with cu_seqlens.
std::unique_ptr<SequenceAttention> make_packed_attention(std::vector<int64_t> doc_lens);

// For packed attention: a one-row view [1, rows, ...] as the packed view [rows, ...] (LSE [1, H, T] as [H, T]), and
// the packed params of doc_lens.size() documents, the longest max_len, for THD q and k.
TensorView drop_row_dim(const TensorView& one_row);
attention::AttnParams packed_params(const TensorView& q, const TensorView& k, int64_t documents, int64_t max_len);

}  // namespace ringtrain::model
