// Context parallelism across GPUs from the command line:
//  - `ringtrain attention-check --device cuda --cp N`: parity of CP attention against the single-GPU result of the
//    same backend on the same inputs (calls gpu_cp_attention_check below);
//  - `ringtrain bench cp`: per-GPU TFLOP/s and scaling efficiency of CP attention, forward+backward.
// Both run one process per GPU; started by hand they re-run themselves through `ringtrain launch`.
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/multi_gpu.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#ifdef RINGTRAIN_WITH_CUDA
#include "ringtrain/cp/device_run.h"
#endif

namespace ringtrain::cli {
namespace {

void require_gpus(int cp) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) {
    std::fprintf(stderr, "ringtrain: needs GPUs: %s\n", why.c_str());
    throw Exit{2};
  }
  if (cuda_device_count() < cp) {
    std::fprintf(stderr, "ringtrain: --cp %d needs %d GPUs on this node, found %d\n", cp, cp, cuda_device_count());
    throw Exit{2};
  }
}

#ifdef RINGTRAIN_WITH_CUDA
// 4*B*H*S*S*D for the forward, halved when causal (as in the PyTorch anchors).
double forward_flops(const cp::AttnProblem& p) {
  const double f = 4.0 * p.batch * p.heads_q * static_cast<double>(p.seq) * p.seq * p.head_dim;
  return p.causal ? f / 2 : f;
}

std::vector<int64_t> parse_lengths(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    RT_CHECK(!item.empty() && *end == '\0' && v > 0, "bad sequence length '", item, "' in '", s, "'");
    out.push_back(v);
  }
  RT_CHECK(!out.empty(), "empty list of sequence lengths");
  return out;
}

#endif

}  // namespace

int gpu_cp_attention_check(const cp::AttnProblem& prob, const cp::CpConfig& cfg, int cp, uint64_t seed,
                           std::chrono::milliseconds timeout) {
  require_gpus(cp);
  // Every rank draws the whole sequence from the seed, so they must agree on it: the ranks inherit it.
  if (!inside_ranks(cp)) {
    ::setenv("RINGTRAIN_CP_SEED", std::to_string(seed).c_str(), 1);
    return relaunch_self(cp);
  }
  if (const char* s = std::getenv("RINGTRAIN_CP_SEED")) seed = std::strtoull(s, nullptr, 10);
#ifdef RINGTRAIN_WITH_CUDA
  auto comm = nccl_from_environment(timeout);
  cp::DeviceRunOptions opt;
  opt.prob = prob;
  opt.config = cfg;
  opt.seed = seed;
  const cp::DeviceRunResult r = cp::run_cp_on_device(*comm, opt);
  // bf16/fp16: CP and one GPU round the same fp32 values in another order; outputs carry 8 (bf16) or 11 (fp16)
  // mantissa bits, so 1e-2 relative is the dtype's bar. fp32 inputs: 1e-4 (tf32-free kernels, other order).
  const double tol = prob.dtype == DType::F32 ? 1e-4 : 1e-2;
  bool ok = true;
  if (comm->rank() == 0) {
    std::printf("attention-check: %s on %d GPUs, comm=%s, seed %llu\n%s", prob.describe().c_str(), cp,
                std::string(cp::cp_comm_name(cfg.comm)).c_str(), static_cast<unsigned long long>(seed),
                r.selection.c_str());
    std::printf("dispatches (rank 0): %s\n", attention::format_dispatch_counts(r.dispatches).c_str());
  }
  for (auto [name, err] : {std::pair{"O", r.err_o}, {"LSE", r.err_lse}, {"dQ", r.err_dq}, {"dK", r.err_dk},
                           {"dV", r.err_dv}}) {
    const bool pass = err <= tol;  // NaN fails
    ok = ok && pass;
    if (comm->rank() == 0)
      std::printf("  %-4s relative error vs one GPU %.3e  (tolerance %.0e)  %s\n", name, err, tol,
                  pass ? "ok" : "FAIL");
  }
  if (comm->rank() == 0) std::printf("%s\n", ok ? "attention-check: PASS" : "attention-check: FAIL");
  return ok ? 0 : 1;
#else
  (void)prob, (void)cfg, (void)seed, (void)timeout;
  throw Error("this build of ringtrain has no CUDA support");
#endif
}

void add_bench_cp_command(CLI::App& app) {
  struct Opts {
    std::string seqs = "32768", backends = "cudnn,flash", comm = "ring", dtype = "bf16", json;
    int cp = 2, iters = 5, warmup = 2;
    int64_t batch = 1, heads = 32, kv_heads = 0, head_dim = 128;
    bool causal = false, check = false, single = true;
    int64_t timeout_ms = 300000;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* bench = app.get_subcommand("bench");
  CLI::App* cmd = bench->add_subcommand("cp", "Time context-parallel attention on several GPUs (forward+backward)");
  cmd->add_option("--cp", o->cp, "GPUs (ranks)")->capture_default_str();
  cmd->add_option("--seq", o->seqs, "comma-separated sequence lengths")->capture_default_str();
  cmd->add_option("--backends", o->backends, "backends to time, one after the other")->capture_default_str();
  cmd->add_option("--comm", o->comm, "ring, allgather or a2a (heads divisible by cp)")->capture_default_str();
  cmd->add_option("--batch", o->batch)->capture_default_str();
  cmd->add_option("--heads", o->heads)->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "default: --heads");
  cmd->add_option("--head-dim", o->head_dim)->capture_default_str();
  cmd->add_option("--dtype", o->dtype)->capture_default_str();
  cmd->add_flag("--causal", o->causal);
  cmd->add_option("--iters", o->iters)->capture_default_str();
  cmd->add_option("--warmup", o->warmup)->capture_default_str();
  cmd->add_flag("--check", o->check, "also compare with the single-GPU result (parity)");
  cmd->add_flag("!--no-single", o->single, "skip timing one GPU on the whole sequence (no scaling efficiency)");
  cmd->add_option("--json", o->json, "write the rows as JSON (rank 0)");
  cmd->add_option("--timeout-ms", o->timeout_ms, "communicator timeout")->capture_default_str();
  cmd->callback([o] {
    require_gpus(o->cp);
    if (!inside_ranks(o->cp)) throw Exit{relaunch_self(o->cp)};
#ifdef RINGTRAIN_WITH_CUDA
    auto comm = nccl_from_environment(std::chrono::milliseconds(o->timeout_ms));
    const bool lead = comm->rank() == 0;
    nlohmann::json rows = nlohmann::json::array();
    if (lead)
      std::printf("%-9s %-9s %-5s %10s %10s %12s %10s %10s %s\n", "S", "backend", "cp", "fwd_ms", "fwdbwd_ms",
                  "TFLOP/s/GPU", "1gpu_ms", "efficiency", "parity(max rel err)");
    for (int64_t seq : parse_lengths(o->seqs)) {
      for (attention::BackendId id : attention::parse_backend_list(o->backends)) {
        attention::set_root_backends({id}, "bench cp");
        cp::DeviceRunOptions opt;
        opt.prob = {o->batch, seq, o->heads, o->kv_heads ? o->kv_heads : o->heads, o->head_dim, o->causal,
                    parse_dtype(o->dtype)};
        opt.config.comm = cp::parse_cp_comm(o->comm);
        opt.seed = static_cast<uint64_t>(seq) * 31 + static_cast<uint64_t>(id);
        opt.check = o->check;
        opt.warmup = o->warmup;
        opt.iters = o->iters;
        opt.time_single = o->single;
        // A failure (e.g. out of memory) ends this rank with the error; the launcher stops the others, and the
        // rows printed so far stand.
        const cp::DeviceRunResult r = cp::run_cp_on_device(*comm, opt);
        const double per_gpu = 3.5 * forward_flops(opt.prob) / o->cp / (r.cp_fwdbwd_ms * 1e9);
        const double eff = o->single ? r.single_fwdbwd_ms / (o->cp * r.cp_fwdbwd_ms) : 0;
        const double parity = std::max({r.err_o, r.err_lse, r.err_dq, r.err_dk, r.err_dv});
        if (lead) {
          std::printf("%-9lld %-9s %-5d %10.2f %10.2f %12.0f %10.2f %10.3f %s\n", static_cast<long long>(seq),
                      std::string(attention::backend_name(id)).c_str(), o->cp, r.cp_fwd_ms, r.cp_fwdbwd_ms, per_gpu,
                      r.single_fwdbwd_ms, eff, o->check ? cat(parity).c_str() : "-");
          std::fflush(stdout);
        }
        rows.push_back({{"seq", seq},
                        {"backend", attention::backend_name(id)},
                        {"cp", o->cp},
                        {"comm", o->comm},
                        {"cp_fwd_ms", r.cp_fwd_ms},
                        {"cp_fwdbwd_ms", r.cp_fwdbwd_ms},
                        {"tflops_per_gpu", per_gpu},
                        {"single_fwdbwd_ms", r.single_fwdbwd_ms},
                        {"efficiency", eff},
                        {"parity_max_rel_err", o->check ? parity : -1.0}});
      }
    }
    if (lead && !o->json.empty()) {
      std::ofstream(o->json) << rows.dump(1) << "\n";
    }
#endif
  });
}

}  // namespace ringtrain::cli
