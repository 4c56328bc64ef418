// Rank variables from each launcher, the TCP rendezvous (ranks as threads on loopback), and `ringtrain launch`
// (real processes: variables set per rank, a failing rank stops the others).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "ringtrain/comm/communicator.h"
#include "ringtrain/comm/launch.h"
#include "ringtrain/comm/rendezvous.h"
#include "test_util.h"

namespace ringtrain::comm {
namespace {

int free_port() {
  // A port in the dynamic range, different per test run so parallel CTest runs do not collide.
  static std::mt19937 rng(std::random_device{}());
  return 30000 + static_cast<int>(rng() % 20000);
}

TEST(RankInfo, ReadsEachLaunchersVariables) {
  auto t = rank_info_from({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.0.0.2"},
                           {"MASTER_PORT", "1234"}});
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.world, 4);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.master_addr, "10.0.0.2");
  EXPECT_EQ(t.master_port, 1234);
  EXPECT_EQ(t.source, "torchrun");
  auto m = rank_info_from({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  EXPECT_EQ(m.rank, 5);
  EXPECT_EQ(m.world, 8);
  EXPECT_EQ(m.local_rank, 1);
  EXPECT_EQ(m.source, "openmpi");
  auto s = rank_info_from({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "2"}});
  EXPECT_EQ(s.rank, 2);
  EXPECT_EQ(s.world, 16);
  EXPECT_EQ(s.source, "slurm");
  auto one = rank_info_from({});
  EXPECT_EQ(one.world, 1);
  EXPECT_EQ(one.source, "single process");
}

TEST(RankInfo, BadValuesNameTheVariable) {
  try {
    rank_info_from({{"RANK", "x"}, {"WORLD_SIZE", "2"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RANK='x'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(rank_info_from({{"RANK", "2"}, {"WORLD_SIZE", "2"}}), Error);
  EXPECT_THROW(rank_info_from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}), Error);
}

TEST(Rendezvous, EveryRankGetsRankZerosPayload) {
  const int world = 4, port = free_port();
  std::vector<uint8_t> payload(128);
  std::mt19937 rng(std::random_device{}());
  for (auto& b : payload) b = static_cast<uint8_t>(rng());
  std::vector<std::vector<uint8_t>> got(world);
  std::vector<std::thread> ts;
  for (int r = world - 1; r >= 0; --r)  // rank 0 last: the others must retry until it listens
    ts.emplace_back([&, r] {
      RankInfo info;
      info.rank = r;
      info.world = world;
      info.master_port = port;
      got[r] = rendezvous_broadcast(info, r == 0 ? payload : std::vector<uint8_t>{}, std::chrono::seconds(20));
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(got[r], payload) << "rank " << r;
}

TEST(Rendezvous, MissingRankTimesOutNamingIt) {
  RankInfo info;
  info.world = 3;
  info.master_port = free_port();
  std::thread one([&] {
    RankInfo r1 = info;
    r1.rank = 1;
    try {
      rendezvous_broadcast(r1, {}, std::chrono::milliseconds(1500));
    } catch (const CommError&) {
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  try {
    rendezvous_broadcast(info, {1, 2, 3}, std::chrono::milliseconds(1000));
    FAIL() << "rank 2 never joins";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("waiting for rank(s) 2 of 3"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  one.join();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(Launch, EachRankGetsItsVariables) {
  const testing::TempDir tmp("rt_launch");
  const std::string dir = tmp.path.string();
  LaunchOptions o;
  o.nproc = 3;
  o.master_port = 29611;
  const std::string script = std::string("echo \"$RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR $MASTER_PORT ") +
                             "$NCCL_NVLS_ENABLE\" > " + dir + "/rank$RANK";
  ASSERT_EQ(launch_local(o, {"sh", "-c", script}).code, 0);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(read_file(std::string(dir) + "/rank" + std::to_string(r)),
              std::to_string(r) + " 3 " + std::to_string(r) + " 127.0.0.1 29611 0\n");
}

TEST(Launch, FailingRankStopsTheOthersQuickly) {
  LaunchOptions o;
  o.nproc = 3;
  o.grace = std::chrono::milliseconds(500);
  const auto t0 = std::chrono::steady_clock::now();
  // Rank 1 fails at once with code 7; ranks 0 and 2 would sleep for a minute.
  const LaunchResult r = launch_local(o, {"sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 7; fi; sleep 60"});
  EXPECT_EQ(r.code, 7);
  EXPECT_EQ(r.signal, 0) << "a failing rank is no signal to end by";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

// A rank that dies first leaves a child of its own (a wrapper script's worker) behind: the stop reaches it too.
TEST(Launch, AFailedRanksOwnChildrenAreStoppedToo) {
  const testing::TempDir tmp("rt_launch_orphan");
  const std::string child_file = (tmp.path / "child").string();
  LaunchOptions o;
  o.nproc = 2;
  o.grace = std::chrono::milliseconds(500);
  const std::string script = "if [ \"$RANK\" = 1 ]; then sleep 60 & echo $! > " + child_file +
                             "; sleep 0.2; kill -9 $$; fi; sleep 60";
  const auto t0 = std::chrono::steady_clock::now();
  const LaunchResult r = launch_local(o, {"sh", "-c", script});
  EXPECT_EQ(r.code, 128 + SIGKILL);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  const pid_t child = static_cast<pid_t>(std::stol(read_file(child_file)));
  ASSERT_GT(child, 1);
  // Gone, or a zombie that nobody reaps (the orphan's new parent may be a container's init that does not).
  const auto running = [&] {
    std::ifstream stat("/proc/" + std::to_string(child) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return false;
    const size_t end = line.rfind(')');
    return end == std::string::npos || end + 2 >= line.size() || line[end + 2] != 'Z';
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (running() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(running()) << "rank 1's child " << child << " outlived the launch";
}

TEST(Launch, SignalToTheLauncherStopsTheRanks) {
  LaunchOptions o;
  o.nproc = 2;
  o.grace = std::chrono::milliseconds(500);
  std::thread killer([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // launch_local's handler is installed by then
    ::kill(::getpid(), SIGTERM);
  });
  const auto t0 = std::chrono::steady_clock::now();
  const LaunchResult r = launch_local(o, {"sleep", "60"});
  killer.join();
  EXPECT_EQ(r.code, 128 + SIGTERM);
  EXPECT_EQ(r.signal, SIGTERM);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

// A signal while the launcher stops the others after a rank failed is still the one to end by (the user interrupted),
// the failing rank's code kept for a caller that ignores the signal.
TEST(Launch, ASignalWhileARankFailureStopsTheOthersIsStillTheOneToEndBy) {
  LaunchOptions o;
  o.nproc = 2;
  o.grace = std::chrono::milliseconds(3000);
  // Rank 1 fails after a second, when rank 0 has long ignored SIGTERM: the ranks still run at the SIGINT (2 s).
  std::thread killer([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2000));
    ::kill(::getpid(), SIGINT);
  });
  const LaunchResult r =
      launch_local(o, {"sh", "-c", "if [ \"$RANK\" = 1 ]; then sleep 1; exit 7; fi; trap '' TERM; sleep 60"});
  killer.join();
  EXPECT_EQ(r.code, 7);
  EXPECT_EQ(r.signal, SIGINT);
}

// Ranks that take SIGTERM as a request to stop get stop_grace to do so; ranks that ignore it are killed after it, or
// at once on a second signal to the launcher.
TEST(Launch, RanksThatIgnoreTheStopAreKilledAfterTheStopGraceOrAtASecondSignal) {
  const std::vector<std::string> deaf = {"sh", "-c", "trap '' TERM; sleep 60"};
  for (const bool twice : {false, true}) {
    LaunchOptions o;
    o.nproc = 2;
    o.stop_grace = twice ? std::chrono::milliseconds(600000) : std::chrono::milliseconds(1000);
    std::thread killer([twice] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ::kill(::getpid(), SIGINT);
      if (!twice) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ::kill(::getpid(), SIGINT);
    });
    const auto t0 = std::chrono::steady_clock::now();
    const LaunchResult r = launch_local(o, deaf);
    killer.join();
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(r.code, 128 + SIGINT) << "twice " << twice;
    EXPECT_EQ(r.signal, SIGINT) << "twice " << twice;
    // Not before the grace (once), well before the minute the ranks would sleep.
    if (!twice) EXPECT_GE(took, std::chrono::milliseconds(1400));
    EXPECT_LT(took, std::chrono::seconds(15)) << "twice " << twice;
  }
}

// `nohup ringtrain launch ...`: a SIGHUP the launcher was started ignoring leaves the ranks running.
TEST(Launch, ASignalTheLauncherWasStartedIgnoringStaysIgnored) {
  struct sigaction ignore {}, before {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGHUP, &ignore, &before);
  LaunchOptions o;
  o.nproc = 2;
  std::thread hangup([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::kill(::getpid(), SIGHUP);
  });
  const LaunchResult r = launch_local(o, {"sh", "-c", "sleep 1"});
  hangup.join();
  struct sigaction after {};
  ::sigaction(SIGHUP, &before, &after);
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(after.sa_handler, SIG_IGN) << "the launcher left a handler of its own in place";
}

// `ringtrain launch` stopped by Ctrl-C ends by SIGINT itself, so that a shell script looping over runs stops too
// (bash ends a loop only for a child that SIGINT killed), with the message that it stopped the ranks.
TEST(Launch, TheCommandStoppedByASignalEndsByIt) {
  const testing::TempDir tmp("rt_launch_signal");
  for (const int sig : {SIGINT, SIGTERM}) {
    const std::string started = (tmp.path / ("started" + std::to_string(sig))).string();
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::signal(SIGINT, SIG_DFL);  // a test run from a script's background job would pass SIGINT on ignored
      ::dup2(out[1], STDERR_FILENO);
      ::close(out[0]);
      const std::string program = testing::cli_program(), rank = "touch " + started + "$RANK; sleep 60";
      ::execl(program.c_str(), program.c_str(), "launch", "--nproc", "2", "--stop-grace-ms", "5000", "--", "sh", "-c",
              rank.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(out[1]);
    // The launcher installs its handlers before it starts the ranks: once both have started, it takes the signal.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!(std::filesystem::exists(started + "0") && std::filesystem::exists(started + "1")) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ::kill(pid, sig);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    std::string err;
    char buf[512];
    for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<size_t>(n));
    ::close(out[0]);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "signal " << sig << ", status " << status;
    EXPECT_NE(err.find("ringtrain launch: signal " + std::to_string(sig) + "; stopping the ranks"), std::string::npos)
        << err;
  }
}

TEST(Launch, MissingProgramIsReported) {
  LaunchOptions o;
  o.nproc = 2;
  EXPECT_EQ(launch_local(o, {"/nonexistent/ringtrain-test-program"}).code, 127);
  EXPECT_THROW(launch_local(o, {}), Error);
}

}  // namespace
}  // namespace ringtrain::comm
