// Context parallelism on two GPUs through NCCL: for every GPU backend, ring, all-gather and all-to-all, causal and
// not, GQA, lengths that need padding and one long sequence, sliding windows (all-gather and all-to-all), CP
// attention equals the single-GPU result of the same backend on the same inputs (O, LSE, dQ, dK, dV within the bf16
// bar). Also the narrowing rule on the GPU: with a model scope listing all four backends inside CP, only CP-capable
// implementations run.
// The parent tests start this program on two ranks (launch_local); the CpRank tests run inside those ranks.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <limits>
#include <random>

#include "ringtrain/attention/selection.h"
#include "ringtrain/check/device_checks.h"
#include "ringtrain/comm/rendezvous.h"
#include "test_util.h"
#ifdef RINGTRAIN_WITH_NCCL
#include "ringtrain/comm/nccl/nccl_communicator.h"
#include "ringtrain/cp/cp_common.h"
#include "ringtrain/cp/zigzag.h"
#endif

namespace ringtrain::cp {
namespace {

using attention::BackendId;
using check::DeviceRunOptions;
using check::DeviceRunResult;
using check::run_cp_on_device;

using testing::inside_rank;

TEST(CpTwoGpus, ParityForEveryBackend) {
  if (inside_rank()) GTEST_SKIP() << "parent test";
  RT_REQUIRE_GPU();
#ifndef RINGTRAIN_WITH_NCCL
  GTEST_SKIP() << "this build has no NCCL communicator";
#endif
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << cuda_device_count();
  EXPECT_EQ(testing::run_ranks_of_this_program("CpRank.*"), 0);
}

#ifdef RINGTRAIN_WITH_NCCL
struct Case {
  BackendId backend;
  CpComm comm;
  bool causal;
  int64_t seq, heads_q, heads_kv;
  bool keep_kv = true;  // ring: the backward starts on the forward's last KV block, or fetches it
  int64_t window = 0;
};

// bf16: both sides round fp32 results of the same products to 8 mantissa bits, in another order; 1e-2 relative
// is the project's bf16 bar (typical values 2e-3 to 5e-3).
constexpr double kBf16Tol = 1e-2;

TEST(CpRank, EveryGpuBackendMatchesOneGpu) {
  if (!inside_rank()) GTEST_SKIP() << "runs inside a rank started by the parent test";
  auto comm = comm::make_nccl_communicator(comm::rank_info_from_environment(), std::chrono::seconds(120));
  std::vector<Case> cases;
  for (BackendId b : attention::kAllBackends) {
    const attention::Backend* impl = attention::find_backend(b, DeviceKind::CUDA);
    if (!impl || !impl->cp_capable()) continue;
    for (CpComm c : {CpComm::Ring, CpComm::AllGather, CpComm::AllToAll}) {
      // 4099 needs padding. All-gather attends each query chunk with a bottom-right causal mask of Sq=c against
      // Skv=(j+1)c keys, which cuDNN serves only for multiples of 64: cudnn gets 4096 there (its stated limit).
      const int64_t seq = (b == BackendId::Cudnn && c == CpComm::AllGather) ? 4096 : 4099;
      for (bool causal : {true, false}) cases.push_back({b, c, causal, seq, 8, 2});
    }
    cases.push_back({b, CpComm::Ring, true, 4099, 8, 2, /*keep_kv=*/false});
    // Windows inside a chunk (1025 rows here) and across chunks. cuDNN takes a window only top-left with Sq <= Skv,
    // which all-to-all's whole-sequence call is and all-gather's bottom-right blocks are not.
    for (CpComm c : {CpComm::AllGather, CpComm::AllToAll})
      for (int64_t w : {700, 2500})
        if (b != BackendId::Cudnn || c == CpComm::AllToAll) cases.push_back({b, c, true, 4099, 8, 2, true, w});
  }
  ASSERT_FALSE(cases.empty()) << "no GPU backend is declared CP-capable";
  for (BackendId b : {BackendId::Flash, BackendId::Cudnn, BackendId::Efficient}) {
    const attention::Backend* impl = attention::find_backend(b, DeviceKind::CUDA);
    if (impl && impl->cp_capable()) cases.push_back({b, CpComm::Ring, true, 131072, 8, 8});
  }
  const uint64_t seed = std::strtoull(std::getenv("MASTER_PORT"), nullptr, 10);  // fresh per run, same on both ranks
  for (const Case& c : cases) {
    attention::set_root_backends({c.backend}, "test");
    DeviceRunOptions opt;
    opt.prob = {1, c.seq, c.heads_q, c.heads_kv, 128, c.causal, DType::BF16, c.window};
    opt.config.comm = c.comm;
    opt.seed = seed + c.seq;
    opt.keep_kv = c.keep_kv;
    const DeviceRunResult r = run_cp_on_device(*comm, opt);
    const std::string what = cat(attention::backend_name(c.backend), " ", cp_comm_name(c.comm), c.causal ? " causal" : "",
                                 " S=", c.seq, c.keep_kv ? "" : " (fetch)",
                                 c.window > 0 ? cat(" window=", c.window) : std::string());
    if (comm->rank() == 0)
      std::printf("%s: O %.2e LSE %.2e dQ %.2e dK %.2e dV %.2e\n", what.c_str(), r.err_o, r.err_lse, r.err_dq, r.err_dk,
                  r.err_dv);
    EXPECT_LE(r.err_o, kBf16Tol) << what;
    EXPECT_LE(r.err_lse, kBf16Tol) << what;
    EXPECT_LE(r.err_dq, kBf16Tol) << what;
    EXPECT_LE(r.err_dk, kBf16Tol) << what;
    EXPECT_LE(r.err_dv, kBf16Tol) << what;
    const int i = static_cast<int>(c.backend);
    EXPECT_GT(r.dispatches.forward[i], 0) << what;
    EXPECT_EQ(r.dispatches.total(), r.dispatches.forward[i] + r.dispatches.backward[i]) << what;
  }
}

// Packed documents under CP on two GPUs: per-document zigzag, each CP algorithm per document, against the same
// backend's single-GPU call on the whole packed batch (THD with cu_seqlens). Odd document lengths need padding;
// cudnn's all-gather blocks need chunk lengths that are multiples of 64, so cudnn runs ring and a2a here.
TEST(CpRank, PackedDocumentsMatchOneGpu) {
  if (!inside_rank()) GTEST_SKIP() << "runs inside a rank started by the parent test";
  auto comm = comm::make_nccl_communicator(comm::rank_info_from_environment(), std::chrono::seconds(120));
  const Device dev = comm->device();
  const std::vector<int64_t> lens = {1000, 37, 4099, 513, 2048};
  const int64_t hq = 8, hkv = 2, d = 128;
  int64_t total = 0;
  std::vector<int32_t> cu_host = {0};
  for (int64_t n : lens) cu_host.push_back(static_cast<int32_t>(total += n));
  Tensor cu = Tensor::empty({static_cast<int64_t>(cu_host.size())}, DType::I32, dev);
  copy(cu, contiguous_view(cu_host.data(), DType::I32, Device::cpu(), {cu.numel()}));
  auto thd = [&](int64_t t, int64_t h) { return Tensor::empty({t, h, d}, DType::BF16, dev); };
  const uint64_t seed = std::strtoull(std::getenv("MASTER_PORT"), nullptr, 10);  // the same on both ranks
  const Tensor q = thd(total, hq), k = thd(total, hkv), v = thd(total, hkv), dout = thd(total, hq);
  uint64_t s = seed;
  for (const Tensor* t : {&q, &k, &v, &dout}) fill_normal_hashed(*t, s++);

  const cp::PackedZigzag l(comm->size(), comm->rank(), lens);
  const int64_t lt = l.local_total();
  auto for_docs = [&](auto&& f) {
    for (size_t i = 0; i < lens.size(); ++i) f(l.doc(i), l.global_start(i), lens[i], l.local_start(i));
  };
  // This rank's shard of a global packed tensor.
  auto shard_of = [&](const Tensor& g, int64_t h, DType dt) {
    Tensor m = Tensor::empty({lt, h, d}, dt, dev);
    for_docs([&](const ZigzagLayout& dl, int64_t gs, int64_t n, int64_t ls) {
      shard(packed_rows(g, gs, n), 1, dl, packed_rows(m, ls, dl.local_len()));
    });
    return m;
  };
  auto host = [](const TensorView& t) {
    Tensor h = Tensor::empty({t.numel()}, t.dtype == DType::BF16 ? DType::F32 : t.dtype);
    TensorView hv = t;
    hv.data = h.data();
    hv.device = Device::cpu();
    hv.dtype = h.dtype();
    int64_t st = 1;
    for (int i = t.ndim - 1; i >= 0; --i) hv.stride[i] = st, st *= t.shape[i];
    copy(hv, t);
    return std::pair{std::move(h), hv};
  };

  attention::AttnParams p;
  p.device = dev;
  p.dtype = DType::BF16;
  p.batch = static_cast<int64_t>(lens.size());
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.head_dim = d;
  p.seqlen_q = p.seqlen_kv = 4099;
  p.mask = attention::MaskType::CausalTopLeft;
  p.packed = true;
  for (BackendId b : {BackendId::Flash, BackendId::Cudnn, BackendId::Efficient}) {
    const attention::Backend* impl = attention::find_backend(b, DeviceKind::CUDA);
    if (!impl || !impl->cp_capable()) continue;
    attention::set_root_backends({b}, "test");
    // The reference: one GPU, the whole packed batch.
    const Tensor o = thd(total, hq), dq = thd(total, hq), dk = thd(total, hkv), dv = thd(total, hkv);
    const Tensor lse = Tensor::empty({hq, total}, DType::F32, dev);
    attention::forward(p, {q, k, v, o, lse, cu, cu});
    attention::backward(p, {q, k, v, o, dout, lse, dq, dk, dv, false, cu, cu});
    const Tensor mq = shard_of(q, hq, DType::BF16), mk = shard_of(k, hkv, DType::BF16),
                 mv = shard_of(v, hkv, DType::BF16), mdout = shard_of(dout, hq, DType::BF16);
    for (CpComm c : {CpComm::Ring, CpComm::AllGather, CpComm::AllToAll}) {
      if (b == BackendId::Cudnn && c == CpComm::AllGather) continue;
      const Tensor mo = thd(lt, hq), mdq = thd(lt, hq), mdk = thd(lt, hkv), mdv = thd(lt, hkv);
      const Tensor mlse = Tensor::empty({hq, lt}, DType::F32, dev);
      for (const Tensor* t : {&mo, &mdq, &mdk, &mdv, &mlse}) fill(*t, std::numeric_limits<double>::quiet_NaN());
      attention::AttnParams lp = p;
      lp.seqlen_q = lp.seqlen_kv = 0;
      CpConfig cfg;
      cfg.comm = c;
      packed_attention_forward(*comm, cfg, lp, {mq, mk, mv, mo, mlse}, lens);
      packed_attention_backward(*comm, cfg, lp, {mq, mk, mv, mo, mdout, mlse, mdq, mdk, mdv}, lens);
      // Compare each document's valid rows (a prefix of its local rows) with the same rows of the sharded reference.
      const std::string what = cat(attention::backend_name(b), " packed ", cp_comm_name(c), " rank ", comm->rank());
      double worst[5] = {0, 0, 0, 0, 0};
      const Tensor ro = shard_of(o, hq, DType::BF16), rdq = shard_of(dq, hq, DType::BF16),
                   rdk = shard_of(dk, hkv, DType::BF16), rdv = shard_of(dv, hkv, DType::BF16);
      for_docs([&](const ZigzagLayout& dl, int64_t gs, int64_t, int64_t ls) {
        const int64_t nv = dl.valid_len();
        if (nv == 0) return;
        const std::pair<const Tensor*, const Tensor*> pairs[] = {{&mo, &ro}, {&mdq, &rdq}, {&mdk, &rdk}, {&mdv, &rdv}};
        for (int j = 0; j < 4; ++j) {
          auto [a, ah] = host(packed_rows(*pairs[j].first, ls, nv));
          auto [r, rh] = host(packed_rows(*pairs[j].second, ls, nv));
          worst[j] = std::max(worst[j], testing::rel_error(ah, rh));
        }
        // LSE: this rank's valid rows of the document are the global rows of its zigzag chunks.
        Tensor ref_lse = Tensor::empty({1, hq, dl.local_len()}, DType::F32, dev);
        shard(packed_lse(lse, gs, dl.global_len), 2, dl, ref_lse);
        auto [a, ah] = host(packed_lse(mlse, ls, nv));
        auto [r, rh] = host(lse_rows(ref_lse, 0, nv));
        worst[4] = std::max(worst[4], testing::rel_error(ah, rh));
      });
      std::printf("%s: O %.2e dQ %.2e dK %.2e dV %.2e LSE %.2e\n", what.c_str(), worst[0], worst[1], worst[2],
                  worst[3], worst[4]);
      const char* names[] = {"O", "dQ", "dK", "dV", "LSE"};
      for (int j = 0; j < 5; ++j) EXPECT_LE(worst[j], kBf16Tol) << what << " " << names[j];
    }
  }
}

// The original crash's situation on the GPU: every backend allowed at the root and by the model, cp = 2. Whatever
// runs must be declared CP-capable.
TEST(CpRank, ModelScopeCannotWidenCpOnGpu) {
  if (!inside_rank()) GTEST_SKIP() << "runs inside a rank started by the parent test";
  auto comm = comm::make_nccl_communicator(comm::rank_info_from_environment(), std::chrono::seconds(120));
  attention::set_root_backends(attention::default_backends(), "test");
  const attention::BackendScope model("model", {BackendId::Cudnn, BackendId::Flash, BackendId::Efficient,
                                                BackendId::Math});
  DeviceRunOptions opt;
  opt.prob = {1, 2048, 8, 2, 128, true, DType::BF16};
  const DeviceRunResult r = run_cp_on_device(*comm, opt);
  for (BackendId b : attention::kAllBackends) {
    const int i = static_cast<int>(b);
    if (r.dispatches.forward[i] + r.dispatches.backward[i] == 0) continue;
    const attention::Backend* impl = attention::find_backend(b, DeviceKind::CUDA);
    ASSERT_NE(impl, nullptr);
    EXPECT_TRUE(impl->cp_capable()) << attention::backend_name(b) << " ran under CP";
  }
  EXPECT_GT(r.dispatches.total(), 0);
}
#endif

}  // namespace
}  // namespace ringtrain::cp
