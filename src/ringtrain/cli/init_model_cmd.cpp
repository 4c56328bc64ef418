// `ringtrain init-model`: writes a randomly initialised Hugging Face checkpoint (config.json + model.safetensors).
#include <cstdio>
#include <memory>
#include <string>

#include "ringtrain/cli/commands.h"
#include "ringtrain/core/checked.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/params.h"

namespace ringtrain::cli {

void add_init_model_command(CLI::App& app) {
  struct Opts {
    std::string arch = "llama", dtype = "fp32", out;
    int64_t layers = 2, hidden = 64, heads = 4, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 256;
    uint64_t seed = 0;
    double rope_theta = 10000.0;
    bool tie = false, force = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("init-model", "Write a randomly initialised checkpoint");
  cmd->add_option("--arch", o->arch, "llama, qwen2, qwen3 or mistral")->capture_default_str();
  cmd->add_option("--layers", o->layers)->capture_default_str();
  cmd->add_option("--hidden", o->hidden)->capture_default_str();
  cmd->add_option("--heads", o->heads, "query heads")->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "key/value heads (default: --heads)");
  cmd->add_option("--head-dim", o->head_dim, "default: hidden / heads");
  cmd->add_option("--ffn", o->ffn, "MLP width (default: 4 x hidden)");
  cmd->add_option("--vocab", o->vocab)->capture_default_str();
  cmd->add_option("--seed", o->seed)->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "storage dtype: fp32, bf16 or fp16")->capture_default_str();
  cmd->add_option("--rope-theta", o->rope_theta)->capture_default_str();
  cmd->add_flag("--tie", o->tie, "tie the LM head to the embeddings");
  cmd->add_option("--out", o->out, "checkpoint folder")->required();
  cmd->add_flag("--force", o->force, "replace a checkpoint already in --out");
  cmd->callback([o] {
    using namespace model;
    ModelConfig c;
    c.arch = parse_arch(o->arch);
    c.layers = o->layers, c.hidden = o->hidden, c.heads = o->heads, c.vocab = o->vocab;
    c.kv_heads = o->kv_heads ? o->kv_heads : o->heads;
    c.head_dim = o->head_dim ? o->head_dim : (o->heads > 0 ? o->hidden / o->heads : 0);
    c.ffn = o->ffn ? o->ffn : checked_mul(4, o->hidden, "--hidden x 4 (the default --ffn)");
    c.tie_embeddings = o->tie;
    c.qkv_bias = c.arch == Arch::Qwen2;
    c.qk_norm = c.arch == Arch::Qwen3;
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
