// The check layer's harness against hand-computed cases: medians of timed runs, the error measure (NaN never
// passes), the parity report, and one whole-sequence run on a device against the fp64 reference.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include "ringtrain/attention/selection.h"
#include "ringtrain/check/attention_check.h"
#include "ringtrain/check/timing.h"
#include "test_util.h"

namespace ringtrain {
namespace {

TEST(TimedRuns, MediansOfMarksAndOfPhases) {
  check::TimedRuns runs;
  runs.ms = {{1, 3}, {2, 10}, {5, 6}};
  EXPECT_EQ(runs.marks(), 2u);
  EXPECT_DOUBLE_EQ(runs.median_to(0), 2);        // of 1, 2, 5
  EXPECT_DOUBLE_EQ(runs.median_to(1), 6);        // of 3, 10, 6
  EXPECT_DOUBLE_EQ(runs.median_between(0, 1), 2);  // of 2, 8, 1
  EXPECT_THROW(check::median({}), Error);
}

TEST(TimedRuns, HostClockCountsRunsAndMeasuresEachPhase) {
  int calls = 0;
  // The second phase sleeps 20 ms: a lower bound that holds on a loaded machine (sleep never returns early).
  const check::TimedRuns runs =
      check::time_runs(Device::cpu(), nullptr, 2, 3, [&](int iteration, check::DeviceClock& clock) {
        EXPECT_EQ(iteration, calls);
        ++calls;
        clock.mark();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      });
  EXPECT_EQ(calls, 5);
  ASSERT_EQ(runs.ms.size(), 3u);
  for (const auto& run : runs.ms) {
    ASSERT_EQ(run.size(), 2u);  // the step's mark, then the end of the run
    EXPECT_GE(run[0], 0);
    EXPECT_LE(run[0], run[1]);
  }
  EXPECT_GE(runs.median_between(0, 1), 20.0);
  EXPECT_THROW(check::time_runs(Device::cpu(), nullptr, 0, 0, [](int, check::DeviceClock&) {}), Error);
}

TEST(RelativeError, HandComputedNanAndInfinities) {
  float got[2] = {1, 2}, ref[2] = {1, 1};
  const TensorView g = contiguous_view(got, DType::F32, Device::cpu(), {2});
  const TensorView r = contiguous_view(ref, DType::F32, Device::cpu(), {2});
  EXPECT_NEAR(check::relative_error(g, r), std::sqrt(0.5), 1e-12);  // ||(0, 1)|| / ||(1, 1)||
  got[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isinf(check::relative_error(g, r)));
  got[1] = ref[1] = -std::numeric_limits<float>::infinity();  // LSE of a row with no key, on both sides
  EXPECT_DOUBLE_EQ(check::relative_error(g, r), 0.0);
  got[1] = 0;
  EXPECT_TRUE(std::isinf(check::relative_error(g, r)));
  float other[3] = {0, 0, 0};
  EXPECT_THROW(check::relative_error(contiguous_view(other, DType::F32, Device::cpu(), {3}), r), Error);
}

TEST(ParityReport, NanFailsAndTheMaximumIsReported) {
  check::ParityReport r;
  r.rows = {{"O", 1e-4, 1e-3}, {"LSE", 5e-4, 1e-3}};
  EXPECT_TRUE(r.pass());
  EXPECT_DOUBLE_EQ(r.max_error(), 5e-4);
  r.rows.push_back({"dQ", std::numeric_limits<double>::quiet_NaN(), 1e-3});
  EXPECT_FALSE(r.pass());
  EXPECT_TRUE(std::isnan(r.max_error()));
}

// The selected CPU backend on the whole sequence (attention_on_device) against the fp64 reference, outputs poisoned
// first. fp32: only accumulation order differs, ~1e-7 relative; 1e-5 leaves room for long rows.
TEST(AttentionOnDevice, CpuBackendMatchesTheFp64Reference) {
  const check::AttnProblem prob{2, 37, 4, 2, 16, true, DType::F32};
  const check::AttnInputs in = check::random_inputs(prob, testing::fresh_seed());
  const check::AttnResults got = check::attention_on_device(prob, in, Device::cpu());
  const check::AttnResults ref = check::reference_attention(prob, in);
  const check::ParityReport parity = check::compare(got, ref, 1e-5);
  for (const auto& row : parity.rows) EXPECT_LE(row.error, 1e-5) << row.name;
  EXPECT_TRUE(parity.pass());
  EXPECT_GT(check::relative_error(got.o, ref.o), 0.0) << "the run must not be the reference itself";
}

TEST(AttnProblem, FlopsAsTheTorchComparisonCountsThem) {
  check::AttnProblem p{2, 1024, 8, 2, 64, false, DType::BF16};
  EXPECT_DOUBLE_EQ(p.forward_flops(), 4.0 * 2 * 8 * 1024.0 * 1024 * 64);
  p.causal = true;
  EXPECT_DOUBLE_EQ(p.forward_flops(), 2.0 * 2 * 8 * 1024.0 * 1024 * 64);
}

}  // namespace
}  // namespace ringtrain
