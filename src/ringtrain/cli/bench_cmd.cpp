// `ringtrain bench attention`: times attention backends on one GPU (CUDA events, warm-up, median of the
// iterations) and prints ms and TFLOP/s for the forward and for forward+backward. FLOPs are counted as in the
// PyTorch anchors (bench/compare_torch.py): 4*B*H*S*S*D for the forward, halved when causal; forward+backward
// counts 3.5 times that.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ringtrain/attention/selection.h"
#include "ringtrain/cli/commands.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"

#ifdef RINGTRAIN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "ringtrain/core/cuda/tensor_ops.h"
#endif

namespace ringtrain::cli {
namespace {

struct BenchOpts {
  std::string backends = "cudnn,flash,efficient,math", seqs = "16384", dtype = "bf16", json;
  int64_t batch = 1, heads = 32, kv_heads = 0, head_dim = 128;
  bool causal = false;
  int iters = 10, warmup = 3;
};

struct BenchRow {
  std::string backend, status;  // status: "ok" or why it did not run
  int64_t seq = 0;
  double fwd_ms = 0, fwd_tflops = 0, fwdbwd_ms = 0, fwdbwd_tflops = 0;
};

#ifdef RINGTRAIN_WITH_CUDA
std::vector<int64_t> parse_int_list(const std::string& s, const char* what) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      out.push_back(std::stoll(item));
    } catch (const std::exception&) {
      throw Error(cat("bench: bad ", what, " '", item, "' in '", s, "'"));
    }
    RT_CHECK(out.back() > 0, "bench: ", what, " must be positive, got ", out.back());
  }
  RT_CHECK(!out.empty(), "bench: empty ", what, " list");
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void cuda_ok(cudaError_t e, const char* what) { RT_CHECK(e == cudaSuccess, "bench: ", what, ": ", cudaGetErrorString(e)); }

// Times fn() `iters` times between CUDA events after `warmup` untimed calls; returns the median in ms.
template <typename F>
double time_median_ms(int warmup, int iters, F&& fn) {
  for (int i = 0; i < warmup; ++i) fn(i);
  cuda_ok(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t start, stop;
  cuda_ok(cudaEventCreate(&start), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    cuda_ok(cudaEventRecord(start), "cudaEventRecord");
    fn(warmup + i);
    cuda_ok(cudaEventRecord(stop), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float t = 0;
    cuda_ok(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(ms);
}

// One input set: q, k, v, dO and the outputs.
struct Buffers {
  Tensor q, k, v, dout, o, lse, dq, dk, dv;
};

BenchRow bench_one(const attention::Backend& be, const attention::AttnParams& p, const BenchOpts& o) {
  BenchRow row;
  row.backend = std::string(attention::backend_name(be.id()));
  row.seq = p.seqlen_q;
  const auto reasons = be.unsupported_reasons(p);
  if (!reasons.empty()) {
    row.status = reasons.front();
    return row;
  }
  const Device dev = p.device;
  const DType dt = p.dtype;
  const int64_t B = p.batch, S = p.seqlen_q, H = p.heads_q, Hk = p.heads_kv, D = p.head_dim;
  // Rotate among input sets when one set would sit in L2 (else repeated calls would time the cache).
  int l2 = 0;
  cuda_ok(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev.index), "L2 size");
  const int64_t set_bytes = static_cast<int64_t>(dtype_size(dt)) * B * S * D * (2 * H + 2 * Hk);
  const int sets = set_bytes >= 4 * int64_t{l2} ? 1 : static_cast<int>(std::min<int64_t>(8, 4 * int64_t{l2} / set_bytes + 1));
  std::vector<Buffers> bufs(static_cast<size_t>(sets));
  uint64_t seed = 1234;
  for (Buffers& b : bufs) {
    b.q = Tensor::empty({B, S, H, D}, dt, dev);
    b.k = Tensor::empty({B, S, Hk, D}, dt, dev);
    b.v = Tensor::empty({B, S, Hk, D}, dt, dev);
    b.dout = Tensor::empty({B, S, H, D}, dt, dev);
    for (const Tensor* t : {&b.q, &b.k, &b.v, &b.dout}) cuda_ops::fill_normal(*t, seed++, 1.0, nullptr);
    b.o = Tensor::empty({B, S, H, D}, dt, dev);
    b.lse = Tensor::empty({B, H, S}, DType::F32, dev);
    b.dq = Tensor::empty({B, S, H, D}, dt, dev);
    b.dk = Tensor::empty({B, S, Hk, D}, dt, dev);
    b.dv = Tensor::empty({B, S, Hk, D}, dt, dev);
  }
  auto fwd = [&](int i) {
    const Buffers& b = bufs[static_cast<size_t>(i % sets)];
    be.forward(p, attention::AttnForwardArgs{b.q, b.k, b.v, b.o, b.lse});
  };
  auto fwdbwd = [&](int i) {
    fwd(i);
    const Buffers& b = bufs[static_cast<size_t>(i % sets)];
    be.backward(p, attention::AttnBackwardArgs{b.q, b.k, b.v, b.o, b.dout, b.lse, b.dq, b.dk, b.dv});
  };
  attention::validate(p, attention::AttnForwardArgs{bufs[0].q, bufs[0].k, bufs[0].v, bufs[0].o, bufs[0].lse});
  const double flops = 4.0 * B * H * S * S * D / (p.mask == attention::MaskType::None ? 1 : 2);
  row.fwd_ms = time_median_ms(o.warmup, o.iters, fwd);
  row.fwdbwd_ms = time_median_ms(o.warmup, o.iters, fwdbwd);
  row.fwd_tflops = flops / (row.fwd_ms * 1e9);
  row.fwdbwd_tflops = 3.5 * flops / (row.fwdbwd_ms * 1e9);
  row.status = "ok";
  return row;
}
#endif

void run_attention_bench(const BenchOpts& o) {
#ifndef RINGTRAIN_WITH_CUDA
  (void)o;
  throw Error("bench attention times GPU backends: this build of ringtrain has no CUDA support");
#else
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) throw Error(cat("bench attention: ", why));
  const auto ids = attention::parse_backend_list(o.backends);
  const auto seqs = parse_int_list(o.seqs, "sequence length");
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("attention benchmark on %s: %s B=%lld Hq=%lld Hkv=%lld D=%lld %s, warm-up %d, median of %d\n",
              prop.name, o.dtype.c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.heads),
              static_cast<long long>(o.kv_heads ? o.kv_heads : o.heads), static_cast<long long>(o.head_dim),
              o.causal ? "causal" : "no mask", o.warmup, o.iters);
  std::printf("%-10s %7s %10s %10s %12s %14s\n", "backend", "S", "fwd_ms", "fwd_TF/s", "fwdbwd_ms", "fwdbwd_TF/s");
  std::vector<BenchRow> rows;
  for (int64_t s : seqs) {
    attention::AttnParams p;
    p.device = Device::cuda(0);
    p.dtype = parse_dtype(o.dtype);
    p.batch = o.batch;
    p.heads_q = o.heads;
    p.heads_kv = o.kv_heads ? o.kv_heads : o.heads;
    p.head_dim = o.head_dim;
    p.seqlen_q = p.seqlen_kv = s;
    p.mask = o.causal ? attention::MaskType::CausalTopLeft : attention::MaskType::None;
    for (attention::BackendId id : ids) {
      const attention::Backend* be = attention::find_backend(id, DeviceKind::CUDA);
      BenchRow row;
      if (!be) {
        row.backend = std::string(attention::backend_name(id));
        row.seq = s;
        row.status = "no cuda implementation in this build";
      } else {
        row = bench_one(*be, p, o);
      }
      if (row.status == "ok")
        std::printf("%-10s %7lld %10.3f %10.1f %12.3f %14.1f\n", row.backend.c_str(), static_cast<long long>(s),
                    row.fwd_ms, row.fwd_tflops, row.fwdbwd_ms, row.fwdbwd_tflops);
      else
        std::printf("%-10s %7lld  skipped: %s\n", row.backend.c_str(), static_cast<long long>(s), row.status.c_str());
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  if (!o.json.empty()) {
    nlohmann::json j;
    j["gpu"] = prop.name;
    j["dtype"] = o.dtype;
    j["batch"] = o.batch;
    j["heads"] = o.heads;
    j["kv_heads"] = o.kv_heads ? o.kv_heads : o.heads;
    j["head_dim"] = o.head_dim;
    j["causal"] = o.causal;
    j["iters"] = o.iters;
    j["warmup"] = o.warmup;
    for (const BenchRow& r : rows)
      j["rows"].push_back({{"backend", r.backend}, {"seq", r.seq}, {"status", r.status}, {"fwd_ms", r.fwd_ms},
                           {"fwd_tflops", r.fwd_tflops}, {"fwdbwd_ms", r.fwdbwd_ms}, {"fwdbwd_tflops", r.fwdbwd_tflops}});
    std::ofstream f(o.json);
    RT_CHECK(f.good(), "bench: cannot write '", o.json, "'");
    f << j.dump(2) << "\n";
  }
#endif
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOpts>();
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  CLI::App* cmd = bench->add_subcommand("attention", "Time attention backends on one GPU (forward, forward+backward)");
  cmd->add_option("--backends", o->backends, "backends to time, e.g. cudnn,flash,efficient,math")->capture_default_str();
  cmd->add_option("--seq", o->seqs, "sequence lengths, comma-separated (Sq = Skv)")->capture_default_str();
  cmd->add_option("--batch", o->batch)->capture_default_str();
  cmd->add_option("--heads", o->heads, "query heads")->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "key/value heads (default: --heads)");
  cmd->add_option("--head-dim", o->head_dim)->capture_default_str();
  cmd->add_flag("--causal", o->causal, "causal mask");
  cmd->add_option("--dtype", o->dtype, "bf16, fp16 or fp32")->capture_default_str();
  cmd->add_option("--iters", o->iters, "timed iterations (median reported)")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", o->warmup, "untimed iterations first")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--json", o->json, "also write the results to this JSON file");
  cmd->callback([o] { run_attention_bench(*o); });
}

}  // namespace ringtrain::cli
