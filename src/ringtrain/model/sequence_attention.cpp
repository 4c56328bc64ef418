#include "ringtrain/model/sequence_attention.h"

#include "ringtrain/attention/selection.h"

namespace ringtrain::model {
namespace {

class LocalAttention final : public SequenceAttention {
 public:
  int64_t total_seqlen(int64_t local_seqlen) const override { return local_seqlen; }
  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse) override {
    attention::AttnForwardArgs a;
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
    attention::forward(attention::params_for(q, k, attention::MaskType::CausalTopLeft), a);
  }
  void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                const TensorView& dv) override {
    attention::AttnBackwardArgs a;
    a.q = q, a.k = k, a.v = v, a.o = o, a.dout = dout, a.lse = lse, a.dq = dq, a.dk = dk, a.dv = dv;
    attention::backward(attention::params_for(q, k, attention::MaskType::CausalTopLeft), a);
  }
};

}  // namespace

std::unique_ptr<SequenceAttention> make_local_attention() { return std::make_unique<LocalAttention>(); }

}  // namespace ringtrain::model
