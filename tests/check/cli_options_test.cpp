// The command line refuses bad sizes when it parses them: every numeric option has a range, shape products are
// checked, named choices are validated by the parsers of the lower layers. Each case must exit non-zero with a
// message that names the option (or the product) and the value.
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

namespace ringtrain {
namespace {

using testing::CliResult;
using testing::run_cli;

struct BadInput {
  const char* args;
  const char* message;  // a part of the expected message
};

TEST(CliOptions, BadSizesAreRefusedWithTheOptionNamed) {
  const BadInput cases[] = {
      {"attention-check --seq 9223372036854775807", "--seq: Value 9223372036854775807 not in range"},
      {"launch --nproc 2147483647 -- true", "--nproc: Value 2147483647 not in range"},
      {"init-model --layers 1000000000 --out /nonexistent/x", "--layers: Value 1000000000 not in range"},
      {"backends --heads -3", "--heads: Value -3 not in range"},
      {"backends --head-dim 0", "--head-dim: Value 0 not in range"},
      {"attention-check --cp 0", "--cp: Value 0 not in range"},
      {"bench attention --seq 4096,-1", "--seq: Value -1 not in range"},
      {"bench cp --iters 0", "--iters: Value 0 not in range"},
      {"bench model --seq 1", "--seq: Value 1 not in range"},
      {"logprobs --model m --data d --timeout 0", "--timeout: Value 0 not in range"},
      // Text that is no integer is said to be one, not called out of range.
      {"logprobs --model m --data d --timeout 1e3", "--timeout: Value 1e3 is not an integer"},
      {"backends --heads 7.0", "--heads: Value 7.0 is not an integer"},
      {"logprobs --model m --data d --model-backends flash,nope", "unknown attention backend 'nope'"},
      {"attention-check --comm ringg", "unknown context-parallel communication 'ringg'"},
      {"backends --dtype fp8", "--dtype"},
      {"backends --batch 99999999999999999999", "--batch"},
      // Each size within its range, their product past 64 bits.
      {"backends --batch 65536 --seq 1073741824 --heads 4096 --head-dim 1024", "overflows 64 bits"},
      {"backends --heads 6 --kv-heads 4", "--heads (6) must be a multiple of --kv-heads (4)"},
  };
  for (const BadInput& c : cases) {
    const CliResult r = run_cli(c.args);
    EXPECT_NE(r.code, 0) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << ": missing '" << c.message << "' in\n"
                                                           << r.output;
  }
}

TEST(CliOptions, CommAliasAndTheRootAllowList) {
  // --comm is --cp-comm's other name; --backends narrows the root list that the report prints.
  const CliResult r = run_cli("backends --device cpu --dtype fp32 --heads 4 --head-dim 32 --seq 64 --cp 2 "
                              "--backends math");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("root [math] (--backends)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("selected: math"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ringtrain
