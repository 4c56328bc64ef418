// A rank that fails in the middle of the ring makes the others fail fast instead of hanging.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "ringtrain/attention/selection.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/core/error.h"
#include "ringtrain/cp/cp_attention.h"
#include "ringtrain/cp/zigzag.h"
#include "forwarding_comm.h"
#include "test_util.h"

namespace ringtrain {
namespace {

// Forwards to a real communicator, but throws at its n-th send_recv (1-based) on the chosen rank.
class FailingComm final : public testing::ForwardingComm {
 public:
  FailingComm(comm::Communicator& inner, int fail_at) : ForwardingComm(inner), fail_at_(fail_at) {}
  std::unique_ptr<comm::Request> exchange(std::span<const comm::Transfer> parts, int dst, int src, DType dtype,
                                          void* stream) override {
    if (++sends_ == fail_at_) throw Error(cat("injected failure at ring exchange ", sends_, " on rank ", rank()));
    return ForwardingComm::exchange(parts, dst, src, dtype, stream);
  }

 private:
  int fail_at_;
  int sends_ = 0;
};

TEST(CpFailures, RankFailingMidRingFailsTheOthersFast) {
  const int cp_size = 4;
  const auto timeout = std::chrono::milliseconds(10000);
  const uint64_t seed = testing::fresh_seed();
  std::vector<std::string> seen(cp_size);
  const auto start = std::chrono::steady_clock::now();
  std::string root;
  try {
    comm::run_ranks(cp_size, timeout, [&](comm::Communicator& c) {
      // Rank 2 fails at its 2nd exchange of the backward ring (the forward ring makes cp-1 = 3 of them).
      FailingComm fc(c, c.rank() == 2 ? 3 + 2 : -1);
      const cp::ZigzagLayout l(cp_size, c.rank(), 40);
      const int64_t len = l.local_len();
      std::mt19937_64 rng(seed + c.rank());
      auto make = [&](int64_t heads) { return Tensor::empty({1, len, heads, 32}, DType::F32); };
      const Tensor q = make(2), k = make(1), v = make(1), dout = make(2);
      for (const Tensor* t : {&q, &k, &v, &dout}) testing::fill_normal(*t, rng);
      const Tensor o = make(2), dq = make(2), dk = make(1), dv = make(1);
      const Tensor lse = Tensor::empty({1, 2, len}, DType::F32);
      const auto params = attention::params_for(q, k, attention::MaskType::CausalTopLeft);
      attention::AttnForwardArgs fa;
      fa.q = q;
      fa.k = k;
      fa.v = v;
      fa.o = o;
      fa.lse = lse;
      attention::AttnBackwardArgs ba;
      ba.q = q;
      ba.k = k;
      ba.v = v;
      ba.o = o;
      ba.dout = dout;
      ba.lse = lse;
      ba.dq = dq;
      ba.dk = dk;
      ba.dv = dv;
      try {
        cp::attention_forward(fc, {}, params, fa, 40);
        cp::attention_backward(fc, {}, params, ba, 40);
      } catch (const std::exception& e) {
        seen[c.rank()] = e.what();
        throw;
      }
    });
  } catch (const Error& e) {
    root = e.what();
  }
  const double elapsed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(root.find("rank 2: injected failure at ring exchange 5 on rank 2"), std::string::npos) << root;
  for (int r : {0, 1, 3}) EXPECT_NE(seen[r].find("rank 2 failed: injected failure"), std::string::npos) << seen[r];
  EXPECT_LT(elapsed_ms, 3000) << "the others should fail at once, not at the " << timeout.count() << " ms timeout";
}

}  // namespace
}  // namespace ringtrain
