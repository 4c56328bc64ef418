#include "ringtrain/model/cp_scoring.h"

#include "ringtrain/core/error.h"
#include "ringtrain/cp/zigzag.h"

namespace ringtrain::model {
namespace {

class CpAttention final : public SequenceAttention {
 public:
  CpAttention(comm::Communicator& comm, cp::CpConfig config, int64_t global_len)
      : comm_(comm), config_(config), global_len_(global_len) {}
  int64_t total_seqlen(int64_t) const override { return global_len_; }
  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse) override {
    attention::AttnForwardArgs a;
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
    cp::attention_forward(comm_, config_, attention::params_for(q, k, attention::MaskType::CausalTopLeft), a,
                          global_len_);
  }
  void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                const TensorView& dv) override {
    attention::AttnBackwardArgs a;
    a.q = q, a.k = k, a.v = v, a.o = o, a.dout = dout, a.lse = lse, a.dq = dq, a.dk = dk, a.dv = dv;
    cp::attention_backward(comm_, config_, attention::params_for(q, k, attention::MaskType::CausalTopLeft), a,
                           global_len_);
  }

 private:
  comm::Communicator& comm_;
  cp::CpConfig config_;
  int64_t global_len_;
};

}  // namespace

std::unique_ptr<SequenceAttention> make_cp_attention(comm::Communicator& comm, cp::CpConfig config,
                                                     int64_t global_len) {
  return std::make_unique<CpAttention>(comm, config, global_len);
}

CpShard make_cp_shard(const cp::ZigzagLayout& layout, const std::vector<int32_t>& ids) {
  CpShard s;
  const int64_t n = layout.local_len(), S = static_cast<int64_t>(ids.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = layout.global_index(i);
    s.global.push_back(g);
    s.positions.push_back(static_cast<int32_t>(g));
    s.tokens.push_back(g < S ? ids[g] : 0);
    s.targets.push_back(g + 1 < S ? ids[g + 1] : -1);
  }
  return s;
}

}  // namespace ringtrain::model
