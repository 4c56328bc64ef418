// The run config: defaults, the original key names, overrides, round trip through to_yaml, the example configs,
// mesh and shape validation, and hostile files (every bad input an Error naming where, never a crash).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "ringtrain/core/error.h"
#include "ringtrain/worker/config.h"
#include "test_util.h"

namespace ringtrain::worker {
namespace {

namespace fs = std::filesystem;

// The smallest valid config on the CPU.
const std::string kMinimal =
    "policy:\n"
    "  model_name: builtin:tiny\n"
    "  precision: float32\n"
    "device: cpu\n"
    "train:\n"
    "  data: samples.jsonl\n";

// The error message of parse_config(text, "cfg.yaml", overrides); fails the test when it does not throw.
std::string parse_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, "cfg.yaml", overrides);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return "";
}

TEST(WorkerConfig, DefaultsMatchTheOriginalFramework) {
  const Config c = parse_config(kMinimal, "cfg.yaml");
  EXPECT_EQ(c.policy.model_name, "builtin:tiny");
  EXPECT_EQ(c.policy.train_global_batch_size, 32);
  EXPECT_EQ(c.policy.train_micro_batch_size, 4);
  EXPECT_DOUBLE_EQ(c.policy.optimizer.lr, 5e-6);
  EXPECT_DOUBLE_EQ(c.policy.optimizer.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(c.policy.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.policy.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.policy.optimizer.eps, 1e-8);
  EXPECT_EQ(c.policy.precision, Precision::Float32);
  EXPECT_EQ(c.compute_dtype(), DType::F32);
  EXPECT_EQ(c.device, Device::cpu());
  EXPECT_EQ(c.parallel.world(), 1);
  EXPECT_EQ(c.train_mb_tokens(), 0);  // fixed microbatches of train_micro_batch_size
  EXPECT_EQ(c.logprob_mb_tokens(), 0);
  const Config packed = parse_config(kMinimal, "cfg.yaml", {"policy.sequence_packing.enabled=true"});
  EXPECT_EQ(packed.train_mb_tokens(), 4096);
  EXPECT_EQ(packed.logprob_mb_tokens(), 4096);
  const Config dpo = parse_config(
      kMinimal, "cfg.yaml",
      {"policy.sequence_packing.enabled=true", "loss_fn.type=dpo", "loss_fn.reference_policy_kl_penalty=0.1"});
  EXPECT_EQ(dpo.train_mb_tokens(), 8192);  // a pair stays in one row
  const Config dynamic = parse_config(kMinimal, "cfg.yaml", {"policy.dynamic_batching.enabled=true"});
  EXPECT_EQ(dynamic.train_mb_tokens(), 4096 * 4);
  EXPECT_EQ(dynamic.logprob_mb_tokens(), 4096 * 4);
}

TEST(WorkerConfig, ReadsNestedOriginalKeys) {
  const Config c = parse_config(kMinimal +
                                    "loss_fn:\n"
                                    "  type: clipped_pg\n"
                                    "  ratio_clip_min: 0.2\n"
                                    "  ratio_clip_max: 0.28\n"
                                    "  ratio_clip_c: 3\n"
                                    "  reference_policy_kl_penalty: 0.01\n"
                                    "  token_level_loss: false\n"
                                    "parallel: {dp: 2, cp_comm: allgather}\n"
                                    "attention: {backends: [flash, math]}\n",
                                "cfg.yaml",
                                {"policy.dtensor_cfg.context_parallel_size=2", "policy.optimizer.kwargs.lr=1e-5",
                                 "policy.optimizer.kwargs.betas=[0.8, 0.95]", "policy.train_micro_batch_size=2"});
  EXPECT_EQ(c.loss_fn.type, LossType::ClippedPg);
  EXPECT_DOUBLE_EQ(c.loss_fn.ratio_clip_max, 0.28);
  ASSERT_TRUE(c.loss_fn.ratio_clip_c.has_value());
  EXPECT_DOUBLE_EQ(*c.loss_fn.ratio_clip_c, 3.0);
  EXPECT_FALSE(c.loss_fn.token_level_loss);
  EXPECT_EQ(c.parallel.dp, 2);
  EXPECT_EQ(c.parallel.cp, 2);
  EXPECT_EQ(c.parallel.world(), 4);
  EXPECT_EQ(c.parallel.cp_comm, cp::CpComm::AllGather);
  EXPECT_EQ(c.attention_backends,
            (std::vector<attention::BackendId>{attention::BackendId::Flash, attention::BackendId::Math}));
  EXPECT_DOUBLE_EQ(c.policy.optimizer.lr, 1e-5);
  EXPECT_DOUBLE_EQ(c.policy.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.policy.optimizer.beta2, 0.95);
  EXPECT_EQ(c.policy.train_micro_batch_size, 2);
  EXPECT_EQ(c.local_batch_sequences(), 16);
}

TEST(WorkerConfig, PrintedYamlReadsBackEqual) {
  Config c = parse_config(
      kMinimal, "cfg.yaml",
      {"loss_fn.type=dpo", "loss_fn.reference_policy_kl_penalty=0.1", "loss_fn.ratio_clip_c=2.5",
       "policy.optimizer.kwargs.lr=3.3e-7", "attention.backends=[math]", "parallel.cp=3", "parallel.cp_comm=a2a",
       "train.seed=18446744073709551615", "policy.scheduler.kind=cosine",
       "train.steps=100", "policy.sequence_packing.enabled=true", "policy.sequence_packing.train_mb_tokens=9000",
                           "train.data=' x: #y'", "train.checkpoint_dir='null'", "train.metrics_dir='123'"});
  const std::string yaml = to_yaml(c);
  const Config back = parse_config(yaml, "printed");
  EXPECT_TRUE(back == c) << yaml;
  EXPECT_EQ(to_yaml(back), yaml);
  EXPECT_EQ(back.train.seed, 18446744073709551615ull);
  EXPECT_EQ(back.train.data, " x: #y");
  EXPECT_EQ(back.train.checkpoint_dir, "null");
  EXPECT_EQ(back.train.metrics_dir, "123");
  // Every field is printed with its doc; the second name of the cp size is not.
  EXPECT_NE(yaml.find("train_micro_batch_size: 4  # "), std::string::npos) << yaml;
  EXPECT_EQ(yaml.find("context_parallel_size"), std::string::npos) << yaml;
  // A changed value must change the comparison (the round trip is not vacuous).
  c.policy.optimizer.lr = 3.4e-7;
  EXPECT_FALSE(parse_config(yaml, "printed") == c);
}

TEST(WorkerConfig, ExampleConfigsParse) {
  for (const char* name : {"sft.yaml", "grpo.yaml", "dpo.yaml"}) {
    SCOPED_TRACE(name);
    const Config c = load_config(fs::path(RINGTRAIN_SOURCE_DIR) / "configs" / name);
    c.validate_against(resolve_model_config(c.policy));
    EXPECT_TRUE(parse_config(to_yaml(c), "printed") == c) << to_yaml(c);  // null ratio_clip_c included
  }
  EXPECT_EQ(load_config(fs::path(RINGTRAIN_SOURCE_DIR) / "configs" / "dpo.yaml").loss_fn.type, LossType::Dpo);
  EXPECT_EQ(load_config(fs::path(RINGTRAIN_SOURCE_DIR) / "configs" / "grpo.yaml").loss_fn.type, LossType::ClippedPg);
}

TEST(WorkerConfig, UnknownKeysNameThePathAndTheNearestKey) {
  std::string e = parse_error(kMinimal + "loss_fn:\n  ratio_clip_mx: 0.3\n");
  EXPECT_NE(e.find("cfg.yaml:8"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'loss_fn.ratio_clip_mx'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'loss_fn.ratio_clip_max'"), std::string::npos) << e;
  e = parse_error(kMinimal, {"policy.train_micro_batchsize=2"});
  EXPECT_NE(e.find("policy.train_micro_batch_size"), std::string::npos) << e;
  e = parse_error(kMinimal + "polcy:\n  x: 1\n");
  EXPECT_NE(e.find("did you mean 'policy'"), std::string::npos) << e;
  e = parse_error(kMinimal, {"policy.optimizer=3"});
  EXPECT_NE(e.find("is a section"), std::string::npos) << e;
  // A part left out or a name cut short is nearer than any single-letter slip; nonsense gets no guess.
  for (const auto& [typed, meant] : std::vector<std::pair<std::string, std::string>>{
           {"grpo.num_generations", "grpo.num_generations_per_prompt"},
           {"policy.micro_batch_size", "policy.train_micro_batch_size"},
           {"policy.optimizer.lr", "policy.optimizer.kwargs.lr"}}) {
    e = parse_error(kMinimal, {typed + "=2"});
    EXPECT_NE(e.find("did you mean '" + meant + "'"), std::string::npos) << e;
  }
  e = parse_error(kMinimal, {"nosuch.key=1"});
  EXPECT_EQ(e.find("did you mean"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'nosuch.key' (`ringtrain config FILE` prints every key)"), std::string::npos) << e;
}

TEST(WorkerConfig, TypeAndRangeErrorsNameKeyValueAndLine) {
  struct Case {
    std::string yaml, want;
  };
  const std::vector<Case> cases = {
      {"policy: {train_micro_batch_size: two}", "policy.train_micro_batch_size = 'two': expected an integer"},
      {"policy: {train_micro_batch_size: 2.5}", "expected an integer"},
      {"policy: {train_micro_batch_size: 0}", "out of range [1, "},
      {"policy: {train_micro_batch_size: 99999999999999999999999}", "out of range"},
      {"policy: {max_grad_norm: .nan}", "policy.max_grad_norm = .nan: not a finite number"},
      {"policy: {max_grad_norm: nan}", "not a finite number"},
      {"policy: {max_grad_norm: 1e999}", "not a finite number"},
      {"policy: {max_grad_norm: -1}", "policy.max_grad_norm = -1: out of range [0, "},
      {"policy: {precision: fp8}", "expected one of auto, bfloat16, float32, float64"},
      {"policy: {sequence_packing: {enabled: maybe}}", "expected true or false"},
      {"policy: {optimizer: {kwargs: {betas: [0.9]}}}", "expected a list of two numbers"},
      {"policy: {optimizer: {kwargs: {betas: [0.9, 1.0]}}}", "betas[1] = 1.0: out of range [0, 1)"},
      {"loss_fn: {ratio_clip_min: 1}", "loss_fn.ratio_clip_min = 1: out of range [0, 1)"},
      {"policy: {train_micro_batch_size: [1, 2]}", "expected a single value, got a list"},
      {"policy: 5", "policy: expected a mapping of keys"},
      {"loss_fn: {ratio_clip_c: 1}", "loss_fn.ratio_clip_c = 1: out of range (1, "},
      {"attention: {backends: [flash, warp]}", "attention.backends[1]"},
      {"attention: {backends: [math, flash, math]}", "attention.backends[2] = math: listed twice"},
      {"attention: {backends: [decode]}", "attention.backends = [decode]: decode serves only the GPU sampler's"},
      {"parallel: {cp_comm: tree}", "expected one of ring, allgather, a2a"},
      {"train: {seed: -1}", "train.seed = '-1'"},
      {"device: tpu", "device = 'tpu'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml);
    // Type errors come before the cross-field checks, so the case needs no complete config around it.
    const std::string e = parse_error("# line 1\n" + c.yaml + "\n");
    EXPECT_NE(e.find(c.want), std::string::npos) << e;
    EXPECT_NE(e.find("cfg.yaml:2"), std::string::npos) << e;
  }
}

TEST(WorkerConfig, CrossFieldChecksNameTheKeys) {
  struct Case {
    std::vector<std::string> overrides;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{"parallel.dp=3"},
       "policy.train_global_batch_size = 32 must be a multiple of parallel.dp (3) x "
       "policy.train_micro_batch_size (4) = 12"},
      {{"policy.train_global_batch_size=6", "policy.train_micro_batch_size=4"}, "must be a multiple"},
      // With packing the microbatches are token budgets: only dp must divide the batch.
      {{"parallel.dp=5", "policy.sequence_packing.enabled=true"},
       "policy.train_global_batch_size = 32 must be a multiple of parallel.dp = 5"},
      {{"policy.precision=bfloat16"}, "the CPU policy computes in float32 or float64"},
      {{"device=cuda"}, "policy.precision = float32 with device cuda:0"},
      {{"policy.sequence_packing.enabled=true", "policy.sequence_packing.train_mb_tokens=100"},
       "sequence_packing.train_mb_tokens = 100 is below the longest training unit, 4096 tokens"},
      {{"policy.dynamic_batching.enabled=true", "policy.dynamic_batching.train_mb_tokens=8000", "loss_fn.type=dpo",
        "loss_fn.reference_policy_kl_penalty=0.1"},
       "dynamic_batching.train_mb_tokens = 8000 is below the longest training unit, 8192 tokens"},
      {{"loss_fn.type=dpo"}, "loss_fn.reference_policy_kl_penalty = 0: with loss_fn.type = dpo it is DPO's beta"},
      {{"loss_fn.type=dpo", "loss_fn.reference_policy_kl_penalty=0.1", "loss_fn.preference_loss_weight=0.5"},
       "loss_fn.preference_loss_weight = 0.5: the worker's DPO loss weighs the preference term 1"},
      {{"policy.optimizer.kwargs.eps=0"}, "policy.optimizer.kwargs.eps = 0: must be > 0"},
      {{"policy.dynamic_batching.enabled=true", "policy.sequence_packing.enabled=true"}, "choose one way"},
      {{"policy.sequence_packing.enabled=true", "policy.sequence_packing.logprob_mb_tokens=4095"},
       "logprob_mb_tokens = 4095"},
      {{"policy.scheduler.kind=cosine", "policy.scheduler.warmup_steps=5", "train.steps=5"},
       "cosine needs total_steps (5, or train.steps when 0) above policy.scheduler.warmup_steps (5)"},
      {{"policy.scheduler.min_lr=1"}, "policy.scheduler.min_lr = 1 is above"},
      {{"train.steps=0", "train.epochs=0"}, "both 0"},
      {{"train.checkpoint_every=5"}, "needs train.checkpoint_dir"},
      {{"policy.dtensor_cfg.tensor_parallel_size=2"}, "no tensor parallelism"},
      {{"policy.model_name=builtin:huge"}, "unknown builtin model (known: tiny, char-tiny, small, llama-3.2-1b)"},
      {{"policy.model_name="}, "policy.model_name is required"},
      {{"train.data=~"}, "train.data is required"},
      {{"policy.train_micro_batch_size"}, "expected KEY=VALUE"},
      {{"policy.train_micro_batch_size=[1"}, "the value is not YAML"},
      {{"train.seed=" + std::string(20000, '[') + std::string(20000, ']')}, "levels deep, where the reader stops"},
      {{"parallel.cp=1025"}, "parallel.cp = 1025: out of range [1, 1024]"},
      {{"policy.dtensor_cfg.context_parallel_size=65536"}, "out of range [1, 1024]"},
      {{"parallel.dp=64", "parallel.cp=32", "policy.train_global_batch_size=64", "policy.train_micro_batch_size=1"},
       "parallel.dp (64) x parallel.cp (32) = 2048 ranks: at most 1024"},
      // The YAML reader would take these bytes for a UTF-16 byte-order mark and drop them with the value.
      {{"train.data=\xFF\xFE" "ab"}, "the value starts with a byte-order mark"},
      {{"train.data=\xEF\xBB\xBF" "ab"}, "starts with a byte-order mark"},
      // From Python a NUL can reach an override; the YAML parser would read only "1".
      {{std::string("train.seed=1\0" "2", 14)}, "override 'train.seed=1\\x002': holds a NUL byte"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.overrides[0]);
    const std::string e = parse_error(kMinimal, c.overrides);
    EXPECT_NE(e.find(c.want), std::string::npos) << e;
  }
  // A packed batch of 32 on dp = 2 whatever train_micro_batch_size (it forms no microbatch then); padded, refused.
  EXPECT_NO_THROW(parse_config(kMinimal, "cfg.yaml",
                               {"parallel.dp=2", "policy.train_micro_batch_size=3", "policy.sequence_packing.enabled=true"}));
  EXPECT_THROW(parse_config(kMinimal, "cfg.yaml", {"parallel.dp=2", "policy.train_micro_batch_size=3"}), Error);
}

TEST(WorkerConfig, AConfigForTheWorkerAloneNeedsNoData) {
  const Config c = parse_config(kMinimal, "cfg.yaml", {"train.data=~"}, ConfigUse::Worker);
  EXPECT_TRUE(c.train.data.empty());
  EXPECT_NO_THROW(c.validate(ConfigUse::Worker));
  EXPECT_THROW(c.validate(), Error);  // a run still needs it
  // Every other check still runs.
  try {
    parse_config(kMinimal, "cfg.yaml", {"train.data=~", "policy.model_name="}, ConfigUse::Worker);
    ADD_FAILURE() << "no error without policy.model_name";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("policy.model_name is required"), std::string::npos) << e.what();
  }
}

TEST(WorkerConfig, TwoNamesOfTheCpSizeMustNotBothBeGiven) {
  const std::string both = parse_error(
      "policy:\n  model_name: builtin:tiny\n  precision: float32\n  dtensor_cfg: {context_parallel_size: 2}\n"
      "device: cpu\ntrain: {data: x}\nparallel: {cp: 2}\n");
  EXPECT_NE(both.find("cfg.yaml:7: parallel.cp sets the same setting as policy.dtensor_cfg.context_parallel_size"),
            std::string::npos)
      << both;
}

TEST(WorkerConfig, ValidateAgainstTheModel) {
  const model::ModelConfig tiny = resolve_model_config(parse_config(kMinimal, "cfg.yaml").policy);  // 4 heads, 2 kv
  EXPECT_EQ(tiny.heads, 4);
  EXPECT_EQ(tiny.kv_heads, 2);
  parse_config(kMinimal, "cfg.yaml", {"parallel.cp=2", "parallel.cp_comm=a2a"}).validate_against(tiny);
  try {
    parse_config(kMinimal, "cfg.yaml", {"parallel.cp=4", "parallel.cp_comm=a2a"}).validate_against(tiny);
    ADD_FAILURE() << "4 ranks of a2a over 2 kv heads accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("key/value heads (2) must both be divisible by cp = 4"), std::string::npos)
        << e.what();
  }
  parse_config(kMinimal, "cfg.yaml", {"parallel.cp=4", "parallel.cp_comm=ring"}).validate_against(tiny);
  try {
    parse_config(kMinimal, "cfg.yaml", {"policy.max_total_sequence_length=8193"}).validate_against(tiny);
    ADD_FAILURE() << "a length past the model's positions accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the model's max_position_embeddings = 8192"), std::string::npos)
        << e.what();
  }
  model::ModelConfig windowed = tiny;
  windowed.sliding_window = 1024;
  EXPECT_NO_THROW(parse_config(kMinimal, "cfg.yaml").validate_against(windowed));
  const std::string long_sequences = "policy.max_total_sequence_length=2048";
  EXPECT_NO_THROW(parse_config(kMinimal, "cfg.yaml", {long_sequences}).validate_against(windowed));
  try {  // refused before any weight is loaded: ring attention takes no window
    parse_config(kMinimal, "cfg.yaml", {long_sequences, "parallel.cp=2", "parallel.cp_comm=ring"})
        .validate_against(windowed);
    ADD_FAILURE() << "a window shorter than the sequence accepted under parallel.cp = 2 with the ring";
  } catch (const Error& e) {
    for (const char* part :
         {"'sliding_window' = 1024", "parallel.cp = 2", "parallel.cp_comm = ring",
          "policy.max_total_sequence_length (2048 tokens)", "use parallel.cp_comm = allgather or a2a"})
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
  for (const char* comm : {"parallel.cp_comm=allgather", "parallel.cp_comm=a2a"})
    EXPECT_NO_THROW(
        parse_config(kMinimal, "cfg.yaml", {long_sequences, "parallel.cp=2", comm}).validate_against(windowed));
  windowed.sliding_window = 2048;  // covers every sequence: no window
  EXPECT_NO_THROW(parse_config(kMinimal, "cfg.yaml", {long_sequences, "parallel.cp=2"}).validate_against(windowed));
}

TEST(WorkerConfig, HostileFilesAreErrorsNotCrashes) {
  const testing::TempDir tmp("rt_config_test");
  const fs::path& dir = tmp.path;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
    return dir / name;
  };
  auto error_of = [](const fs::path& p) -> std::string {
    try {
      load_config(p);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(error_of(write("empty.yaml", "")).find("empty config"), std::string::npos);
  EXPECT_NE(error_of(write("comments.yaml", "# nothing\n")).find("empty config"), std::string::npos);
  EXPECT_NE(error_of(dir).find("not a regular file"), std::string::npos);
  EXPECT_NE(error_of(dir / "missing.yaml").find("no such config file"), std::string::npos);
  fs::create_symlink("loop_b.yaml", dir / "loop_a.yaml");
  fs::create_symlink("loop_a.yaml", dir / "loop_b.yaml");
  const std::string loop = error_of(dir / "loop_a.yaml");
  EXPECT_NE(loop.find("loop_a.yaml: Too many levels of symbolic links"), std::string::npos) << loop;
  EXPECT_NE(error_of(write("list.yaml", "- 1\n- 2\n")).find("expected a mapping of sections"), std::string::npos);
  EXPECT_NE(error_of(write("scalar.yaml", "42\n")).find("got a value"), std::string::npos);
  const std::string dup = error_of(write("dup.yaml", kMinimal + "policy:\n  logprob_batch_size: 2\n"));
  EXPECT_NE(dup.find("dup.yaml:7: duplicate key 'policy'"), std::string::npos) << dup;
  const std::string dup_leaf = error_of(write("dup2.yaml", "train:\n  steps: 1\n  steps: 2\n"));
  EXPECT_NE(dup_leaf.find("duplicate key 'train.steps'"), std::string::npos) << dup_leaf;
  const std::string deep_flow = error_of(write("deep_flow.yaml", "policy: " + std::string(100000, '[')));
  EXPECT_NE(deep_flow.find("deep_flow.yaml:1:"), std::string::npos) << deep_flow;
  EXPECT_NE(deep_flow.find("levels deep, where the reader stops"), std::string::npos) << deep_flow;
  std::string deep_block;
  for (int i = 0; i < 1000; ++i) deep_block += std::string(static_cast<size_t>(i), ' ') + "k:\n";
  EXPECT_NE(error_of(write("deep_block.yaml", deep_block)).find("YAML error"), std::string::npos);
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n";
  for (int i = 0; i < 9; ++i)
    bomb += cat(char('b' + i), ": &", char('b' + i), " [*", char('a' + i), ", *", char('a' + i), ", *", char('a' + i),
                "]\n");
  EXPECT_NE(error_of(write("alias_bomb.yaml", bomb)).find("unknown key 'a'"), std::string::npos);
  const std::string aliased = error_of(write("alias.yaml", "policy: &p {model_name: *p}\n"));
  EXPECT_NE(aliased.find("policy.model_name"), std::string::npos) << aliased;
  EXPECT_NE(error_of(write("tabs.yaml", "policy:\n\t- x: [\n")).find("YAML error"), std::string::npos);
  EXPECT_NE(error_of(write("binary.yaml", std::string("\0\xff\xfe\x01", 4))).find("binary.yaml"), std::string::npos);
  std::ofstream(dir / "huge.yaml") << std::string(5u << 20, '#');
  EXPECT_NE(error_of(dir / "huge.yaml").find("too large for a config"), std::string::npos);
}

// yaml-cpp reads a quote left open as a value running to the end of the file, and the keys after it would keep their
// defaults unseen: such a value is an error at its line and column; closed quotes of both kinds, with their escapes,
// are not.
TEST(WorkerConfig, AQuoteLeftOpenIsAnErrorAtItsLine) {
  const std::string open_quote = kMinimal + "  metrics_dir: \"runs/a\n  steps: 2\n  checkpoint_every: 1\n";
  const std::string e = parse_error(open_quote);
  EXPECT_NE(e.find("cfg.yaml:7:16: the value \"runs/a"), std::string::npos) << e;
  EXPECT_NE(e.find("not closed on its line"), std::string::npos) << e;
  const std::string single = parse_error(kMinimal + "  metrics_dir: 'it''s\n  steps: 2\n");
  EXPECT_NE(single.find("cfg.yaml:7:16"), std::string::npos) << single;
  const std::string listed = parse_error(
      "policy:\n  model_name: builtin:tiny\n  optimizer:\n    kwargs:\n      betas:\n        - 0.9\n        - \"0.99\n"
      "train:\n  data: x.jsonl\n");
  EXPECT_NE(listed.find("cfg.yaml:7:11: the value \"0.99"), std::string::npos) << listed;
  // yaml-cpp itself refuses an open quote at the very end of the text ("illegal EOF"), not before a line break.
  const std::string overridden = parse_error(kMinimal, {"train.metrics_dir=\"runs/a\n"});
  EXPECT_NE(overridden.find("override 'train.metrics_dir=\"runs/a\\x0a': the value \"runs/a"), std::string::npos)
      << overridden;
  EXPECT_NE(overridden.find("is not closed on its line"), std::string::npos) << overridden;

  const Config c = parse_config(kMinimal + "  metrics_dir: 'it''s'\n  checkpoint_dir: \"a\\\"b # c\"\n  steps: 3\n",
                                "cfg.yaml", {"train.seed=7"});
  EXPECT_EQ(c.train.metrics_dir, "it's");
  EXPECT_EQ(c.train.checkpoint_dir, "a\"b # c");
  EXPECT_EQ(c.train.steps, 3);
  EXPECT_EQ(c.train.seed, 7u);
}

// A quoted number or flag is a string (YAML's rule, and what a Python dict's "2" becomes): refused where a number or
// true/false belongs, in the file and in an override, naming the key.
TEST(WorkerConfig, AQuotedNumberOrFlagIsAString) {
  const std::string e = parse_error(kMinimal + "  steps: \"3\"\n");
  EXPECT_NE(e.find("cfg.yaml:7: train.steps = \"3\": a string; expected an integer (written without quotes)"),
            std::string::npos) << e;
  EXPECT_NE(parse_error(kMinimal, {"train.seed='7'"}).find("train.seed = \"7\": a string; expected an integer"),
            std::string::npos);
  EXPECT_NE(parse_error(kMinimal, {"policy.optimizer.kwargs.lr=!!str 1e-5"}).find("a string; expected a number"),
            std::string::npos);
  EXPECT_NE(parse_error(kMinimal, {"policy.dtensor_cfg.activation_checkpointing=\"true\""})
                .find("a string; expected true or false"),
            std::string::npos);
  // A plain scalar stays a number, and a quoted string stays a string.
  const Config c = parse_config(kMinimal + "  steps: 3\n", "cfg.yaml", {"train.metrics_dir=\"7\""});
  EXPECT_EQ(c.train.steps, 3);
  EXPECT_EQ(c.train.metrics_dir, "7");
}

}  // namespace
}  // namespace ringtrain::worker
