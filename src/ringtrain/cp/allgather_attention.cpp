// All-gather-KV CP. Rank s's local block [chunk s | chunk 2cp-1-s] is gathered in rank order and scattered into
// a [B, padded_len, Hkv, D] global-order tensor; each local query chunk j (global rows [j*c, j*c + valid)) then
// attends keys [0, j*c + valid) with bottom-right causal alignment (its last query sees the last key), or all
// valid keys without a mask. Under a sliding window w the keys start at the first row's window, j*c + 1 - w, and
// the window goes with the call: bottom-right alignment puts each row's window where the global sequence has it.
// dK/dV of the global tensor (fp32) go back to rank order and are reduce-scattered. Packed documents go together:
// one all-gather of the rank's rows of every document, each document put in global order in its own rows of one
// tensor, one reduce-scatter.
#include "ringtrain/cp/allgather_attention.h"

#include <algorithm>
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

// K and V of every sequence in global order (`order`), gathered from every rank in one collective.
KvPack gather_kv(comm::Communicator& comm, const GlobalOrder& order, const AttnParams& p, const TensorView& k,
                 const TensorView& v, void* stream) {
  const Device dev = comm.device();
  KvPack mine = make_kv_pack(k, order.local_rows, p.dtype, dev, false);
  copy_async(mine.k, k, stream);
  copy_async(mine.v, v, stream);
  Tensor gathered = Tensor::empty({static_cast<int64_t>(mine.count()) * comm.size()}, p.dtype, dev);
  comm.all_gather(mine.buf.data(), gathered.data(), mine.count(), p.dtype, stream);
  KvPack global = make_kv_pack(k, order.total, p.dtype, dev, false);
  for (int s = 0; s < comm.size(); ++s) {
    char* base = static_cast<char*>(gathered.data()) + s * mine.count() * dtype_size(p.dtype);
    const KvPack block = view_kv_pack(base, k, order.local_rows, p.dtype, dev);
    order.to_global(s, block.k, global.k, stream);
    order.to_global(s, block.v, global.v, stream);
  }
  return global;
}

// Local query chunk h (0: chunk r, 1: chunk 2cp-1-r): its valid rows and the global keys [k_start, k_start + nk)
// they attend.
struct ChunkBlock {
  int64_t q_start = 0, nq = 0, k_start = 0, nk = 0;
  MaskType mask = MaskType::None;
};

ChunkBlock chunk_block(const ZigzagLayout& l, const AttnParams& p, int h) {
  const int64_t c = l.chunk_len(), j = h == 0 ? l.rank : 2 * l.cp - 1 - l.rank;
  const int64_t nq = l.chunk_valid(j);
  if (!is_causal(p)) return {h * c, nq, 0, l.global_len, MaskType::None};
  const int64_t k_start = p.window > 0 ? std::max<int64_t>(0, j * c + 1 - p.window) : 0;
  return {h * c, nq, k_start, j * c + nq - k_start, MaskType::CausalBottomRight};
}

void forward(comm::Communicator& comm, const GlobalOrder& order, const AttnParams& p, const AttnForwardArgs& a) {
  const attention::BackendScope cp_scope = attention::BackendScope::context_parallel(comm.size());
  const Device dev = comm.device();
  const KvPack kv = gather_kv(comm, order, p, a.k, a.v, a.stream);
  Tensor o_acc = zeros_like(a.o, DType::F32, dev);
  Tensor lse_acc = empty_like(a.lse, DType::F32, dev);
  fill_neg_inf(lse_acc, a.stream);
  for (size_t i = 0; i < order.segments.size(); ++i)
    for (int h = 0; h < 2; ++h) {
      const ChunkBlock blk = chunk_block(order.segments[i].layout, p, h);
      if (blk.nq == 0) continue;
      const int64_t q = order.segments[i].start + blk.q_start, k0 = order.at[i] + blk.k_start;
      block_forward(p, a, q, blk.nq, rows(kv.k, k0, blk.nk), rows(kv.v, k0, blk.nk), blk.nk, blk.mask,
                    rows(o_acc, q, blk.nq), lse_rows(lse_acc, q, blk.nq));
    }
  copy_async(a.o, o_acc, a.stream);
  copy_async(a.lse, lse_acc, a.stream);
}

void backward(comm::Communicator& comm, const GlobalOrder& order, const AttnParams& p, const AttnBackwardArgs& a) {
  RT_CHECK(!a.accumulate, "all-gather attention backward: accumulate=true is not supported under context parallelism");
  const attention::BackendScope cp_scope = attention::BackendScope::context_parallel(comm.size());
  const Device dev = comm.device();
  const KvPack kv = gather_kv(comm, order, p, a.k, a.v, a.stream);
  Tensor dq_acc = zeros_like(a.q, DType::F32, dev);
  const KvPack dkv = make_kv_pack(a.k, order.total, DType::F32, dev, true);
  for (size_t i = 0; i < order.segments.size(); ++i)
    for (int h = 0; h < 2; ++h) {
      const ChunkBlock blk = chunk_block(order.segments[i].layout, p, h);
      if (blk.nq == 0) continue;
      const int64_t q = order.segments[i].start + blk.q_start, k0 = order.at[i] + blk.k_start;
      block_backward(p, a, q, blk.nq, rows(kv.k, k0, blk.nk), rows(kv.v, k0, blk.nk), blk.nk, blk.mask, dq_acc,
                     rows(dkv.k, k0, blk.nk), rows(dkv.v, k0, blk.nk));
    }
  // Back to rank order (block s = rank s's local rows), then every rank gets the sum of its block.
  const size_t block_count =
      2 * static_cast<size_t>(a.k.shape[0] * order.local_rows * a.k.shape[2] * a.k.shape[3]);
  Tensor scattered = Tensor::empty({static_cast<int64_t>(block_count) * comm.size()}, DType::F32, dev);
  for (int s = 0; s < comm.size(); ++s) {
    const KvPack block =
        view_kv_pack(scattered.ptr<float>() + s * block_count, a.k, order.local_rows, DType::F32, dev);
    order.to_block(s, dkv.k, block.k, a.stream);
    order.to_block(s, dkv.v, block.v, a.stream);
  }
  const KvPack mine = make_kv_pack(a.k, order.local_rows, DType::F32, dev, false);
  comm.reduce_scatter(scattered.data(), mine.buf.data(), mine.count(), DType::F32, comm::ReduceOp::Sum, a.stream);
  copy_async(a.dq, dq_acc, a.stream);
  copy_async(a.dk, mine.k, a.stream);
  copy_async(a.dv, mine.v, a.stream);
}

}  // namespace

void allgather_attention_forward(comm::Communicator& comm, const AttnParams& p, const AttnForwardArgs& a,
                                 int64_t global_len) {
  const ZigzagLayout l = check_cp_call("all-gather attention forward", comm, p, global_len);
  attention::validate(p, a);
  forward(comm, GlobalOrder({{l, 0}}, l.local_len()), p, a);
}

void allgather_attention_backward(comm::Communicator& comm, const AttnParams& p, const AttnBackwardArgs& a,
                                  int64_t global_len) {
  const ZigzagLayout l = check_cp_call("all-gather attention backward", comm, p, global_len);
  attention::validate(p, a);
  backward(comm, GlobalOrder({{l, 0}}, l.local_len()), p, a);
}

void allgather_packed_attention_forward(comm::Communicator& comm, const AttnParams& p, const AttnForwardArgs& a,
                                        const PackedZigzag& l) {
  DenseSegments d = packed_segments("packed all-gather attention forward", comm, p, l, check_cp_call, a);
  forward(comm, GlobalOrder(std::move(d.segments), d.rows), d.params, packed_as_dense(a, d.rows));
}

void allgather_packed_attention_backward(comm::Communicator& comm, const AttnParams& p, const AttnBackwardArgs& a,
                                         const PackedZigzag& l) {
  DenseSegments d = packed_segments("packed all-gather attention backward", comm, p, l, check_cp_call, a);
  backward(comm, GlobalOrder(std::move(d.segments), d.rows), d.params, packed_as_dense(a, d.rows));
}

}  // namespace ringtrain::cp
