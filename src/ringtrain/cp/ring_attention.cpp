// Ring attention on rank r: at step i the rank holds the KV block of source s = (r - i) mod cp and attends the
// part of its queries that sees that block (ring_block). Packed documents travel together: the block is the rank's
// rows of every document, one exchange per step, and each document attends its own rows of it (a Segment each).
// The next block's send/recv is posted before the step's compute and waited after it (double buffer). Each step's
// partial result is merged into the running O and LSE (fp32 LSE; O in fp32, or the output itself when at most one
// merge rounds it).
// Backward: the same blocks in the opposite direction, s = (r + 1 + i) mod cp, so that the own block comes last,
// always with the final O and LSE. Each step's dK/dV share is computed while the sum of the earlier shares of the
// same block arrives from the next rank, then added and sent on to the previous one; the sum gathers one share per
// rank and ends complete at its owner, whose own share is the last. The forward ends holding block r + 1, the
// backward's first: kept (KeptKv), no exchange of the backward waits uncovered.
#include "ringtrain/cp/ring_attention.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

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

// A block of another rank's keys lies wholly before the diagonal of the rows that see it, so under a sliding window
// it would need a mask bounded below only (key j visible from row i when j > i - w), which no backend takes. A
// window at least as long as the sequence hides nothing, and block_params drops it from every block.
ZigzagLayout check_ring_call(const char* what, const comm::Communicator& comm, const AttnParams& p,
                             int64_t global_len) {
  const ZigzagLayout l = check_cp_call(what, comm, p, global_len);
  RT_CHECK(attention::masking_window(p.window, global_len) == 0 || l.cp == 1, what, ": a sliding window (",
           p.describe(),
           ") is not supported by ring attention: a block of another rank's keys would need a mask bounded below "
           "only; the all-gather and all-to-all algorithms serve windows (parallel.cp_comm or --cp-comm = allgather "
           "or a2a)");
  return l;
}

// Every block's rows end at the last valid row.
RingBlock ring_block(const ZigzagLayout& l, bool causal, int src) {
  const int64_t c = l.chunk_len(), valid = l.valid_len();
  if (!causal) return {0, valid, l.valid_len(src), MaskType::None};
  // Own block: the local concatenation [chunk r, chunk 2cp-1-r] is in global order, so plain causal.
  if (src == l.rank) return {0, valid, valid, MaskType::CausalTopLeft};
  // Earlier source: both local chunks come after its first chunk and before its second one.
  if (src < l.rank) return {0, valid, std::min(l.valid_len(src), c), MaskType::None};
  // Later source: only the second local chunk comes after (both of) its chunks.
  return {c, std::max<int64_t>(valid - c, 0), l.valid_len(src), MaskType::None};
}

// An exchange of a packed copy, which lives until the exchange completes.
struct PackedRequest final : comm::Request {
  explicit PackedRequest(KvPack p) : pack(std::move(p)) {}
  void wait() override { request->wait(); }
  KvPack pack;
  std::unique_ptr<comm::Request> request;
};

// Sends the block (k, v) to `dst` while receiving a block from `src` into `into`. Views that are not one packed
// buffer (the caller's own K and V) go as two parts of one exchange when contiguous, sparing a packing copy.
std::unique_ptr<comm::Request> send_kv(comm::Communicator& comm, const TensorView& k, const TensorView& v, int dst,
                                       const KvPack& into, int src, DType dtype, void* stream) {
  if (static_cast<const char*>(v.data) == static_cast<const char*>(k.data) + k.nbytes())
    return comm.send_recv(k.data, dst, into.buf.data(), src, into.count(), dtype, stream);
  if (k.is_contiguous() && v.is_contiguous()) {
    const comm::Transfer parts[2] = {{k.data, into.k.data, static_cast<size_t>(k.numel())},
                                     {v.data, into.v.data, static_cast<size_t>(v.numel())}};
    return comm.exchange(parts, dst, src, dtype, stream);
  }
  auto packed = std::make_unique<PackedRequest>(make_kv_pack(k, k.shape[1], dtype, comm.device(), false));
  copy_async(packed->pack.k, k, stream);
  copy_async(packed->pack.v, v, stream);
  packed->request = comm.send_recv(packed->pack.buf.data(), dst, into.buf.data(), src, into.count(), dtype, stream);
  return packed;
}

// The common geometry of a ring call: cp, rank and the neighbours, the segments, and the local rows of the tensors
// (every segment's rows, which travel together: one exchange per step whatever the number of sequences).
struct Ring {
  int cp = 1, rank = 0, next = 0, prev = 0;
  std::vector<Segment> segments;
  int64_t rows = 0;

  Ring(const comm::Communicator& comm, std::vector<Segment> segs, int64_t local_rows)
      : cp(comm.size()), rank(comm.rank()), next((rank + 1) % cp), prev((rank + cp - 1) % cp),
        segments(std::move(segs)), rows(local_rows) {}
};

void forward(comm::Communicator& comm, const Ring& ring, const AttnParams& p, const AttnForwardArgs& a,
             KeptKv* kept) {
  const attention::BackendScope cp_scope = attention::BackendScope::context_parallel(ring.cp);
  const Device dev = comm.device();
  const bool causal = is_causal(p);

  // The running result is a.o and a.lse (fp32) themselves when one merge at most rounds a.o (cp <= 2) or a.o is
  // fp32 or fp64, else an fp32 copy. Each step's partial O comes in the input dtype, what every backend writes natively.
  const bool o_direct = ring.cp <= 2 || a.o.dtype == DType::F32 || a.o.dtype == DType::F64;
  const Tensor o_acc = o_direct ? Tensor() : empty_like(a.o, DType::F32, dev);
  const TensorView o_run = o_direct ? a.o : o_acc.view();
  // Step 0 attends the own K and V where they are; the blocks that arrive alternate between two buffers.
  KvPack arrived[2];
  for (int i = 0; i < std::min(ring.cp - 1, 2); ++i) arrived[i] = make_kv_pack(a.k, ring.rows, p.dtype, dev, false);
  for (int step = 0; step < ring.cp; ++step) {
    const int src = (ring.rank - step + ring.cp) % ring.cp;
    const TensorView cur_k = step == 0 ? a.k : arrived[(step - 1) % 2].k;
    const TensorView cur_v = step == 0 ? a.v : arrived[(step - 1) % 2].v;
    std::unique_ptr<comm::Request> kv_req;
    if (step + 1 < ring.cp)
      kv_req = send_kv(comm, cur_k, cur_v, ring.next, arrived[step % 2], ring.prev, p.dtype, a.stream);
    for (const Segment& seg : ring.segments) {
      const RingBlock blk = ring_block(seg.layout, causal, src);
      const int64_t len = seg.len();
      if (step == 0) {  // rows no query of the own block has (padding): O = 0, LSE = -inf, as if they saw no key
        const int64_t nq = blk.empty() ? 0 : blk.nq;
        if (nq < len) {
          fill_async(rows(o_run, seg.start + nq, len - nq), 0.0, a.stream);
          fill_neg_inf(lse_rows(a.lse, seg.start + nq, len - nq), a.stream);
        }
      }
      if (blk.empty()) continue;
      const int64_t q_start = seg.start + blk.q_start;
      const TensorView k = rows(cur_k, seg.start, len), v = rows(cur_v, seg.start, len);
      const TensorView o_rows = rows(o_run, q_start, blk.nq), lse_part = lse_rows(a.lse, q_start, blk.nq);
      if (step == 0) {  // the own block covers every valid row: it writes the running result directly
        block_forward(p, a, q_start, blk.nq, k, v, blk.nk, blk.mask, o_rows, lse_part);
      } else {
        Tensor o_step = empty_like(o_rows, p.dtype, dev);
        Tensor lse_step = empty_like(lse_part, DType::F32, dev);
        block_forward(p, a, q_start, blk.nq, k, v, blk.nk, blk.mask, o_step, lse_step);
        merge_partial(o_rows, lse_part, o_step, lse_step, a.stream);
      }
    }
    if (kv_req) kv_req->wait();
  }
  if (!o_direct) copy_async(a.o, o_acc, a.stream);
  if (kept && ring.cp > 1)  // block r + 1, the last to arrive
    *kept = KeptKv{std::move(arrived[ring.cp % 2].buf), a.k.data, a.v.data};
}

void backward(comm::Communicator& comm, const Ring& ring, const AttnParams& p, const AttnBackwardArgs& a,
              KeptKv* kept) {
  RT_CHECK(!a.accumulate, "ring attention backward: accumulate=true is not supported under context parallelism");
  const attention::BackendScope cp_scope = attention::BackendScope::context_parallel(ring.cp);
  const Device dev = comm.device();
  const bool causal = is_causal(p);
  const int cp = ring.cp;
  const auto as_kv = [&](const Tensor& buf, DType dtype) {
    return view_kv_pack(buf.data(), a.k, ring.rows, dtype, dev);
  };

  // The KV block of step 0 (rank r + 1's): kept by the forward, else fetched now. Later blocks but the own one
  // arrive from the next rank while the step before computes.
  KvPack cur, nxt;
  if (cp > 1) {
    if (kept && kept->kv.defined()) {
      RT_CHECK(kept->k == a.k.data && kept->v == a.v.data,
               "ring attention backward: the kept KV block comes from a forward on other k and v");
      cur = as_kv(kept->kv, p.dtype);
      cur.buf = std::move(kept->kv);
    } else {
      cur = make_kv_pack(a.k, ring.rows, p.dtype, dev, false);
      send_kv(comm, a.k, a.v, ring.prev, cur, ring.next, p.dtype, a.stream)->wait();
    }
    if (cp > 2) nxt = make_kv_pack(a.k, ring.rows, p.dtype, dev, false);
  }
  // The other blocks' gradients are written by the block's backward in the input dtype (dq_share, shares), which
  // spares a backend that cannot accumulate (cuDNN) a conversion pass, and a buffer the zeroing. The own block,
  // last, writes a.dq, a.dk and a.dv directly, and the other blocks' sums are added in, rounding once.
  // dQ: with one other block its share is the sum; with more, the shares add up in fp32 (dq_acc). Every block's rows
  // end at the last valid row of its segment, so the rows holding a sum are [dq_from, valid) of each segment.
  // dK/dV: the sum of block s starts with the share of rank s - 1 at step 0 and travels towards the previous rank
  // as narrow as exact: the first hop carries the lone share in the input dtype, later hops fp32 sums.
  // Sums are kept in fp32, or in fp64 for fp64 inputs (never narrower than the shares they add).
  const DType sum_dtype = p.dtype == DType::F64 ? DType::F64 : DType::F32;
  const Tensor dq_share = cp > 1 ? empty_like(a.q, p.dtype, dev) : Tensor();
  const Tensor dq_acc = cp > 2 ? empty_like(a.q, sum_dtype, dev) : Tensor();
  const TensorView dq_sum = cp > 2 ? dq_acc.view() : dq_share.view();
  std::vector<int64_t> dq_from;  // per segment, relative to its start
  for (const Segment& seg : ring.segments) dq_from.push_back(seg.layout.valid_len());
  KvPack shares[2];
  for (int i = 0; i < std::min(cp - 1, 2); ++i) shares[i] = make_kv_pack(a.k, ring.rows, p.dtype, dev, false);
  const auto hop_dtype = [&](int step) { return step == 1 ? p.dtype : sum_dtype; };  // `step` shares arrive
  const int64_t sum_count = static_cast<int64_t>(shares[0].count());
  Tensor sum_in = cp > 1 ? Tensor::empty({sum_count}, cp > 2 ? sum_dtype : p.dtype, dev) : Tensor();
  Tensor sum_out = cp > 2 ? Tensor::empty({sum_count}, sum_dtype, dev) : Tensor();

  for (int step = 0; step < cp; ++step) {
    const int src = (ring.rank + 1 + step) % cp;
    const bool own = src == ring.rank;
    const KvPack& share = shares[step % 2];
    std::unique_ptr<comm::Request> kv_req, dkv_req;
    if (step + 2 < cp)  // the block of step + 1, unless it is the own one
      kv_req = comm.send_recv(cur.buf.data(), ring.prev, nxt.buf.data(), ring.next, cur.count(), p.dtype, a.stream);
    if (step > 0)
      dkv_req = comm.send_recv(step == 1 ? shares[0].buf.data() : sum_out.data(), ring.prev, sum_in.data(), ring.next,
                               static_cast<size_t>(sum_count), hop_dtype(step), a.stream);
    std::vector<int64_t> seen_keys;  // per segment: the keys of this step's block that some query saw
    for (size_t si = 0; si < ring.segments.size(); ++si) {
      const Segment& seg = ring.segments[si];
      const int64_t len = seg.len(), valid = seg.layout.valid_len(), s0 = seg.start;
      const RingBlock blk = ring_block(seg.layout, causal, src);
      const int64_t nq = blk.empty() ? 0 : blk.nq, nk = blk.empty() ? 0 : blk.nk;
      seen_keys.push_back(nk);
      int64_t& from = dq_from[si];
      if (own) {
        if (nk > 0)
          block_backward(p, a, s0, nq, rows(a.k, s0, len), rows(a.v, s0, len), nk, blk.mask, a.dq,
                         rows(a.dk, s0, len), rows(a.dv, s0, len), /*accumulate=*/false);
        if (nq < len) fill_async(rows(a.dq, s0 + nq, len - nq), 0.0, a.stream);  // padding rows
        if (nk < len)
          for (const TensorView& t : {a.dk, a.dv}) fill_async(rows(t, s0 + nk, len - nk), 0.0, a.stream);
        if (from < valid) add_async(rows(a.dq, s0 + from, valid - from), rows(dq_sum, s0 + from, valid - from),
                                    a.stream);
      } else {
        if (nk > 0) {
          block_backward(p, a, s0 + blk.q_start, blk.nq, rows(cur.k, s0, len), rows(cur.v, s0, len), blk.nk, blk.mask,
                         dq_share, rows(share.k, s0, len), rows(share.v, s0, len), /*accumulate=*/false);
          if (cp > 2) {  // rows new to the sum are copied, the others added
            if (blk.q_start < from)
              copy_async(rows(dq_acc, s0 + blk.q_start, from - blk.q_start),
                         rows(dq_share, s0 + blk.q_start, from - blk.q_start), a.stream);
            if (from < valid)
              add_async(rows(dq_acc, s0 + from, valid - from), rows(dq_share, s0 + from, valid - from), a.stream);
          }
          from = std::min(from, blk.q_start);
        }
        if (step == 0 && nk < len)  // the share that starts the sum: zero where no query saw the key
          for (const TensorView& t : {share.k, share.v}) fill_async(rows(t, s0 + nk, len - nk), 0.0, a.stream);
      }
    }
    if (dkv_req) {
      dkv_req->wait();
      const KvPack in = as_kv(sum_in, hop_dtype(step));
      if (own) {  // the other ranks' shares of the own block, complete
        for (size_t si = 0; si < ring.segments.size(); ++si) {
          const int64_t s0 = ring.segments[si].start, nk = seen_keys[si];
          if (nk == 0) continue;
          add_async(rows(a.dk, s0, nk), rows(in.k, s0, nk), a.stream);
          add_async(rows(a.dv, s0, nk), rows(in.v, s0, nk), a.stream);
        }
      } else {
        // The sum goes on in fp32: in place when it arrived in fp32, else converted into sum_out (free: its send has
        // completed).
        KvPack res = in;
        if (hop_dtype(step) != sum_dtype) {
          res = as_kv(sum_out, sum_dtype);
          copy_async(res.k, in.k, a.stream);
          copy_async(res.v, in.v, a.stream);
        }
        for (size_t si = 0; si < ring.segments.size(); ++si) {
          const int64_t s0 = ring.segments[si].start, nk = seen_keys[si];
          if (nk == 0) continue;
          add_async(rows(res.k, s0, nk), rows(share.k, s0, nk), a.stream);
          add_async(rows(res.v, s0, nk), rows(share.v, s0, nk), a.stream);
        }
        if (hop_dtype(step) == sum_dtype) std::swap(sum_in, sum_out);  // the result is in sum_out, to be sent next
      }
    }
    if (kv_req) {
      kv_req->wait();
      std::swap(cur, nxt);
    }
  }
}

// The dense call as one segment.
Ring dense_ring(const comm::Communicator& comm, const ZigzagLayout& l) { return Ring(comm, {{l, 0}}, l.local_len()); }

}  // namespace

void ring_attention_forward(comm::Communicator& comm, const AttnParams& p, const AttnForwardArgs& a,
                            int64_t global_len, KeptKv* kept) {
  const ZigzagLayout l = check_ring_call("ring attention forward", comm, p, global_len);
  attention::validate(p, a);
  forward(comm, dense_ring(comm, l), p, a, kept);
}

void ring_attention_backward(comm::Communicator& comm, const AttnParams& p, const AttnBackwardArgs& a,
                             int64_t global_len, KeptKv* kept) {
  const ZigzagLayout l = check_ring_call("ring attention backward", comm, p, global_len);
  attention::validate(p, a);
  backward(comm, dense_ring(comm, l), p, a, kept);
}

void ring_packed_attention_forward(comm::Communicator& comm, const AttnParams& p, const AttnForwardArgs& a,
                                   const PackedZigzag& l) {
  DenseSegments d = packed_segments("packed ring attention forward", comm, p, l, check_ring_call, a);
  forward(comm, Ring(comm, std::move(d.segments), d.rows), d.params, packed_as_dense(a, d.rows), nullptr);
}

void ring_packed_attention_backward(comm::Communicator& comm, const AttnParams& p, const AttnBackwardArgs& a,
                                    const PackedZigzag& l) {
  DenseSegments d = packed_segments("packed ring attention backward", comm, p, l, check_ring_call, a);
  backward(comm, Ring(comm, std::move(d.segments), d.rows), d.params, packed_as_dense(a, d.rows), nullptr);
}

}  // namespace ringtrain::cp
