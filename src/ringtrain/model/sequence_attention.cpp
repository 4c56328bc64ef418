#include "ringtrain/model/sequence_attention.h"

#include <algorithm>
#include <limits>

#include "ringtrain/attention/selection.h"
#include "ringtrain/core/error.h"

namespace ringtrain::model {
namespace {

class LocalAttention final : public SequenceAttention {
 public:
  int64_t total_seqlen(int64_t local_seqlen) const override { return local_seqlen; }
  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, int64_t window) override {
    attention::AttnForwardArgs a;
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
    attention::forward(params(q, k, window), a);
  }
  void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, int64_t window) override {
    attention::AttnBackwardArgs a;
    a.q = q, a.k = k, a.v = v, a.o = o, a.dout = dout, a.lse = lse, a.dq = dq, a.dk = dk, a.dv = dv;
    attention::backward(params(q, k, window), a);
  }

 private:
  static attention::AttnParams params(const TensorView& q, const TensorView& k, int64_t window) {
    attention::AttnParams p = attention::params_for(q, k, attention::MaskType::CausalTopLeft);
    p.window = attention::masking_window(window, k.shape[1]);
    return p;
  }
};

class PackedAttention final : public SequenceAttention {
 public:
  explicit PackedAttention(std::vector<int64_t> doc_lens) : docs_(static_cast<int64_t>(doc_lens.size())) {
    RT_CHECK(!doc_lens.empty(), "packed attention: no documents");
    cu_seqlens_.push_back(0);
    for (size_t d = 0; d < doc_lens.size(); ++d) {
      RT_CHECK(doc_lens[d] > 0 && doc_lens[d] <= std::numeric_limits<int32_t>::max() - cu_seqlens_.back(),
               "packed attention: document ", d, " of ", doc_lens[d], " tokens (after ", cu_seqlens_.back(),
               ") does not fit int32 cu_seqlens");
      cu_seqlens_.push_back(cu_seqlens_.back() + static_cast<int32_t>(doc_lens[d]));
      max_len_ = std::max(max_len_, doc_lens[d]);
    }
  }
  int64_t total_seqlen(int64_t) const override { return max_len_; }
  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, int64_t window) override {
    attention::AttnForwardArgs a;
    a.q = drop_row_dim(q), a.k = drop_row_dim(k), a.v = drop_row_dim(v), a.o = drop_row_dim(o),
    a.lse = drop_row_dim(lse);
    a.cu_seqlens_q = a.cu_seqlens_kv = cu_seqlens_on(q.device);
    attention::forward(params(a.q, a.k, window), a);
  }
  void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, int64_t window) override {
    attention::AttnBackwardArgs a;
    a.q = drop_row_dim(q), a.k = drop_row_dim(k), a.v = drop_row_dim(v), a.o = drop_row_dim(o),
    a.dout = drop_row_dim(dout), a.lse = drop_row_dim(lse), a.dq = drop_row_dim(dq), a.dk = drop_row_dim(dk),
    a.dv = drop_row_dim(dv);
    a.cu_seqlens_q = a.cu_seqlens_kv = cu_seqlens_on(q.device);
    attention::backward(params(a.q, a.k, window), a);
  }

 private:
  attention::AttnParams params(const TensorView& q, const TensorView& k, int64_t window) const {
    RT_CHECK(q.shape[0] == cu_seqlens_.back(), "packed attention: ", q.shape[0], " rows for documents of ",
             cu_seqlens_.back(), " tokens");
    attention::AttnParams p = packed_params(q, k, docs_, max_len_);
    p.window = attention::masking_window(window, max_len_);
    return p;
  }
  // The offsets where the tensors are (uploaded once per device).
  TensorView cu_seqlens_on(Device device) {
    if (!uploaded_.defined() || uploaded_.view().device != device) {
      const int64_t n = static_cast<int64_t>(cu_seqlens_.size());
      uploaded_ = Tensor::empty({n}, DType::I32, device);
      copy(uploaded_, contiguous_view(cu_seqlens_.data(), DType::I32, Device::cpu(), {n}));
    }
    return uploaded_.view();
  }

  int64_t docs_, max_len_ = 0;
  std::vector<int32_t> cu_seqlens_;
  Tensor uploaded_;
};

}  // namespace

std::unique_ptr<SequenceAttention> make_local_attention() { return std::make_unique<LocalAttention>(); }

std::unique_ptr<SequenceAttention> make_packed_attention(std::vector<int64_t> doc_lens) {
  return std::make_unique<PackedAttention>(std::move(doc_lens));
}

TensorView drop_row_dim(const TensorView& one_row) {
  RT_CHECK(one_row.ndim >= 2 && one_row.shape[0] == 1, "packed attention: expected one row [1, ...], got ",
           one_row.shape_str());
  TensorView v = one_row;
  v.ndim = one_row.ndim - 1;
  for (int d = 0; d < v.ndim; ++d) v.shape[d] = one_row.shape[d + 1], v.stride[d] = one_row.stride[d + 1];
  v.shape[v.ndim] = 0, v.stride[v.ndim] = 0;
  return v;
}

attention::AttnParams packed_params(const TensorView& q, const TensorView& k, int64_t documents, int64_t max_len) {
  RT_CHECK(q.ndim == 3 && k.ndim == 3, "packed attention: expected THD tensors, got q ", q.shape_str(), " k ",
           k.shape_str());
  attention::AttnParams p;
  p.device = q.device;
  p.dtype = q.dtype;
  p.batch = documents;
  p.heads_q = q.shape[1];
  p.heads_kv = k.shape[1];
  p.head_dim = q.shape[2];
  p.seqlen_q = p.seqlen_kv = max_len;
  p.mask = attention::MaskType::CausalTopLeft;
  p.packed = true;
  return p;
}

}  // namespace ringtrain::model
