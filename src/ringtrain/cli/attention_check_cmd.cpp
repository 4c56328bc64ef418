// `ringtrain attention-check`: runs context-parallel attention forward + backward on random inputs (cp in-process
// CPU ranks, or one GPU with --device cuda and --cp 1; with --cp > 1 on GPUs see gpu_cp_cmd.cpp) and the
// single-rank fp64 math reference on the whole sequence; prints the backend selection, dispatch counts, wall times and the relative errors of O, LSE, dQ, dK,
// dV. Exit code 0 when all are within tolerance, 1 otherwise, 2 when the check cannot run here.
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <tuple>

#include "ringtrain/attention/selection.h"
#include "ringtrain/cli/commands.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/parallel.h"
#include "ringtrain/cp/cp_check.h"
#include "ringtrain/cp/zigzag.h"

namespace ringtrain::cli {
namespace {

using attention::AttnParams;
using attention::MaskType;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One attention call on a GPU, whole sequence (cp = 1): device copies of the inputs, the selected backend inside a
// context-parallel scope of size 1, results copied back to the host.
cp::AttnResults run_on_device(const cp::AttnProblem& prob, const cp::AttnInputs& in, Device dev) {
  auto to_device = [&](const Tensor& host) {
    Tensor t = cp::empty_like(host, host.dtype(), dev);
    copy(t, host);
    return t;
  };
  const Tensor q = to_device(in.q), k = to_device(in.k), v = to_device(in.v), dout = to_device(in.dout);
  const Tensor o = cp::empty_like(in.q, prob.dtype, dev), dq = cp::empty_like(in.q, prob.dtype, dev);
  const Tensor dk = cp::empty_like(in.k, prob.dtype, dev), dv = cp::empty_like(in.k, prob.dtype, dev);
  const Tensor lse = Tensor::empty({prob.batch, prob.heads_q, prob.seq}, DType::F32, dev);
  const AttnParams p = attention::params_for(q, k, prob.causal ? MaskType::CausalTopLeft : MaskType::None);
  const attention::BackendScope cp_scope = attention::BackendScope::context_parallel(1);
  cp::AttnResults r{cp::empty_like(in.q, prob.dtype, Device::cpu()),
                    Tensor::empty({prob.batch, prob.heads_q, prob.seq}, DType::F32),
                    cp::empty_like(in.q, prob.dtype, Device::cpu()), cp::empty_like(in.k, prob.dtype, Device::cpu()),
                    cp::empty_like(in.k, prob.dtype, Device::cpu())};
  attention::AttnForwardArgs fa;
  fa.q = q;
  fa.k = k;
  fa.v = v;
  fa.o = o;
  fa.lse = lse;
  cuda_synchronize(dev.index);
  auto t0 = Clock::now();
  attention::forward(p, fa);
  cuda_synchronize(dev.index);
  r.forward_seconds = seconds_since(t0);
  attention::AttnBackwardArgs ba;
  ba.q = q;
  ba.k = k;
  ba.v = v;
  ba.o = o;
  ba.dout = dout;
  ba.lse = lse;
  ba.dq = dq;
  ba.dk = dk;
  ba.dv = dv;
  t0 = Clock::now();
  attention::backward(p, ba);
  cuda_synchronize(dev.index);
  r.backward_seconds = seconds_since(t0);
  copy(r.o, o);
  copy(r.lse, lse);
  copy(r.dq, dq);
  copy(r.dk, dk);
  copy(r.dv, dv);
  return r;
}

}  // namespace

void add_attention_check_command(CLI::App& app) {
  struct Opts {
    std::string device = "cpu", comm = "ring", dtype = "fp32", backends;
    int cp = 4;
    int64_t batch = 1, seq = 4096, heads = 8, kv_heads = 2, head_dim = 64;
    bool causal = false;
    uint64_t seed = 0;
    int64_t timeout_ms = 120000;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "attention-check", "Run context-parallel attention against the fp64 single-rank reference and report errors");
  cmd->add_option("--device", o->device, "cpu (cp in-process ranks) or cuda (one GPU, --cp 1)")->capture_default_str();
  cmd->add_option("--cp", o->cp, "context-parallel size")->capture_default_str();
  cmd->add_option("--comm", o->comm, "ring, allgather or a2a (heads divisible by cp)")->capture_default_str();
  cmd->add_option("--batch", o->batch)->capture_default_str();
  cmd->add_option("--seq", o->seq, "sequence length (any; padded to a multiple of 2*cp)")->capture_default_str();
  cmd->add_option("--heads", o->heads, "query heads")->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "key/value heads")->capture_default_str();
  cmd->add_option("--head-dim", o->head_dim)->capture_default_str();
  cmd->add_flag("--causal", o->causal, "causal mask over the whole sequence");
  cmd->add_option("--dtype", o->dtype, "fp32, bf16 or fp16")->capture_default_str();
  cmd->add_option("--backends", o->backends, "ordered allow-list of attention backends, e.g. flash,math");
  cmd->add_option("--seed", o->seed, "random seed (default: a fresh one, printed)");
  cmd->add_option("--timeout-ms", o->timeout_ms, "communicator timeout")->capture_default_str();
  cmd->callback([o] {
    const Device dev = parse_device(o->device);
    const DType dtype = parse_dtype(o->dtype);
    RT_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
             "--dtype must be fp32, bf16 or fp16, got ", o->dtype);
    RT_CHECK(o->cp >= 1, "--cp must be >= 1, got ", o->cp);
    RT_CHECK(o->batch >= 1 && o->seq >= 1 && o->heads >= 1 && o->kv_heads >= 1 && o->head_dim >= 1,
             "--batch, --seq, --heads, --kv-heads and --head-dim must be >= 1");
    RT_CHECK(o->heads % o->kv_heads == 0, "--heads (", o->heads, ") must be a multiple of --kv-heads (", o->kv_heads,
             ")");
    RT_CHECK(o->timeout_ms > 0, "--timeout-ms must be > 0");
    cp::CpRunOptions run;
    run.cp = o->cp;
    run.config.comm = cp::parse_cp_comm(o->comm);
    run.timeout = std::chrono::milliseconds(o->timeout_ms);
    if (dev.is_cuda()) {
      if (const std::string why = cuda_unavailable_reason(); !why.empty()) {
        std::fprintf(stderr, "ringtrain attention-check: --device cuda cannot run here: %s\n", why.c_str());
        throw Exit{2};
      }
    }
    if (!o->backends.empty()) attention::set_root_backends(attention::parse_backend_list(o->backends), "--backends");
    if (o->seed == 0) o->seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    if (dev.is_cuda() && o->cp > 1) {  // one process per GPU, parity against one GPU
      const cp::AttnProblem prob{o->batch, o->seq, o->heads, o->kv_heads, o->head_dim, o->causal, dtype};
      throw Exit{gpu_cp_attention_check(prob, run.config, o->cp, o->seed, run.timeout)};
    }

    const cp::AttnProblem prob{o->batch, o->seq, o->heads, o->kv_heads, o->head_dim, o->causal, dtype};
    std::printf("attention-check: %s on %s, cp=%d comm=%s, seed %llu, %d host threads\n", prob.describe().c_str(),
                device_name(dev).c_str(), o->cp, std::string(cp::cp_comm_name(run.config.comm)).c_str(),
                static_cast<unsigned long long>(o->seed), host_threads());

    // The decision for the first block of rank 0 (local queries against local keys), made under the CP scope.
    const cp::ZigzagLayout layout(o->cp, 0, o->seq);
    AttnParams step;
    step.device = dev;
    step.dtype = dtype;
    step.batch = o->batch;
    step.heads_q = o->heads;
    step.heads_kv = o->kv_heads;
    step.head_dim = o->head_dim;
    step.seqlen_q = step.seqlen_kv = dev.is_cuda() ? o->seq : layout.local_len();
    step.mask = o->causal ? MaskType::CausalTopLeft : MaskType::None;
    {
      const attention::BackendScope cp_scope = attention::BackendScope::context_parallel(o->cp);
      const attention::Selection s = attention::explain(step);
      std::fputs(s.report().c_str(), stdout);
      if (!s.backend) {
        std::fprintf(stderr, "ringtrain attention-check: no attention backend can serve the blocks (reasons above)\n");
        throw Exit{2};
      }
    }

    const cp::AttnInputs in = cp::random_inputs(prob, o->seed);
    attention::reset_dispatch_counts();
    const auto t_run = Clock::now();
    const cp::AttnResults got = dev.is_cuda() ? run_on_device(prob, in, dev) : cp::cp_attention_on_ranks(prob, in, run);
    const double run_s = seconds_since(t_run);
    const attention::DispatchCounts counts = attention::dispatch_counts();
    const auto t_ref = Clock::now();
    const cp::AttnResults ref = cp::reference_attention(prob, in);
    const double ref_s = seconds_since(t_ref);

    std::printf("dispatches: %s\n", attention::format_dispatch_counts(counts).c_str());
    std::printf("wall time: %s forward %.3f s, backward %.3f s (%.3f s with sharding and checks); "
                "fp64 reference %.3f s\n",
                dev.is_cuda() ? "gpu" : "cp", got.forward_seconds, got.backward_seconds, run_s, ref_s);
    // The bound is relative to the error of the same computation in the dtype (cp::error_bound).
    const cp::AttnResults dtype_ref =
        dtype == DType::F32 ? cp::AttnResults{} : cp::dtype_reference_attention(prob, in);
    bool ok = true;
    const std::tuple<const char*, const Tensor*, const Tensor*, const Tensor*> rows[] = {
        {"O", &got.o, &ref.o, &dtype_ref.o},       {"LSE", &got.lse, &ref.lse, &dtype_ref.lse},
        {"dQ", &got.dq, &ref.dq, &dtype_ref.dq},   {"dK", &got.dk, &ref.dk, &dtype_ref.dk},
        {"dV", &got.dv, &ref.dv, &dtype_ref.dv}};
    for (const auto& [name, ours, fp64, in_dtype] : rows) {
      const double err = cp::relative_error(*ours, *fp64);
      const double tol = cp::error_bound(dtype, dtype == DType::F32 ? 0.0 : cp::relative_error(*in_dtype, *fp64));
      const bool pass = err <= tol;  // NaN fails
      ok = ok && pass;
      std::printf("  %-4s relative error %.3e  (tolerance %.2e)  %s\n", name, err, tol, pass ? "ok" : "FAIL");
    }
    std::printf("%s\n", ok ? "attention-check: PASS" : "attention-check: FAIL");
    if (!ok) throw Exit{1};
  });
}

}  // namespace ringtrain::cli
