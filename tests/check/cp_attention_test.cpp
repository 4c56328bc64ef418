// Context-parallel attention (ring, all-gather and all-to-all) against the single-rank fp64 math reference on the unsharded
// sequence: O, LSE, dQ, dK, dV for cp 1..8, causal and not, MHA/GQA/MQA, head dims 32/64/128, lengths that need
// padding (whole chunks of padding included), with the CPU flash and math backends as the per-block backend.
// Sliding windows (all-gather and all-to-all; the ring at cp = 1) against the fp64 math backend without a mask, the
// window written out as a dense -inf bias by Hugging Face's rule (window_reference.h): windows of one key, inside a
// chunk, across chunk boundaries, spanning several chunks, and covering the sequence.
#include <gtest/gtest.h>

#include "ringtrain/attention/cpu/cpu_backends.h"
#include "ringtrain/attention/selection.h"
#include "ringtrain/check/attention_check.h"
#include "root_list_guard.h"
#include "test_util.h"
#include "window_reference.h"

namespace ringtrain {
namespace {

using attention::BackendId;
using cp::CpComm;

struct Case {
  int cp;
  CpComm comm;
  bool causal;
  int64_t batch, seq, heads_q, heads_kv, head_dim;
  BackendId block_backend;
  DType dtype = DType::F32;
  bool keep_kv = true;  // the ring backward starts on the forward's last block, or fetches it
  int64_t window = 0;
};

std::string case_name(const Case& c) {
  const char* heads = c.heads_kv == c.heads_q ? "mha" : (c.heads_kv == 1 ? "mqa" : "gqa");
  return cat("cp", c.cp, "_", cp::cp_comm_name(c.comm), c.causal ? "_causal_" : "_full_", heads, "_d", c.head_dim,
             "_S", c.seq, "_B", c.batch, "_", attention::backend_name(c.block_backend), "_", dtype_name(c.dtype),
             c.keep_kv ? "" : "_fetch", c.window > 0 ? cat("_w", c.window) : std::string());
}

void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

std::vector<Case> cases() {
  std::vector<Case> out;
  // The grid, with head dim, length (divisible by 2cp or not), batch and block backend rotating through it.
  const int64_t dims[3] = {32, 64, 128};
  const int64_t heads[3][2] = {{4, 4}, {4, 2}, {4, 1}};
  int n = 0;
  for (int cp : {1, 2, 3, 4, 8})
    for (CpComm comm : {CpComm::Ring, CpComm::AllGather})
      for (bool causal : {true, false})
        for (const auto& h : heads) {
          const int64_t seq = n % 2 == 0 ? 2 * cp * 5 : 2 * cp * 4 + 1 + n % 7;
          out.push_back({cp, comm, causal, 1 + n % 2, seq, h[0], h[1], dims[n % 3],
                         n % 4 < 2 ? BackendId::Flash : BackendId::Math, DType::F32, n % 5 != 4});
          ++n;
        }
  // Padding edge cases: a long ragged sequence, the last chunk partly padded, whole chunks of padding, and ranks
  // with no valid token at all.
  for (CpComm comm : {CpComm::Ring, CpComm::AllGather}) {
    out.push_back({3, comm, true, 1, 1000, 2, 1, 64, BackendId::Flash});
    for (bool causal : {true, false}) {
      out.push_back({8, comm, causal, 2, 37, 4, 2, 32, BackendId::Flash});
      out.push_back({8, comm, causal, 1, 10, 2, 2, 64, BackendId::Math});
      out.push_back({8, comm, causal, 1, 3, 2, 1, 32, BackendId::Flash});
    }
    // bf16 inputs: the running O/LSE stay fp32, outputs and gradients are rounded to bf16 once; every ring backward
    // hop dtype (cp 2: one bf16 share; 3: bf16 then fp32; 4: and fp32 to fp32).
    for (int cp : {2, 3, 4}) out.push_back({cp, comm, true, 1, 90, 4, 2, 64, BackendId::Flash, DType::BF16});
  }
  out.push_back({3, CpComm::Ring, true, 1, 90, 4, 2, 64, BackendId::Flash, DType::BF16, /*keep_kv=*/false});
  // All-to-all (Ulysses): heads split over ranks, so both head counts are multiples of cp; GQA and MHA, padding.
  for (int cp : {1, 2, 3, 4, 8})
    for (bool causal : {true, false}) {
      out.push_back({cp, CpComm::AllToAll, causal, 1 + cp % 2, 2 * cp * 4 + cp % 3, 2 * cp, cp, 32,
                     cp % 2 ? BackendId::Math : BackendId::Flash});
      out.push_back({cp, CpComm::AllToAll, causal, 1, 2 * cp * 3, cp, cp, 64, BackendId::Flash});
    }
  out.push_back({8, CpComm::AllToAll, true, 1, 10, 8, 8, 32, BackendId::Flash});  // whole chunks of padding
  out.push_back({4, CpComm::AllToAll, true, 1, 90, 8, 4, 64, BackendId::Flash, DType::BF16});
  // Sliding windows, by the chunk length c = ceil(S / 2cp): one key, inside a chunk, a chunk and a bit, several
  // chunks, and longer than the sequence (no mask left), on lengths with and without padding.
  int m = 0;
  for (int cp : {1, 2, 3, 4, 8})
    for (CpComm comm : {CpComm::AllGather, CpComm::AllToAll}) {
      const int64_t seq = m % 2 == 0 ? 2 * cp * 6 : 2 * cp * 5 + 3, c = (seq + 2 * cp - 1) / (2 * cp);
      for (int64_t w : {int64_t{1}, c - 2, c + 3, 3 * c + 1, seq + 5}) {
        const int64_t hq = comm == CpComm::AllToAll ? 2 * cp : 4, hkv = comm == CpComm::AllToAll ? cp : 2;
        out.push_back({cp, comm, true, 1 + m % 2, seq, hq, hkv, m % 3 == 2 ? 64 : 32,
                       m % 2 ? BackendId::Math : BackendId::Flash, DType::F32, true, w});
        ++m;
      }
    }
  out.push_back({1, CpComm::Ring, true, 1, 29, 4, 2, 32, BackendId::Flash, DType::F32, true, 6});
  out.push_back({3, CpComm::AllGather, true, 1, 90, 4, 2, 64, BackendId::Flash, DType::BF16, true, 20});
  out.push_back({2, CpComm::AllToAll, true, 1, 90, 4, 2, 64, BackendId::Flash, DType::BF16, true, 20});
  return out;
}

// The fp64 math backend over the whole sequence with the window (causal, top-left) as a dense bias.
check::AttnResults bias_window_reference(const check::AttnProblem& prob, const check::AttnInputs& in) {
  const testing::WindowReference r = testing::window_bias_reference(prob.params(in.q, in.k), in.q, in.k, in.v, in.dout);
  return {r.o, r.lse, r.dq, r.dk, r.dv};
}

class CpParity : public ::testing::TestWithParam<Case> {};

TEST_P(CpParity, MatchesTheSingleRankReference) {
  const Case& c = GetParam();
  const check::AttnProblem prob{c.batch, c.seq, c.heads_q, c.heads_kv, c.head_dim, c.causal, c.dtype, c.window};
  const check::AttnInputs in = check::random_inputs(prob, testing::fresh_seed());
  const check::AttnResults ref =
      c.window > 0 ? bias_window_reference(prob, in) : check::reference_attention(prob, in);

  testing::RootListGuard guard;
  attention::set_root_backends({c.block_backend}, "test");
  attention::reset_dispatch_counts();
  check::CpRunOptions opt;
  opt.cp = c.cp;
  opt.config.comm = c.comm;
  opt.timeout = std::chrono::milliseconds(60000);
  opt.keep_kv = c.keep_kv;
  const check::AttnResults got = check::cp_attention_on_ranks(prob, in, opt);
  const attention::DispatchCounts counts = attention::dispatch_counts();

  // fp32: flash accumulates in fp32 (relative error about sqrt(S) * 2^-24 per dot product, a few 1e-7 here) and
  // the per-step merges add a few fp32 roundings; 1e-5 leaves an order of magnitude of margin and still catches
  // any wrong mask, block or merge (those give errors of order 1e-2 or more). bf16: results rounded to 8 mantissa
  // bits (relative 2^-9 = 2e-3 per element), so 1e-2.
  const double tol = c.dtype == DType::F32 ? 1e-5 : 1e-2;
  EXPECT_LE(testing::rel_error(got.o, ref.o), tol) << "O";
  EXPECT_LE(testing::rel_error(got.lse, ref.lse), tol) << "LSE";
  EXPECT_LE(testing::rel_error(got.dq, ref.dq), tol) << "dQ";
  EXPECT_LE(testing::rel_error(got.dk, ref.dk), tol) << "dK";
  EXPECT_LE(testing::rel_error(got.dv, ref.dv), tol) << "dV";
  // Every block call went through the selection and ran the one allowed backend.
  const int chosen = static_cast<int>(c.block_backend);
  EXPECT_GT(counts.forward[chosen], 0);
  EXPECT_GT(counts.backward[chosen], 0);
  EXPECT_EQ(counts.total(), counts.forward[chosen] + counts.backward[chosen]) << format_dispatch_counts(counts);
}

INSTANTIATE_TEST_SUITE_P(Grid, CpParity, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace ringtrain
