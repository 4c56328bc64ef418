// `ringtrain grpo --config FILE [KEY=VALUE ...] [--resume]`: the GRPO loop of rl/grpo.h (optional SFT warm-up, then
// sampling, rewards, group-normalised advantages and clipped-PG steps) on the CPU (ranks are threads of this process)
// or on GPUs (one process per GPU, relaunched through `ringtrain launch`), its metrics in train.metrics_dir, then
// the reward curves drawn to an SVG and a summary: mean reward of the first 10 GRPO steps against the last 10, and
// the first validation against the last (grpo.val_period, grpo.val_at_start).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/multi_gpu.h"
#include "ringtrain/cli/options.h"
#include "ringtrain/cli/stop_on_signal.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "ringtrain/rl/grpo.h"
#include "ringtrain/worker/config.h"
#include "ringtrain/worker/metrics.h"
#include "ringtrain/worker/policy_worker.h"
#include "ringtrain/worker/plot.h"
#include "ringtrain/worker/train_loop.h"

namespace ringtrain::cli {
namespace {

constexpr size_t kSummaryWindow = 10;

// "first 10 steps 0.412, last 10 0.735 (+0.323)" over a series' values in step order; windows of at most half the
// steps (one step: both windows are that step).
std::string rise_text(const std::vector<double>& v) {
  const size_t n = std::max<size_t>(1, std::min(kSummaryWindow, v.size() / 2));
  double first = 0, last = 0;
  for (size_t i = 0; i < n; ++i) first += v[i], last += v[v.size() - n + i];
  first /= static_cast<double>(n), last /= static_cast<double>(n);
  char text[128];
  std::snprintf(text, sizeof text, "first %zu steps %.3f, last %zu %.3f (%+.3f)", n, first, n, last, last - first);
  return text;
}

// The curves may lie beside the checkpoints (train.metrics_dir may be train.checkpoint_dir or a folder in it), never
// at or inside one's name (rl::is_checkpoint_entry). Compared by path, so that a run refused at its resume was
// refused at its start, when the folders did not exist.
void check_out_is_not_in_a_checkpoint(const std::filesystem::path& out, const std::string& checkpoint_dir) {
  namespace fs = std::filesystem;
  if (checkpoint_dir.empty()) return;
  std::error_code ec;
  const fs::path out_path = fs::weakly_canonical(out, ec), root = fs::weakly_canonical(checkpoint_dir, ec);
  if (out_path.empty() || root.empty()) return;
  const fs::path rel = out_path.lexically_relative(root);
  if (rel.empty() || *rel.begin() == "..") return;
  const std::string first = rel.begin()->string();
  RT_CHECK(!rl::is_checkpoint_entry(first), "--plot ", out.string(), " is or lies inside ",
           (fs::path(checkpoint_dir) / first).string(), ", a checkpoint's name in train.checkpoint_dir (a save "
           "replaces its folder whole); refusing to write there");
}

}  // namespace

void add_grpo_command(CLI::App& app) {
  struct Opts {
    std::string config, plot;
    std::vector<std::string> overrides;
    bool resume = false, overwrite_metrics = false, no_progress = false;
    int timeout_s = 600;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("grpo", "GRPO on a prompt set (built-in task or JSONL), optionally after SFT");
  cmd->add_option("--config", o->config, "YAML run config with a grpo: section (configs/grpo_tiny.yaml)")->required();
  cmd->add_option("overrides", o->overrides, "KEY=VALUE overrides, e.g. train.seed=3");
  cmd->add_flag("--resume", o->resume, "continue from the newest checkpoint in train.checkpoint_dir (none: start)");
  cmd->add_flag("--overwrite-metrics", o->overwrite_metrics,
                "replace the metrics an earlier run left in train.metrics_dir (without it a fresh run refuses them)");
  cmd->add_flag("--no-progress", o->no_progress, "no progress line on stderr");
  cmd->add_option("--plot", o->plot, "SVG of the reward curves (default: METRICS_DIR/reward.svg)");
  add_bounded(*cmd, "--timeout", o->timeout_s, "seconds a rank waits for the others", 1,
              static_cast<int>(kMaxTimeoutMs / 1000))
      ->capture_default_str();
  cmd->callback([o] {
    const worker::Config c = worker::load_config(o->config, o->overrides);
    RT_CHECK(!c.grpo.prompts.empty(), o->config, ": grpo.prompts is required (builtin:reverse_digits or a JSONL file)");
    // The curves' file, checked before the first step: a run that cannot write it fails now, not after training.
    RT_CHECK(o->plot.empty() || !c.train.metrics_dir.empty(), "--plot ", o->plot,
             ": the curves are drawn from train.metrics_dir's metrics.jsonl, and train.metrics_dir is empty; set it "
             "(or drop --plot)");
    const std::filesystem::path metrics_dir = c.train.metrics_dir;
    const std::filesystem::path plot =
        o->plot.empty() && !metrics_dir.empty() ? metrics_dir / "reward.svg" : std::filesystem::path(o->plot);
    if (!plot.empty()) {
      worker::check_svg_out(plot);
      check_out_is_not_input("--plot", plot.string(),
                             {{o->config, "--config"},
                              {c.grpo.prompts, "grpo.prompts"},
                              {c.policy.model_name, "policy.model_name"}});
      check_out_is_not_in_a_checkpoint(plot, c.train.checkpoint_dir);
      const std::filesystem::path folder = plot.parent_path();
      RT_CHECK(folder.empty() || folder == metrics_dir || std::filesystem::is_directory(folder), "--plot ",
               plot.string(), ": folder ", folder.string(), " does not exist");
    }
    const int world = static_cast<int>(c.parallel.world());
    if (!c.device.is_cuda()) check_one_process_on_cpu("ringtrain grpo", world);
    if (!o->resume && !o->overwrite_metrics && !c.train.metrics_dir.empty())  // once, before GPU ranks are started
      worker::check_no_earlier_metrics(c.train.metrics_dir, worker::EarlierMetrics::RecordsOrEventFiles,
                                       cat(worker::kEarlierRunHint, " (train.metrics_dir)"));
    // The rollouts are the data of a GRPO run: a train.data beside them would otherwise go unused unseen.
    if (!c.train.data.empty() && !(c.device.is_cuda() && inside_ranks(world)))
      std::fprintf(stderr, "ringtrain grpo: note: train.data = %s is not used: GRPO trains on its own rollouts of "
                   "grpo.prompts; `ringtrain train` trains on train.data\n", c.train.data.c_str());
    if (c.device.is_cuda()) {
      require_cuda("grpo");
      if (!inside_ranks(world))
        throw relaunch_self(world, {}, saving_stop_grace(std::chrono::seconds(o->timeout_s)));
    }
    c.validate_against(worker::resolve_model_config(c.policy));
    rl::GrpoOptions options;
    options.resume = o->resume;
    options.overwrite_metrics = o->overwrite_metrics;
    options.progress = !o->no_progress;
    rl::GrpoSummary summary;
    bool lead = true;
    const auto timeout = std::chrono::seconds(o->timeout_s);
    const auto announce = [&] {
      std::printf("ringtrain grpo: %s on %s (%s), %lld steps after %lld SFT warm-up steps, device %s, dp %d x cp %d\n",
                  c.grpo.prompts.c_str(), c.policy.model_name.c_str(),
                  std::string(worker::precision_name(c.policy.precision)).c_str(),
                  static_cast<long long>(c.train.steps),
                  static_cast<long long>(c.grpo.sft_warmup_steps), device_name(c.device).c_str(),
                  static_cast<int>(c.parallel.dp), static_cast<int>(c.parallel.cp));
      std::fflush(stdout);
    };
    const char* then = worker::saves_at_stop(c) ? "saves the GRPO steps it finished" : "ends without saving";
    run_stoppable("grpo", then, [&](const StopRequest* stop) {
      options.stop = stop;
      lead = run_on_ranks(c, timeout, [&](comm::Communicator& rank, worker::StartingWeights* shared) {
        if (rank.rank() == 0) announce();
        rl::GrpoOptions mine = options;
        mine.starting_weights = shared;
        rl::GrpoSummary result = rl::run_grpo(c, rank, mine);
        if (rank.rank() == 0) summary = std::move(result);
      });
    });
    if (!lead) return;
    const auto skipped = std::count_if(summary.steps.begin(), summary.steps.end(), [](auto& s) { return s.skipped; });
    std::printf("done: %zu GRPO steps in %.1f s (SFT warm-up %.1f s)%s\n", summary.steps.size(), summary.grpo_seconds,
                summary.warmup_seconds,
                skipped > 0 ? cat("; ", skipped, " of them skipped", worker::kSkippedWhy).c_str() : "");
    std::vector<double> reward, exact;
    worker::Series val_reward, val_exact;  // by GRPO step: 0 = before the first
    if (!c.train.metrics_dir.empty()) {
      const std::filesystem::path jsonl = worker::metrics_jsonl(c.train.metrics_dir);
      const std::vector<worker::Series> all = worker::read_metrics(jsonl);
      std::vector<std::string> names = {"reward/mean", "reward/exact_match", "loss", "kl_to_reference"};
      for (const worker::Series& s : all) {
        if (s.name == "val/reward") val_reward = s;
        if (s.name == "val/exact_match") val_exact = s, names.push_back(s.name);
      }
      const std::vector<worker::Series> panels = worker::select_series(all, names);
      reward = panels[0].values, exact = panels[1].values;
      const std::string title = "GRPO on " + c.grpo.prompts + " (" + c.policy.model_name + ")";
      worker::write_svg(plot, worker::render_svg(panels, title));
      std::printf("metrics: %s; curves: %s\n", jsonl.c_str(), plot.c_str());
      for (worker::Series* s : {&val_reward, &val_exact})
        for (double& step : s->steps) step -= static_cast<double>(c.grpo.sft_warmup_steps);
    } else {
      for (const rl::GrpoStepLog& s : summary.steps) reward.push_back(s.reward_mean), exact.push_back(s.exact_match);
      const auto add = [&](double step, const std::pair<double, double>& v) {
        val_reward.steps.push_back(step), val_reward.values.push_back(v.first);
        val_exact.steps.push_back(step), val_exact.values.push_back(v.second);
      };
      if (summary.start_validation) add(0, *summary.start_validation);
      for (const rl::GrpoStepLog& s : summary.steps)
        if (s.validation) add(static_cast<double>(s.step), *s.validation);
    }
    if (!reward.empty()) {
      std::printf("reward (%s): %s\n", c.grpo.reward.c_str(), rise_text(reward).c_str());
      std::printf("exact match:    %s\n", rise_text(exact).c_str());
    }
    if (!val_reward.values.empty() && val_reward.values.size() == val_exact.values.size()) {
      const size_t last = val_reward.values.size() - 1;
      std::printf("held-out, greedy (%lld prompts): reward %.3f -> %.3f, exact match %.3f -> %.3f (GRPO step %.0f -> "
                  "%.0f)\n",
                  static_cast<long long>(summary.validation_prompts), val_reward.values[0], val_reward.values[last],
                  val_exact.values[0], val_exact.values[last], val_reward.steps[0], val_reward.steps[last]);
    }
  });
}

}  // namespace ringtrain::cli
