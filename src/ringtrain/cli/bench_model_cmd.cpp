// `ringtrain bench model`: times training steps of a causal LM with random weights on one GPU or, with --cp N, on N
// GPUs with context parallelism (one process per GPU). A step zeroes the fp32 gradients, runs forward, the token
// logprobs (chunked LM head) and the backward of the loss mean(logprob) over the sequence's scored tokens into
// every weight gradient. Warm-up steps, then the median of timed steps between CUDA events; the same events split
// each step into forward, LM head and backward (rank 0's medians, printed below each row).
//
// FLOPs per step for a sequence of S tokens, as bench/../anchors/e2e_hf.py counts them (MFU, so recomputation under
// activation checkpointing is not counted):
//   6 * N * S + 6 * L * S^2 * (heads * head_dim)
// N = the matmul weights: L * (hidden * (heads + 2 kv_heads) * head_dim + heads * head_dim * hidden + 3 * hidden *
// ffn) + vocab * hidden (the LM head once, also when tied; the embedding lookup is no matmul). The attention term is
// causal attention's QK^T and PV (2 * 2 * S^2 * heads * head_dim, halved by the mask) times 3 for training.
// MFU = FLOPs / (step time * GPUs * 989 TFLOP/s, the H200's dense bf16 peak).
//
// Memory: the device pool's high-water mark over the steps (weights, fp32 gradients, activations and work buffers;
// cuBLASLt/cuDNN workspaces are outside the pool) and, separately, the extra peak of the LM head's logprob forward
// and backward alone. One machine-readable line per shape starts with "BENCH_MODEL " followed by JSON.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ringtrain/attention/backend.h"
#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/multi_gpu.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/hf_config.h"
#ifdef RINGTRAIN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "ringtrain/model/cp_scoring.h"
#include "ringtrain/model/cuda/gpu_logprobs.h"
#include "ringtrain/model/cuda/gpu_model.h"
#include "ringtrain/model/logprobs.h"
#endif

namespace ringtrain::cli {
namespace {

struct BenchModelOpts {
  std::string arch = "llama", seqs = "8192,32768", checkpoint = "none", backends, cp_comm = "ring";
  int64_t layers = 16, hidden = 2048, heads = 32, kv_heads = 8, head_dim = 64, ffn = 8192, vocab = 128256;
  bool untied = false;
  int cp = 1, iters = 5, warmup = 2;
  int64_t chunk = 0;  // 0: default_logprob_chunk(vocab)
  uint64_t seed = 1;
  int64_t timeout_ms = 600000;
};

#ifdef RINGTRAIN_WITH_CUDA
using model::cuda::bf16;

constexpr double kPeakBf16Flops = 989e12;  // H200 dense bf16

model::ModelConfig bench_config(const BenchModelOpts& o) {
  model::ModelConfig c;
  c.arch = model::parse_arch(o.arch);
  c.layers = o.layers, c.hidden = o.hidden, c.heads = o.heads, c.kv_heads = o.kv_heads, c.head_dim = o.head_dim;
  c.ffn = o.ffn, c.vocab = o.vocab;
  c.tie_embeddings = !o.untied;
  c.qkv_bias = c.arch == model::Arch::Qwen2;
  c.qk_norm = c.arch == model::Arch::Qwen3;
  c.rope.theta = 500000.0;
  c.rms_eps = 1e-5;
  c.max_positions = 1 << 20;
  return c;
}

double matmul_weights(const model::ModelConfig& c) {
  const double qd = static_cast<double>(c.heads) * c.head_dim, kvd = static_cast<double>(c.kv_heads) * c.head_dim;
  const double per_layer = c.hidden * (qd + 2 * kvd) + qd * c.hidden + 3.0 * c.hidden * c.ffn;
  return c.layers * per_layer + static_cast<double>(c.vocab) * c.hidden;
}

double step_flops(const model::ModelConfig& c, int64_t seq) {
  const double S = static_cast<double>(seq);
  return 6 * matmul_weights(c) * S + 6.0 * c.layers * S * S * (c.heads * c.head_dim);
}

std::vector<int64_t> parse_seqs(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    RT_CHECK(!item.empty() && *end == '\0' && v > 1, "bench model: bad sequence length '", item, "' in '", s, "'");
    out.push_back(v);
  }
  RT_CHECK(!out.empty(), "bench model: empty --seq list");
  return out;
}

void cuda_ok(cudaError_t e, const char* what) {
  RT_CHECK(e == cudaSuccess, "bench model: ", what, ": ", cudaGetErrorString(e));
}

double gib(uint64_t bytes) { return static_cast<double>(bytes) / double(1 << 30); }

// The current device's default pool, where Tensor allocates.
cudaMemPool_t current_pool() {
  int device = 0;
  cuda_ok(cudaGetDevice(&device), "cudaGetDevice");
  cudaMemPool_t pool;
  cuda_ok(cudaDeviceGetDefaultMemPool(&pool, device), "default memory pool");
  return pool;
}

uint64_t pool_attribute(cudaMemPoolAttr attr) {
  uint64_t v = 0;
  cuda_ok(cudaMemPoolGetAttribute(current_pool(), attr, &v), "memory pool attribute");
  return v;
}

// Restarts the pool's high-water mark from what is in use now.
void reset_pool_peak() {
  uint64_t zero = 0;
  cuda_ok(cudaMemPoolSetAttribute(current_pool(), cudaMemPoolAttrUsedMemHigh, &zero), "resetting the pool's peak");
}

// One rank's share of a sequence: its rows (all of them on one GPU, the zigzag shard under CP) on the device.
struct StepInputs {
  model::CpShard rows;
  Tensor targets, d_logprobs;  // int32 [n]; fp32 [n] = 1 / (scored tokens of the whole sequence), 0 on padding
  std::unique_ptr<model::SequenceAttention> attention;
};

StepInputs make_inputs(const std::vector<int32_t>& ids, comm::Communicator* comm, const cp::CpConfig& cfg,
                       Device dev) {
  StepInputs in;
  const int64_t S = static_cast<int64_t>(ids.size());
  const int world = comm ? comm->size() : 1;
  if (comm) {
    in.rows = model::make_cp_shard(cp::ZigzagLayout(world, comm->rank(), S), ids);
    in.attention = model::make_cp_attention(*comm, cfg, S);
  } else {
    in.rows.tokens = ids, in.rows.targets = model::next_token_targets(ids);
    in.rows.positions = model::iota_positions(ids.size());
    in.attention = model::make_local_attention();
  }
  const int64_t n = static_cast<int64_t>(in.rows.tokens.size());
  std::vector<float> d(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) d[i] = in.rows.targets[i] < 0 ? 0.f : 1.f / static_cast<float>(S - 1);
  in.targets = Tensor::empty({n}, DType::I32, dev);
  in.d_logprobs = Tensor::empty({n}, DType::F32, dev);
  copy(in.targets, contiguous_view(in.rows.targets.data(), DType::I32, Device::cpu(), {n}));
  copy(in.d_logprobs, contiguous_view(d.data(), DType::F32, Device::cpu(), {n}));
  return in;
}

struct StepBuffers {
  Tensor logprobs, d_hidden;  // fp32 [n]; bf16 [n, hidden]
};

// One training step on this rank; everything enqueued on the model's stream. The loss is linear in the logprobs,
// so its gradient is known before them and the LM head runs once per chunk (logprobs and their backward together).
// When given, `phases` gets an event recorded after the forward and one after the LM head.
void train_step(model::cuda::GpuModel& m, StepInputs& in, StepBuffers& buf, int64_t chunk,
                cudaEvent_t* phases = nullptr) {
  const model::ModelConfig& c = m.config();
  const int64_t n = static_cast<int64_t>(in.rows.tokens.size());
  m.zero_grads();
  const bf16* hidden = m.forward(in.rows.tokens.data(), in.rows.positions.data(), 1, n, *in.attention, true);
  if (phases) cuda_ok(cudaEventRecord(phases[0], m.stream()), "cudaEventRecord");
  model::cuda::token_logprobs_backward(m.gemm(), buf.d_hidden.ptr<bf16>(), m.lm_head_grad(),
                                       in.d_logprobs.ptr<float>(), hidden, m.lm_head(), in.targets.ptr<int32_t>(), n,
                                       c.hidden, c.vocab, chunk, buf.logprobs.ptr<float>());
  if (phases) cuda_ok(cudaEventRecord(phases[1], m.stream()), "cudaEventRecord");
  m.backward(buf.d_hidden.ptr<bf16>(), *in.attention);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The slowest rank's time (ms): every rank waits for the others in the collectives anyway.
double max_over_ranks(double ms, comm::Communicator* comm) {
  if (!comm) return ms;
  const Tensor t = Tensor::empty({1}, DType::F32, comm->device());
  float v = static_cast<float>(ms);
  copy(t, contiguous_view(&v, DType::F32, Device::cpu(), {1}));
  comm->all_reduce(t.data(), 1, DType::F32, comm::ReduceOp::Max);
  copy(contiguous_view(&v, DType::F32, Device::cpu(), {1}), t);
  return v;
}

nlohmann::json bench_shape(model::cuda::GpuModel& m, int64_t seq, const BenchModelOpts& o, comm::Communicator* comm,
                           const cp::CpConfig& cfg) {
  const model::ModelConfig& c = m.config();
  std::mt19937_64 rng(o.seed + static_cast<uint64_t>(seq));  // the same sequence on every rank
  std::vector<int32_t> ids(static_cast<size_t>(seq));
  for (int32_t& t : ids) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.vocab));
  StepInputs in = make_inputs(ids, comm, cfg, m.device());
  const int64_t n = static_cast<int64_t>(in.rows.tokens.size());
  const int64_t chunk = o.chunk > 0 ? o.chunk : model::cuda::default_logprob_chunk(c.vocab);
  StepBuffers buf{Tensor::empty({n}, DType::F32, m.device()), Tensor::empty({n, c.hidden}, DType::BF16, m.device())};

  reset_pool_peak();
  for (int i = 0; i < o.warmup; ++i) train_step(m, in, buf, chunk);
  cuda_ok(cudaDeviceSynchronize(), "warm-up");
  // Events: start, after the forward, after the LM head, stop.
  cudaEvent_t ev[4];
  for (cudaEvent_t& e : ev) cuda_ok(cudaEventCreate(&e), "cudaEventCreate");
  std::vector<double> times, forward_ms, head_ms, backward_ms;
  const auto elapsed = [](cudaEvent_t a, cudaEvent_t b) {
    float t = 0;
    cuda_ok(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
    return static_cast<double>(t);
  };
  for (int i = 0; i < o.iters; ++i) {
    if (comm) comm->barrier();
    cuda_ok(cudaEventRecord(ev[0], m.stream()), "cudaEventRecord");
    train_step(m, in, buf, chunk, ev + 1);
    cuda_ok(cudaEventRecord(ev[3], m.stream()), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(ev[3]), "cudaEventSynchronize");
    times.push_back(elapsed(ev[0], ev[3]));
    forward_ms.push_back(elapsed(ev[0], ev[1]));
    head_ms.push_back(elapsed(ev[1], ev[2]));
    backward_ms.push_back(elapsed(ev[2], ev[3]));
  }
  for (cudaEvent_t e : ev) cudaEventDestroy(e);
  const double ms = max_over_ranks(median(times), comm);
  const uint64_t peak = pool_attribute(cudaMemPoolAttrUsedMemHigh);
  size_t free_bytes = 0, total_bytes = 0;
  cuda_ok(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");

  // The LM head alone (logprobs, then their backward), on the last forward's hidden states: its extra peak.
  cuda_ok(cudaDeviceSynchronize(), "before the logprob step");
  const uint64_t before = pool_attribute(cudaMemPoolAttrUsedMemCurrent);
  reset_pool_peak();
  model::cuda::token_logprobs(m.gemm(), buf.logprobs.ptr<float>(), m.hidden(), m.lm_head(), in.targets.ptr<int32_t>(),
                              n, c.hidden, c.vocab, chunk);
  model::cuda::token_logprobs_backward(m.gemm(), buf.d_hidden.ptr<bf16>(), m.lm_head_grad(),
                                       in.d_logprobs.ptr<float>(), m.hidden(), m.lm_head(), in.targets.ptr<int32_t>(),
                                       n, c.hidden, c.vocab, chunk);
  cuda_ok(cudaDeviceSynchronize(), "logprob step");
  const uint64_t logprob_extra = pool_attribute(cudaMemPoolAttrUsedMemHigh) - before;

  const int world = comm ? comm->size() : 1;
  const double flops = step_flops(c, seq);
  nlohmann::json row;
  row["seq"] = seq;
  row["cp"] = world;
  row["checkpoint"] = o.checkpoint;
  row["status"] = "ok";
  row["step_ms"] = ms;
  row["tokens_per_s"] = seq / (ms * 1e-3);
  row["tflops_per_gpu"] = flops / world / (ms * 1e9);
  row["mfu"] = flops / world / (ms * 1e-3) / kPeakBf16Flops;
  row["peak_pool_gib"] = gib(peak);
  row["device_used_gib"] = gib(total_bytes - free_bytes);
  row["weights_and_grads_gib"] = gib(m.weight_bytes());
  row["logprob_extra_gib"] = gib(logprob_extra);
  row["logprob_chunk"] = chunk;
  // This rank's phases (medians over the timed steps): forward, LM head (logprobs and their backward), backward.
  row["forward_ms"] = median(forward_ms);
  row["lm_head_ms"] = median(head_ms);
  row["backward_ms"] = median(backward_ms);
  return row;
}

void run_model_bench(const BenchModelOpts& o) {
  const model::ModelConfig c = bench_config(o);
  const std::vector<int64_t> seqs = parse_seqs(o.seqs);
  RT_CHECK(o.checkpoint == "none" || o.checkpoint == "all", "bench model: --checkpoint ", o.checkpoint,
           ": expected all or none");
  RT_CHECK(o.iters >= 1, "bench model: --iters must be at least 1");
  std::unique_ptr<comm::Communicator> comm;
  if (o.cp > 1) comm = nccl_from_environment(std::chrono::milliseconds(o.timeout_ms));
  const bool lead = !comm || comm->rank() == 0;
  const int device = comm ? comm->device().index : 0;
  model::ModelOptions opts;
  if (!o.backends.empty()) opts.attention_backends = attention::parse_backend_list(o.backends);
  if (o.checkpoint == "all") opts.checkpoint_layers = model::ModelOptions::checkpoint_all(c.layers);
  model::cuda::GpuModel m = model::cuda::GpuModel::random(c, o.seed, opts, device);
  cp::CpConfig cfg;
  cfg.comm = cp::parse_cp_comm(o.cp_comm);
  if (lead) {
    cudaDeviceProp prop{};
    cuda_ok(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    std::printf("model benchmark on %d x %s: %s L=%lld hidden=%lld heads=%lld/%lld head_dim=%lld ffn=%lld vocab=%lld "
                "%s, bf16, checkpoint=%s, backends=%s, warm-up %d, median of %d\n",
                o.cp, prop.name, o.arch.c_str(), static_cast<long long>(c.layers), static_cast<long long>(c.hidden),
                static_cast<long long>(c.heads), static_cast<long long>(c.kv_heads), static_cast<long long>(c.head_dim),
                static_cast<long long>(c.ffn), static_cast<long long>(c.vocab), c.tie_embeddings ? "tied" : "untied",
                o.checkpoint.c_str(), o.backends.empty() ? "default" : o.backends.c_str(), o.warmup, o.iters);
    std::printf("FLOPs/step = 6*N*S + 6*L*S^2*(heads*head_dim), N = %.4g matmul weights; MFU vs %.0f TFLOP/s per GPU\n",
                matmul_weights(c), kPeakBf16Flops / 1e12);
    std::printf("%8s %4s %10s %12s %12s %7s %10s %12s\n", "S", "cp", "step_ms", "tokens/s", "TFLOP/s/GPU", "MFU",
                "peak_GiB", "logprob_GiB");
  }
  for (int64_t seq : seqs) {
    nlohmann::json row;
    try {
      row = bench_shape(m, seq, o, comm.get(), cfg);
    } catch (const Error& e) {
      if (comm) throw;  // a rank that fails alone would leave the others waiting: the launcher stops them all
      row = {{"seq", seq}, {"cp", 1}, {"checkpoint", o.checkpoint}, {"status", cat("failed: ", e.what())}};
      cudaGetLastError();  // an out-of-memory error is not sticky; clear it for the next shape
    }
    if (!lead) continue;
    if (row["status"] == "ok") {
      std::printf("%8lld %4d %10.1f %12.0f %12.1f %6.1f%% %10.1f %12.3f\n", static_cast<long long>(seq),
                  row["cp"].get<int>(), row["step_ms"].get<double>(), row["tokens_per_s"].get<double>(),
                  row["tflops_per_gpu"].get<double>(), 100 * row["mfu"].get<double>(),
                  row["peak_pool_gib"].get<double>(), row["logprob_extra_gib"].get<double>());
      std::printf("%8s phases (rank 0): forward %.1f ms, LM head %.1f ms, backward %.1f ms\n", "",
                  row["forward_ms"].get<double>(), row["lm_head_ms"].get<double>(), row["backward_ms"].get<double>());
    } else {
      std::printf("%8lld %4d  %s\n", static_cast<long long>(seq), o.cp, row["status"].get<std::string>().c_str());
    }
    std::printf("BENCH_MODEL %s\n", row.dump().c_str());
    std::fflush(stdout);
  }
}
#endif

}  // namespace

void add_bench_model_command(CLI::App& app) {
  auto o = std::make_shared<BenchModelOpts>();
  CLI::App* bench = app.get_subcommand("bench");
  CLI::App* cmd = bench->add_subcommand("model", "Time training steps (forward, logprobs, backward) of a random model");
  cmd->add_option("--arch", o->arch, "llama, qwen2, qwen3 or mistral")->capture_default_str();
  cmd->add_option("--layers", o->layers)->capture_default_str();
  cmd->add_option("--hidden", o->hidden)->capture_default_str();
  cmd->add_option("--heads", o->heads)->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads)->capture_default_str();
  cmd->add_option("--head-dim", o->head_dim)->capture_default_str();
  cmd->add_option("--ffn", o->ffn)->capture_default_str();
  cmd->add_option("--vocab", o->vocab)->capture_default_str();
  cmd->add_flag("--untied", o->untied, "a separate lm_head (default: tied to the embeddings, as Llama-3.2-1B)");
  cmd->add_option("--seq", o->seqs, "comma-separated sequence lengths (tokens per step)")->capture_default_str();
  cmd->add_option("--cp", o->cp, "GPUs (context parallelism)")->capture_default_str();
  cmd->add_option("--cp-comm", o->cp_comm, "ring, allgather or a2a")->capture_default_str();
  cmd->add_option("--checkpoint", o->checkpoint, "activation checkpointing: all or none")->capture_default_str();
  cmd->add_option("--backends", o->backends, "the model's attention allow-list, e.g. cudnn (default: all)");
  cmd->add_option("--chunk", o->chunk, "tokens per LM-head chunk (default: within the 896 MiB budget)");
  cmd->add_option("--iters", o->iters)->capture_default_str();
  cmd->add_option("--warmup", o->warmup)->capture_default_str();
  cmd->add_option("--seed", o->seed)->capture_default_str();
  cmd->add_option("--timeout-ms", o->timeout_ms, "communicator timeout")->capture_default_str();
  cmd->callback([o] {
    if (const std::string why = cuda_unavailable_reason(); !why.empty()) {
      std::fprintf(stderr, "ringtrain: bench model needs a GPU: %s\n", why.c_str());
      throw Exit{2};
    }
    RT_CHECK(o->cp >= 1, "bench model: --cp ", o->cp, ": must be at least 1");
    if (cuda_device_count() < o->cp) {
      std::fprintf(stderr, "ringtrain: --cp %d needs %d GPUs on this node, found %d\n", o->cp, o->cp,
                   cuda_device_count());
      throw Exit{2};
    }
    if (o->cp > 1 && !inside_ranks(o->cp)) throw Exit{relaunch_self(o->cp)};
#ifdef RINGTRAIN_WITH_CUDA
    run_model_bench(*o);
#endif
  });
}

}  // namespace ringtrain::cli
