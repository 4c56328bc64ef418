// The multi-rank helpers of test_util.h, apart because they need the comm layer's launcher: linked only into the
// test programs of comm and the layers above.
#include <cstdlib>
#include <random>

#include "ringtrain/comm/launch.h"
#include "test_util.h"

namespace ringtrain::testing {

bool inside_rank() { return std::getenv("RANK") != nullptr; }

int run_ranks_of_this_program(const std::string& filter, int nproc, std::chrono::milliseconds grace) {
  comm::LaunchOptions o;
  o.nproc = nproc;
  o.master_port = 31000 + static_cast<int>(std::random_device{}() % 20000);
  o.grace = grace;
  return comm::launch_local(o, {"/proc/self/exe", "--gtest_filter=" + filter}).code;
}

}  // namespace ringtrain::testing
