#include "ringtrain/train/bench_train.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <random>

#include "ringtrain/attention/backend.h"
#include "ringtrain/check/device_checks.h"
#include "ringtrain/check/timing.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/flops.h"
#include "ringtrain/model/policy.h"
#include "ringtrain/train/mesh.h"
#include "ringtrain/train/trainer.h"

namespace ringtrain::train {
namespace {

using Clock = std::chrono::steady_clock;
using check::gib;
using check::max_over_ranks;
using check::median;

}  // namespace

std::vector<float> random_weights(const model::ModelConfig& c, uint64_t seed) {
  const model::ParamLayout layout(c);
  std::vector<float> params(static_cast<size_t>(layout.total()));
  fill_normal_hashed(contiguous_view(params.data(), DType::F32, Device::cpu(), {layout.total()}), seed, 0.02);
  for (const model::ParamSpec& s : layout.specs()) {
    const bool norm = s.name.find("norm.weight") != std::string::npos, bias = s.name.ends_with(".bias");
    if (norm || bias) std::fill_n(params.begin() + s.offset, s.numel, norm ? 1.f : 0.f);
  }
  return params;
}

model::ModelConfig llama_1b_config() {
  model::ModelConfig c;
  c.arch = model::Arch::Llama;
  c.layers = 16, c.hidden = 2048, c.heads = 32, c.kv_heads = 8, c.head_dim = 64, c.ffn = 8192, c.vocab = 128256;
  c.tie_embeddings = true;
  c.rope.theta = 500000.0;
  c.rms_eps = 1e-5;
  c.max_positions = 1 << 20;
  return c;
}

nlohmann::json run_train_bench(const BenchTrainOptions& o, comm::Communicator& world) {
  RT_CHECK(o.steps >= 1 && o.warmup >= 0, "bench train: --steps must be >= 1 and --warmup >= 0");
  RT_CHECK(o.seq >= 2, "bench train: --seq must be at least 2");
  const model::ModelConfig& c = o.model;
  const Device dev = world.device();
  const Mesh mesh(world, {1, world.size()});
  model::PolicyOptions po;
  po.device = dev;
  po.dtype = dev.is_cpu() ? DType::F32 : DType::BF16;
  po.logprob_chunk = o.logprob_chunk;
  po.cp_group = &mesh.cp_group();
  if (!o.backends.empty()) po.model.attention_backends = attention::parse_backend_list(o.backends);
  const auto policy = model::make_policy(c, random_weights(c, o.seed), po);

  // One sequence of seq random tokens (the same on every rank), every token scored.
  TrainBatch batch;
  std::mt19937_64 rng(o.seed + static_cast<uint64_t>(o.seq));
  batch.sequences.emplace_back(static_cast<size_t>(o.seq));
  for (int32_t& t : batch.sequences[0]) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.vocab));
  TrainerConfig cfg;
  cfg.micro_batch_size = 1;
  cfg.loss.kind = parse_loss_kind(o.loss);
  RT_CHECK(cfg.loss.kind != LossKind::DPO, "bench train: --loss must be nll or pg");
  if (cfg.loss.kind == LossKind::ClippedPG) {  // ratios near 1 against the starting policy, a KL term, ±1 advantages
    batch.prev_logprobs = policy->score({batch.sequences}, false).logprobs;
    batch.ref_logprobs = batch.prev_logprobs;
    batch.advantages.emplace_back(static_cast<size_t>(o.seq));
    for (float& a : batch.advantages[0]) a = rng() % 2 ? 1.f : -1.f;
    cfg.loss.pg.kl_beta = 0.01;
  }
  cfg.schedule.base_lr = 1e-5;
  Trainer trainer(cfg, *policy, mesh);

  for (int i = 0; i < o.warmup; ++i) trainer.step(batch);
  synchronize(dev);
  if (dev.is_cuda()) cuda_reset_pool_peak(dev.index);
  std::vector<double> step_ms;
  StepResult last;
  for (int i = 0; i < o.steps; ++i) {
    world.barrier();
    synchronize(dev);
    const auto t0 = Clock::now();
    last = trainer.step(batch);
    synchronize(dev);
    step_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  const double peak = dev.is_cuda() ? static_cast<double>(cuda_pool_peak_bytes(dev.index)) : 0.0;

  std::map<Phase, std::vector<double>> phase_ms;
  for (int i = 0; i < o.steps; ++i) {
    std::map<Phase, double> in_step;
    world.barrier();
    synchronize(dev);
    auto since = Clock::now();
    trainer.step(batch, [&](Phase p) {
      synchronize(dev);
      const auto now = Clock::now();
      in_step[p] += std::chrono::duration<double, std::milli>(now - since).count();
      since = now;
    });
    for (const auto& [p, ms] : in_step) phase_ms[p].push_back(ms);
  }

  const double ms = max_over_ranks(world, median(step_ms));
  const double flops = model::train_step_flops(c, o.seq);
  const int gpus = world.size();
  const int64_t shard = trainer.shard().end - trainer.shard().begin;
  nlohmann::json row;
  row["seq"] = o.seq;
  row["cp"] = gpus;
  row["loss_kind"] = o.loss;
  row["step_ms"] = ms;
  row["tokens_per_s"] = o.seq / (ms * 1e-3);
  row["tflops_per_gpu"] = flops / gpus / (ms * 1e9);
  row["mfu"] = flops / gpus / (ms * 1e-3) / check::kPeakBf16Flops;
  row["peak_pool_gib"] = gib(peak);
  row["params"] = policy->weights().numel();
  row["weights_gib"] = gib(static_cast<double>(policy->weights().nbytes()));
  row["grads_gib"] = gib(static_cast<double>(policy->grads().nbytes()));
  // fp32 (fp64 for fp64 models) master weights and two moments of this rank's 1/(dp·cp) shard.
  const double state_bytes = 3.0 * static_cast<double>(shard) * dtype_size(trainer.shard().master.dtype());
  row["optimizer_gib"] = gib(state_bytes);
  row["loss"] = last.loss;
  row["grad_norm"] = last.grad_norm;
  nlohmann::json phases = nlohmann::json::array();  // in the order they run
  for (const auto& [p, v] : phase_ms) phases.push_back({{"phase", phase_name(p)}, {"ms", median(v)}});
  row["phases_ms"] = phases;
  return row;
}

}  // namespace ringtrain::train
