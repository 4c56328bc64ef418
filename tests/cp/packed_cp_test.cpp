// Packed documents under context parallelism: each document zigzag-sharded on its own, every CP algorithm, against
// the single-rank fp64 math reference on the whole packed batch (THD with cu_seqlens, so no token may see another
// document), sliding windows included (all-gather and all-to-all). fp32: accumulation-order differences only, 1e-5
// relative. The ring moves all documents in each exchange: cp - 1 exchanges forward and 2 cp - 2 backward (the
// first block fetched, cp - 2 blocks, cp - 1 gradient sums); all-gather one all-gather forward and one all-gather and
// one reduce-scatter backward; all-to-all one per tensor (5 forward, 9 backward): counted, whatever the number of
// documents.
#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <tuple>

#include "ringtrain/attention/cpu/cpu_backends.h"
#include "ringtrain/attention/selection.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/cp/cp_attention.h"
#include "ringtrain/cp/zigzag.h"
#include "forwarding_comm.h"
#include "root_list_guard.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using attention::BackendId;
using cp::CpComm;

struct Packed {
  Tensor q, k, v, dout, o, lse, dq, dk, dv;
  Packed(int64_t t, int64_t hq, int64_t hkv, int64_t d)
      : q(Tensor::empty({t, hq, d}, DType::F32)), k(Tensor::empty({t, hkv, d}, DType::F32)),
        v(Tensor::empty({t, hkv, d}, DType::F32)), dout(Tensor::empty({t, hq, d}, DType::F32)),
        o(Tensor::empty({t, hq, d}, DType::F32)), lse(Tensor::empty({hq, t}, DType::F32)),
        dq(Tensor::empty({t, hq, d}, DType::F32)), dk(Tensor::empty({t, hkv, d}, DType::F32)),
        dv(Tensor::empty({t, hkv, d}, DType::F32)) {
    for (const Tensor* x : {&o, &lse, &dq, &dk, &dv}) testing::poison(*x);
  }
};

// A communicator that counts the exchanges and collectives it passes on.
class CountingComm final : public testing::ForwardingComm {
 public:
  using ForwardingComm::ForwardingComm;
  int exchanges = 0, all_gathers = 0, reduce_scatters = 0, all_to_alls = 0;
  std::unique_ptr<comm::Request> exchange(std::span<const comm::Transfer> parts, int dst, int src, DType dtype,
                                          void* stream) override {
    ++exchanges;
    return ForwardingComm::exchange(parts, dst, src, dtype, stream);
  }
  void all_gather(const void* s, void* r, size_t n, DType t, void* st) override {
    ++all_gathers;
    ForwardingComm::all_gather(s, r, n, t, st);
  }
  void reduce_scatter(const void* s, void* r, size_t n, DType t, comm::ReduceOp op, void* st) override {
    ++reduce_scatters;
    ForwardingComm::reduce_scatter(s, r, n, t, op, st);
  }
  void all_to_all(const void* s, void* r, size_t n, DType t, void* st) override {
    ++all_to_alls;
    ForwardingComm::all_to_all(s, r, n, t, st);
  }
};

// (cp, comm, causal, heads_q, heads_kv, sliding window or 0)
class PackedCp : public ::testing::TestWithParam<std::tuple<int, CpComm, bool, int, int, int>> {};

TEST_P(PackedCp, MatchesThePackedSingleRankReference) {
  const auto [cp, comm_kind, causal, hq, hkv, window] = GetParam();
  const std::vector<int64_t> lens = {7, 1, 33, 20, 12};
  const int64_t d = 32;
  int64_t total = 0;
  for (int64_t n : lens) total += n;
  std::mt19937_64 rng(testing::fresh_seed());
  Packed g(total, hq, hkv, d);
  for (const Tensor* x : {&g.q, &g.k, &g.v, &g.dout}) testing::fill_normal(*x, rng);
  Tensor cu = Tensor::empty({static_cast<int64_t>(lens.size()) + 1}, DType::I32);
  cu.ptr<int32_t>()[0] = 0;
  for (size_t i = 0; i < lens.size(); ++i) cu.ptr<int32_t>()[i + 1] = cu.ptr<int32_t>()[i] + static_cast<int32_t>(lens[i]);

  attention::AttnParams p;
  p.batch = static_cast<int64_t>(lens.size());
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.head_dim = d;
  p.seqlen_q = p.seqlen_kv = 33;
  p.mask = causal ? attention::MaskType::CausalTopLeft : attention::MaskType::None;
  p.packed = true;
  p.window = window;
  const auto& math = *attention::find_backend(BackendId::Math, DeviceKind::CPU);
  math.forward(p, {g.q, g.k, g.v, g.o, g.lse, cu, cu});
  math.backward(p, {g.q, g.k, g.v, g.o, g.dout, g.lse, g.dq, g.dk, g.dv, false, cu, cu});

  testing::RootListGuard guard;
  attention::set_root_backends({BackendId::Flash}, "test");
  Packed out(total, hq, hkv, d);
  comm::run_ranks(cp, std::chrono::milliseconds(30000), [&](comm::Communicator& c) {
    const cp::PackedZigzag l(c.size(), c.rank(), lens);
    Packed mine(l.local_total(), hq, hkv, d);
    auto for_docs = [&](auto&& f) {
      for (size_t i = 0; i < lens.size(); ++i) f(l.doc(i), l.global_start(i), lens[i], l.local_start(i));
    };
    for_docs([&](const cp::ZigzagLayout& dl, int64_t gs, int64_t n, int64_t ls) {
      for (auto [from, to] : {std::pair{&g.q, &mine.q}, {&g.k, &mine.k}, {&g.v, &mine.v}, {&g.dout, &mine.dout}})
        cp::shard(cp::packed_rows(*from, gs, n), 1, dl, cp::packed_rows(*to, ls, dl.local_len()));
    });
    attention::AttnParams lp = p;
    lp.seqlen_q = lp.seqlen_kv = 0;  // per-document lengths come from doc_lens
    cp::CpConfig cfg;
    cfg.comm = comm_kind;
    CountingComm counted(c);
    cp::packed_attention_forward(counted, cfg, lp, {mine.q, mine.k, mine.v, mine.o, mine.lse}, lens);
    const int forward_exchanges = counted.exchanges, forward_gathers = counted.all_gathers,
              forward_scatters = counted.reduce_scatters, forward_all_to_alls = counted.all_to_alls;
    cp::packed_attention_backward(
        counted, cfg, lp, {mine.q, mine.k, mine.v, mine.o, mine.dout, mine.lse, mine.dq, mine.dk, mine.dv}, lens);
    if (comm_kind == CpComm::Ring) {
      EXPECT_EQ(forward_exchanges, cp - 1) << "rank " << c.rank();
      EXPECT_EQ(counted.exchanges - forward_exchanges, 2 * cp - 2) << "rank " << c.rank();
    }
    if (comm_kind == CpComm::AllGather) {  // one of each per pass, whatever the number of documents
      EXPECT_EQ(forward_gathers, 1) << "rank " << c.rank();
      EXPECT_EQ(forward_scatters, 0) << "rank " << c.rank();
      EXPECT_EQ(counted.all_gathers, 2) << "rank " << c.rank();
      EXPECT_EQ(counted.reduce_scatters, 1) << "rank " << c.rank();
    }
    if (comm_kind == CpComm::AllToAll) {  // q, k, v there and O, LSE back; then q, k, v, O, dO, LSE and dQ, dK, dV
      EXPECT_EQ(forward_all_to_alls, 5) << "rank " << c.rank();
      EXPECT_EQ(counted.all_to_alls - forward_all_to_alls, 9) << "rank " << c.rank();
    }
    for_docs([&](const cp::ZigzagLayout& dl, int64_t gs, int64_t n, int64_t ls) {
      for (auto [from, to] : {std::pair{&mine.o, &out.o}, {&mine.dq, &out.dq}, {&mine.dk, &out.dk}, {&mine.dv, &out.dv}})
        cp::unshard(cp::packed_rows(*from, ls, dl.local_len()), 1, dl, cp::packed_rows(*to, gs, n));
      cp::unshard(cp::packed_lse(mine.lse, ls, dl.local_len()), 2, dl, cp::packed_lse(out.lse, gs, n));
    });
  });
  EXPECT_LE(testing::rel_error(out.o, g.o), 1e-5) << "O";
  EXPECT_LE(testing::rel_error(out.lse, g.lse), 1e-5) << "LSE";
  EXPECT_LE(testing::rel_error(out.dq, g.dq), 1e-5) << "dQ";
  EXPECT_LE(testing::rel_error(out.dk, g.dk), 1e-5) << "dK";
  EXPECT_LE(testing::rel_error(out.dv, g.dv), 1e-5) << "dV";
}

INSTANTIATE_TEST_SUITE_P(
    Docs, PackedCp,
    ::testing::Values(std::tuple{2, CpComm::Ring, true, 4, 2, 0}, std::tuple{2, CpComm::Ring, false, 4, 1, 0},
                      std::tuple{3, CpComm::Ring, true, 4, 2, 0}, std::tuple{4, CpComm::AllGather, true, 4, 2, 0},
                      std::tuple{3, CpComm::AllGather, false, 2, 2, 0}, std::tuple{2, CpComm::AllToAll, true, 4, 2, 0},
                      std::tuple{4, CpComm::AllToAll, false, 8, 4, 0}, std::tuple{3, CpComm::AllGather, true, 4, 2, 5},
                      std::tuple{4, CpComm::AllGather, true, 4, 1, 1}, std::tuple{2, CpComm::AllToAll, true, 4, 2, 9}));

}  // namespace
}  // namespace ringtrain
