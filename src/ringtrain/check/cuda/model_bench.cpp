// run_model_bench (`ringtrain bench model`): times training steps of a causal LM with random weights on one GPU or,
// with --cp N, on N GPUs with context parallelism (one process per GPU). A step zeroes the fp32 gradients, runs forward, the token
// logprobs (chunked LM head) and the backward of the loss mean(logprob) over the sequence's scored tokens into
// every weight gradient. Warm-up steps, then the median of timed steps (CUDA events on the model's stream); marks
// inside each step split it into forward, LM head and backward (rank 0's medians, printed below each row).
//
// FLOPs per step for a sequence of S tokens, as bench/compare_hf_model.py counts them (MFU, so recomputation under
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
#include <cuda_runtime_api.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ringtrain/check/cuda/cuda_checks.h"
#include "ringtrain/check/timing.h"
#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/cp_scoring.h"
#include "ringtrain/model/flops.h"
#include "ringtrain/model/cuda/gpu_logprobs.h"
#include "ringtrain/model/cuda/gpu_model.h"
#include "ringtrain/model/hf_config.h"
#include "ringtrain/model/logprobs.h"

namespace ringtrain::check::cuda {
namespace {

using model::cuda::bf16;

model::ModelConfig bench_config(const ModelBenchOptions& o) {
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

// The current device's default pool, where Tensor allocates.
cudaMemPool_t current_pool() {
  int device = 0;
  RT_CUDA_CHECK(cudaGetDevice(&device));
  cudaMemPool_t pool;
  RT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device), "default memory pool");
  return pool;
}

uint64_t pool_attribute(cudaMemPoolAttr attr) {
  uint64_t v = 0;
  RT_CUDA_CHECK(cudaMemPoolGetAttribute(current_pool(), attr, &v), "memory pool attribute");
  return v;
}

// Restarts the pool's high-water mark from what is in use now.
void reset_pool_peak() {
  uint64_t zero = 0;
  RT_CUDA_CHECK(cudaMemPoolSetAttribute(current_pool(), cudaMemPoolAttrUsedMemHigh, &zero),
                "resetting the pool's peak");
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
// When given, `clock` is marked after the forward and after the LM head.
void train_step(model::cuda::GpuModel& m, StepInputs& in, StepBuffers& buf, int64_t chunk,
                DeviceClock* clock = nullptr) {
  const model::ModelConfig& c = m.config();
  const int64_t n = static_cast<int64_t>(in.rows.tokens.size());
  m.zero_grads();
  const bf16* hidden = m.forward(in.rows.tokens.data(), in.rows.positions.data(), 1, n, *in.attention, true);
  if (clock) clock->mark();
  model::cuda::token_logprobs_backward(m.gemm(), buf.d_hidden.ptr<bf16>(), m.lm_head_grad(),
                                       in.d_logprobs.ptr<float>(), hidden, m.lm_head(), in.targets.ptr<int32_t>(), n,
                                       c.hidden, c.vocab, chunk, buf.logprobs.ptr<float>());
  if (clock) clock->mark();
  m.backward(buf.d_hidden.ptr<bf16>(), *in.attention);
}

nlohmann::json bench_shape(model::cuda::GpuModel& m, int64_t seq, const ModelBenchOptions& o, comm::Communicator* comm,
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
  // Marks: start, after the forward, after the LM head, end.
  const TimedRuns runs = time_runs(
      m.device(), m.stream(), o.warmup, o.iters, [&](int, DeviceClock& clock) { train_step(m, in, buf, chunk, &clock); },
      [&] {
        if (comm) comm->barrier();
      });
  const double ms = comm ? max_over_ranks(*comm, runs.median_to(2)) : runs.median_to(2);
  const uint64_t peak = pool_attribute(cudaMemPoolAttrUsedMemHigh);
  size_t free_bytes = 0, total_bytes = 0;
  RT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));

  // The LM head alone (logprobs, then their backward), on the last forward's hidden states: its extra peak.
  RT_CUDA_CHECK(cudaDeviceSynchronize(), "before the logprob step");
  const uint64_t before = pool_attribute(cudaMemPoolAttrUsedMemCurrent);
  reset_pool_peak();
  model::cuda::token_logprobs(m.gemm(), buf.logprobs.ptr<float>(), m.hidden(), m.lm_head(), in.targets.ptr<int32_t>(),
                              n, c.hidden, c.vocab, chunk);
  model::cuda::token_logprobs_backward(m.gemm(), buf.d_hidden.ptr<bf16>(), m.lm_head_grad(),
                                       in.d_logprobs.ptr<float>(), m.hidden(), m.lm_head(), in.targets.ptr<int32_t>(),
                                       n, c.hidden, c.vocab, chunk);
  RT_CUDA_CHECK(cudaDeviceSynchronize(), "logprob step");
  const uint64_t logprob_extra = pool_attribute(cudaMemPoolAttrUsedMemHigh) - before;

  const int world = comm ? comm->size() : 1;
  const double flops = model::train_step_flops(c, seq);
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
  row["forward_ms"] = runs.median_to(0);
  row["lm_head_ms"] = runs.median_between(0, 1);
  row["backward_ms"] = runs.median_between(1, 2);
  return row;
}

}  // namespace

void run_model_bench(const ModelBenchOptions& o, comm::Communicator* comm, const ModelBenchReport& report) {
  const model::ModelConfig c = bench_config(o);
  RT_CHECK(!o.seqs.empty(), "bench model: no sequence lengths");
  RT_CHECK(o.checkpoint == "none" || o.checkpoint == "all", "bench model: --checkpoint ", o.checkpoint,
           ": expected all or none");
  RT_CHECK(o.iters >= 1, "bench model: --iters must be at least 1");
  const int device = comm ? comm->device().index : 0;
  model::ModelOptions opts;
  opts.attention_backends = o.model_backends;
  if (o.checkpoint == "all") opts.checkpoint_layers = model::ModelOptions::checkpoint_all(c.layers);
  model::cuda::GpuModel m = model::cuda::GpuModel::random(c, o.seed, opts, device);
  cp::CpConfig cfg;
  cfg.comm = cp::parse_cp_comm(o.cp_comm);
  report.header(gpu_name(device), model::matmul_weights(c));
  for (int64_t seq : o.seqs) {
    nlohmann::json row;
    try {
      row = bench_shape(m, seq, o, comm, cfg);
    } catch (const Error& e) {
      if (comm) throw;  // a rank that fails alone would leave the others waiting: the launcher stops them all
      row = {{"seq", seq}, {"cp", 1}, {"checkpoint", o.checkpoint}, {"status", cat("failed: ", e.what())}};
      cudaGetLastError();  // an out-of-memory error is not sticky; clear it for the next shape
    }
    report.row(row);
  }
}

}  // namespace ringtrain::check::cuda
