// `ringtrain launch --nproc N -- COMMAND ...`: one process per rank on this node (torchrun's variables).
#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/options.h"
#include "ringtrain/comm/launch.h"

namespace ringtrain::cli {

void add_launch_command(CLI::App& app) {
  struct Opts {
    comm::LaunchOptions launch;
    int grace_ms = 5000, stop_grace_ms = 30000;
    std::vector<std::string> command;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("launch", "Run COMMAND once per rank on this node (RANK, WORLD_SIZE, ...)");
  add_bounded(*cmd, "--nproc", o->launch.nproc, "processes (ranks), one per GPU", 1, kMaxRanks)->required();
  cmd->add_option("--master-addr", o->launch.master_addr)->capture_default_str();
  add_bounded(*cmd, "--master-port", o->launch.master_port, "rank 0's rendezvous port", 1, 65535)->capture_default_str();
  add_bounded(*cmd, "--grace-ms", o->grace_ms, "after a rank fails: ms between SIGTERM and SIGKILL of the others", 0,
              3600 * 1000)
      ->capture_default_str();
  add_bounded(*cmd, "--stop-grace-ms", o->stop_grace_ms,
              "after Ctrl-C or SIGTERM: ms the ranks get to stop at their next microbatch before SIGKILL (a second "
              "signal kills them at once)",
              0, 3600 * 1000)
      ->capture_default_str();
  cmd->add_option("command", o->command, "the command to run, after --")->required();
  cmd->callback([o] {
    o->launch.grace = std::chrono::milliseconds(o->grace_ms);
    o->launch.stop_grace = std::chrono::milliseconds(o->stop_grace_ms);
    // Ended by the signal that stopped the ranks, as a shell's own child would be (main raises it again).
    if (const comm::LaunchResult r = comm::launch_local(o->launch, o->command); r.code != 0)
      throw Exit{r.code, r.signal};
  });
}

}  // namespace ringtrain::cli
