// `ringtrain init-model`: writes a randomly initialised Hugging Face checkpoint (config.json + model.safetensors).
#include <cstdio>
#include <memory>
#include <string>

#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/options.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/params.h"

namespace ringtrain::cli {

void add_init_model_command(CLI::App& app) {
  struct Opts {
    ModelShapeOptions shape;
    std::string dtype = "fp32", out;
    uint64_t seed = 0;
    double rope_theta = 10000.0;
    bool tie = false, force = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("init-model", "Write a randomly initialised checkpoint");
  o->shape.add_to(*cmd);
  cmd->add_option("--seed", o->seed)->check(seed_check())->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "storage dtype: fp32, bf16 or fp16")
      ->check(dtype_name_check())
      ->capture_default_str();
  add_bounded(*cmd, "--rope-theta", o->rope_theta, "RoPE base frequency", 1e-3, 1e12)->capture_default_str();
  cmd->add_flag("--tie", o->tie, "tie the LM head to the embeddings");
  cmd->add_option("--out", o->out, "checkpoint folder")->required();
  cmd->add_flag("--force", o->force, "replace a checkpoint already in --out");
  cmd->callback([o] {
    using namespace model;
    RT_CHECK(!o->out.empty(), "--out: the checkpoint folder's name is empty");
    ModelConfig c = o->shape.apply_to(ModelConfig{}, o->tie);
    c.rope.theta = o->rope_theta;
    c.dtype = parse_dtype(o->dtype);
    RT_CHECK(c.dtype == DType::F32 || c.dtype == DType::BF16 || c.dtype == DType::F16, "--dtype: ", o->dtype,
             " is not a checkpoint dtype (fp32, bf16, fp16)");
    // The same validation as a loaded config.json.
    c = parse_config(config_to_json(c), "init-model options");
    save_checkpoint(o->out, c, random_params(ParamLayout(c), o->seed),
                    o->force ? ExistingCheckpoint::Replace : ExistingCheckpoint::Refuse);
    std::printf("wrote %s (%s, %lld parameters)\n", o->out.c_str(), arch_class_name(c.arch).c_str(),
                static_cast<long long>(ParamLayout(c).total()));
  });
}

}  // namespace ringtrain::cli
