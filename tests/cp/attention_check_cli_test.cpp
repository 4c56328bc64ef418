// `ringtrain attention-check` end to end: a passing CP run exits 0 with every error printed, and --device cuda
// where no GPU can be used exits 2 with the reason.
#include <gtest/gtest.h>

#include <string>

#include "ringtrain/core/error.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using testing::CliResult;
using testing::run_cli;

TEST(AttentionCheckCli, RaggedAllGatherRunPassesAndReportsEverything) {
  const CliResult r = run_cli(cat("attention-check --cp 3 --seq 50 --comm allgather --causal --heads 4 --kv-heads 2 ",
                                  "--head-dim 32 --seed ", testing::fresh_seed() | 1));
  EXPECT_EQ(r.code, 0) << r.output;
  for (const char* want : {"flash      SELECTED", "context-parallel cp=3", "dispatches: flash: fwd 6 bwd 6",
                           "O    relative", "LSE  relative", "dQ   relative", "dK   relative", "dV   relative",
                           "attention-check: PASS"})
    EXPECT_NE(r.output.find(want), std::string::npos) << "missing '" << want << "' in\n" << r.output;
}

TEST(AttentionCheckCli, SlidingWindowPassesWithAllGatherAndAllToAllAndTheRingRefusesIt) {
  for (const char* comm : {"allgather", "a2a"}) {
    const CliResult r = run_cli(cat("attention-check --cp 3 --seq 61 --comm ", comm, " --causal --window 13 --heads 6 ",
                                    "--kv-heads 3 --head-dim 32 --seed ", testing::fresh_seed() | 1));
    EXPECT_EQ(r.code, 0) << r.output;
    for (const char* want : {"causal window=13 on cpu", "mask=causal_top_left window=13", "attention-check: PASS"})
      EXPECT_NE(r.output.find(want), std::string::npos) << "missing '" << want << "' in\n" << r.output;
  }
  const CliResult ring = run_cli("attention-check --cp 2 --seq 40 --causal --window 13");
  EXPECT_EQ(ring.code, 1) << ring.output;
  EXPECT_NE(ring.output.find("is not supported by ring attention"), std::string::npos) << ring.output;
  const CliResult unmasked = run_cli("attention-check --cp 2 --seq 40 --comm allgather --window 13");
  EXPECT_EQ(unmasked.code, 1) << unmasked.output;
  EXPECT_NE(unmasked.output.find("--window 13 needs a causal mask (--causal)"), std::string::npos) << unmasked.output;
}

TEST(AttentionCheckCli, NoBackendAllowedExitsTwoWithReasons) {
  const CliResult r = run_cli("attention-check --cp 2 --seq 16 --backends cudnn,efficient");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("no attention backend can serve the blocks"), std::string::npos) << r.output;
}

TEST(AttentionCheckCli, CudaWithoutGpuExitsTwo) {
  const std::string why = cuda_unavailable_reason();
  if (why.empty()) GTEST_SKIP() << "a GPU is usable here; this test covers machines without one";
  const CliResult r = run_cli("attention-check --device cuda --cp 1 --seq 64");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(why), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ringtrain
