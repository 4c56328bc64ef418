#include "ringtrain/worker/train_loop.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "ringtrain/comm/agreed.h"
#include "ringtrain/core/checked.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/fnv1a.h"
#include "ringtrain/train/checkpoint.h"
#include "ringtrain/worker/policy_worker.h"

namespace ringtrain::worker {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kStepPrefix = "step_";

// The data order's state: BatchSchedule draws every epoch's permutation from the seed, over the data's units, in
// steps of the global batch; an FNV-1a hash of every row's fields (tokens, masks, advantages, logprobs) tells
// another data file of as many units apart.
std::string data_order(const Config& c, const Dataset& data) {
  Fnv1a hash;
  const auto mix_values = [&](const std::vector<float>& v) {
    hash.mix(v.size());
    for (float f : v) hash.mix(std::bit_cast<uint32_t>(f));
  };
  for (const Sample& x : data.samples) {
    hash.mix(x.input_ids.size());
    for (int32_t id : x.input_ids) hash.mix(static_cast<uint32_t>(id));
    mix_values(x.token_mask);
    hash.mix(std::bit_cast<uint32_t>(x.sample_mask));
    for (const std::vector<float>* v : {&x.advantages, &x.generation_logprobs, &x.prev_logprobs, &x.reference_logprobs})
      mix_values(*v);
  }
  return cat("batch_schedule seed ", c.train.seed, ", ", data.units(), " units (rows ", hash.hex(), "), ",
             c.policy.train_global_batch_size, " per step");
}

}  // namespace

int64_t total_train_steps(const Config& c, int64_t units) {
  if (c.train.epochs == 0) return c.train.steps;  // no epoch limit: train.steps alone (validate() refuses both 0)
  const BatchSchedule schedule(units, c.policy.train_global_batch_size, c.train.seed);
  const int64_t by_epochs = c.train.epochs * schedule.steps_per_epoch();
  return c.train.steps > 0 ? std::min(c.train.steps, by_epochs) : by_epochs;
}

std::optional<fs::path> newest_checkpoint(const fs::path& dir) {
  std::error_code ec;
  const fs::file_type type = fs::status(dir, ec).type();
  if (type == fs::file_type::not_found) return std::nullopt;
  RT_CHECK(type == fs::file_type::directory, "train.checkpoint_dir = ", dir.string(), ": not a directory");
  std::optional<fs::path> best;
  int64_t best_step = -1;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(kStepPrefix)) continue;
    int64_t step = -1;
    const char* first = name.data() + kStepPrefix.size();
    const char* last = name.data() + name.size();
    const auto [end, err] = std::from_chars(first, last, step);
    if (err != std::errc() || end != last || first == last) continue;  // step_N.saving and other names
    RT_CHECK(fs::symlink_status(e.path() / "trainer_state.json", ec).type() == fs::file_type::regular,
             e.path().string(), " is not a complete checkpoint (no trainer_state.json; an unfinished save leaves ",
             name, ".saving): move it away, or choose another train.checkpoint_dir");
    if (step > best_step) best_step = step, best = e.path();
  }
  return best;
}

std::string resume_hint(const Config& c) {
  // Without a checkpoint the run can only start again, which an earlier run's metrics refuse unless replaced.
  const std::string again =
      c.train.metrics_dir.empty()
          ? std::string()
          : cat("; running it again needs --overwrite-metrics (train.metrics_dir = ", c.train.metrics_dir,
                " holds this run's metrics)");
  const fs::path dir = c.train.checkpoint_dir;
  if (dir.empty()) return cat("train.checkpoint_dir is not set, so no checkpoint continues this run", again);
  try {
    const std::optional<fs::path> newest = newest_checkpoint(dir);
    return newest ? cat("--resume continues from ", newest->string())
                  : cat("no checkpoint in ", dir.string(), " yet, so none continues this run", again);
  } catch (const std::exception& e) {  // said beside the stop it explains, not in its place
    return cat("the newest checkpoint cannot be named: ", e.what());
  }
}

void remove_save_leftovers(const Config& c, const std::string& command) {
  if (c.train.checkpoint_dir.empty()) return;
  for (const fs::path& p : train::remove_save_leftovers(c.train.checkpoint_dir))
    std::fprintf(stderr, "ringtrain %s: removed %s, left by a save that did not finish\n", command.c_str(),
                 p.string().c_str());
}

bool saves_at_stop(const Config& c) { return c.train.checkpoint_on_stop && !c.train.checkpoint_dir.empty(); }

void save_at_stop_and_report(const Config& c, bool lead, const std::string& command, const std::string& stopped_in,
                             int64_t done, int64_t saved, const std::function<void(int64_t)>& save) {
  if (saves_at_stop(c) && done > saved) {
    try {
      save(done);
    } catch (const std::exception& e) {
      if (lead)
        std::fprintf(stderr, "ringtrain %s: the checkpoint of the %lld finished steps was not saved: %s\n",
                     command.c_str(), static_cast<long long>(done), e.what());
    }
  }
  if (lead) std::fprintf(stderr, "ringtrain %s: %s; %s\n", command.c_str(), stopped_in.c_str(), resume_hint(c).c_str());
}

void prepare_checkpoint_dir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const bool dangling = fs::is_symlink(fs::symlink_status(dir)) && !fs::exists(dir);
  RT_CHECK(fs::status(dir).type() == fs::file_type::directory, "train.checkpoint_dir = ", dir.string(),
           dangling ? cat(": a symbolic link to ", fs::read_symlink(dir, ec).string(), ", which does not exist")
                    : cat(": not a directory", ec ? cat(" (", ec.message(), ")") : std::string()));
  RT_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "train.checkpoint_dir = ", dir.string(), ": not writable: ",
           std::strerror(errno));
  // A leftover step_N.saving or step_N.old that is not ours would stop the run at that save: refused now instead.
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with(kStepPrefix)) train::check_save_leftover(e.path());
}

RunFolderLocks lock_run_folders(const Config& c) {
  RunFolderLocks locks;
  if (!c.train.checkpoint_dir.empty())
    locks.push_back(std::make_unique<model::FolderLock>(c.train.checkpoint_dir, "train.checkpoint_dir"));
  if (!c.train.metrics_dir.empty())
    locks.push_back(std::make_unique<model::FolderLock>(c.train.metrics_dir, "train.metrics_dir"));
  return locks;
}

MetricsStart metrics_start(bool resume, bool overwrite_metrics, int64_t resumed_step) {
  if (overwrite_metrics) return MetricsStart::overwrite();
  return resume ? MetricsStart::continue_after(resumed_step) : MetricsStart::fresh();
}

void check_resume_start(const Config& c, bool overwrite_metrics) {
  if (overwrite_metrics || c.train.metrics_dir.empty() || c.train.checkpoint_dir.empty() ||
      newest_checkpoint(c.train.checkpoint_dir))
    return;
  check_no_earlier_metrics(c.train.metrics_dir, EarlierMetrics::Records,
                           cat("--resume found no checkpoint in ", c.train.checkpoint_dir, " (train.checkpoint_dir), "
                               "so the run would start again at step 0 and drop them: pass --overwrite-metrics to "
                               "replace them, or set train.checkpoint_dir to that run's checkpoints"));
}

void check_fresh_run(const Config& c, const TrainRunOptions& o) {
  if (o.resume) return;
  if (!o.overwrite_metrics && !c.train.metrics_dir.empty())
    check_no_earlier_metrics(c.train.metrics_dir, EarlierMetrics::RecordsOrEventFiles,
                             cat(kEarlierRunHint, " (train.metrics_dir)"));
  if (c.train.checkpoint_dir.empty()) return;
  const std::optional<fs::path> earlier = newest_checkpoint(c.train.checkpoint_dir);
  RT_CHECK(!earlier, earlier ? earlier->string() : "", " is a checkpoint of an earlier run: pass --resume to continue "
           "that run, or choose another train.checkpoint_dir");
}

namespace {

// Whether some sequence of the data is in the loss with a target token (entry 0 of a token_mask is never one).
bool has_loss_target(const Dataset& data) {
  for (const Sample& x : data.samples)
    if (x.sample_mask != 0.0f && std::any_of(x.token_mask.begin() + std::min<size_t>(1, x.token_mask.size()),
                                             x.token_mask.end(), [](float m) { return m != 0.0f; }))
      return true;
  return false;
}

}  // namespace

void resume_schedule(const Config& c, Config& run_config, const fs::path& from, bool lead, const char* command) {
  const std::optional<train::ScheduleConfig> saved = train::saved_schedule(from);
  if (!saved) {
    if (lead)
      std::fprintf(stderr, "%s: note: %s records no learning-rate schedule; this run's (%s) goes on from its step\n",
                   command, from.string().c_str(), train::describe(trainer_config(run_config).schedule).c_str());
    return;
  }
  const SchedulerConfig& s = c.policy.scheduler;
  if (s.kind == ScheduleKind::Cosine && s.total_steps == 0 && saved->decay == train::ScheduleConfig::Decay::Cosine) {
    const int64_t length = saved->warmup_steps + saved->decay_steps, now = run_config.total_scheduler_steps();
    if (length != now) {
      run_config.policy.scheduler.total_steps = length;
      if (lead)
        std::fprintf(stderr, "%s: the cosine schedule of %s continues over the %lld steps it was made for "
                     "(policy.scheduler.total_steps = 0 follows the run's steps, %lld now; a total_steps of the "
                     "run's own gives a schedule of that length from its start, and the learning rate moves at the "
                     "resume)\n", command, from.string().c_str(), static_cast<long long>(length),
                     static_cast<long long>(now));
    }
  }
  const train::ScheduleConfig mine = trainer_config(run_config).schedule;
  if (lead && !(mine == *saved))
    std::fprintf(stderr, "%s: note: %s was trained with the learning-rate schedule '%s'; this run's is '%s', which "
                 "sets the learning rate from the resumed step on\n", command, from.string().c_str(),
                 train::describe(*saved).c_str(), train::describe(mine).c_str());
}

fs::path step_folder(const fs::path& dir, int64_t steps) { return dir / cat(kStepPrefix, steps); }

bool is_step_entry(std::string_view name) {
  return name.starts_with(kStepPrefix) && name.size() > kStepPrefix.size() &&
         std::isdigit(static_cast<unsigned char>(name[kStepPrefix.size()]));
}

bool checkpoint_due(int64_t done, int64_t steps, int64_t every) {
  return done == steps || (every > 0 && done % every == 0);
}

int64_t run_training(const Config& c, comm::Communicator& world, const Dataset& data, const TrainRunOptions& o) {
  const bool lead = world.rank() == 0;
  // Steps on such data would still move the weights (weight decay) and report a loss of 0.
  RT_CHECK(has_loss_target(data), "train.data = ", c.train.data, ": no sequence has a loss target (every one has "
           "sample_mask 0, a token_mask of zeros after position 0, or a single token)");
  RT_CHECK(data.units() >= c.policy.train_global_batch_size, "train.data = ", c.train.data, ": ", data.units(),
           data.pairs ? " pairs" : " samples", ", fewer than policy.train_global_batch_size = ",
           c.policy.train_global_batch_size, ": not one optimizer step");
  const BatchSchedule schedule(data.units(), c.policy.train_global_batch_size, c.train.seed);
  const int64_t total = total_train_steps(c, data.units());
  // The cosine schedule spans the steps this run takes (train.steps cut to the data's epochs) unless it has its own
  // policy.scheduler.total_steps; as at load, a run that would end inside the warm-up is refused.
  Config run_config = c;
  SchedulerConfig& sched = run_config.policy.scheduler;
  if (sched.total_steps == 0) {
    sched.total_steps = total;
    RT_CHECK(sched.kind != ScheduleKind::Cosine || total > sched.warmup_steps, "policy.scheduler.kind = cosine: this "
             "run takes ", total, " steps (train.steps cut to train.epochs = ", c.train.epochs, " of train.data = ",
             c.train.data, "), not more than policy.scheduler.warmup_steps = ", sched.warmup_steps,
             ": it would end inside the warm-up (set policy.scheduler.total_steps, or fewer warm-up steps)");
  }
  // On every rank, so that all of them stop before any weight is loaded; the lead makes its metrics files only after
  // the PolicyWorker's mesh is formed (a collective), so no rank can see them here.
  check_fresh_run(c, o);
  if (!c.train.checkpoint_dir.empty()) prepare_checkpoint_dir(c.train.checkpoint_dir);
  const RunFolderLocks locks = lead ? lock_run_folders(c) : RunFolderLocks{};
  // Every rank, agreed (a rank whose files differ must not leave the others waiting), before the lead writes a metric.
  if (o.resume)
    comm::all_or_none(world, "resume", [&] {
      check_resume_start(c, o.overwrite_metrics);
      if (c.train.checkpoint_dir.empty()) return;
      if (const auto from = newest_checkpoint(c.train.checkpoint_dir))
        resume_schedule(c, run_config, *from, lead, "ringtrain train");
    });
  PolicyWorker worker(run_config, world, o.starting_weights, o.stop);
  if (lead) remove_save_leftovers(c, "train");  // after the worker's collective start: every rank checked the folder
  const fs::path ckpt_dir = c.train.checkpoint_dir;
  const std::string order = data_order(c, data);

  int64_t step = 0;  // steps done
  if (o.resume) {
    RT_CHECK(!ckpt_dir.empty(), "--resume needs train.checkpoint_dir");
    if (const auto from = newest_checkpoint(ckpt_dir)) {
      const train::TrainingProgress p = worker.load(*from);
      RT_CHECK(p.rng == order, from->string(), ": its data order is '", p.rng, "', this run's '", order,
               "': a run resumes only with the train.seed, train.data and policy.train_global_batch_size it started "
               "with", p.rng.find(" units (tokens ") != std::string::npos
                           ? " (an order that hashes 'tokens' covers the tokens alone; this build compares every row "
                             "field and cannot continue it: start the run again, or continue it with the build that "
                             "wrote it)"
                           : "");
      const int64_t taken = worker.trainer().steps_taken();
      const std::string folder = cat(kStepPrefix, taken);
      RT_CHECK(from->filename() == folder, from->string(), ": its trainer_state.json records step ", taken,
               "; the folder of that step is ", folder, " (a renamed or copied checkpoint would be taken for the "
               "newest)");
      // The counters are non-negative (load checks them) but a hostile epoch could still overflow the product.
      const std::string what = cat(from->string(), ": the data position (epoch ", p.epoch, ", index ", p.index, ")");
      step = checked_add(checked_mul(p.epoch, schedule.steps_per_epoch(), what),
                         p.index / c.policy.train_global_batch_size, what);
      RT_CHECK(step == taken, what, " is not the step the trainer took (", taken, ")");
      RT_CHECK(step <= total, from->string(), ": the run has taken ", step, " steps, more than the ", total,
               " this run takes (train.steps = ", c.train.steps, ", train.epochs = ", c.train.epochs,
               "): raise them to continue it");
      if (lead)
        std::fprintf(stderr, "ringtrain train: resuming from %s (step %lld)\n", from->string().c_str(),
                     static_cast<long long>(step));
    }
  }

  std::unique_ptr<MetricsWriter> metrics;
  std::unique_ptr<ProgressLine> progress;
  if (lead && !c.train.metrics_dir.empty())
    metrics = std::make_unique<MetricsWriter>(c.train.metrics_dir, true,
                                              metrics_start(o.resume, o.overwrite_metrics, step));
  if (lead && o.progress) progress = std::make_unique<ProgressLine>(total, step);

  int64_t saved = step;  // the steps of the newest checkpoint (or of none: 0)
  const auto checkpoint = [&](int64_t done) {
    train::TrainingProgress p;
    p.epoch = done / schedule.steps_per_epoch();
    p.index = done % schedule.steps_per_epoch() * c.policy.train_global_batch_size;
    p.rng = order;
    worker.save(step_folder(ckpt_dir, done), p);
    saved = done;
  };

  const int64_t start = step;
  int64_t skipped = 0;  // steps of this run that changed no weight
  try {
    for (; step < total; ++step) {
      std::vector<Sample> batch;
      for (int64_t u : schedule.step_units(step)) {
        if (data.pairs) {
          batch.push_back(data.samples[static_cast<size_t>(2 * u)]);
          batch.push_back(data.samples[static_cast<size_t>(2 * u + 1)]);
        } else {
          batch.push_back(data.samples[static_cast<size_t>(u)]);
        }
      }
      const TrainResult r = worker.train(batch);
      int64_t tokens = 0;
      for (const Sample& s : batch) tokens += s.length();
      if (metrics) {
        Scalars values = {{"loss", r.step.loss},
                          {"grad_norm", r.step.grad_norm},
                          {"lr", r.step.lr},
                          {"valid_tokens", r.step.valid_tokens},
                          {"tokens_per_second", r.tokens_per_second},
                          {"step_seconds", r.seconds},
                          {"skipped", r.step.skipped ? 1.0 : 0.0}};
        for (const train::Metric& m : r.step.metrics) values.emplace_back(m.name, m.value);
        metrics->write(step + 1, values);
      }
      skipped += r.step.skipped ? 1 : 0;
      if (progress) progress->update(step + 1, tokens, r.step.loss, skipped > 0 ? cat(skipped, " skipped") : "");
      if (!ckpt_dir.empty() && checkpoint_due(step + 1, total, c.train.checkpoint_every)) checkpoint(step + 1);
    }
  } catch (const comm::Interrupted&) {
    if (progress) progress->finish();
    save_at_stop_and_report(c, lead, "train",
                            cat("stopped in step ", step + 1, " of ", total, ", which changed nothing; ", step,
                                " steps done (", step - start, " in this run)"),
                            step, saved, checkpoint);
    throw;
  }
  if (progress) progress->finish();
  // train.steps beyond the data's epochs is cut to them (total_train_steps): said, so that a run of fewer steps than
  // asked is not taken for the whole.
  const std::string cut = c.train.steps > total ? cat("; train.epochs = ", c.train.epochs, " (", total,
                                                      " steps over this data) ended the run before train.steps = ",
                                                      c.train.steps)
                                                : std::string();
  const std::string skips = skipped > 0 ? cat("; ", skipped, " of them skipped", kSkippedWhy) : std::string();
  if (lead)
    std::fprintf(stderr, "ringtrain train: %lld of %lld steps done (%lld in this run)%s%s%s%s\n",
                 static_cast<long long>(step), static_cast<long long>(total), static_cast<long long>(step - start),
                 skips.c_str(), cut.c_str(), ckpt_dir.empty() ? "" : "; checkpoints in ", ckpt_dir.string().c_str());
  return step - start;
}

}  // namespace ringtrain::worker
