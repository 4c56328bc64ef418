#include "ringtrain/rl/grpo.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

#include "ringtrain/comm/agreed.h"
#include "ringtrain/core/clock.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/fnv1a.h"
#include "ringtrain/rl/prompt_file.h"
#include "ringtrain/train/checkpoint.h"
#include "ringtrain/worker/metrics.h"
#include "ringtrain/worker/policy_worker.h"
#include "ringtrain/worker/train_loop.h"

namespace ringtrain::rl {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kBuiltinTask = "builtin:reverse_digits";
// The warm-up's examples come from indices far above any GRPO prompt's, so that on the built-in task the two streams
// never share a prompt (a prompt file is cycled by both).
constexpr uint64_t kWarmupIndexBase = uint64_t{1} << 40;

// Prompt tokens of an example, checked to leave room for `response_tokens` (named by `what`) within the sequence
// limit.
std::vector<int32_t> checked_prompt(const CharTokenizer& tok, const Example& ex, int64_t response_tokens,
                                    const std::string& what, const worker::Config& c) {
  std::vector<int32_t> p = tok.encode_prompt(ex.prompt);
  const int64_t total = static_cast<int64_t>(p.size()) + response_tokens;
  RT_CHECK(total <= c.policy.max_total_sequence_length, ex.origin.empty() ? "" : ex.origin + ": ", what, ": prompt '",
           ex.prompt.substr(0, 40), "' (", p.size(),
           " tokens) + ", response_tokens, " response tokens exceeds policy.max_total_sequence_length = ",
           c.policy.max_total_sequence_length);
  return p;
}

// SFT on the reference answers through a worker of the same config with loss nll at a constant learning rate;
// its final weights go to `out` (a Hugging Face checkpoint).
void sft_warmup(const worker::Config& config, comm::Communicator& world, const PromptSource& prompts,
                const CharTokenizer& tok, worker::MetricsWriter* metrics, const GrpoOptions& options,
                const fs::path& out) {
  worker::Config w = config;
  w.loss_fn.type = worker::LossType::Nll;
  w.train.steps = config.grpo.sft_warmup_steps;
  if (config.grpo.sft_warmup_lr > 0) w.policy.optimizer.lr = config.grpo.sft_warmup_lr;
  w.policy.scheduler = worker::SchedulerConfig{};
  worker::PolicyWorker policy_worker(w, world, options.starting_weights, options.stop);
  const bool lead = world.rank() == 0;
  const int64_t batch = config.policy.train_global_batch_size, steps = w.train.steps;
  std::unique_ptr<worker::ProgressLine> progress;
  if (lead && options.progress) {
    std::fprintf(stderr, "SFT warm-up: %lld steps of %lld reference answers (loss nll, lr %g)\n",
                 static_cast<long long>(steps), static_cast<long long>(batch), w.policy.optimizer.lr);
    progress = std::make_unique<worker::ProgressLine>(steps);
  }
  int64_t step = 0;
  try {
    for (; step < steps; ++step) {
      std::vector<worker::Sample> samples;
      int64_t tokens = 0;
      for (int64_t i = 0; i < batch; ++i) {
        const Example ex = prompts.example(kWarmupIndexBase + static_cast<uint64_t>(step * batch + i));
        const std::vector<int32_t> answer = tok.encode_answer(ex.answer);
        const int64_t answer_tokens = static_cast<int64_t>(answer.size());
        samples.push_back(sft_sample(checked_prompt(tok, ex, answer_tokens, "SFT warm-up", config), answer));
        tokens += samples.back().length();
      }
      const worker::TrainResult r = policy_worker.train(samples);
      if (metrics) {
        metrics->write(step + 1, {{"warmup/loss", r.step.loss},
                                  {"warmup/grad_norm", r.step.grad_norm},
                                  {"warmup/lr", r.step.lr},
                                  {"warmup/tokens_per_second", static_cast<double>(tokens) / r.seconds}});
      }
      if (progress) progress->update(step + 1, tokens, r.step.loss, "SFT warm-up");
    }
  } catch (const comm::Interrupted&) {
    if (progress) progress->finish();
    // The warm-up's steps are no GRPO checkpoint's: nothing is saved, and --resume runs the warm-up again.
    const std::string where = cat("stopped in SFT warm-up step ", step + 1, " of ", steps, ", which changed nothing");
    worker::save_at_stop_and_report(config, lead, "grpo", where, 0, 0, {});
    throw;
  }
  if (progress) progress->finish();
  policy_worker.export_hf(out);
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

// KL(policy || reference) before the step, as the k3 estimate e^x - 1 - x with x = ref - cur, averaged over the
// response tokens: reported whatever the loss's KL weight (the loss's own ref_kl exists only with a weight).
double mean_k3_kl(const std::vector<worker::Sample>& samples, const worker::LogprobResult& cur,
                  const worker::LogprobResult& ref) {
  double sum = 0, count = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    for (size_t p = 1; p < samples[i].token_mask.size(); ++p) {
      if (samples[i].token_mask[p] == 0.f) continue;
      const double x = static_cast<double>(ref.logprobs[i][p]) - cur.logprobs[i][p];
      sum += std::expm1(x) - x;
      count += 1;
    }
  }
  return count > 0 ? sum / count : 0.0;
}

}  // namespace

GroupAdvantages group_advantages(std::span<const double> rewards, std::span<const int64_t> group_of,
                                 const AdvantageOptions& o) {
  RT_CHECK(group_of.size() == rewards.size(), "group_advantages: ", rewards.size(), " rewards but ", group_of.size(),
           " group keys");
  std::map<int64_t, std::vector<size_t>> members;
  for (size_t i = 0; i < rewards.size(); ++i) members[group_of[i]].push_back(i);
  GroupAdvantages out;
  out.advantages.resize(rewards.size());
  out.groups = static_cast<int64_t>(members.size());
  std::vector<double> group;
  for (const auto& [key, index] : members) {
    const size_t g = index.size();
    RT_CHECK(!o.leave_one_out || g >= 2, "group_advantages: a leave-one-out baseline needs groups of 2 or more; group ",
             key, " has 1 sample");
    group.clear();
    for (size_t i : index) group.push_back(rewards[i]);
    const double n = static_cast<double>(g);
    double mean = 0;
    for (double r : group) mean += r;
    mean /= n;
    double squares = 0;  // Σ (r - mean)², two passes for accuracy
    for (double r : group) squares += (r - mean) * (r - mean);
    // The group's first value and the first other one, with their counts. With two distinct values, a sample whose
    // value occurs once sees only the other value: its others' spread is exactly 0, which the downdated sum of
    // squares below would leave as a rounding residue (and divide by).
    const double a = group[0];
    const auto b = std::find_if(group.begin(), group.end(), [&](double r) { return r != a; });
    const size_t count_a = static_cast<size_t>(std::count(group.begin(), group.end(), a));
    const size_t count_b = b == group.end() ? 0 : static_cast<size_t>(std::count(group.begin(), group.end(), *b));
    const bool two_values = count_a + count_b == g;
    // Exactly 0 for a uniform group (r − mean can be a rounding residue of the mean, not a signal); a group of one
    // sample is uniform.
    if (count_a == g) {
      out.uniform_groups += 1;
      for (size_t i : index) out.advantages[i] = 0.0;
      continue;
    }
    // The sample variance (Bessel's correction, as NeMo RL's calculate_baseline_and_std_per_prompt): of the group,
    // or with a leave-one-out baseline of the n - 1 others; of one other it is 0 (the advantage stays r_i - r_j).
    for (size_t i = 0; i < g; ++i) {
      double baseline = mean, variance = squares / (n - 1);
      if (o.leave_one_out) {
        // The others' mean and squared deviations from the whole group's: d = r_i - mean moves the mean by
        // d / (n - 1) and takes d² n / (n - 1) from the sum of squares.
        const double d = group[i] - mean;
        baseline = mean - d / (n - 1);
        const bool alone = g == 2 || (two_values && (group[i] == a ? count_a : count_b) == 1);
        variance = alone ? 0.0 : (squares - d * d * n / (n - 1)) / (n - 2);
        // Where the others nearly agree the downdate is cancellation noise: their spread from them directly.
        if (!alone && variance <= 1e-12 * squares / (n - 2)) {
          double others = 0, spread = 0;
          for (size_t j = 0; j < g; ++j) others += j == i ? 0.0 : group[j];
          others /= n - 1;
          for (size_t j = 0; j < g; ++j) spread += j == i ? 0.0 : (group[j] - others) * (group[j] - others);
          variance = spread / (n - 2);
        }
      }
      const double std_dev = std::sqrt(variance);
      double advantage = group[i] - baseline;
      if (o.normalize && std_dev > 0) advantage /= std_dev + o.eps;
      out.advantages[index[i]] = advantage;
    }
  }
  return out;
}

std::vector<int64_t> prompt_groups(std::span<const std::vector<int32_t>> prompts) {
  std::map<std::vector<int32_t>, int64_t> first;  // prompt tokens -> index of its first rollout
  std::vector<int64_t> out;
  out.reserve(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    out.push_back(first.try_emplace(prompts[i], static_cast<int64_t>(i)).first->second);
  return out;
}

worker::Sample rollout_sample(std::span<const int32_t> prompt, const model::Generation& generation, double advantage) {
  RT_CHECK(!prompt.empty() && !generation.tokens.empty(), "rollout_sample: empty prompt or response");
  RT_CHECK(generation.logprobs.size() == generation.tokens.size(), "rollout_sample: ", generation.logprobs.size(),
           " logprobs for ", generation.tokens.size(), " tokens");
  worker::Sample s;
  s.input_ids.assign(prompt.begin(), prompt.end());
  s.input_ids.insert(s.input_ids.end(), generation.tokens.begin(), generation.tokens.end());
  const size_t n = s.input_ids.size(), p = prompt.size();
  s.token_mask.assign(n, 0.f);
  s.advantages.assign(n, 0.f);
  s.generation_logprobs.assign(n, 0.f);
  for (size_t i = p; i < n; ++i) {
    s.token_mask[i] = 1.f;
    s.advantages[i] = static_cast<float>(advantage);
    s.generation_logprobs[i] = generation.logprobs[i - p];
  }
  return s;
}

worker::Sample sft_sample(std::span<const int32_t> prompt, std::span<const int32_t> answer) {
  model::Generation g;
  g.tokens.assign(answer.begin(), answer.end());
  g.logprobs.assign(answer.size(), 0.f);
  worker::Sample s = rollout_sample(prompt, g, 0.0);
  s.advantages.clear();
  s.generation_logprobs.clear();
  return s;
}

PromptSource::PromptSource(const worker::Config& config, const CharTokenizer& tokenizer) {
  const std::string& p = config.grpo.prompts;
  RT_CHECK(!p.empty(), "grpo.prompts is required for a GRPO run (", kBuiltinTask, " or a JSONL prompt file)");
  if (p.starts_with("builtin:")) {
    RT_CHECK(p == kBuiltinTask, "grpo.prompts = ", p.substr(0, 60), ": unknown built-in task (known: ", kBuiltinTask,
             ")");
    task_ = std::make_unique<ReverseDigitsTask>(config.train.seed);
    identity_ = p;
  } else {
    file_ = read_prompt_file(p, tokenizer);  // an error for a file without records
    Fnv1a hash;
    for (const Example& e : file_) hash.mix(e.prompt), hash.mix(e.answer);
    identity_ = cat("a file of ", file_.size(), " records (", hash.hex(), ")");
  }
}

Example PromptSource::example(uint64_t index) const {
  if (task_) return task_->example(index);
  return file_[index % file_.size()];
}

std::vector<Example> PromptSource::length_bounds() const {
  if (task_) return {task_->longest_example()};
  return file_;
}

namespace {

// The held-out examples of a run that validates: grpo.val_prompts' first grpo.max_val_samples records, or without
// that file the built-in task's examples at indices no GRPO step or warm-up draws. A prompt file has no held-out part.
std::vector<Example> validation_examples(const worker::Config& config, const CharTokenizer& tok,
                                         const PromptSource& prompts) {
  const worker::GrpoConfig& g = config.grpo;
  std::vector<Example> out;
  if (!g.validates()) return out;
  if (!g.val_prompts.empty()) {
    out = read_prompt_file(g.val_prompts, tok);  // an error for a file without records
    if (static_cast<int64_t>(out.size()) > g.max_val_samples) out.resize(static_cast<size_t>(g.max_val_samples));
    return out;
  }
  RT_CHECK(prompts.builtin(), "grpo.val_prompts is required to validate a run on a prompt file (grpo.prompts = ",
           g.prompts, "): name a JSONL file of held-out {prompt, answer} records, or set grpo.val_period = 0 and "
           "grpo.val_at_start = false");
  for (int64_t i = 0; i < g.max_val_samples; ++i)
    out.push_back(prompts.example(kValidationIndexBase + static_cast<uint64_t>(i)));
  return out;
}

// check_grpo_config on the prompts that the run reads (a prompt file is read once).
void check_grpo_run(const worker::Config& config, const model::ModelConfig* model, const CharTokenizer& tok,
                    const PromptSource& prompts, std::span<const Example> validation) {
  const worker::GrpoConfig& g = config.grpo;
  if (model)
    RT_CHECK(model->vocab >= tok.vocab_size(), "policy.model_name = ", config.policy.model_name, ": its vocabulary (",
             model->vocab, ") is smaller than the task tokenizer's (", tok.vocab_size(), ")");
  parse_reward_mode(g.reward);
  RT_CHECK(g.sft_warmup_steps == 0 || !config.train.checkpoint_dir.empty(),
           "grpo.sft_warmup_steps needs train.checkpoint_dir: the warm-up's weights (the reference policy) are kept "
           "there");
  // Prompt lengths against grpo.max_new_tokens (and, with a warm-up, answer lengths) now, as each step's are before
  // it samples: a length that cannot fit is refused, naming its record, before any step is spent or file made.
  const std::string sampling = cat("grpo.max_new_tokens = ", g.max_new_tokens);
  const auto check = [&](const Example& ex) {
    checked_prompt(tok, ex, g.max_new_tokens, sampling, config);
    if (g.sft_warmup_steps > 0)
      checked_prompt(tok, ex, static_cast<int64_t>(tok.encode_answer(ex.answer).size()), "SFT warm-up", config);
  };
  for (const Example& ex : prompts.length_bounds()) check(ex);
  for (const Example& ex : validation) checked_prompt(tok, ex, g.max_new_tokens, "validation: " + sampling, config);
}

struct Validation {
  double reward = 0, exact_match = 0, length_mean = 0, seconds = 0;
};

// One greedy response per held-out example, scored by the run's reward; the prompts go to the sampler in batches of
// a step's rollouts (policy.train_global_batch_size), which the sampler is known to hold. Every rank samples the
// same responses; a stop asked on any rank stops all of them here together (comm::Interrupted).
Validation validate(model::Sampler& sampler, std::span<const Example> examples, const CharTokenizer& tok,
                    const worker::Config& config, RewardMode mode, comm::Communicator& world, const StopRequest* stop,
                    const std::string& what) {
  const auto t0 = SteadyClock::now();
  model::SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = config.grpo.max_new_tokens;
  greedy.stop_tokens = {CharTokenizer::kEos};
  const size_t batch = static_cast<size_t>(config.policy.train_global_batch_size);
  Validation v;
  for (size_t first = 0; first < examples.size(); first += batch) {
    const std::span<const Example> part = examples.subspan(first, std::min(batch, examples.size() - first));
    std::vector<std::vector<int32_t>> prompts;
    for (const Example& ex : part) prompts.push_back(tok.encode_prompt(ex.prompt));
    std::vector<model::Generation> gens;
    bool stopped = false;
    try {
      gens = sampler.generate(prompts, greedy);
    } catch (const comm::Interrupted&) {
      stopped = true;
    }
    comm::agree_to_stop(world, stop, stopped, what);
    for (size_t i = 0; i < part.size(); ++i) {
      v.reward += reward(tok, part[i].answer, gens[i].tokens, mode);
      v.exact_match += reward(tok, part[i].answer, gens[i].tokens, RewardMode::Exact);
      v.length_mean += static_cast<double>(gens[i].tokens.size());
    }
  }
  const double n = static_cast<double>(examples.size());
  v.reward /= n, v.exact_match /= n, v.length_mean /= n;
  v.seconds = seconds_since(t0);
  return v;
}

worker::Scalars validation_scalars(const Validation& v) {
  return {{"val/reward", v.reward},
          {"val/exact_match", v.exact_match},
          {"val/response_length", v.length_mean},
          {"time/validate", v.seconds}};
}

// The section against the rest, then the loss: a config of another loss is refused before its prompts are read.
void check_grpo_loss(const worker::Config& config) {
  config.validate_grpo();
  RT_CHECK(config.loss_fn.type == worker::LossType::ClippedPg, "loss_fn.type = ",
           worker::loss_type_name(config.loss_fn.type),
           ": a GRPO run trains with clipped_pg (its SFT warm-up uses nll by itself)");
}

}  // namespace

bool is_checkpoint_entry(std::string_view name) {
  return worker::is_step_entry(name) || name == kWarmupFolder ||
         (name.starts_with(kWarmupFolder) && name.substr(kWarmupFolder.size()).starts_with('.'));
}

void check_grpo_config(const worker::Config& config, const model::ModelConfig* model) {
  check_grpo_loss(config);
  const CharTokenizer tok;
  const PromptSource prompts(config, tok);
  check_grpo_run(config, model, tok, prompts, validation_examples(config, tok, prompts));
}

GrpoSummary run_grpo(const worker::Config& config, comm::Communicator& world, const GrpoOptions& options) {
  RT_CHECK(world.size() == config.parallel.world(), "the communicator has ", world.size(),
           " ranks but parallel.dp x parallel.cp = ", config.parallel.world());
  const worker::GrpoConfig& g = config.grpo;
  check_grpo_loss(config);
  const CharTokenizer tok;
  const PromptSource prompts(config, tok);
  const model::ModelConfig model = worker::resolve_model_config(config.policy);
  const std::vector<Example> held_out = validation_examples(config, tok, prompts);
  check_grpo_run(config, &model, tok, prompts, held_out);
  const RewardMode mode = parse_reward_mode(g.reward);
  const fs::path root = config.train.checkpoint_dir, warm_dir = root / kWarmupFolder;
  RT_CHECK(!options.resume || !root.empty(), "--resume needs train.checkpoint_dir");
  if (!root.empty()) worker::prepare_checkpoint_dir(root);
  const bool lead = world.rank() == 0;
  const worker::RunFolderLocks locks = lead ? worker::lock_run_folders(config) : worker::RunFolderLocks{};
  if (options.resume)
    comm::all_or_none(world, "resume", [&] { worker::check_resume_start(config, options.overwrite_metrics); });
  // The checkpoint to continue from: the newest step_N (as `ringtrain train` writes them); none starts afresh.
  const std::optional<fs::path> from = root.empty() ? std::nullopt : worker::newest_checkpoint(root);
  RT_CHECK(options.resume || !from, from ? from->string() : "", " exists: pass --resume to continue that run, or "
           "choose another train.checkpoint_dir");
  // An earlier run's metrics: refused by the lead rank's MetricsWriter (fresh), opened before any weight is loaded
  // when there is no checkpoint (a fresh run with one was refused above). Not checked on the other ranks: the lead
  // may already have made its files when they would look.
  std::unique_ptr<worker::MetricsWriter> metrics;
  // Resuming from GRPO step N keeps the warm-up's records and GRPO's first N (warm-up + 1 ... warm-up + N); without
  // a checkpoint the run starts again from its first step (the warm-up's).
  const auto open_metrics = [&](int64_t resumed_records) {
    if (lead && !config.train.metrics_dir.empty())
      metrics = std::make_unique<worker::MetricsWriter>(
          config.train.metrics_dir, true,
          worker::metrics_start(options.resume, options.overwrite_metrics, resumed_records));
  };
  if (!from) open_metrics(0);

  GrpoSummary summary;
  summary.validation_prompts = static_cast<int64_t>(held_out.size());
  worker::Config grpo_config = config;
  if (g.sft_warmup_steps > 0) {
    if (!from) {
      const auto t0 = SteadyClock::now();
      sft_warmup(config, world, prompts, tok, metrics.get(), options, warm_dir);
      summary.warmup_seconds = seconds_since(t0);
    }
    RT_CHECK(fs::is_regular_file(warm_dir / "model.safetensors"), warm_dir.string(),
             ": the SFT warm-up's weights are missing (the reference policy of this run)");
    // The warm-up's weights stand in for policy.model_name from here on: a resumed run must name the model it began
    // with, as one without a warm-up must.
    train::check_same_model(warm_dir / "config.json", model);
    grpo_config.policy.model_name = warm_dir.string();
  }

  if (from)
    comm::all_or_none(world, "resume", [&] {
      worker::resume_schedule(config, grpo_config, *from, lead, "ringtrain grpo");
    });
  const auto t_start = SteadyClock::now();
  worker::PolicyWorker policy_worker(grpo_config, world, options.starting_weights, options.stop);
  if (lead) worker::remove_save_leftovers(config, "grpo");  // every rank has checked the folder by now
  if (lead && !g.val_prompts.empty() && !g.validates())
    std::fprintf(stderr, "ringtrain grpo: note: grpo.val_prompts = %s is not read: the run does not validate "
                 "(grpo.val_period = 0, grpo.val_at_start = false)\n", g.val_prompts.c_str());
  // What fixes the rollouts of step s (prompts and sampling seeds) and the records before them (the warm-up's):
  // recorded in each checkpoint, so that a resumed run continues the same sequence or is refused.
  const std::string rollout_order = cat("grpo seed ", config.train.seed, ", prompts ", prompts.identity(), ", ",
                                        g.num_prompts_per_step, " prompts x ", g.num_generations_per_prompt,
                                        " samples per step, after ", g.sft_warmup_steps, " SFT warm-up steps");
  int64_t start = 0;
  if (from) {
    const train::TrainingProgress position = policy_worker.load(*from);
    RT_CHECK(position.rng == rollout_order, from->string(), ": its rollout order is '", position.rng,
             "', this run's '", rollout_order, "': a GRPO run resumes only with the train.seed, grpo.prompts (the same "
             "records), grpo.num_prompts_per_step, grpo.num_generations_per_prompt and grpo.sft_warmup_steps it "
             "started with");
    start = position.index;
    RT_CHECK(start == policy_worker.trainer().steps_taken() && start <= config.train.steps, from->string(),
             ": resumes at GRPO step ", start, " after ", policy_worker.trainer().steps_taken(),
             " trainer steps; train.steps = ", config.train.steps);
    open_metrics(g.sft_warmup_steps + start);
    if (lead && options.progress)
      std::fprintf(stderr, "resuming from %s (GRPO step %lld)\n", from->string().c_str(),
                   static_cast<long long>(start));
  }

  model::SamplerOptions so;
  so.attention_backends = config.attention_backends;
  so.stop = options.stop;
  model::Sampler sampler(policy_worker.policy(), so);
  model::SamplingParams sp;
  sp.temperature = g.temperature, sp.top_p = g.top_p, sp.top_k = g.top_k, sp.max_new_tokens = g.max_new_tokens;
  sp.stop_tokens = {CharTokenizer::kEos};
  sp.seed = config.train.seed;

  const int64_t P = g.num_prompts_per_step, G = g.num_generations_per_prompt;
  const int64_t warm = g.sft_warmup_steps;
  std::unique_ptr<worker::ProgressLine> progress;
  if (lead && options.progress) {
    std::fprintf(stderr, "GRPO: %lld steps of %lld prompts x %lld samples (reward %s)\n",
                 static_cast<long long>(config.train.steps - start), static_cast<long long>(P),
                 static_cast<long long>(G), g.reward.c_str());
    progress = std::make_unique<worker::ProgressLine>(config.train.steps, start);
  }
  int64_t saved = start;  // the GRPO steps of the newest checkpoint (or of none: 0)
  const auto checkpoint = [&](int64_t done) {
    train::TrainingProgress position;
    position.index = done;
    position.rng = rollout_order;
    policy_worker.save(worker::step_folder(root, done), position);
    saved = done;
  };
  int64_t step = start;
  int64_t skipped = 0;  // steps of this run that changed no weight
  std::string validating;  // the validation in progress, for the report of a stop in it
  const auto run_validation = [&](const std::string& what) {
    validating = what;
    const Validation v = validate(sampler, held_out, tok, config, mode, world, options.stop, what);
    validating.clear();
    return v;
  };
  const auto show_validation = [&](const std::string& when, const Validation& v) {
    if (!progress) return;
    progress->finish();
    std::fprintf(stderr, "validation %s: reward %.3f, exact match %.3f (%zu held-out prompts, greedy)\n", when.c_str(),
                 v.reward, v.exact_match, held_out.size());
  };
  try {
    if (start == 0 && g.val_at_start) {
      // Its own record, numbered as the last record before GRPO's first step (the warm-up's last, or 0).
      const Validation v = run_validation("validation before GRPO step 1");
      show_validation("before GRPO step 1", v);
      if (metrics) metrics->write(warm, validation_scalars(v));
      summary.start_validation = {v.reward, v.exact_match};
    }
    for (; step < config.train.steps; ++step) {
      const auto t0 = SteadyClock::now();
      std::vector<Example> examples;
      std::vector<std::vector<int32_t>> rollout_prompts;
      std::vector<uint64_t> sample_ids;
      for (int64_t i = 0; i < P; ++i) {
        const uint64_t index = static_cast<uint64_t>(step * P + i);
        examples.push_back(prompts.example(index));
        const std::vector<int32_t> p = checked_prompt(tok, examples.back(), g.max_new_tokens,
                                                            cat("grpo.max_new_tokens = ", g.max_new_tokens), config);
        for (int64_t k = 0; k < G; ++k) {
          rollout_prompts.push_back(p);
          sample_ids.push_back(index * static_cast<uint64_t>(G) + static_cast<uint64_t>(k));
        }
      }
      // Each rank samples by itself, so a stop seen by its sampler is agreed before the collective calls that follow.
      std::vector<model::Generation> gens;
      bool stopped = false;
      try {
        gens = sampler.generate(rollout_prompts, sp, sample_ids);
      } catch (const comm::Interrupted&) {
        stopped = true;
      }
      comm::agree_to_stop(world, options.stop, stopped, cat("GRPO step ", step + 1));
      const double t_generate = seconds_since(t0);

      std::vector<double> rewards, exact, lengths;
      for (size_t i = 0; i < gens.size(); ++i) {
        const std::string& answer = examples[i / static_cast<size_t>(G)].answer;
        rewards.push_back(reward(tok, answer, gens[i].tokens, mode));
        exact.push_back(reward(tok, answer, gens[i].tokens, RewardMode::Exact));
        lengths.push_back(static_cast<double>(gens[i].tokens.size()));
      }
      const GroupAdvantages adv =
          group_advantages(rewards, prompt_groups(rollout_prompts),
                           {.normalize = g.normalize_rewards, .leave_one_out = g.use_leave_one_out_baseline});
      std::vector<worker::Sample> samples;
      int64_t tokens = 0;
      for (size_t i = 0; i < gens.size(); ++i) {
        samples.push_back(rollout_sample(rollout_prompts[i], gens[i], adv.advantages[i]));
        tokens += samples.back().length();
      }

      const auto t1 = SteadyClock::now();
      worker::LogprobResult prev = policy_worker.get_logprobs(samples);
      worker::LogprobResult ref = policy_worker.get_reference_logprobs(samples);
      const double kl_to_reference = mean_k3_kl(samples, prev, ref);
      for (size_t i = 0; i < samples.size(); ++i) {
        samples[i].prev_logprobs = std::move(prev.logprobs[i]);
        samples[i].reference_logprobs = std::move(ref.logprobs[i]);
      }
      const double t_logprobs = seconds_since(t1);
      const worker::TrainResult r = policy_worker.train(samples);
      const double t_step = seconds_since(t0);
      // After the step's update, so a stop asked during it stops the run after this step, which is recorded and
      // saved as any finished step.
      std::optional<Validation> validation;
      bool stop_after_step = false;
      if (g.val_period > 0 && ((step + 1) % g.val_period == 0 || step + 1 == config.train.steps)) {
        try {
          validation = run_validation(cat("validation after GRPO step ", step + 1));
        } catch (const comm::Interrupted&) {
          stop_after_step = true;
        }
      }

      GrpoStepLog log;
      log.step = step + 1;
      log.reward_mean = mean_of(rewards);
      log.exact_match = mean_of(exact);
      log.loss = r.step.loss;
      log.grad_norm = r.step.grad_norm;
      log.skipped = r.step.skipped;
      skipped += r.step.skipped ? 1 : 0;
      double var = 0;
      for (double x : rewards) var += (x - log.reward_mean) * (x - log.reward_mean);
      if (metrics) {
        worker::Scalars s = {
            {"reward/mean", log.reward_mean},
            {"reward/std", std::sqrt(var / static_cast<double>(rewards.size()))},
            {"reward/exact_match", log.exact_match},
            {"reward/uniform_group_fraction", static_cast<double>(adv.uniform_groups) / static_cast<double>(adv.groups)},
            {"response/length_mean", mean_of(lengths)},
            {"response/length_max", *std::max_element(lengths.begin(), lengths.end())},
            {"kl_to_reference", kl_to_reference},
            {"loss", r.step.loss},
            {"grad_norm", r.step.grad_norm},
            {"lr", r.step.lr},
        };
        for (const train::Metric& m : r.step.metrics) s.emplace_back(m.name, m.value);
        s.emplace_back("skipped", r.step.skipped ? 1.0 : 0.0);
        s.emplace_back("tokens_per_second", static_cast<double>(tokens) / t_step);
        s.emplace_back("time/generate", t_generate);
        s.emplace_back("time/logprobs", t_logprobs);
        s.emplace_back("time/train", r.seconds);
        if (validation)
          for (auto& kv : validation_scalars(*validation)) s.push_back(std::move(kv));
        metrics->write(warm + step + 1, s);
      }
      if (progress) {
        char note[64];
        std::snprintf(note, sizeof note, "reward %.3f | exact %.3f", log.reward_mean, log.exact_match);
        progress->update(step + 1, tokens, r.step.loss, skipped > 0 ? cat(note, " | ", skipped, " skipped") : note);
      }
      if (validation) {
        show_validation(cat("after GRPO step ", step + 1), *validation);
        log.validation = {validation->reward, validation->exact_match};
      }
      if (!root.empty() && worker::checkpoint_due(step + 1, config.train.steps, config.train.checkpoint_every))
        checkpoint(step + 1);
      summary.steps.push_back(log);
      if (options.on_step) options.on_step(log);
      if (stop_after_step) {
        ++step;  // finished: the stop's report and save count it
        throw comm::Interrupted(cat(validating, " was interrupted; the step itself finished"));
      }
    }
  } catch (const comm::Interrupted&) {
    if (progress) progress->finish();
    const std::string where =
        validating.empty()
            ? cat("stopped in GRPO step ", step + 1, " of ", config.train.steps, ", which changed nothing")
            : cat("stopped in the ", validating, " (of ", config.train.steps, " steps), which changed nothing");
    worker::save_at_stop_and_report(config, lead, "grpo", where, step, saved, checkpoint);
    throw;
  }
  if (progress) progress->finish();
  summary.grpo_seconds = seconds_since(t_start);
  return summary;
}

}  // namespace ringtrain::rl
