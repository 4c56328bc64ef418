// Ulysses CP. Forward on rank r: head group j of the local q/k/v shards goes to rank j (all-to-all); the blocks
// that arrive (every rank's shard of group r) are put in global order, attention runs over the valid prefix of the
// whole sequence with the ordinary mask, and O and LSE go back the same way. The backward trades q, k, v, O, dO and
// LSE the same way and sends dQ, dK, dV back. LSE ([B, H, S]) travels as the [B, S, H, 1] view of itself.
#include "ringtrain/cp/ulysses_attention.h"

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

// Head group j of `local` ([B, 2c, H, d]) to rank j; what arrives (every rank's rows of this rank's group) is
// written in global order into `global` ([B, padded_len, H/cp, d]).
void heads_to_sequence(comm::Communicator& comm, const ZigzagLayout& l, const TensorView& local,
                       const TensorView& global, void* stream) {
  const int64_t g = local.shape[2] / l.cp, len = l.local_len();
  const int64_t block = local.shape[0] * len * g * local.shape[3];
  Tensor send = Tensor::empty({block * l.cp}, local.dtype, comm.device());
  Tensor recv = Tensor::empty({block * l.cp}, local.dtype, comm.device());
  for (int j = 0; j < l.cp; ++j) copy_async(block_view(send, j * block, local, len, g), local.slice(2, j * g, g), stream);
  comm.all_to_all(send.data(), recv.data(), static_cast<size_t>(block), local.dtype, stream);
  for (int s = 0; s < l.cp; ++s) block_to_global(l, s, block_view(recv, s * block, local, len, g), global, stream);
}

// The reverse: this rank's group in global order ([B, padded_len, H/cp, d]) back to the ranks, and every rank's
// results for this rank's rows written into head group j of `local` ([B, 2c, H, d]).
void sequence_to_heads(comm::Communicator& comm, const ZigzagLayout& l, const TensorView& global,
                       const TensorView& local, void* stream) {
  const int64_t g = local.shape[2] / l.cp, len = l.local_len();
  const int64_t block = local.shape[0] * len * g * local.shape[3];
  Tensor send = Tensor::empty({block * l.cp}, global.dtype, comm.device());
  Tensor recv = Tensor::empty({block * l.cp}, global.dtype, comm.device());
  for (int s = 0; s < l.cp; ++s) global_to_block(l, s, global, block_view(send, s * block, local, len, g), stream);
  comm.all_to_all(send.data(), recv.data(), static_cast<size_t>(block), global.dtype, stream);
  for (int j = 0; j < l.cp; ++j) copy_async(local.slice(2, j * g, g), block_view(recv, j * block, local, len, g), stream);
}

// The whole-sequence tensor of this rank's head group, shaped like `local` with H/cp heads and padded_len rows.
Tensor group_tensor(const ZigzagLayout& l, const TensorView& local, DType dtype, Device dev) {
  return Tensor::zeros({local.shape[0], l.padded_len(), local.shape[2] / l.cp, local.shape[3]}, dtype, dev);
}
Tensor group_lse(const ZigzagLayout& l, const AttnParams& p, Device dev) {
  return Tensor::empty({p.batch, p.heads_q / l.cp, l.padded_len()}, DType::F32, dev);
}

// The call over the valid prefix of the whole sequence for one head group.
AttnParams group_params(const ZigzagLayout& l, const AttnParams& p) {
  AttnParams g = block_params(p, l.global_len, l.global_len, p.mask);
  g.heads_q = p.heads_q / l.cp;
  g.heads_kv = p.heads_kv / l.cp;
  return g;
}

ZigzagLayout check_heads(const char* what, const comm::Communicator& comm, const AttnParams& p, int64_t global_len) {
  const ZigzagLayout l = check_cp_call(what, comm, p, global_len);
  RT_CHECK(p.heads_q % l.cp == 0 && p.heads_kv % l.cp == 0, what, ": all-to-all CP splits heads over ranks; ",
           "query heads (", p.heads_q, ") and kv heads (", p.heads_kv, ") must both be divisible by cp=", l.cp,
           (p.window > 0 && p.window < global_len ? " (use allgather: ring takes no sliding window)"
                                                   : " (use ring or allgather)"));
  return l;
}

}  // namespace

void ulysses_attention_forward(comm::Communicator& comm, const AttnParams& p, const AttnForwardArgs& a,
                               int64_t global_len) {
  const ZigzagLayout l = check_heads("all-to-all attention forward", comm, p, global_len);
  attention::validate(p, a);
  const attention::BackendScope cp_scope = attention::BackendScope::context_parallel(l.cp);
  const Device dev = comm.device();
  const int64_t n = l.global_len;
  const Tensor q = group_tensor(l, a.q, p.dtype, dev), k = group_tensor(l, a.k, p.dtype, dev),
               v = group_tensor(l, a.v, p.dtype, dev);
  heads_to_sequence(comm, l, a.q, q, a.stream);
  heads_to_sequence(comm, l, a.k, k, a.stream);
  heads_to_sequence(comm, l, a.v, v, a.stream);
  // Padding rows (beyond the valid prefix) keep O = 0 and LSE = -inf, the convention for rows that see nothing.
  const Tensor o = group_tensor(l, a.o, a.o.dtype, dev), lse = group_lse(l, p, dev);
  fill_neg_inf(lse, a.stream);
  AttnForwardArgs s;
  s.q = rows(q, 0, n);
  s.k = rows(k, 0, n);
  s.v = rows(v, 0, n);
  s.o = rows(o, 0, n);
  s.lse = lse_rows(lse, 0, n);
  s.stream = a.stream;
  attention::forward(group_params(l, p), s);
  sequence_to_heads(comm, l, o, a.o, a.stream);
  sequence_to_heads(comm, l, lse_as_bshd(lse), lse_as_bshd(a.lse), a.stream);
}

void ulysses_attention_backward(comm::Communicator& comm, const AttnParams& p, const AttnBackwardArgs& a,
                                int64_t global_len) {
  const ZigzagLayout l = check_heads("all-to-all attention backward", comm, p, global_len);
  attention::validate(p, a);
  RT_CHECK(!a.accumulate, "all-to-all attention backward: accumulate=true is not supported under context parallelism");
  const attention::BackendScope cp_scope = attention::BackendScope::context_parallel(l.cp);
  const Device dev = comm.device();
  const int64_t n = l.global_len;
  const Tensor q = group_tensor(l, a.q, p.dtype, dev), k = group_tensor(l, a.k, p.dtype, dev),
               v = group_tensor(l, a.v, p.dtype, dev), o = group_tensor(l, a.o, a.o.dtype, dev),
               dout = group_tensor(l, a.dout, a.dout.dtype, dev), lse = group_lse(l, p, dev);
  heads_to_sequence(comm, l, a.q, q, a.stream);
  heads_to_sequence(comm, l, a.k, k, a.stream);
  heads_to_sequence(comm, l, a.v, v, a.stream);
  heads_to_sequence(comm, l, a.o, o, a.stream);
  heads_to_sequence(comm, l, a.dout, dout, a.stream);
  heads_to_sequence(comm, l, lse_as_bshd(a.lse), lse_as_bshd(lse), a.stream);
  // Zeros beyond the valid prefix: padding rows get no gradient.
  const Tensor dq = group_tensor(l, a.dq, a.dq.dtype, dev), dk = group_tensor(l, a.dk, a.dk.dtype, dev),
               dv = group_tensor(l, a.dv, a.dv.dtype, dev);
  AttnBackwardArgs s;
  s.q = rows(q, 0, n);
  s.k = rows(k, 0, n);
  s.v = rows(v, 0, n);
  s.o = rows(o, 0, n);
  s.dout = rows(dout, 0, n);
  s.lse = lse_rows(lse, 0, n);
  s.dq = rows(dq, 0, n);
  s.dk = rows(dk, 0, n);
  s.dv = rows(dv, 0, n);
  s.stream = a.stream;
  attention::backward(group_params(l, p), s);
  sequence_to_heads(comm, l, dq, a.dq, a.stream);
  sequence_to_heads(comm, l, dk, a.dk, a.stream);
  sequence_to_heads(comm, l, dv, a.dv, a.stream);
}

}  // namespace ringtrain::cp
