// Ring attention on rank r: at step i the rank holds the KV block of source s = (r - i) mod cp and attends the
// part of its queries that sees that block (ring_block). The next block's send/recv is posted before the step's
// compute and waited after it (double buffer). Running O and LSE stay fp32 and are merged per step.
// Backward: same blocks, always with the final O and LSE; dQ accumulates locally in fp32; each step's dK/dV share is
// computed (in the input dtype) while the sum of the earlier shares of the same block arrives from the previous
// rank, then added and sent on, so the sum is back at its owner after cp hops of which only the last is not
// overlapped.
#include "ringtrain/cp/ring_attention.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "ringtrain/attention/selection.h"
#include "ringtrain/core/error.h"
#include "ringtrain/cp/cp_common.h"

namespace ringtrain::cp {

using attention::AttnBackwardArgs;
using attention::AttnForwardArgs;
using attention::AttnParams;
using attention::MaskType;

namespace {

// The queries (local rows [q_start, q_start + nq)) that attend the first nk keys of the block from rank src.
struct RingBlock {
  int64_t q_start = 0, nq = 0, nk = 0;
  MaskType mask = MaskType::None;
  bool empty() const { return nq == 0 || nk == 0; }
};

RingBlock ring_block(const ZigzagLayout& l, bool causal, int step, int src) {
  const int64_t c = l.chunk_len(), valid = l.valid_len();
  if (!causal) return {0, valid, l.valid_len(src), MaskType::None};
  // Own block: the local concatenation [chunk r, chunk 2cp-1-r] is in global order, so plain causal.
  if (step == 0) return {0, valid, valid, MaskType::CausalTopLeft};
  // Earlier source: both local chunks come after its first chunk and before its second one.
  if (src < l.rank) return {0, valid, std::min(l.valid_len(src), c), MaskType::None};
  // Later source: only the second local chunk comes after (both of) its chunks.
  return {c, std::max<int64_t>(valid - c, 0), l.valid_len(src), MaskType::None};
}

}  // namespace

void ring_attention_forward(comm::Communicator& comm, const AttnParams& p, const AttnForwardArgs& a,
                            int64_t global_len) {
  const ZigzagLayout l = check_cp_call("ring attention forward", comm, p, global_len);
  attention::validate(p, a);
  const attention::BackendScope cp_scope = attention::BackendScope::context_parallel(l.cp);
  const Device dev = comm.device();
  const bool causal = is_causal(p);
  const int next = (l.rank + 1) % l.cp, prev = (l.rank + l.cp - 1) % l.cp;

  Tensor o_acc = empty_like(a.o, DType::F32, dev);
  Tensor lse_acc = empty_like(a.lse, DType::F32, dev);
  KvPack cur = make_kv_pack(a.k, l.local_len(), p.dtype, dev, false);
  KvPack nxt = make_kv_pack(a.k, l.local_len(), p.dtype, dev, false);
  copy_async(cur.k, a.k, a.stream);
  copy_async(cur.v, a.v, a.stream);

  for (int step = 0; step < l.cp; ++step) {
    const int src = (l.rank - step + l.cp) % l.cp;
    std::unique_ptr<comm::Request> kv_req;
    if (step + 1 < l.cp)
      kv_req = comm.send_recv(cur.buf.data(), next, nxt.buf.data(), prev, cur.count(), p.dtype, a.stream);
    const RingBlock blk = ring_block(l, causal, step, src);
    if (step == 0) {  // rows no query of the own block has (padding): O = 0, LSE = -inf, as if they saw no key
      const int64_t nq = blk.empty() ? 0 : blk.nq, n = l.local_len();
      if (nq < n) {
        fill_async(rows(o_acc, nq, n - nq), 0.0, a.stream);
        fill_neg_inf(lse_rows(lse_acc, nq, n - nq), a.stream);
      }
    }
    if (!blk.empty()) {
      const TensorView o_rows = rows(o_acc, blk.q_start, blk.nq), lse_part = lse_rows(lse_acc, blk.q_start, blk.nq);
      if (step == 0) {  // the own block covers every valid row: it writes the running result directly
        block_forward(p, a, blk.q_start, blk.nq, cur.k, cur.v, blk.nk, blk.mask, o_rows, lse_part);
      } else {
        Tensor o_step = empty_like(o_rows, DType::F32, dev);
        Tensor lse_step = empty_like(lse_part, DType::F32, dev);
        block_forward(p, a, blk.q_start, blk.nq, cur.k, cur.v, blk.nk, blk.mask, o_step, lse_step);
        merge_partial(o_rows, lse_part, o_step, lse_step, a.stream);
      }
    }
    if (kv_req) {
      kv_req->wait();
      std::swap(cur, nxt);
    }
  }
  copy_async(a.o, o_acc, a.stream);
  copy_async(a.lse, lse_acc, a.stream);
}

void ring_attention_backward(comm::Communicator& comm, const AttnParams& p, const AttnBackwardArgs& a,
                             int64_t global_len) {
  const ZigzagLayout l = check_cp_call("ring attention backward", comm, p, global_len);
  attention::validate(p, a);
  RT_CHECK(!a.accumulate, "ring attention backward: accumulate=true is not supported under context parallelism");
  const attention::BackendScope cp_scope = attention::BackendScope::context_parallel(l.cp);
  const Device dev = comm.device();
  const bool causal = is_causal(p);
  const int next = (l.rank + 1) % l.cp, prev = (l.rank + l.cp - 1) % l.cp;
  const DType out_dtype = a.dk.dtype == a.dv.dtype ? a.dk.dtype : DType::F32;
  RT_CHECK(dtype_size(out_dtype) <= dtype_size(DType::F32), "ring attention backward: dK/dV of dtype ",
           dtype_name(out_dtype), " are not supported");

  const int64_t len = l.local_len();
  KvPack cur = make_kv_pack(a.k, len, p.dtype, dev, false);
  KvPack nxt = make_kv_pack(a.k, len, p.dtype, dev, false);
  copy_async(cur.k, a.k, a.stream);
  copy_async(cur.v, a.v, a.stream);
  // A step's gradients are written by the block's backward in the input dtype (dq_share, shares), which spares a
  // backend that cannot accumulate (cuDNN) a conversion pass, and an fp32 buffer the zeroing, at every step. dQ is
  // added into dq_acc (the own block, step 0, covers every valid row and starts it). The dK/dV share of block src
  // is added into the sum of the earlier ranks' shares of that block, which arrives meanwhile, and the sum travels
  // on: computing the share while the sums travel keeps the exchange off the critical path but for the last hop.
  // What travels is as narrow as exact: the first hop carries the lone step-0 share in the input dtype, later hops
  // fp32 sums, and the last hop (to the owner) the complete sum rounded to the output dtype, once.
  Tensor dq_acc = empty_like(a.q, DType::F32, dev);
  const Tensor dq_share = empty_like(a.q, p.dtype, dev);
  const KvPack shares[2] = {make_kv_pack(a.k, len, p.dtype, dev, false), make_kv_pack(a.k, len, p.dtype, dev, false)};
  const DType sum_dtype = l.cp > 2 ? DType::F32 : dtype_size(out_dtype) > dtype_size(p.dtype) ? out_dtype : p.dtype;
  Tensor sum_in = Tensor::empty({static_cast<int64_t>(shares[0].count())}, sum_dtype, dev);
  Tensor sum_out = Tensor::empty({static_cast<int64_t>(shares[0].count())}, sum_dtype, dev);
  const auto as_kv = [&](const Tensor& buf, DType dtype) { return view_kv_pack(buf.data(), a.k, len, dtype, dev); };

  for (int step = 0; step < l.cp; ++step) {
    const int src = (l.rank - step + l.cp) % l.cp;
    const KvPack& share = shares[step % 2];
    const DType in_dtype = step == 1 ? p.dtype : DType::F32;  // the sum of `step` shares arriving now
    std::unique_ptr<comm::Request> kv_req, dkv_req;
    if (step + 1 < l.cp)
      kv_req = comm.send_recv(cur.buf.data(), next, nxt.buf.data(), prev, cur.count(), p.dtype, a.stream);
    if (step > 0)
      dkv_req = comm.send_recv(step == 1 ? shares[0].buf.data() : sum_out.data(), next, sum_in.data(), prev,
                               shares[0].count(), in_dtype, a.stream);
    const RingBlock blk = ring_block(l, causal, step, src);
    const int64_t nk = blk.empty() ? 0 : blk.nk;
    if (nk > 0) {
      block_backward(p, a, blk.q_start, blk.nq, cur.k, cur.v, blk.nk, blk.mask, dq_share, share.k, share.v,
                     /*accumulate=*/false);
      const TensorView dq_rows = rows(dq_acc, blk.q_start, blk.nq), share_rows = rows(dq_share, blk.q_start, blk.nq);
      step == 0 ? copy_async(dq_rows, share_rows, a.stream) : add_async(dq_rows, share_rows, a.stream);
    }
    if (step == 0) {  // rows no query saw: zero in dQ and in the share that starts the sum
      const int64_t nq = blk.empty() ? 0 : blk.nq;
      if (nq < len) fill_async(rows(dq_acc, nq, len - nq), 0.0, a.stream);
      if (nk < len)
        for (const TensorView& t : {share.k, share.v}) fill_async(rows(t, nk, len - nk), 0.0, a.stream);
    }
    if (dkv_req) {
      dkv_req->wait();
      // The sum goes on in fp32, or in the output dtype once it is complete (the last step); in place when the
      // arriving sum has that dtype already, else converted into sum_out (free: its send has completed).
      const DType res_dtype = step + 1 == l.cp ? out_dtype : DType::F32;
      const KvPack in = as_kv(sum_in, in_dtype);
      KvPack res = in;
      if (in_dtype != res_dtype) {
        res = as_kv(sum_out, res_dtype);
        copy_async(res.k, in.k, a.stream);
        copy_async(res.v, in.v, a.stream);
      }
      if (nk > 0) {
        add_async(rows(res.k, 0, nk), rows(share.k, 0, nk), a.stream);
        add_async(rows(res.v, 0, nk), rows(share.v, 0, nk), a.stream);
      }
      if (in_dtype == res_dtype) std::swap(sum_in, sum_out);  // the result is in sum_out, to be sent next
    }
    if (kv_req) {
      kv_req->wait();
      std::swap(cur, nxt);
    }
  }
  // The last block's sum goes to its owner, the next rank, and what arrives is this rank's own block, complete.
  // With one rank the sum is the lone share.
  void* send = sum_out.data();
  if (l.cp == 1) {
    send = shares[0].buf.data();
    if (out_dtype != p.dtype) {
      const KvPack res = as_kv(sum_out, out_dtype);
      copy_async(res.k, shares[0].k, a.stream);
      copy_async(res.v, shares[0].v, a.stream);
      send = sum_out.data();
    }
  }
  const KvPack recv = as_kv(sum_in, out_dtype);
  comm.send_recv(send, next, sum_in.data(), prev, shares[0].count(), out_dtype, a.stream)->wait();
  copy_async(a.dq, dq_acc, a.stream);
  copy_async(a.dk, recv.k, a.stream);
  copy_async(a.dv, recv.v, a.stream);
}

}  // namespace ringtrain::cp
