#include "ringtrain/model/cp_scoring.h"

#include <type_traits>

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

template <typename T>
std::vector<T> cp_rows_to_tokens(const std::vector<T>& gathered, int cp, int64_t seq_len) {
  const int64_t n = static_cast<int64_t>(gathered.size()) / cp;
  std::vector<T> out(static_cast<size_t>(seq_len), T(0));  // the row at global index g scores token g + 1
  for (int r = 0; r < cp; ++r) {
    const cp::ZigzagLayout lr(cp, r, seq_len);
    RT_CHECK(lr.local_len() == n, "logprobs: ", gathered.size(), " gathered rows for ", cp, " ranks of ",
             lr.local_len());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = lr.global_index(i);
      if (g + 1 < seq_len) out[g + 1] = gathered[r * n + i];
    }
  }
  return out;
}

template <typename T>
std::vector<T> cp_row_grads(const CpShard& shard, const std::vector<T>& d_logprobs) {
  const int64_t S = static_cast<int64_t>(d_logprobs.size());
  std::vector<T> d_rows(shard.global.size(), T(0));
  for (size_t i = 0; i < d_rows.size(); ++i)
    if (shard.global[i] + 1 < S) d_rows[i] = d_logprobs[shard.global[i] + 1];
  return d_rows;
}

CpCall make_cp_call(comm::Communicator& comm, const cp::CpConfig& config, const std::vector<int32_t>& ids) {
  RT_CHECK(!ids.empty(), "logprobs: empty sequence");
  const int64_t S = static_cast<int64_t>(ids.size());
  const cp::ZigzagLayout layout(comm.size(), comm.rank(), S);
  return {layout, make_cp_shard(layout, ids), make_cp_attention(comm, config, S)};
}

template <typename T>
std::vector<T> cp_sequence_logprobs(Model<T>& model, comm::Communicator& comm, const cp::CpConfig& config,
                                    const std::vector<int32_t>& ids, int64_t chunk_tokens, bool for_backward) {
  const CpCall call = make_cp_call(comm, config, ids);
  const CpShard& shard = call.shard;
  const int64_t n = call.layout.local_len();
  std::vector<T> rows = model_row_logprobs(model, shard.tokens.data(), shard.positions.data(), shard.targets.data(),
                                           1, n, *call.attention, chunk_tokens, for_backward);
  std::vector<T> all(static_cast<size_t>(n * comm.size()));
  comm.all_gather(rows.data(), all.data(), static_cast<size_t>(n), std::is_same_v<T, double> ? DType::F64 : DType::F32);
  return cp_rows_to_tokens(all, comm.size(), static_cast<int64_t>(ids.size()));
}

template <typename T>
void cp_sequence_logprobs_backward(Model<T>& model, comm::Communicator& comm, const cp::CpConfig& config,
                                   const std::vector<int32_t>& ids, const std::vector<T>& d_logprobs,
                                   int64_t chunk_tokens) {
  RT_CHECK(d_logprobs.size() == ids.size(), "logprobs backward: ", d_logprobs.size(), " gradients for ", ids.size(),
           " tokens");
  const CpCall call = make_cp_call(comm, config, ids);
  const std::vector<T> d_rows = cp_row_grads(call.shard, d_logprobs);
  model_row_logprobs_backward(model, call.shard.targets.data(), d_rows.data(), *call.attention, chunk_tokens);
}

#define RT_INSTANTIATE(T)                                                                                          \
  template std::vector<T> cp_rows_to_tokens<T>(const std::vector<T>&, int, int64_t);                              \
  template std::vector<T> cp_row_grads<T>(const CpShard&, const std::vector<T>&);                                 \
  template std::vector<T> cp_sequence_logprobs<T>(Model<T>&, comm::Communicator&, const cp::CpConfig&,            \
                                                  const std::vector<int32_t>&, int64_t, bool);                     \
  template void cp_sequence_logprobs_backward<T>(Model<T>&, comm::Communicator&, const cp::CpConfig&,             \
                                                 const std::vector<int32_t>&, const std::vector<T>&, int64_t);
RT_INSTANTIATE(float)
RT_INSTANTIATE(double)
#undef RT_INSTANTIATE

}  // namespace ringtrain::model
