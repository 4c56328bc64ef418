// `ringtrain bench attention`: times attention backends on one GPU (warm-up, median of the iterations; see
// check::bench_attention_backend) and prints ms and TFLOP/s for the forward and for forward+backward. FLOPs are
// counted as bench/compare_torch.py counts them: 4*B*H*S*S*D for the forward, halved when causal;
// forward+backward counts 3.5 times that.
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ringtrain/check/device_checks.h"
#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/options.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/file_io.h"

namespace ringtrain::cli {
namespace {

struct BenchOpts {
  AttnShapeOptions shape;
  std::string json;
  int iters = 10, warmup = 3;
};

void run_attention_bench(const BenchOpts& o) {
  const AttnShapeOptions& s = o.shape;
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) throw Error(cat("bench attention: ", why));
  const auto ids = attention::parse_backend_list(s.backends);
  const std::string gpu = check::gpu_name(0);
  std::printf("attention benchmark on %s: %s B=%lld Hq=%lld Hkv=%lld D=%lld %s%s, warm-up %d, median of %d\n",
              gpu.c_str(), s.dtype.c_str(), static_cast<long long>(s.batch), static_cast<long long>(s.heads),
              static_cast<long long>(s.kv_heads_or_heads()), static_cast<long long>(s.head_dim),
              s.causal ? "causal" : "no mask", s.window > 0 ? cat(" window ", s.window).c_str() : "", o.warmup,
              o.iters);
  std::printf("%-10s %7s %10s %10s %12s %14s\n", "backend", "S", "fwd_ms", "fwd_TF/s", "fwdbwd_ms", "fwdbwd_TF/s");
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t seq : s.seqs) {
    const check::AttnProblem prob = s.problem(seq);
    for (attention::BackendId id : ids) {
      const check::AttentionBenchRow row = check::bench_attention_backend(id, prob, o.warmup, o.iters);
      if (row.status == "ok" && !row.no_backward.empty())
        std::printf("%-10s %7lld %10.3f %10.1f  forward only: %s\n", row.backend.c_str(), static_cast<long long>(seq),
                    row.fwd_ms, row.fwd_tflops, row.no_backward.c_str());
      else if (row.status == "ok")
        std::printf("%-10s %7lld %10.3f %10.1f %12.3f %14.1f\n", row.backend.c_str(), static_cast<long long>(seq),
                    row.fwd_ms, row.fwd_tflops, row.fwdbwd_ms, row.fwdbwd_tflops);
      else
        std::printf("%-10s %7lld  skipped: %s\n", row.backend.c_str(), static_cast<long long>(seq), row.status.c_str());
      std::fflush(stdout);
      rows.push_back({{"backend", row.backend}, {"seq", row.seq}, {"status", row.status}, {"fwd_ms", row.fwd_ms},
                      {"fwd_tflops", row.fwd_tflops}, {"fwdbwd_ms", row.fwdbwd_ms},
                      {"fwdbwd_tflops", row.fwdbwd_tflops}, {"no_backward", row.no_backward}});
    }
  }
  if (!o.json.empty()) {
    nlohmann::json j;
    j["gpu"] = gpu;
    j["dtype"] = s.dtype;
    j["batch"] = s.batch;
    j["heads"] = s.heads;
    j["kv_heads"] = s.kv_heads_or_heads();
    j["head_dim"] = s.head_dim;
    j["causal"] = s.causal;
    j["window"] = s.window;
    j["iters"] = o.iters;
    j["warmup"] = o.warmup;
    j["rows"] = rows;
    model::write_file_atomic(o.json, j.dump(2) + "\n");
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOpts>();
  o->shape.dtype = "bf16";
  o->shape.heads = 32;
  o->shape.head_dim = 128;
  o->shape.seqs = {16384};
  o->shape.backends = "cudnn,flash,efficient,math";
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  CLI::App* cmd = bench->add_subcommand("attention", "Time attention backends on one GPU (forward, forward+backward)");
  o->shape.add_to(*cmd, AttnShapeOptions::kBackends | AttnShapeOptions::kSeqList | AttnShapeOptions::kBatch |
                            AttnShapeOptions::kHeads | AttnShapeOptions::kHeadDim | AttnShapeOptions::kCausal |
                            AttnShapeOptions::kWindow | AttnShapeOptions::kDtype);
  add_bounded(*cmd, "--iters", o->iters, "timed iterations (median reported)", 1, kMaxIters)->capture_default_str();
  add_bounded(*cmd, "--warmup", o->warmup, "untimed iterations first", 0, kMaxIters)->capture_default_str();
  cmd->add_option("--json", o->json, "also write the results to this JSON file");
  cmd->callback([o] { run_attention_bench(*o); });
}

}  // namespace ringtrain::cli
