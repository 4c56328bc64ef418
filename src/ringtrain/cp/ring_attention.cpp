// Ring attention on rank r: at step i the rank holds the KV block of source s = (r - i) mod cp and attends the
// part of its queries that sees that block (ring_block). The next block's send/recv is posted before the step's
// compute and waited after it (double buffer). Running O and LSE stay fp32 and are merged per step.
// Backward: same blocks, always with the final O and LSE; dQ accumulates locally in fp32; each step's dK/dV share is
// computed (in the input dtype) while the fp32 sum of the earlier shares of the same block arrives from the previous
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

  Tensor o_acc = zeros_like(a.o, DType::F32, dev);
  Tensor lse_acc = empty_like(a.lse, DType::F32, dev);
  fill_neg_inf(lse_acc, a.stream);
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
    if (!blk.empty()) {
      const TensorView o_rows = rows(o_acc, blk.q_start, blk.nq), lse_part = lse_rows(lse_acc, blk.q_start, blk.nq);
      if (step == 0) {  // the first block writes the running result directly
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

  const int64_t len = l.local_len();
  Tensor dq_acc = zeros_like(a.q, DType::F32, dev);
  KvPack cur = make_kv_pack(a.k, len, p.dtype, dev, false);
  KvPack nxt = make_kv_pack(a.k, len, p.dtype, dev, false);
  copy_async(cur.k, a.k, a.stream);
  copy_async(cur.v, a.v, a.stream);
  // A step's gradients are written by the block's backward in the input dtype (dq_share, dkv_share), which spares
  // a backend that cannot accumulate (cuDNN) a conversion pass, and an fp32 buffer the zeroing, at every step. Then
  // dQ is added into dq_acc, and the dK/dV share into the sum of the earlier ranks' shares of the same block, which
  // arrives meanwhile (in); the previous block's finished sum travels on (out). Computing the share while the sums
  // travel keeps the fp32 dK/dV exchange off the critical path but for the last hop.
  const Tensor dq_share = empty_like(a.q, p.dtype, dev);
  const KvPack dkv_share = make_kv_pack(a.k, len, p.dtype, dev, false);
  KvPack dkv_in = make_kv_pack(a.k, len, DType::F32, dev, false);
  KvPack dkv_out = make_kv_pack(a.k, len, DType::F32, dev, false);
  // The share covers the block's first nk rows (the others saw no query): added into a sum, or, at the owner's
  // step, the start of the sum (zero past nk).
  const auto take_share = [&](const KvPack& sum, int64_t nk, bool starts_sum) {
    for (const auto& [dst, src] : {std::pair{sum.k, dkv_share.k}, std::pair{sum.v, dkv_share.v}}) {
      if (!starts_sum) {
        if (nk > 0) add_async(rows(dst, 0, nk), rows(src, 0, nk), a.stream);
        continue;
      }
      if (nk > 0) copy_async(rows(dst, 0, nk), rows(src, 0, nk), a.stream);
      if (nk < len) fill_async(rows(dst, nk, len - nk), 0.0, a.stream);
    }
  };

  for (int step = 0; step < l.cp; ++step) {
    const int src = (l.rank - step + l.cp) % l.cp;
    std::unique_ptr<comm::Request> kv_req, dkv_req;
    if (step + 1 < l.cp)
      kv_req = comm.send_recv(cur.buf.data(), next, nxt.buf.data(), prev, cur.count(), p.dtype, a.stream);
    if (step > 0)
      dkv_req = comm.send_recv(dkv_out.buf.data(), next, dkv_in.buf.data(), prev, dkv_out.count(), DType::F32,
                               a.stream);
    const RingBlock blk = ring_block(l, causal, step, src);
    const int64_t share_rows = blk.empty() ? 0 : blk.nk;
    if (share_rows > 0) {
      block_backward(p, a, blk.q_start, blk.nq, cur.k, cur.v, blk.nk, blk.mask, dq_share, dkv_share.k, dkv_share.v,
                     /*accumulate=*/false);
      add_async(rows(dq_acc, blk.q_start, blk.nq), rows(dq_share, blk.q_start, blk.nq), a.stream);
    }
    if (dkv_req) {
      dkv_req->wait();
      take_share(dkv_in, share_rows, false);
      std::swap(dkv_out, dkv_in);  // block src's sum leaves at the next step; the buffer just sent receives the next
    } else {
      take_share(dkv_out, share_rows, true);
    }
    if (kv_req) {
      kv_req->wait();
      std::swap(cur, nxt);
    }
  }
  // The last block's sum goes to its owner, the next rank, and what arrives is this rank's own block, complete.
  // Nothing is added to it any more, so it travels in the output dtype (rounded by the sender instead of the owner:
  // the same values, half the bytes of fp32 for bf16 outputs), from the share buffer, free by now (stream order).
  const DType out_dtype = a.dk.dtype == a.dv.dtype ? a.dk.dtype : DType::F32;
  RT_CHECK(dtype_size(out_dtype) <= dtype_size(DType::F32), "ring attention backward: dK/dV of dtype ",
           dtype_name(out_dtype), " are not supported");
  void* send = dkv_out.buf.data();
  if (out_dtype != DType::F32) {
    const KvPack rounded = view_kv_pack(dkv_share.buf.data(), a.k, len, out_dtype, dev);
    copy_async(rounded.k, dkv_out.k, a.stream);
    copy_async(rounded.v, dkv_out.v, a.stream);
    send = dkv_share.buf.data();
  }
  const KvPack recv = view_kv_pack(dkv_in.buf.data(), a.k, len, out_dtype, dev);
  comm.send_recv(send, next, dkv_in.buf.data(), prev, dkv_out.count(), out_dtype, a.stream)->wait();
  copy_async(a.dq, dq_acc, a.stream);
  copy_async(a.dk, recv.k, a.stream);
  copy_async(a.dv, recv.v, a.stream);
}

}  // namespace ringtrain::cp
