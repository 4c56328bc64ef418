#include "ringtrain/model/cp_scoring.h"

#include <algorithm>

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
               const TensorView& lse, int64_t window) override {
    attention::AttnForwardArgs a;
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
    cp::attention_forward(comm_, config_, params(q, k, window), a, global_len_);
  }
  void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, int64_t window) override {
    attention::AttnBackwardArgs a;
    a.q = q, a.k = k, a.v = v, a.o = o, a.dout = dout, a.lse = lse, a.dq = dq, a.dk = dk, a.dv = dv;
    cp::attention_backward(comm_, config_, params(q, k, window), a, global_len_);
  }

 private:
  // A window shorter than the sequence stays in the params: all-gather and all-to-all serve it, the ring refuses it
  // naming them.
  attention::AttnParams params(const TensorView& q, const TensorView& k, int64_t window) const {
    attention::AttnParams p = attention::params_for(q, k, attention::MaskType::CausalTopLeft);
    p.window = attention::masking_window(window, global_len_);
    return p;
  }

  comm::Communicator& comm_;
  cp::CpConfig config_;
  int64_t global_len_;
};

class CpPackedAttention final : public SequenceAttention {
 public:
  CpPackedAttention(comm::Communicator& comm, cp::CpConfig config, std::vector<int64_t> doc_lens)
      : comm_(comm), config_(config), doc_lens_(std::move(doc_lens)) {
    RT_CHECK(!doc_lens_.empty(), "packed CP attention: no documents");
    for (int64_t n : doc_lens_) max_len_ = std::max(max_len_, n);
  }
  int64_t total_seqlen(int64_t) const override { return max_len_; }
  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, int64_t window) override {
    attention::AttnForwardArgs a;
    a.q = drop_row_dim(q), a.k = drop_row_dim(k), a.v = drop_row_dim(v), a.o = drop_row_dim(o),
    a.lse = drop_row_dim(lse);
    cp::packed_attention_forward(comm_, config_, params(a.q, a.k, window), a, doc_lens_);
  }
  void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, int64_t window) override {
    attention::AttnBackwardArgs a;
    a.q = drop_row_dim(q), a.k = drop_row_dim(k), a.v = drop_row_dim(v), a.o = drop_row_dim(o),
    a.dout = drop_row_dim(dout), a.lse = drop_row_dim(lse), a.dq = drop_row_dim(dq), a.dk = drop_row_dim(dk),
    a.dv = drop_row_dim(dv);
    cp::packed_attention_backward(comm_, config_, params(a.q, a.k, window), a, doc_lens_);
  }

 private:
  attention::AttnParams params(const TensorView& q, const TensorView& k, int64_t window) const {
    attention::AttnParams p = packed_params(q, k, static_cast<int64_t>(doc_lens_.size()), max_len_);
    p.window = attention::masking_window(window, max_len_);
    return p;
  }

  comm::Communicator& comm_;
  cp::CpConfig config_;
  std::vector<int64_t> doc_lens_;
  int64_t max_len_ = 0;
};

}  // namespace

std::unique_ptr<SequenceAttention> make_cp_packed_attention(comm::Communicator& comm, cp::CpConfig config,
                                                            std::vector<int64_t> doc_lens) {
  return std::make_unique<CpPackedAttention>(comm, config, std::move(doc_lens));
}

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
