#include "ringtrain/worker/bench_rollouts.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>

#include "ringtrain/check/timing.h"
#include "ringtrain/core/clock.h"
#include "ringtrain/core/error.h"
#include "ringtrain/worker/packing.h"

namespace ringtrain::worker {
namespace {

// The bar for this mix: packed at least 2x padded, and within 15% of the long layout's tokens/s.
constexpr double kBarOverPadded = 2.0, kBarOverLong = 0.85;

// Warm-up calls, then the median wall time of `iters` calls, each started after a barrier.
template <typename F>
double median_seconds(comm::Communicator& world, int warmup, int iters, F&& call) {
  for (int i = 0; i < warmup; ++i) call();
  std::vector<double> seconds;
  for (int i = 0; i < iters; ++i) {
    world.barrier();
    const auto t0 = SteadyClock::now();
    call();
    seconds.push_back(seconds_since(t0));
  }
  return check::median(seconds);
}

// Random tokens for the given lengths; every token a loss target; +-1 advantages for clipped_pg.
std::vector<Sample> make_samples(const std::vector<int64_t>& lengths, int64_t vocab, bool advantages, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Sample> out(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    Sample& s = out[i];
    s.input_ids.resize(static_cast<size_t>(lengths[i]));
    for (int32_t& t : s.input_ids) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    s.token_mask.assign(s.input_ids.size(), 1.0f);
    if (advantages) s.advantages.assign(s.input_ids.size(), rng() % 2 ? 1.0f : -1.0f);
  }
  return out;
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t t = 0;
  for (int64_t x : v) t += x;
  return t;
}

// Tokens the forwards of a plan process: a packed row holds its sequences' tokens, a padded microbatch count x
// its longest.
int64_t processed_tokens(const std::vector<Microbatch>& plan, const std::vector<int64_t>& lengths, bool packed) {
  int64_t total = 0;
  for (const Microbatch& mb : plan) {
    if (packed) {
      total += mb.tokens;
      continue;
    }
    int64_t longest = 0;
    for (int64_t i : mb.sequences) longest = std::max(longest, lengths[static_cast<size_t>(i)]);
    total += longest * static_cast<int64_t>(mb.sequences.size());
  }
  return total;
}

double max_abs_diff(const LogprobResult& a, const LogprobResult& b) {
  RT_CHECK(a.logprobs.size() == b.logprobs.size(), "bench rollouts: ", a.logprobs.size(), " and ",
           b.logprobs.size(), " scored sequences");
  double d = 0;
  for (size_t i = 0; i < a.logprobs.size(); ++i) {
    RT_CHECK(a.logprobs[i].size() == b.logprobs[i].size(), "bench rollouts: sequence ", i, " scored with ",
             a.logprobs[i].size(), " and ", b.logprobs[i].size(), " values");
    for (size_t p = 0; p < a.logprobs[i].size(); ++p) {
      const double e = std::fabs(static_cast<double>(a.logprobs[i][p]) - b.logprobs[i][p]);
      d = std::isnan(e) ? INFINITY : std::max(d, e);
    }
  }
  return d;
}

void check_options(const BenchRolloutsOptions& o) {
  RT_CHECK(o.iters >= 1 && o.warmup >= 0, "bench rollouts: --iters must be >= 1 and --warmup >= 0");
  RT_CHECK(o.sequences >= 1, "bench rollouts: --sequences ", o.sequences, ": must be at least 1");
  RT_CHECK(o.min_len >= 1 && o.min_len <= o.max_len, "bench rollouts: --min-len ", o.min_len, " and --max-len ",
           o.max_len, ": need 1 <= min <= max");
  RT_CHECK(o.mb_tokens >= o.max_len, "bench rollouts: --mb-tokens ", o.mb_tokens, " is below --max-len ", o.max_len,
           ": the longest sequence must fit one packed row");
  RT_CHECK(o.padded_batch >= 1 && o.sequences % o.padded_batch == 0, "bench rollouts: --padded-batch ",
           o.padded_batch, " must divide --sequences ", o.sequences, " (one train step takes the whole batch)");
  RT_CHECK(o.long_len >= 0, "bench rollouts: --long-len ", o.long_len, ": must be >= 0 (0 = --mb-tokens)");
  RT_CHECK(o.loss == "nll" || o.loss == "clipped_pg", "bench rollouts: --loss ", o.loss,
           ": expected nll or clipped_pg");
}

}  // namespace

std::vector<int64_t> rollout_lengths(int64_t n, int64_t min_len, int64_t max_len, uint64_t seed) {
  RT_CHECK(n >= 0 && min_len >= 1 && min_len <= max_len, "rollout_lengths: n ", n, ", lengths [", min_len, ", ",
           max_len, "]");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(std::log(static_cast<double>(min_len)),
                                           std::log(static_cast<double>(max_len)));
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t& len : out) len = std::clamp<int64_t>(std::llround(std::exp(u(rng))), min_len, max_len);
  return out;
}

Config rollouts_layout_config(const BenchRolloutsOptions& o, const std::string& layout, int64_t sequences,
                              int64_t max_length) {
  Config c;
  c.policy.model_name = o.model_name;
  c.device = o.device;
  // validate() asks for a data source; the batches here are made in memory and handed to the worker directly.
  c.train.data = "(bench rollouts: generated in memory)";
  c.train.seed = o.seed;
  c.attention_backends = o.backends;
  c.loss_fn.type = o.loss == "clipped_pg" ? LossType::ClippedPg : LossType::Nll;
  PolicyConfig& p = c.policy;
  p.train_global_batch_size = sequences;
  p.max_total_sequence_length = max_length;
  p.logprob_chunk_size = o.logprob_chunk;
  p.dtensor_cfg.activation_checkpointing = o.activation_checkpointing;
  p.train_micro_batch_size = p.logprob_batch_size = 1;
  if (layout == "packed" || layout == "long") {
    p.sequence_packing.enabled = true;
    p.sequence_packing.train_mb_tokens = p.sequence_packing.logprob_mb_tokens = std::max(o.mb_tokens, max_length);
  } else if (layout == "dynamic") {
    p.dynamic_batching.enabled = true;
    p.dynamic_batching.train_mb_tokens = p.dynamic_batching.logprob_mb_tokens = std::max(o.mb_tokens, max_length);
  } else {
    RT_CHECK(layout == "padded", "bench rollouts: unknown layout ", layout);
    p.train_micro_batch_size = p.logprob_batch_size = o.padded_batch;
  }
  return c;
}

nlohmann::json run_rollouts_bench(const BenchRolloutsOptions& o, comm::Communicator& world,
                                  std::map<std::string, LogprobResult>* logprobs) {
  check_options(o);
  RT_CHECK(world.size() == 1, "bench rollouts: runs on one rank (one device), the world has ", world.size());
  const std::vector<int64_t> lengths = rollout_lengths(o.sequences, o.min_len, o.max_len, o.seed);
  const int64_t total = sum(lengths);
  const bool pg = o.loss == "clipped_pg";

  // The long layout: the same total as sequences of long_len tokens, the last one holding the rest.
  const int64_t long_len = std::min(o.long_len > 0 ? o.long_len : o.mb_tokens, total);
  std::vector<int64_t> long_lengths(static_cast<size_t>(total / long_len), long_len);
  if (total % long_len) long_lengths.push_back(total % long_len);

  std::vector<std::string> layouts{"packed", "padded"};
  if (o.dynamic) layouts.push_back("dynamic");
  layouts.push_back("long");

  nlohmann::json rows = nlohmann::json::array();
  std::map<std::string, LogprobResult> first_scores;
  std::map<std::string, std::map<std::string, double>> tokens_per_s;  // pass -> layout -> real tokens/s
  nlohmann::json model_json;
  for (const std::string& layout : layouts) {
    const bool is_long = layout == "long";
    const std::vector<int64_t>& lens = is_long ? long_lengths : lengths;
    const Config c =
        rollouts_layout_config(o, layout, static_cast<int64_t>(lens.size()), is_long ? long_len : o.max_len);
    const auto worker = std::make_unique<PolicyWorker>(c, world);
    const model::ModelConfig& m = worker->model_config();
    if (model_json.is_null()) {
      model_json = {{"model_name", o.model_name}, {"arch", model::arch_class_name(m.arch)}, {"layers", m.layers},
                    {"hidden", m.hidden}, {"heads", m.heads}, {"kv_heads", m.kv_heads}, {"head_dim", m.head_dim},
                    {"ffn", m.ffn}, {"vocab", m.vocab}, {"tied", m.tie_embeddings},
                    {"dtype", std::string(dtype_name(c.compute_dtype()))}};
    }
    // The long layout's tokens from their own stream; packed, padded and dynamic score the very same samples.
    std::vector<Sample> samples = make_samples(lens, m.vocab, pg, is_long ? o.seed + 1 : o.seed);
    int64_t tokens = 0;
    for (const Sample& s : samples) tokens += s.length();

    const auto add_row = [&](const char* pass, Pass plan_pass, double seconds) -> nlohmann::json& {
      const std::vector<Microbatch> plan = plan_microbatches(c, lens, plan_pass);
      const double tps = seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0;
      tokens_per_s[pass][layout] = tps;
      rows.push_back({{"layout", layout}, {"pass", pass}, {"sequences", samples.size()}, {"tokens", tokens},
                      {"processed_tokens", processed_tokens(plan, lens, c.policy.sequence_packing.enabled)},
                      {"microbatches", plan.size()}, {"seconds", seconds}, {"tokens_per_s", tps}});
      return rows.back();
    };

    LogprobResult first;
    bool scored = false;
    const double score_s = median_seconds(world, o.warmup, o.iters, [&] {
      LogprobResult r = worker->get_logprobs(samples);
      if (!scored) first = std::move(r), scored = true;
    });
    add_row("logprobs", Pass::Score, score_s);
    if (o.train) {
      if (pg)  // the policy's own logprobs as the rollout's: ratios start at 1
        for (size_t i = 0; i < samples.size(); ++i) samples[i].prev_logprobs = first.logprobs[i];
      TrainResult step;  // the first step's: every layout takes it from the same weights
      bool stepped = false;
      const double train_s = median_seconds(world, o.warmup, o.iters, [&] {
        TrainResult r = worker->train(samples);
        if (!stepped) step = std::move(r), stepped = true;
      });
      nlohmann::json& row = add_row("train", Pass::Train, train_s);
      row["first_loss"] = step.step.loss;
      row["first_grad_norm"] = step.step.grad_norm;
    }
    first_scores[layout] = std::move(first);
  }

  nlohmann::json report;
  report["model"] = model_json;
  report["device"] = o.device.is_cuda() ? "cuda" : "cpu";
  report["mix"] = {{"sequences", o.sequences}, {"min_len", o.min_len}, {"max_len", o.max_len}, {"seed", o.seed},
                   {"tokens", total}, {"shortest", *std::min_element(lengths.begin(), lengths.end())},
                   {"longest", *std::max_element(lengths.begin(), lengths.end())}, {"lengths", lengths}};
  report["mb_tokens"] = o.mb_tokens;
  report["padded_batch"] = o.padded_batch;
  report["long"] = {{"sequence_tokens", long_len}, {"sequences", long_lengths.size()}, {"tokens", sum(long_lengths)}};
  report["loss"] = o.loss;
  report["iters"] = o.iters;
  report["warmup"] = o.warmup;
  report["rows"] = rows;
  nlohmann::json ratios = nlohmann::json::object();
  for (const auto& [pass, by_layout] : tokens_per_s) {
    const double packed = by_layout.at("packed");
    nlohmann::json r;
    r["packed_over_padded"] = packed / by_layout.at("padded");
    r["packed_over_long"] = packed / by_layout.at("long");
    if (by_layout.count("dynamic")) r["packed_over_dynamic"] = packed / by_layout.at("dynamic");
    r["meets_bar"] = r["packed_over_padded"].get<double>() >= kBarOverPadded &&
                     r["packed_over_long"].get<double>() >= kBarOverLong;
    ratios[pass] = r;
  }
  report["ratios"] = ratios;
  report["bar"] = {{"packed_over_padded_min", kBarOverPadded}, {"packed_over_long_min", kBarOverLong}};
  report["logprobs_max_abs_diff_packed_vs_padded"] = max_abs_diff(first_scores.at("packed"), first_scores.at("padded"));
  if (logprobs) *logprobs = std::move(first_scores);
  return report;
}

}  // namespace ringtrain::worker
