// Ulysses CP. Forward on rank r: head group j of the local q/k/v shards goes to rank j (all-to-all); the blocks
// that arrive (every rank's shard of group r) are put in global order, attention runs over the valid prefix of the
// whole sequence with the ordinary mask, and O and LSE go back the same way. The backward trades q, k, v, O, dO and
// LSE the same way and sends dQ, dK, dV back. LSE ([B, H, S]) travels as the [B, S, H, 1] view of itself. Packed
// documents go together: each all-to-all carries the rank's rows of every document, and each document is put in
// global order in its own rows of the group tensors and attended there.
#include "ringtrain/cp/ulysses_attention.h"

#include <utility>
#include <vector>

#include "ringtrain/attention/selection.h"
#include "ringtrain/core/error.h"
#include "ringtrain/cp/cp_common.h"

namespace ringtrain::cp {

using attention::AttnBackwardArgs;
using attention::AttnForwardArgs;
using attention::AttnParams;

namespace {

// [B, H, S] -> the same memory as [B, S, H, 1], so LSE moves with the helpers written for [B, S, H, D].
TensorView lse_as_bshd(const TensorView& lse) {
  TensorView v = lse;
  v.ndim = 4;
  v.shape = {lse.shape[0], lse.shape[2], lse.shape[1], 1};
  v.stride = {lse.stride[0], lse.stride[2], lse.stride[1], 1};
  return v;
}

// Contiguous [B, len, heads, d] view at element `offset` of buf.
TensorView block_view(const Tensor& buf, int64_t offset, const TensorView& like, int64_t len, int64_t heads) {
  return contiguous_view(static_cast<char*>(buf.data()) + offset * static_cast<int64_t>(dtype_size(buf.dtype())),
                         buf.dtype(), buf.view().device, {like.shape[0], len, heads, like.shape[3]});
}

// Head group j of `local` ([B, rows, H, d]) to rank j; what arrives (every rank's rows of this rank's group) is
// written in global order into `global` ([B, total, H/cp, d]), sequence by sequence.
void heads_to_sequence(comm::Communicator& comm, const GlobalOrder& order, const TensorView& local,
                       const TensorView& global, void* stream) {
  const int cp = comm.size();
  const int64_t g = local.shape[2] / cp, len = order.local_rows;
  const int64_t block = local.shape[0] * len * g * local.shape[3];
  Tensor send = Tensor::empty({block * cp}, local.dtype, comm.device());
  Tensor recv = Tensor::empty({block * cp}, local.dtype, comm.device());
  for (int j = 0; j < cp; ++j) copy_async(block_view(send, j * block, local, len, g), local.slice(2, j * g, g), stream);
  comm.all_to_all(send.data(), recv.data(), static_cast<size_t>(block), local.dtype, stream);
  for (int s = 0; s < cp; ++s) order.to_global(s, block_view(recv, s * block, local, len, g), global, stream);
}

// The reverse: this rank's group in global order ([B, total, H/cp, d]) back to the ranks, and every rank's results
// for this rank's rows written into head group j of `local` ([B, rows, H, d]).
void sequence_to_heads(comm::Communicator& comm, const GlobalOrder& order, const TensorView& global,
                       const TensorView& local, void* stream) {
  const int cp = comm.size();
  const int64_t g = local.shape[2] / cp, len = order.local_rows;
  const int64_t block = local.shape[0] * len * g * local.shape[3];
  Tensor send = Tensor::empty({block * cp}, global.dtype, comm.device());
  Tensor recv = Tensor::empty({block * cp}, global.dtype, comm.device());
  for (int s = 0; s < cp; ++s) order.to_block(s, global, block_view(send, s * block, local, len, g), stream);
  comm.all_to_all(send.data(), recv.data(), static_cast<size_t>(block), global.dtype, stream);
  for (int j = 0; j < cp; ++j) copy_async(local.slice(2, j * g, g), block_view(recv, j * block, local, len, g), stream);
}

// The whole-sequence tensor of this rank's head group, shaped like `local` with H/cp heads and `total` rows.
Tensor group_tensor(const GlobalOrder& order, int cp, const TensorView& local, DType dtype, Device dev) {
  return Tensor::zeros({local.shape[0], order.total, local.shape[2] / cp, local.shape[3]}, dtype, dev);
}
Tensor group_lse(const GlobalOrder& order, int cp, const AttnParams& p, Device dev) {
  return Tensor::empty({p.batch, p.heads_q / cp, order.total}, DType::F32, dev);
}

// The call over the valid prefix of sequence i's whole sequence for one head group.
AttnParams group_params(const GlobalOrder& order, size_t i, int cp, const AttnParams& p) {
  const int64_t n = order.segments[i].layout.global_len;
  AttnParams g = block_params(p, n, n, p.mask);
  g.heads_q = p.heads_q / cp;
  g.heads_kv = p.heads_kv / cp;
  return g;
}

ZigzagLayout check_heads(const char* what, const comm::Communicator& comm, const AttnParams& p, int64_t global_len) {
  const ZigzagLayout l = check_cp_call(what, comm, p, global_len);
  RT_CHECK(p.heads_q % l.cp == 0 && p.heads_kv % l.cp == 0, what, ": all-to-all CP splits heads over ranks; ",
           "query heads (", p.heads_q, ") and kv heads (", p.heads_kv, ") must both be divisible by cp=", l.cp,
           attention::masking_window(p.window, global_len) > 0 ? " (use allgather: ring takes no sliding window)"
                                                                : " (use ring or allgather)");
  return l;
}

void forward(comm::Communicator& comm, const GlobalOrder& order, const AttnParams& p, const AttnForwardArgs& a) {
  const attention::BackendScope cp_scope = attention::BackendScope::context_parallel(comm.size());
  const Device dev = comm.device();
  const int cp = comm.size();
  const Tensor q = group_tensor(order, cp, a.q, p.dtype, dev), k = group_tensor(order, cp, a.k, p.dtype, dev),
               v = group_tensor(order, cp, a.v, p.dtype, dev);
  heads_to_sequence(comm, order, a.q, q, a.stream);
  heads_to_sequence(comm, order, a.k, k, a.stream);
  heads_to_sequence(comm, order, a.v, v, a.stream);
  // Padding rows (beyond each valid prefix) keep O = 0 and LSE = -inf, the convention for rows that see nothing.
  const Tensor o = group_tensor(order, cp, a.o, a.o.dtype, dev), lse = group_lse(order, cp, p, dev);
  fill_neg_inf(lse, a.stream);
  for (size_t i = 0; i < order.segments.size(); ++i) {
    const int64_t at = order.at[i], n = order.segments[i].layout.global_len;
    const auto r = [&](const Tensor& t) { return rows(t, at, n); };
    AttnForwardArgs s{r(q), r(k), r(v), r(o), lse_rows(lse, at, n)};
    s.stream = a.stream;
    attention::forward(group_params(order, i, cp, p), s);
  }
  sequence_to_heads(comm, order, o, a.o, a.stream);
  sequence_to_heads(comm, order, lse_as_bshd(lse), lse_as_bshd(a.lse), a.stream);
}

void backward(comm::Communicator& comm, const GlobalOrder& order, const AttnParams& p, const AttnBackwardArgs& a) {
  RT_CHECK(!a.accumulate, "all-to-all attention backward: accumulate=true is not supported under context parallelism");
  const attention::BackendScope cp_scope = attention::BackendScope::context_parallel(comm.size());
  const Device dev = comm.device();
  const int cp = comm.size();
  const Tensor q = group_tensor(order, cp, a.q, p.dtype, dev), k = group_tensor(order, cp, a.k, p.dtype, dev),
               v = group_tensor(order, cp, a.v, p.dtype, dev), o = group_tensor(order, cp, a.o, a.o.dtype, dev),
               dout = group_tensor(order, cp, a.dout, a.dout.dtype, dev), lse = group_lse(order, cp, p, dev);
  heads_to_sequence(comm, order, a.q, q, a.stream);
  heads_to_sequence(comm, order, a.k, k, a.stream);
  heads_to_sequence(comm, order, a.v, v, a.stream);
  heads_to_sequence(comm, order, a.o, o, a.stream);
  heads_to_sequence(comm, order, a.dout, dout, a.stream);
  heads_to_sequence(comm, order, lse_as_bshd(a.lse), lse_as_bshd(lse), a.stream);
  // Zeros beyond each valid prefix: padding rows get no gradient.
  const Tensor dq = group_tensor(order, cp, a.dq, a.dq.dtype, dev), dk = group_tensor(order, cp, a.dk, a.dk.dtype, dev),
               dv = group_tensor(order, cp, a.dv, a.dv.dtype, dev);
  for (size_t i = 0; i < order.segments.size(); ++i) {
    const int64_t at = order.at[i], n = order.segments[i].layout.global_len;
    const auto r = [&](const Tensor& t) { return rows(t, at, n); };
    AttnBackwardArgs s{r(q), r(k), r(v), r(o), r(dout), lse_rows(lse, at, n), r(dq), r(dk), r(dv)};
    s.stream = a.stream;
    attention::backward(group_params(order, i, cp, p), s);
  }
  sequence_to_heads(comm, order, dq, a.dq, a.stream);
  sequence_to_heads(comm, order, dk, a.dk, a.stream);
  sequence_to_heads(comm, order, dv, a.dv, a.stream);
}

}  // namespace

void ulysses_attention_forward(comm::Communicator& comm, const AttnParams& p, const AttnForwardArgs& a,
                               int64_t global_len) {
  const ZigzagLayout l = check_heads("all-to-all attention forward", comm, p, global_len);
  attention::validate(p, a);
  forward(comm, GlobalOrder({{l, 0}}, l.local_len()), p, a);
}

void ulysses_attention_backward(comm::Communicator& comm, const AttnParams& p, const AttnBackwardArgs& a,
                                int64_t global_len) {
  const ZigzagLayout l = check_heads("all-to-all attention backward", comm, p, global_len);
  attention::validate(p, a);
  backward(comm, GlobalOrder({{l, 0}}, l.local_len()), p, a);
}

void ulysses_packed_attention_forward(comm::Communicator& comm, const AttnParams& p, const AttnForwardArgs& a,
                                      const PackedZigzag& l) {
  DenseSegments d = packed_segments("packed all-to-all attention forward", comm, p, l, check_heads, a);
  forward(comm, GlobalOrder(std::move(d.segments), d.rows), d.params, packed_as_dense(a, d.rows));
}

void ulysses_packed_attention_backward(comm::Communicator& comm, const AttnParams& p, const AttnBackwardArgs& a,
                                       const PackedZigzag& l) {
  DenseSegments d = packed_segments("packed all-to-all attention backward", comm, p, l, check_heads, a);
  backward(comm, GlobalOrder(std::move(d.segments), d.rows), d.params, packed_as_dense(a, d.rows));
}

}  // namespace ringtrain::cp
