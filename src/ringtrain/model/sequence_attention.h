// How the model's causal self-attention reaches the attention layer. The model hands this rank's tokens as
// dense BSHD views (q [B, S_local, Hq, D], k/v [B, S_local, Hkv, D], o like q, lse fp32 [B, Hq, S_local]);
// one rank calls attention::forward/backward directly, context parallelism (cp/) runs a ring over ranks.
// Either way the call goes through the backend selection under the caller's scopes.
#pragma once

#include <cstdint>
#include <memory>

#include "ringtrain/core/tensor.h"

namespace ringtrain::model {

class SequenceAttention {
 public:
  virtual ~SequenceAttention() = default;
  // Length of the whole sequence whose shard of `local_seqlen` tokens this rank holds.
  virtual int64_t total_seqlen(int64_t local_seqlen) const = 0;
  virtual void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                       const TensorView& lse) = 0;
  // dq, dk, dv overwritten.
  virtual void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                        const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv) = 0;
};

// The whole sequence on this rank: causal (top-left) attention through attention::forward / backward.
std::unique_ptr<SequenceAttention> make_local_attention();

}  // namespace ringtrain::model
