// `ringtrain config FILE [KEY=VALUE ...]`: the run config resolved (defaults filled in, overrides applied, every
// check that needs no weights passed, against the model's config.json too, and a GRPO run's prompts) and printed
// back as YAML with a doc comment per key.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ringtrain/cli/commands.h"
#include "ringtrain/rl/grpo.h"
#include "ringtrain/worker/config.h"

namespace ringtrain::cli {

void add_config_command(CLI::App& app) {
  struct Opts {
    std::string file;
    std::vector<std::string> overrides;
    bool no_model = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("config", "Check a run config and print it resolved, every key with its doc");
  cmd->add_option("file", o->file, "YAML run config (configs/*.yaml)")->required();
  cmd->add_option("overrides", o->overrides, "KEY=VALUE overrides, e.g. policy.train_micro_batch_size=2");
  cmd->add_flag("--no-model", o->no_model, "skip the checks against the model's config.json");
  cmd->callback([o] {
    const worker::Config c = worker::load_config(o->file, o->overrides);
    std::optional<model::ModelConfig> model;
    if (!o->no_model) {
      model = worker::resolve_model_config(c.policy);
      c.validate_against(*model);
    }
    if (!c.grpo.prompts.empty()) rl::check_grpo_config(c, model ? &*model : nullptr);
    std::fputs(worker::to_yaml(c).c_str(), stdout);
  });
}

}  // namespace ringtrain::cli
