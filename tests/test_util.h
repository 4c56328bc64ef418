// Shared by all test programs: fresh random inputs (seed printed, RINGTRAIN_TEST_SEED to replay), poisoned
// outputs, and error measures where NaN never passes.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ringtrain/core/device_info.h"
#include "ringtrain/core/tensor.h"

namespace ringtrain::testing {

// A new seed per call unless RINGTRAIN_TEST_SEED is set; printed so a failure can be replayed.
uint64_t fresh_seed();
// Fills a host tensor with N(0, stddev) values drawn from rng.
void fill_normal(const TensorView& t, std::mt19937_64& rng, double stddev = 1.0);
// Writes NaN into every element so that an element a kernel forgets to write fails the comparison.
void poison(const TensorView& t);

// ||a - b||_2 / ||b||_2 over all elements (b the reference); +inf if any element of a is NaN or inf while
// b's is finite, or if the shapes differ. A reference of all zeros compares by the absolute norm of a.
double rel_error(const TensorView& a, const TensorView& b);
// max |a - b| over elements, NaN-poisoned: +inf if any element is NaN.
double max_abs_error(const TensorView& a, const TensorView& b);
// max |a - b| over per-sequence values (logprobs of sequences of different lengths): +inf for a NaN or when the
// sequence counts or lengths differ.
double max_ragged_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b);

// Multi-GPU tests: a parent test starts this test program once per rank through comm::launch_local (the code of
// `ringtrain launch`), and the per-rank tests run only inside those ranks (where RANK is set).
bool inside_rank();
// Runs the tests matching `filter` in `nproc` ranks of this program on a fresh port; the launcher's exit status.
// grace: how long the launcher lets the other ranks finish after one has failed.
int run_ranks_of_this_program(const std::string& filter, int nproc = 2,
                              std::chrono::milliseconds grace = std::chrono::milliseconds(5000));

// A fresh, empty folder under the system's temporary directory (PREFIX_PID_N), removed with everything in it when the
// object goes, so that test runs leave nothing behind.
struct TempDir {
  explicit TempDir(const std::string& prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path path;
};

// The ringtrain program the tests run: $RINGTRAIN_CLI when set (binaries carried to another machine, where the build
// folder's path does not exist), else the one this build made.
std::string cli_program();
// Runs the ringtrain program (cli_program()) with `args` through the shell; stdout and stderr together.
struct CliResult {
  int code = -1;  // the exit status; -1 when it did not exit normally
  std::string output;
};
// With `pipe_in`, that file reaches the program's standard input through a pipe (`cat FILE | ringtrain ARGS`).
CliResult run_cli(const std::string& args, const std::string& pipe_in = "");

}  // namespace ringtrain::testing

// Skips the current GoogleTest test, with the reason, when no CUDA GPU can be used.
#define RT_REQUIRE_GPU()                                                                  \
  do {                                                                                   \
    if (const std::string why = ::ringtrain::cuda_unavailable_reason(); !why.empty())   \
      GTEST_SKIP() << "GPU test skipped: " << why;                                       \
  } while (0)
