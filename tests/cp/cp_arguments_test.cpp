// CP attention refuses what it cannot do with a clear message: all-to-all with heads not divisible by cp, a local
// shard of the wrong length, packed sequences and an additive bias through the dense entry points, and a sliding
// window in ring attention over several ranks.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "ringtrain/attention/selection.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/core/error.h"
#include "ringtrain/cp/cp_attention.h"

namespace ringtrain {
namespace {

using cp::CpComm;

// Calls the CP forward on one in-process rank and returns its error message ("" if it ran).
std::string cp_forward_error(const attention::AttnParams& p, const attention::AttnForwardArgs& a, int64_t global_len) {
  try {
    comm::run_ranks(1, std::chrono::milliseconds(5000), [&](comm::Communicator& c) {
      cp::attention_forward(c, {}, p, a, global_len);
    });
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CpArguments, AllToAllNeedsHeadsDivisibleByCp) {
  try {
    comm::run_ranks(2, std::chrono::milliseconds(5000), [&](comm::Communicator& c) {
      const Tensor q = Tensor::empty({1, 4, 4, 32}, DType::F32), kv = Tensor::empty({1, 4, 1, 32}, DType::F32);
      const Tensor o = Tensor::empty({1, 4, 4, 32}, DType::F32), lse = Tensor::empty({1, 4, 4}, DType::F32);
      cp::CpConfig cfg;
      cfg.comm = CpComm::AllToAll;
      cp::attention_forward(c, cfg, attention::params_for(q, kv, attention::MaskType::None), {q, kv, kv, o, lse}, 8);
    });
    FAIL() << "MQA cannot split one kv head over 2 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv heads (1) must both be divisible by cp=2"), std::string::npos) << e.what();
  }
}

TEST(CpArguments, PackedAndWrongLengthsAreRejectedClearly) {
  const Tensor q = Tensor::empty({1, 10, 2, 32}, DType::F32), o = Tensor::empty({1, 10, 2, 32}, DType::F32);
  const Tensor lse = Tensor::empty({1, 2, 10}, DType::F32);
  attention::AttnForwardArgs a;
  a.q = a.k = a.v = q;
  a.o = o;
  a.lse = lse;
  attention::AttnParams p = attention::params_for(q, q, attention::MaskType::CausalTopLeft);
  // cp = 1 holds 2 chunks of ceil(S / 2): S = 10 needs 10 local rows, S = 7 needs 8.
  EXPECT_EQ(cp_forward_error(p, a, 10), "");
  const std::string wrong_len = cp_forward_error(p, a, 7);
  EXPECT_NE(wrong_len.find("local shard has Sq=10 Skv=10, expected 8"), std::string::npos) << wrong_len;
  p.packed = true;
  const std::string packed = cp_forward_error(p, a, 10);
  EXPECT_NE(packed.find("packed sequences (THD) go through cp::packed_attention_forward/backward"), std::string::npos)
      << packed;
  p.packed = false;
  p.has_bias = true;
  a.bias = Tensor::empty({1, 2, 10, 10}, DType::F32);
  const std::string bias = cp_forward_error(p, a, 10);
  EXPECT_NE(bias.find("an additive attention bias is not supported under context parallelism"), std::string::npos)
      << bias;
  p.has_bias = false;
  a.bias = {};
  p.window = 4;
  EXPECT_EQ(cp_forward_error(p, a, 10), "");  // one rank: the ring's own block is the whole sequence
}

// The error of a CP forward with a sliding window over 12 tokens on 2 ranks ("" if it ran).
std::string windowed_error(CpComm comm, int64_t window, int64_t heads_kv = 2) {
  try {
    comm::run_ranks(2, std::chrono::milliseconds(5000), [&](comm::Communicator& c) {
      const Tensor q = Tensor::zeros({1, 6, 2, 32}, DType::F32), kv = Tensor::zeros({1, 6, heads_kv, 32}, DType::F32);
      const Tensor o = Tensor::empty({1, 6, 2, 32}, DType::F32), lse = Tensor::empty({1, 2, 6}, DType::F32);
      attention::AttnParams p = attention::params_for(q, kv, attention::MaskType::CausalTopLeft);
      p.window = window;
      cp::CpConfig cfg;
      cfg.comm = comm;
      cp::attention_forward(c, cfg, p, {q, kv, kv, o, lse}, 12);
    });
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CpArguments, RingAttentionOverSeveralRanksRefusesASlidingWindow) {
  EXPECT_EQ(windowed_error(CpComm::AllGather, 4), "");
  EXPECT_EQ(windowed_error(CpComm::AllToAll, 4), "");
  const std::string ring = windowed_error(CpComm::Ring, 4);
  for (const char* part : {"ring attention forward: a sliding window (cpu fp32 B=1 Hq=2 Hkv=2 D=32 Sq=6 Skv=6 "
                           "mask=causal_top_left window=4) is not supported by ring attention",
                           "parallel.cp_comm or --cp-comm = allgather or a2a"})
    EXPECT_NE(ring.find(part), std::string::npos) << ring;
  // A window as long as the sequence hides nothing: the ring runs it.
  EXPECT_EQ(windowed_error(CpComm::Ring, 12), "");
  // All-to-all that cannot split the heads points to all-gather only, the ring refusing the window.
  const std::string a2a = windowed_error(CpComm::AllToAll, 4, /*heads_kv=*/1);
  EXPECT_NE(a2a.find("kv heads (1) must both be divisible by cp=2 (use allgather: ring takes no sliding window)"),
            std::string::npos)
      << a2a;
}

}  // namespace
}  // namespace ringtrain
