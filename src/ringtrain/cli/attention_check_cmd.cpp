// `ringtrain attention-check`: runs context-parallel attention forward + backward on random inputs (cp in-process
// CPU ranks, or one GPU with --device cuda and --cp 1; with --cp > 1 on GPUs see gpu_cp_cmd.cpp) and the single-rank
// fp64 math reference on the whole sequence; prints the backend selection, dispatch counts, wall times and the
// relative errors of O, LSE, dQ, dK, dV. Exit code 0 when all are within tolerance, 1 otherwise, 2 when the check
// cannot run here.
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "ringtrain/attention/selection.h"
#include "ringtrain/check/attention_check.h"
#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/multi_gpu.h"
#include "ringtrain/cli/options.h"
#include "ringtrain/core/clock.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/parallel.h"
#include "ringtrain/cp/zigzag.h"

namespace ringtrain::cli {

void print_parity(const check::ParityReport& r, const char* against) {
  for (const check::ParityReport::Row& row : r.rows)
    std::printf("  %-4s relative error%s %.3e  (tolerance %.2e)  %s\n", row.name.c_str(), against, row.error,
                row.tolerance, row.error <= row.tolerance ? "ok" : "FAIL");
  std::printf("%s\n", r.pass() ? "attention-check: PASS" : "attention-check: FAIL");
}

void add_attention_check_command(CLI::App& app) {
  struct Opts {
    AttnShapeOptions shape;
    uint64_t seed = 0;
    int64_t timeout_ms = 120000;
  };
  auto o = std::make_shared<Opts>();
  o->shape.cp = 4;
  o->shape.kv_heads = 2;
  CLI::App* cmd = app.add_subcommand(
      "attention-check", "Run context-parallel attention against the fp64 single-rank reference and report errors");
  o->shape.add_to(*cmd, AttnShapeOptions::kDevice | AttnShapeOptions::kCp | AttnShapeOptions::kCpComm |
                            AttnShapeOptions::kBatch |
                            AttnShapeOptions::kSeq | AttnShapeOptions::kHeads | AttnShapeOptions::kHeadDim |
                            AttnShapeOptions::kCausal | AttnShapeOptions::kWindow | AttnShapeOptions::kDtype |
                            AttnShapeOptions::kBackends);
  // The last --seed wins: the GPU ranks are started with the seed appended (gpu_cp_attention_check).
  cmd->add_option("--seed", o->seed, "random seed (default: a fresh one, printed)")
      ->check(seed_check())
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add_timeout_ms(*cmd, o->timeout_ms);
  cmd->footer("cpu: cp in-process ranks; cuda: --cp 1 on one GPU, --cp N on N GPUs (parity against one GPU). Any "
              "--seq works: it is padded to a multiple of 2*cp.");
  cmd->callback([o] {
    const AttnShapeOptions& s = o->shape;
    const Device dev = s.parsed_device();
    const DType dtype = s.parsed_dtype();
    RT_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
             "--dtype must be fp32, bf16 or fp16, got ", s.dtype);
    const check::AttnProblem prob = s.problem(s.seq);
    check::CpRunOptions run;
    run.cp = s.cp;
    run.config.comm = s.parsed_comm();
    run.timeout = std::chrono::milliseconds(o->timeout_ms);
    if (dev.is_cuda()) require_cuda("attention-check");
    const RootBackends root(s.backends, "--backends");
    if (o->seed == 0) o->seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    if (dev.is_cuda() && s.cp > 1) {  // one process per GPU, parity against one GPU
      throw Exit{gpu_cp_attention_check(prob, run.config, s.cp, o->seed, run.timeout)};
    }

    std::printf("attention-check: %s on %s, cp=%d comm=%s, seed %llu, %d host threads\n", prob.describe().c_str(),
                device_name(dev).c_str(), s.cp, std::string(cp::cp_comm_name(run.config.comm)).c_str(),
                static_cast<unsigned long long>(o->seed), host_threads());

    // The decision for the first block of rank 0 (local queries against local keys), made under the CP scope.
    attention::AttnParams step = s.params(dev.is_cuda() ? s.seq : cp::ZigzagLayout(s.cp, 0, s.seq).local_len());
    step.seqlen_kv = step.seqlen_q;
    {
      const attention::BackendScope cp_scope = attention::BackendScope::context_parallel(s.cp);
      const attention::Selection sel = attention::explain(step);
      std::fputs(sel.report().c_str(), stdout);
      if (!sel.backend) {
        std::fprintf(stderr, "ringtrain attention-check: no attention backend can serve the blocks (reasons above)\n");
        throw Exit{2};
      }
    }

    const check::AttnInputs in = check::random_inputs(prob, o->seed);
    attention::reset_dispatch_counts();
    const auto t_run = SteadyClock::now();
    const check::AttnResults got =
        dev.is_cuda() ? check::attention_on_device(prob, in, dev) : check::cp_attention_on_ranks(prob, in, run);
    const double run_s = seconds_since(t_run);
    const attention::DispatchCounts counts = attention::dispatch_counts();
    const auto t_ref = SteadyClock::now();
    const check::AttnResults ref = check::reference_attention(prob, in);
    const double ref_s = seconds_since(t_ref);

    std::printf("dispatches: %s\n", attention::format_dispatch_counts(counts).c_str());
    std::printf("wall time: %s forward %.3f s, backward %.3f s (%.3f s with sharding and checks); "
                "fp64 reference %.3f s\n",
                dev.is_cuda() ? "gpu" : "cp", got.forward_seconds, got.backward_seconds, run_s, ref_s);
    // The bound is relative to the error of the same computation in the dtype (check::error_bound).
    const check::ParityReport parity = check::compare_to_reference(prob, in, got, ref);
    print_parity(parity, "");
    if (!parity.pass()) throw Exit{1};
  });
}

}  // namespace ringtrain::cli
