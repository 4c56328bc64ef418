// Context parallelism across GPUs from the command line:
//  - `ringtrain attention-check --device cuda --cp N`: parity of CP attention against the single-GPU result of the
//    same backend on the same inputs (calls gpu_cp_attention_check below);
//  - `ringtrain bench cp`: per-GPU TFLOP/s and scaling efficiency of CP attention, forward+backward.
// Both run one process per GPU; started by hand they re-run themselves through `ringtrain launch`.
#include <algorithm>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "ringtrain/check/device_checks.h"
#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/multi_gpu.h"
#include "ringtrain/cli/options.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/file_io.h"

namespace ringtrain::cli {

int gpu_cp_attention_check(const check::AttnProblem& prob, const cp::CpConfig& cfg, int cp, uint64_t seed,
                           std::chrono::milliseconds timeout) {
  require_gpus(cp, "attention-check");
  // Every rank draws the whole sequence from the seed, so they must agree on it: the ranks get it as --seed (the
  // last --seed given wins, so a seed already on the command line is simply repeated).
  if (!inside_ranks(cp)) throw relaunch_self(cp, {"--seed", std::to_string(seed)});
  auto comm = nccl_from_environment(timeout);
  check::DeviceRunOptions opt;
  opt.prob = prob;
  opt.config = cfg;
  opt.seed = seed;
  const check::DeviceRunResult r = check::run_cp_on_device(*comm, opt);
  // bf16/fp16: CP and one GPU round the same fp32 values in another order; outputs carry 8 (bf16) or 11 (fp16)
  // mantissa bits, so 1e-2 relative is the dtype's bar. fp32 inputs: 1e-4 (tf32-free kernels, other order).
  const check::ParityReport parity = r.parity(prob.dtype == DType::F32 ? 1e-4 : 1e-2);
  if (comm->rank() == 0) {
    std::printf("attention-check: %s on %d GPUs, comm=%s, seed %llu\n%s", prob.describe().c_str(), cp,
                std::string(cp::cp_comm_name(cfg.comm)).c_str(), static_cast<unsigned long long>(seed),
                r.selection.c_str());
    std::printf("dispatches (rank 0): %s\n", attention::format_dispatch_counts(r.dispatches).c_str());
    print_parity(parity, " vs one GPU");
  }
  return parity.pass() ? 0 : 1;
}

void add_bench_cp_command(CLI::App& app) {
  struct Opts {
    AttnShapeOptions shape;
    std::string json;
    int iters = 5, warmup = 2;
    bool check = false, single = true;
    int64_t timeout_ms = 300000;
  };
  auto o = std::make_shared<Opts>();
  o->shape.cp = 2;
  o->shape.seqs = {32768};
  o->shape.backends = "cudnn,flash";
  o->shape.dtype = "bf16";
  o->shape.heads = 32;
  o->shape.head_dim = 128;
  CLI::App* bench = app.get_subcommand("bench");
  CLI::App* cmd = bench->add_subcommand("cp", "Time context-parallel attention on several GPUs (forward+backward)");
  o->shape.add_to(*cmd, AttnShapeOptions::kCp | AttnShapeOptions::kSeqList | AttnShapeOptions::kBackends |
                            AttnShapeOptions::kCpComm | AttnShapeOptions::kBatch | AttnShapeOptions::kHeads |
                            AttnShapeOptions::kHeadDim | AttnShapeOptions::kDtype | AttnShapeOptions::kCausal |
                            AttnShapeOptions::kWindow);
  add_bounded(*cmd, "--iters", o->iters, "timed iterations (median reported)", 1, kMaxIters)->capture_default_str();
  add_bounded(*cmd, "--warmup", o->warmup, "untimed iterations first", 0, kMaxIters)->capture_default_str();
  cmd->add_flag("--check", o->check, "also compare with the single-GPU result (parity)");
  cmd->add_flag("!--no-single", o->single, "skip timing one GPU on the whole sequence (no scaling efficiency)");
  cmd->add_option("--json", o->json, "write the rows as JSON (rank 0)");
  add_timeout_ms(*cmd, o->timeout_ms);
  cmd->footer("--backends: the backends to time, one after the other (each alone in the root allow-list).");
  cmd->callback([o] {
    const AttnShapeOptions& s = o->shape;
    require_gpus(s.cp, "bench cp");
    if (!inside_ranks(s.cp)) throw relaunch_self(s.cp);
    auto comm = nccl_from_environment(std::chrono::milliseconds(o->timeout_ms));
    const bool lead = comm->rank() == 0;
    nlohmann::json rows = nlohmann::json::array();
    if (lead)
      std::printf("%-9s %-9s %-5s %10s %10s %12s %10s %10s %s\n", "S", "backend", "cp", "fwd_ms", "fwdbwd_ms",
                  "TFLOP/s/GPU", "1gpu_ms", "efficiency", "parity(max rel err)");
    for (int64_t seq : s.seqs) {
      for (attention::BackendId id : attention::parse_backend_list(s.backends)) {
        const RootBackends only(std::string(attention::backend_name(id)), "bench cp");
        check::DeviceRunOptions opt;
        opt.prob = s.problem(seq);
        opt.config.comm = s.parsed_comm();
        opt.seed = static_cast<uint64_t>(seq) * 31 + static_cast<uint64_t>(id);
        opt.check = o->check;
        opt.warmup = o->warmup;
        opt.iters = o->iters;
        opt.time_single = o->single;
        // A failure (e.g. out of memory) ends this rank with the error; the launcher stops the others, and the
        // rows printed so far stand.
        const check::DeviceRunResult r = check::run_cp_on_device(*comm, opt);
        const double per_gpu = 3.5 * opt.prob.forward_flops() / s.cp / (r.cp_fwdbwd_ms * 1e9);
        const double eff = o->single ? r.single_fwdbwd_ms / (s.cp * r.cp_fwdbwd_ms) : 0;
        const double parity = r.parity(0).max_error();
        if (lead) {
          std::printf("%-9lld %-9s %-5d %10.2f %10.2f %12.0f %10.2f %10.3f %s\n", static_cast<long long>(seq),
                      std::string(attention::backend_name(id)).c_str(), s.cp, r.cp_fwd_ms, r.cp_fwdbwd_ms, per_gpu,
                      r.single_fwdbwd_ms, eff, o->check ? cat(parity).c_str() : "-");
          std::fflush(stdout);
        }
        rows.push_back({{"seq", seq},
                        {"backend", attention::backend_name(id)},
                        {"cp", s.cp},
                        {"comm", s.cp_comm},
                        {"window", s.window},
                        {"cp_fwd_ms", r.cp_fwd_ms},
                        {"cp_fwdbwd_ms", r.cp_fwdbwd_ms},
                        {"tflops_per_gpu", per_gpu},
                        {"single_fwdbwd_ms", r.single_fwdbwd_ms},
                        {"efficiency", eff},
                        {"parity_max_rel_err", o->check ? parity : -1.0}});
      }
    }
    if (lead && !o->json.empty()) model::write_file_atomic(o->json, rows.dump(1) + "\n");
  });
}

}  // namespace ringtrain::cli
