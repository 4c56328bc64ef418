// `ringtrain train --config FILE [KEY=VALUE ...] [--resume]`: the policy worker's training run (worker/train_loop.h)
// on the CPU (ranks are threads of this process) or on GPUs (one process per GPU, relaunched through
// `ringtrain launch`). `ringtrain export CHECKPOINT --out DIR`: a checkpoint's weights as a Hugging Face folder.
#include <chrono>
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
#include "ringtrain/model/hf_config.h"
#include "ringtrain/model/params.h"
#include "ringtrain/worker/data.h"
#include "ringtrain/worker/policy_worker.h"
#include "ringtrain/worker/train_loop.h"

namespace ringtrain::cli {

void add_train_command(CLI::App& app) {
  struct Opts {
    std::string config;
    std::vector<std::string> overrides;
    bool resume = false, no_progress = false, overwrite_metrics = false;
    int timeout_s = 600;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("train", "Train a policy on a data file as a run config says");
  cmd->add_option("--config", o->config, "YAML run config (configs/*.yaml)")->required();
  cmd->add_option("overrides", o->overrides, "KEY=VALUE overrides, e.g. train.steps=100");
  cmd->add_flag("--resume", o->resume, "continue from the newest complete checkpoint in train.checkpoint_dir");
  cmd->add_flag("--overwrite-metrics", o->overwrite_metrics,
                "replace the metrics an earlier run left in train.metrics_dir (without it a fresh run refuses them)");
  cmd->add_flag("--no-progress", o->no_progress, "no progress line on stderr");
  add_bounded(*cmd, "--timeout", o->timeout_s, "seconds a rank waits for the others", 1,
              static_cast<int>(kMaxTimeoutMs / 1000))
      ->capture_default_str();
  cmd->callback([o] {
    const worker::Config c = worker::load_config(o->config, o->overrides);
    worker::TrainRunOptions ro;
    ro.resume = o->resume;
    ro.progress = !o->no_progress;
    ro.overwrite_metrics = o->overwrite_metrics;
    // A config with grpo.prompts is a GRPO run; `train` trains on train.data and would leave the grpo section unused.
    RT_CHECK(c.grpo.prompts.empty() || !c.train.data.empty(), o->config,
             ": grpo.prompts is set and train.data is not: this config is a GRPO run, for `ringtrain grpo --config ",
             o->config, "`");
    const int world = static_cast<int>(c.parallel.world());
    if (!c.device.is_cuda()) check_one_process_on_cpu("ringtrain train", world);
    worker::check_fresh_run(c, ro);  // once, before GPU ranks are started
    if (c.device.is_cuda()) require_cuda("train");
    const bool in_ranks = c.device.is_cuda() && inside_ranks(world);  // one of the GPU ranks, not their launcher
    if (!c.grpo.prompts.empty() && !in_ranks)
      std::fprintf(stderr, "ringtrain train: note: the grpo section (grpo.prompts = %s) is not used: train runs SFT / "
                   "PG / DPO steps over train.data = %s; `ringtrain grpo` runs the GRPO loop\n",
                   c.grpo.prompts.c_str(), c.train.data.c_str());
    if (c.device.is_cuda() && !in_ranks)
      throw relaunch_self(world, {}, saving_stop_grace(std::chrono::seconds(o->timeout_s)));
    // Everything that needs no weights is checked before any rank starts: the config against the model, the data.
    const model::ModelConfig m = worker::resolve_model_config(c.policy);
    c.validate_against(m);
    RT_CHECK(!c.train.data.empty(), "train.data: no data file given");
    const worker::Dataset data = worker::load_dataset(c.train.data, worker::data_spec(c, m));
    const auto timeout = std::chrono::seconds(o->timeout_s);
    const char* then = worker::saves_at_stop(c) ? "saves the steps it finished" : "ends without saving";
    run_stoppable("train", then, [&](const StopRequest* stop) {
      ro.stop = stop;
      run_on_ranks(c, timeout, [&](comm::Communicator& comm, worker::StartingWeights* shared) {
        worker::TrainRunOptions mine = ro;
        mine.starting_weights = shared;
        worker::run_training(c, comm, data, mine);
      });
    });
  });
}

void add_export_command(CLI::App& app) {
  struct Opts {
    std::string checkpoint, out, files_from;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("export", "A checkpoint's weights as a Hugging Face folder");
  cmd->add_option("checkpoint", o->checkpoint, "checkpoint folder (ringtrain train's step_N, or any HF folder)")
      ->required();
  cmd->add_option("--out", o->out, "the Hugging Face folder to write (an earlier export or an empty folder is replaced)")
      ->required();
  cmd->add_option("--files-from", o->files_from,
                  "the folder whose tokenizer, chat template and generation config files the export copies (default: "
                  "the checkpoint folder, which for a training step_N holds those of the run's base model)");
  cmd->callback([o] {
    check_out_is_not_input("--out", o->out, {{o->checkpoint, "checkpoint"}, {o->files_from, "--files-from"}});
    const model::ModelConfig m = model::load_config(o->checkpoint);
    worker::write_hf_folder(o->out, m, model::load_checkpoint_params(o->checkpoint, m),
                            model::read_hf_companion_files(o->files_from.empty() ? o->checkpoint : o->files_from));
  });
}

}  // namespace ringtrain::cli
