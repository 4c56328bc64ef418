// Checkpoint files: safetensors round trips (fp32/bf16/fp16), sharded checkpoints, every malformed-file path
// (truncation, bad header, bad offsets, missing tensor, wrong shape, unknown dtype), config.json parsing and its
// errors. Every error must name the file and what is wrong.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>

#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "model_test_util.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/model/params.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using model::ModelConfig;
using nlohmann::json;

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           cat("rt_ckpt_", ::getpid(), "_", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

// Runs fn, which must throw an Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST_F(Checkpoint, SafetensorsRoundTripAllDtypes) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::normal_distribution<float> n;
  model::TensorMap t;
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    std::vector<float> v(3 * 5);
    for (float& x : v) x = n(rng);
    t.emplace(cat("w.", dtype_name(dt)), model::from_float32(v, {3, 5}, dt));
  }
  t.emplace("scalar_like", model::from_float32({1.5f}, {1}, DType::F32));
  const auto file = dir_ / "x.safetensors";
  model::write_safetensors(file, t);
  const std::string bytes = model::read_file(file);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ((8 + header_len) % 8, 0u) << "data section should be 8-byte aligned";
  const json header = json::parse(bytes.substr(8, header_len));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["w.bf16"]["dtype"], "BF16");
  EXPECT_EQ(header["w.bf16"]["shape"], json({3, 5}));
  const model::TensorMap back = model::read_safetensors(file);
  ASSERT_EQ(back.size(), t.size());
  for (const auto& [name, tensor] : t) {
    EXPECT_EQ(back.at(name).dtype, tensor.dtype) << name;
    EXPECT_EQ(back.at(name).shape, tensor.shape) << name;
    EXPECT_EQ(back.at(name).bytes, tensor.bytes) << name;
  }
  // bf16 holds the fp32 value rounded to 8 significant bits.
  const std::vector<float> f = model::to_float32("w.fp32", back.at("w.fp32"));
  const std::vector<float> b = model::to_float32("w.bf16", back.at("w.bf16"));
  for (size_t i = 0; i < f.size(); ++i) EXPECT_NE(b[i], 0.f);
  // No temporary files are left behind.
  for (const auto& e : std::filesystem::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST_F(Checkpoint, ModelSaveLoadRoundTrip) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (DType dt : {DType::F32, DType::BF16}) {
    ModelConfig c = testing::tiny_config(model::Arch::Qwen2);
    c.dtype = dt;
    const std::vector<float> p = testing::tiny_params(c, rng);
    model::save_checkpoint(dir_, c, p);
    const ModelConfig c2 = model::load_config(dir_);
    EXPECT_EQ(model::config_to_json(c2), model::config_to_json(c));
    const std::vector<float> p2 = model::load_checkpoint_params(dir_, c2);
    ASSERT_EQ(p2.size(), p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      const float want = dt == DType::F32 ? p[i] : bf16_to_float(float_to_bf16(p[i]));
      ASSERT_EQ(p2[i], want) << i;
    }
  }
}

TEST_F(Checkpoint, ShardedIndexIsRead) {
  // The Mistral fixture is three shards with an index, as transformers wrote them.
  const auto dir = testing::model_fixture_dir("mistral") / "checkpoint";
  const model::TensorMap t = model::read_checkpoint_tensors(dir);
  const ModelConfig c = model::load_config(dir);
  EXPECT_EQ(static_cast<int64_t>(t.size()), static_cast<int64_t>(model::ParamLayout(c).specs().size()));
  EXPECT_EQ(model::load_checkpoint_params(dir, c).size(), static_cast<size_t>(model::ParamLayout(c).total()));
  // An index naming a tensor its shard lacks.
  std::filesystem::copy(dir, dir_ / "ck");
  json idx = json::parse(model::read_file(dir_ / "ck" / "model.safetensors.index.json"));
  idx["weight_map"]["model.extra.weight"] = idx["weight_map"]["model.norm.weight"];
  std::ofstream(dir_ / "ck" / "model.safetensors.index.json") << idx.dump();
  expect_error([&] { model::read_checkpoint_tensors(dir_ / "ck"); },
               {"model.safetensors.index.json", "'model.extra.weight'", "does not hold it"});
  // Beside the index, a model.safetensors of other weights: read first, as transformers does.
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c2 = model::load_config(dir_ / "ck");
  const std::vector<float> other = testing::tiny_params(c2, rng);
  model::write_safetensors(dir_ / "ck" / "model.safetensors",
                           model::params_to_tensors(model::ParamLayout(c2), other.data(), DType::F32));
  EXPECT_EQ(model::load_checkpoint_params(dir_ / "ck", c2), other);
}

TEST_F(Checkpoint, MalformedFilesNameFileAndProblem) {
  model::TensorMap t;
  t.emplace("a", model::from_float32(std::vector<float>(6, 1.f), {2, 3}, DType::F32));
  t.emplace("b", model::from_float32(std::vector<float>(4, 2.f), {4}, DType::BF16));
  const auto good = dir_ / "good.safetensors";
  model::write_safetensors(good, t);
  const std::string bytes = model::read_file(good);
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir_ / name, std::ios::binary) << content;
    return (dir_ / name);
  };
  // Truncated in the data section, in the header, and before the length.
  expect_error([&] { model::read_safetensors(write("t1.safetensors", bytes.substr(0, bytes.size() - 3))); },
               {"t1.safetensors", "truncated"});
  expect_error([&] { model::read_safetensors(write("t2.safetensors", bytes.substr(0, 20))); },
               {"t2.safetensors", "exceeds the file size"});
  expect_error([&] { model::read_safetensors(write("t3.safetensors", bytes.substr(0, 5))); },
               {"t3.safetensors", "too short"});
  // A header that is not JSON.
  std::string bad = bytes;
  bad[8] = '#';
  expect_error([&] { model::read_safetensors(write("h.safetensors", bad)); }, {"h.safetensors", "header: invalid JSON"});
  // Entries that lie: wrong byte count for the shape, unknown dtype, overlapping data.
  auto with_header = [&](const json& h, size_t data_bytes) {
    std::string hs = h.dump(), out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((hs.size() >> (8 * i)) & 0xff);
    return out + hs + std::string(data_bytes, '\0');
  };
  expect_error(
      [&] {
        model::read_safetensors(write("s.safetensors", with_header({{"w", {{"dtype", "F32"}, {"shape", {2, 3}},
                                                                             {"data_offsets", {0, 20}}}}}, 20)));
      },
      {"s.safetensors", "tensor 'w'", "20 bytes for shape [2, 3]", "expected 24"});
  expect_error(
      [&] {
        model::read_safetensors(write("d.safetensors", with_header({{"w", {{"dtype", "F8_E4M3"}, {"shape", {4}},
                                                                             {"data_offsets", {0, 4}}}}}, 4)));
      },
      {"d.safetensors", "tensor 'w'", "unsupported dtype \"F8_E4M3\""});
  expect_error(
      [&] {
        model::read_safetensors(write(
            "o.safetensors",
            with_header({{"w", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
                         {"v", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}}}},
                        12)));
      },
      {"o.safetensors", "overlaps"});
  // Missing file.
  expect_error([&] { model::read_safetensors(dir_ / "nope.safetensors"); }, {"nope.safetensors", "cannot open"});
}

TEST_F(Checkpoint, MissingTensorWrongShapeAndExtraTensor) {
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(model::Arch::Llama);
  const model::ParamLayout layout(c);
  const std::vector<float> p = testing::tiny_params(c, rng);
  model::TensorMap t = model::params_to_tensors(layout, p.data(), DType::F32);
  model::TensorMap missing = t;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  expect_error([&] { model::params_from_tensors(layout, c, missing, "ckpt-dir"); },
               {"ckpt-dir", "missing tensor 'model.layers.1.mlp.up_proj.weight'", "[24, 16]"});
  model::TensorMap wrong = t;
  wrong["model.layers.0.self_attn.k_proj.weight"] = model::from_float32(std::vector<float>(16 * 16), {16, 16}, DType::F32);
  wrong["model.layers.0.self_attn.k_proj.weight"].file = "shard-7.safetensors";
  expect_error([&] { model::params_from_tensors(layout, c, wrong, "ckpt-dir"); },
               {"shard-7.safetensors", "'model.layers.0.self_attn.k_proj.weight'", "shape [16, 16]", "expected [8, 16]"});
  model::TensorMap extra = t;
  extra["model.layers.0.mlp.gate_proj.bias"] = model::from_float32(std::vector<float>(24), {24}, DType::F32);
  extra["model.layers.0.mlp.gate_proj.bias"].file = "m.safetensors";
  expect_error([&] { model::params_from_tensors(layout, c, extra, "ckpt-dir"); },
               {"m.safetensors", "unexpected tensor 'model.layers.0.mlp.gate_proj.bias'"});
  // RoPE caches of old checkpoints are ignored; so is lm_head.weight of a tied model.
  model::TensorMap cache = t;
  cache["model.layers.0.self_attn.rotary_emb.inv_freq"] = model::from_float32(std::vector<float>(2), {2}, DType::F32);
  EXPECT_NO_THROW(model::params_from_tensors(layout, c, cache, "ckpt-dir"));
}

json base_config() {
  return json{{"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 32},      {"hidden_size", 16},
              {"intermediate_size", 24},                {"num_hidden_layers", 2}, {"num_attention_heads", 4},
              {"num_key_value_heads", 2},               {"rms_norm_eps", 1e-5},   {"rope_theta", 10000.0}};
}

TEST(HfConfig, ParsesBothRopeFormats) {
  json legacy = base_config();
  legacy["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  legacy["rope_theta"] = 500000.0;
  json v5 = base_config();
  v5.erase("rope_theta");
  v5["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0},
                           {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 8192}};
  for (const json& j : {legacy, v5}) {
    const ModelConfig c = model::parse_config(j, "config.json");
    EXPECT_TRUE(c.rope.llama3);
    EXPECT_EQ(c.rope.theta, 500000.0);
    EXPECT_EQ(c.rope.factor, 8.0);
    EXPECT_EQ(c.rope.original_max_position, 8192);
    EXPECT_EQ(c.head_dim, 4);
  }
  // Every fixture's config.json (as transformers 5 writes them) parses to what its name says.
  EXPECT_TRUE(model::load_config(testing::model_fixture_dir("qwen2") / "checkpoint").qkv_bias);
  const ModelConfig q3 = model::load_config(testing::model_fixture_dir("qwen3") / "checkpoint");
  EXPECT_TRUE(q3.qk_norm && q3.tie_embeddings);
  EXPECT_EQ(q3.head_dim, 32);
  EXPECT_EQ(model::load_config(testing::model_fixture_dir("mistral") / "checkpoint").sliding_window, 4096);
}

TEST(HfConfig, UnsupportedValuesNameTheKey) {
  struct Case {
    const char* key;
    json value;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"architectures", {"GPT2LMHeadModel"}, "key 'architectures' = [\"GPT2LMHeadModel\"]"},
      {"hidden_act", "gelu", "key 'hidden_act' = \"gelu\""},
      {"num_key_value_heads", 3, "key 'num_key_value_heads' = 3"},
      {"vocab_size", nullptr, "key 'vocab_size'"},
      {"head_dim", 5, "key 'head_dim' = 5"},
      {"mlp_bias", true, "key 'mlp_bias' = true"},
      {"quantization_config",
       {{"quant_method", "gptq"}, {"bits", 4}},
       "key 'quantization_config' = {\"bits\":4,\"quant_method\":\"gptq\"}: quantized checkpoints are not supported"},
      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}, "key 'rope_type' = \"yarn\""},
      // Keys that change the rotation are read or refused, never left unread.
      {"partial_rotary_factor", 0.5, "key 'partial_rotary_factor' = 0.5: only 1.0 is supported"},
      {"rope_scaling", {{"factor", 8.0}}, "key 'rope_scaling' = {\"factor\":8.0}: gives scaling values but no"},
      {"rope_scaling", {{"rope_type", "llama3"}, {"mscale", 1.2}}, "key 'mscale' = 1.2: not a RoPE parameter"},
      {"rope_parameters",
       {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}}},
       "key 'full_attention' = {\"rope_theta\":1000000.0,\"rope_type\":\"default\"}: RoPE parameters per layer type"},
      // transformers builds the model from model_type: a class that says otherwise is refused, not resolved.
      {"model_type", "mistral", "key 'model_type' = \"mistral\": disagrees with 'architectures' = LlamaForCausalLM"},
      {"rms_norm_eps", -1.0, "key 'rms_norm_eps' = -1.0"},
      {"torch_dtype", "int8", "key 'torch_dtype' = \"int8\""},
      {"hidden_size", "64", "key 'hidden_size' = \"64\""},
      {"eos_token_id", "2", "key 'eos_token_id' = \"2\": expected a token id"},
      {"bos_token_id", json::array(), "key 'bos_token_id' = []"},
  };
  for (const Case& k : cases) {
    json j = base_config();
    j[k.key] = k.value;
    expect_error([&] { model::parse_config(j, "some/config.json"); }, {"some/config.json", k.expect});
  }
  json missing = base_config();
  missing.erase("num_hidden_layers");
  expect_error([&] { model::parse_config(missing, "c.json"); }, {"c.json", "'num_hidden_layers'", "missing"});
}

// The special token ids come back as given (transformers' generation stops at eos_token_id), only those given.
TEST(HfConfig, SpecialTokenIdsAreKept) {
  json j = base_config();
  j["bos_token_id"] = 1;
  j["eos_token_id"] = {2, 31};
  j["pad_token_id"] = nullptr;
  const json back = model::config_to_json(model::parse_config(j, "c"));
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    ASSERT_TRUE(back.contains(key)) << key;
    EXPECT_EQ(back.at(key), j.at(key)) << key;
  }
  j.erase("pad_token_id");
  j["bos_token_id"] = -1;  // released configs hold such ids; no weight depends on them
  const json again = model::config_to_json(model::parse_config(j, "c"));
  EXPECT_FALSE(again.contains("pad_token_id"));
  EXPECT_EQ(again.at("bos_token_id"), -1);
}

// transformers' rules (configuration_qwen2.py, modeling_mistral.py): Mistral windows every layer when sliding_window
// is set; Qwen2/Qwen3 drop the window without use_sliding_window, then window the "sliding_attention" entries of
// layer_types, or without them the layers from max_window_layers (default 28) on.
TEST(HfConfig, SlidingWindowRules) {
  json m = base_config();
  m["architectures"] = {"MistralForCausalLM"};
  m["sliding_window"] = 16;
  ModelConfig c = model::parse_config(m, "c");
  EXPECT_EQ(c.sliding_window, 16);
  EXPECT_EQ(c.layer_window(0), 16);
  EXPECT_EQ(c.layer_window(1), 16);
  m["sliding_window"] = nullptr;
  EXPECT_EQ(model::parse_config(m, "c").sliding_window, 0);
  m.erase("sliding_window");  // missing: MistralConfig's default
  EXPECT_EQ(model::parse_config(m, "c").sliding_window, 4096);
  m["model_type"] = "mistral";  // agreeing with the class
  EXPECT_EQ(model::parse_config(m, "c").sliding_window, 4096);

  json q = base_config();
  q["architectures"] = {"Qwen2ForCausalLM"};
  q["num_hidden_layers"] = 3;
  q["sliding_window"] = 16;
  q["use_sliding_window"] = true;
  EXPECT_EQ(model::parse_config(q, "c").sliding_window, 0);  // max_window_layers 28 >= 3 layers: none windowed
  q["max_window_layers"] = 1;
  c = model::parse_config(q, "c");
  EXPECT_EQ(c.sliding_window, 16);
  EXPECT_EQ(c.layer_window(0), 0);  // the first max_window_layers layers attend fully
  EXPECT_EQ(c.layer_window(1), 16);
  EXPECT_EQ(c.layer_window(2), 16);
  EXPECT_NO_THROW(model::check_sequence_supported(c, 17));  // a window shorter than the sequence does not limit it
  q["max_window_layers"] = 0;
  c = model::parse_config(q, "c");
  EXPECT_TRUE(c.full_attention_layers.empty());
  EXPECT_EQ(c.layer_window(0), 16);
  q["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};  // takes precedence
  c = model::parse_config(q, "c");
  EXPECT_EQ(c.layer_window(0), 0);
  EXPECT_EQ(c.layer_window(1), 16);
  EXPECT_EQ(c.layer_window(2), 0);
  // Written back and read again: the same layers windowed.
  const ModelConfig again = model::parse_config(model::config_to_json(c), "c");
  EXPECT_EQ(again.sliding_window, 16);
  EXPECT_EQ(again.full_attention_layers, c.full_attention_layers);
  q["use_sliding_window"] = false;  // transformers sets sliding_window to None then
  EXPECT_EQ(model::parse_config(q, "c").sliding_window, 0);
  q["use_sliding_window"] = true;
  q.erase("sliding_window");  // missing: Qwen2Config's default
  EXPECT_EQ(model::parse_config(q, "c").layer_window(1), 4096);
  q["sliding_window"] = 16;
  q["architectures"] = {"Qwen3ForCausalLM"};
  q["use_sliding_window"] = true;
  EXPECT_EQ(model::parse_config(q, "c").layer_window(1), 16);
  json l = base_config();
  l["sliding_window"] = 16;
  l["use_sliding_window"] = true;
  EXPECT_EQ(model::parse_config(l, "c").sliding_window, 0);  // Llama has no window
}

TEST(HfConfig, BadSlidingWindowKeysAreNamed) {
  struct Case {
    const char* key;
    json value;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"layer_types", {"full_attention", "sliding_attention"}, {"key 'layer_types'", "num_hidden_layers = 3"}},
      {"layer_types", "sliding_attention", {"key 'layer_types' = \"sliding_attention\"", "a list"}},
      {"layer_types",
       {"full_attention", "chunked_attention", "full_attention"},
       {"key 'layer_types'", "entry 1 = \"chunked_attention\""}},
      {"layer_types", {"full_attention", 7, "full_attention"}, {"key 'layer_types'", "entry 1 = 7"}},
      {"max_window_layers", -1, {"key 'max_window_layers' = -1", "negative"}},
      {"max_window_layers", "2", {"key 'max_window_layers' = \"2\"", "integer"}},
      {"sliding_window", 0, {"key 'sliding_window' = 0"}},
      {"sliding_window", 2.5, {"key 'sliding_window' = 2.5"}},
      {"use_sliding_window", "yes", {"key 'use_sliding_window' = \"yes\""}},
  };
  for (const Case& k : cases) {
    json q = base_config();
    q["architectures"] = {"Qwen2ForCausalLM"};
    q["num_hidden_layers"] = 3;
    q["sliding_window"] = 16;
    q["use_sliding_window"] = true;
    q[k.key] = k.value;
    try {
      model::parse_config(q, "q.json");
      ADD_FAILURE() << k.key << " = " << k.value.dump() << " accepted";
    } catch (const Error& e) {
      for (const std::string& part : k.expect)
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  }
}

TEST(HfConfig, RingAttentionRefusesAWindowShorterThanTheSequence) {
  using cp::CpComm;
  ModelConfig c = testing::tiny_config(model::Arch::Mistral);
  c.sliding_window = 16;
  EXPECT_NO_THROW(model::check_context_parallel_supported(c, 17, 1, CpComm::Ring));
  // a window covering the sequence is none
  EXPECT_NO_THROW(model::check_context_parallel_supported(c, 16, 2, CpComm::Ring));
  expect_error([&] { model::check_context_parallel_supported(c, 17, 2, CpComm::Ring); },
               {"'sliding_window' = 16", "17 tokens", "parallel.cp = 2", "parallel.cp_comm = ring",
                "use parallel.cp_comm = allgather or a2a"});
  EXPECT_NO_THROW(model::check_context_parallel_supported(c, 17, 2, CpComm::AllGather));
  EXPECT_NO_THROW(model::check_context_parallel_supported(c, 17, 2, CpComm::AllToAll));
  // All-to-all with heads (4 / 2) not divisible by cp: the way out is all-gather, and ring only without a window.
  expect_error([&] { model::check_context_parallel_supported(c, 17, 4, CpComm::AllToAll, {"--cp", "--cp-comm", "x"}); },
               {"--cp-comm = a2a with --cp = 4", "key/value heads (2) must both be divisible by cp = 4",
                "use --cp-comm = allgather (ring takes no sliding window)"});
  expect_error([&] { model::check_context_parallel_supported(c, 16, 4, CpComm::AllToAll); },
               {"use parallel.cp_comm = allgather or ring"});
}

TEST_F(Checkpoint, DeferredReadsMatchLoadedBytesAndNameNonFiniteWeights) {
  std::mt19937_64 rng(testing::fresh_seed());
  ModelConfig c = testing::tiny_config(model::Arch::Llama);
  c.dtype = DType::BF16;
  std::vector<float> p = testing::tiny_params(c, rng);
  model::save_checkpoint(dir_, c, p);
  const model::TensorMap loaded = model::read_checkpoint_tensors(dir_);
  const model::TensorMap deferred = model::read_checkpoint_tensors(dir_, model::TensorData::Defer);
  ASSERT_EQ(loaded.size(), deferred.size());
  for (const auto& [name, t] : loaded) {
    EXPECT_TRUE(deferred.at(name).bytes.empty()) << name;
    std::vector<float> from_file(static_cast<size_t>(t.numel()), std::nanf(""));
    model::to_float32(name, deferred.at(name), from_file.data());
    EXPECT_EQ(from_file, model::to_float32(name, t)) << name;
  }
  p[model::ParamLayout(c).layers[0].down + 3] = std::nanf("");
  model::save_checkpoint(dir_, c, p);
  expect_error([&] { model::load_checkpoint_params(dir_, c); },
               {"model.safetensors", "tensor 'model.layers.0.mlp.down_proj.weight'", "element 3 is nan"});
}

// A deferred tensor's data must come from the file its header was read from: a checkpoint saved over it (a new file
// under the name) or a file rewritten in place (same size, same inode) is refused, not read at the old offsets.
TEST_F(Checkpoint, DeferredReadsRefuseAFileThatChangedAfterItsHeader) {
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(model::Arch::Llama);
  model::save_checkpoint(dir_, c, testing::tiny_params(c, rng));
  const std::string weights = (dir_ / "model.safetensors").string(), name = "model.norm.weight";
  model::TensorMap deferred = model::read_checkpoint_tensors(dir_, model::TensorData::Defer);
  model::save_checkpoint(dir_, c, testing::tiny_params(c, rng));
  std::vector<float> out(static_cast<size_t>(deferred.at(name).numel()));
  expect_error([&] { model::to_float32(name, deferred.at(name), out.data()); },
               {weights, "changed after its header was read", name});

  deferred = model::read_checkpoint_tensors(dir_, model::TensorData::Defer);
  model::to_float32(name, deferred.at(name), out.data());  // unchanged: read
  std::string bytes = model::read_file(weights);
  bytes.back() = static_cast<char>(bytes.back() ^ 1);
  const auto written = std::filesystem::last_write_time(weights);
  {
    std::ofstream rewrite(weights, std::ios::in | std::ios::out | std::ios::binary);
    rewrite.seekp(static_cast<std::streamoff>(bytes.size() - 1));
    rewrite.put(bytes.back());
  }
  // Two seconds on, whatever the file system's clock resolution (some keep whole or even seconds).
  std::filesystem::last_write_time(weights, written + std::chrono::seconds(2));
  expect_error([&] { model::to_float32(name, deferred.at(name), out.data()); },
               {weights, "changed after its header was read"});
}

TEST_F(Checkpoint, SaveRefusesOrReplacesAnExistingCheckpointWithoutStaleShards) {
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(model::Arch::Qwen3);
  const std::vector<float> p = testing::tiny_params(c, rng);
  const auto ck = dir_ / "ck";
  model::save_checkpoint(ck, c, p, model::ExistingCheckpoint::Refuse);
  expect_error([&] { model::save_checkpoint(ck, c, p, model::ExistingCheckpoint::Refuse); },
               {ck.string(), "already holds a checkpoint"});
  // A stale sharded checkpoint in the folder: a second set of weights beside the new model.safetensors.
  const std::string shard = "model-00001-of-00001.safetensors";
  std::filesystem::copy_file(ck / "model.safetensors", ck / shard);
  json index;
  for (const auto& [name, t] : model::read_safetensors(ck / shard, model::TensorData::Defer)) index["weight_map"][name] = shard;
  model::write_file_atomic(ck / "model.safetensors.index.json", index.dump());
  model::write_file_atomic(ck / "tokenizer.json", "{}");
  std::vector<float> p2 = testing::tiny_params(c, rng);
  model::save_checkpoint(ck, c, p2, model::ExistingCheckpoint::Replace);
  EXPECT_FALSE(std::filesystem::exists(ck / "model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(ck / shard));
  EXPECT_TRUE(std::filesystem::exists(ck / "tokenizer.json"));  // not ours: kept
  EXPECT_EQ(model::load_checkpoint_params(ck, c), p2);
  for (const auto& e : std::filesystem::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

// Replacing a checkpoint checks every file it would replace or remove before it touches the first: a config.json that
// is a symlink, or a stale shard that is a folder, leaves the old checkpoint whole (weights, config and index).
TEST_F(Checkpoint, ReplacingChecksEveryFileBeforeTouchingAny) {
  std::mt19937_64 rng(testing::fresh_seed());
  const ModelConfig c = testing::tiny_config(model::Arch::Llama);
  const std::vector<float> p = testing::tiny_params(c, rng), p2 = testing::tiny_params(c, rng);
  const auto ck = dir_ / "ck";
  model::save_checkpoint(ck, c, p, model::ExistingCheckpoint::Refuse);
  std::filesystem::create_directories(dir_ / "store");
  std::filesystem::rename(ck / "config.json", dir_ / "store" / "config.json");
  std::filesystem::create_symlink("../store/config.json", ck / "config.json");
  expect_error([&] { model::save_checkpoint(ck, c, p2, model::ExistingCheckpoint::Replace); },
               {(ck / "config.json").string(), "symbolic link"});
  EXPECT_TRUE(std::filesystem::is_symlink(ck / "config.json"));
  EXPECT_EQ(model::load_checkpoint_params(ck, c), p);

  // A stale index whose shard is a folder: refused before the index or the weights go.
  std::filesystem::remove(ck / "config.json");
  std::filesystem::rename(dir_ / "store" / "config.json", ck / "config.json");
  json index;
  index["weight_map"]["model.embed_tokens.weight"] = "model-00001-of-00002.safetensors";
  model::write_file_atomic(ck / "model.safetensors.index.json", index.dump());
  std::filesystem::create_directories(ck / "model-00001-of-00002.safetensors");
  expect_error([&] { model::save_checkpoint(ck, c, p2, model::ExistingCheckpoint::Replace); },
               {"model-00001-of-00002.safetensors", "a directory"});
  EXPECT_EQ(model::read_file(ck / "model.safetensors.index.json"), index.dump());
  std::filesystem::remove(ck / "model.safetensors.index.json");
  EXPECT_EQ(model::load_checkpoint_params(ck, c), p);
  for (const auto& e : std::filesystem::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST_F(Checkpoint, WritesRefuseWhatIsNotARegularFileAndReadsNameDirectories) {
  const auto target = dir_ / "target.txt";
  model::write_file_atomic(target, "keep");
  std::filesystem::create_symlink(target, dir_ / "link");
  expect_error([&] { model::write_file_atomic(dir_ / "link", "x"); }, {"link", "symbolic link"});
  EXPECT_TRUE(std::filesystem::is_symlink(dir_ / "link"));
  EXPECT_EQ(model::read_file(target), "keep");
  ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0644), 0);
  expect_error([&] { model::write_file_atomic(dir_ / "fifo", "x"); }, {"fifo", "FIFO"});
  // Without a writer, opening the FIFO would block: a checkpoint or config file is opened without waiting.
  expect_error([&] { model::read_file(dir_ / "fifo"); }, {"fifo", "a FIFO, expected a regular file"});
  expect_error([&] { model::read_file(dir_); }, {dir_.string(), "is a directory"});
  expect_error([&] { model::write_file_atomic(dir_ / "no" / "such" / "f", "x"); },
               {"cannot create", "No such file or directory"});
}

// Names up to the file system's 255 bytes are written, files and checkpoint folders alike (their temporary names are
// kept within the limit); a longer one is refused naming it, not its temporary name.
TEST_F(Checkpoint, LongNamesAreWrittenAndTooLongOnesNamed) {
  const std::string longest(255, 'n');
  model::write_file_atomic(dir_ / longest, "long");
  EXPECT_EQ(model::read_file(dir_ / longest), "long");
  ModelConfig c = testing::tiny_config(model::Arch::Llama);
  c.dtype = DType::F32;
  std::mt19937_64 rng(testing::fresh_seed());
  const std::vector<float> p = testing::tiny_params(c, rng);
  model::save_checkpoint(dir_ / std::string(250, 'c'), c, p);
  EXPECT_EQ(model::load_checkpoint_params(dir_ / std::string(250, 'c'), c), p);
  const std::string too_long(256, 'x');
  expect_error([&] { model::write_file_atomic(dir_ / too_long, "x"); },
               {(dir_ / too_long).string() + ": its name is 256 bytes long; a file system allows 255"});
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
    EXPECT_NE(e.path().filename().string()[0], 'x') << e.path();
  }
}

// A run's folder lock: refused while another open description holds the flock (as another process would), naming
// the key, the folder and the holder's pid; taken once that is gone, with this pid; nested in one process; never
// through a symlink or onto a folder.
// A folder is removable when every folder in it is readable, writable and searchable by this process, and a sticky
// folder's entries are its own: checked as an unprivileged user (a child process that drops root, or this one when it
// is not root; the sticky case only in the child, where the folders are another user's), since root may remove
// anything.
TEST_F(Checkpoint, RemovableMeansEveryFolderInItIsWritable) {
  namespace fs = std::filesystem;
  fs::permissions(dir_, fs::perms::all);
  const fs::path open = dir_ / "open", locked = dir_ / "locked";
  for (const fs::path& top : {open, locked}) {
    fs::create_directories(top / "optimizer" / "deeper");
    std::ofstream(top / "optimizer" / "deeper" / "file") << "x";
    for (const fs::path& p : {top, top / "optimizer", top / "optimizer" / "deeper"}) fs::permissions(p, fs::perms::all);
  }
  const fs::path sticky = dir_ / "sticky";
  fs::create_directories(sticky / "inner");
  fs::permissions(sticky, fs::perms::all | fs::perms::sticky_bit);
  fs::permissions(sticky / "inner", fs::perms::all);
  fs::permissions(locked / "optimizer" / "deeper", fs::perms::owner_read | fs::perms::owner_exec |
                                                        fs::perms::group_read | fs::perms::group_exec |
                                                        fs::perms::others_read | fs::perms::others_exec);
  // 0: as expected; otherwise which check went wrong. The sticky folder is another user's only for the child of root.
  const auto verdicts = [&](bool sticky_is_another_users) {
    try {
      model::check_removable(open, "save");
    } catch (const Error&) {
      return 1;
    }
    try {
      model::check_removable(locked, "save");
      return 2;
    } catch (const Error& e) {
      const std::string m = e.what();
      if (m.find("save: " + locked.string() + " cannot be replaced, since this process cannot remove " +
                 (locked / "optimizer" / "deeper").string()) == std::string::npos ||
          m.find("Permission denied") == std::string::npos)
        return 3;
    }
    if (!sticky_is_another_users) return 0;
    try {  // every folder writable, but a sticky one holding another user's folder
      model::check_removable(sticky, "save");
      return 5;
    } catch (const Error& e) {
      return std::string(e.what()).find((sticky / "inner").string() + " (its folder is sticky") != std::string::npos
                 ? 0
                 : 6;
    }
  };
  int outcome = 0;
  if (::geteuid() != 0) {
    outcome = verdicts(false);
  } else {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) _exit(::setgid(65534) == 0 && ::setuid(65534) == 0 ? verdicts(true) : 4);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    outcome = WEXITSTATUS(status);
  }
  EXPECT_EQ(outcome, 0) << "1: a writable tree refused, 2: a read-only folder accepted, 3: the message, 4: setuid, "
                            "5: another user's folder in a sticky one accepted, 6: the message";
  fs::permissions(locked / "optimizer" / "deeper", fs::perms::all);
}

TEST_F(Checkpoint, FolderLockRefusesASecondHolderAndNests) {
  const auto run = dir_ / "run";
  const auto lock_file = run / ".ringtrain.lock";
  std::filesystem::create_directories(run);
  const auto other_holder = [&] {
    const int fd = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    EXPECT_GE(fd, 0);
    return fd;
  };
  const auto can_take = [&] {
    const int fd = other_holder();
    const bool took = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    ::close(fd);
    return took;
  };
  const int other = other_holder();
  ASSERT_EQ(::flock(other, LOCK_EX | LOCK_NB), 0);
  ASSERT_EQ(::pwrite(other, "4242\n", 5, 0), 5);
  expect_error([&] { model::FolderLock lock(run, "train.metrics_dir"); },
               {"train.metrics_dir = " + run.string(), "another run is writing there (process 4242)"});
  ::close(other);
  {
    model::FolderLock lock(run, "train.metrics_dir");
    EXPECT_EQ(model::read_file(lock_file), cat(::getpid(), "\n"));
    EXPECT_FALSE(can_take());
    {
      model::FolderLock nested(run, "train.checkpoint_dir");
      EXPECT_FALSE(can_take());
    }
    EXPECT_FALSE(can_take());  // still held by the outer lock
  }
  EXPECT_TRUE(can_take());
  model::FolderLock made(dir_ / "new" / "folder", "train.checkpoint_dir");  // made with its folder
  EXPECT_TRUE(std::filesystem::is_regular_file(dir_ / "new" / "folder" / ".ringtrain.lock"));

  std::filesystem::create_directories(dir_ / "linked");
  std::filesystem::create_symlink(lock_file, dir_ / "linked" / ".ringtrain.lock");
  expect_error([&] { model::FolderLock lock(dir_ / "linked", "train.metrics_dir"); },
               {"cannot open the run lock", "linked"});
  std::filesystem::create_directories(dir_ / "odd" / ".ringtrain.lock");
  expect_error([&] { model::FolderLock lock(dir_ / "odd", "train.metrics_dir"); }, {"train.metrics_dir", "odd"});
  model::write_file_atomic(dir_ / "plain", "x");
  expect_error([&] { model::FolderLock lock(dir_ / "plain", "train.checkpoint_dir"); },
               {"train.checkpoint_dir = ", "not a directory"});
}

// A staging folder that a writer holds is not removed as a leftover; one that nobody holds (a killed writer's) is.
TEST_F(Checkpoint, RemoveUnlessHeldSparesAFolderBeingWritten) {
  const auto staging = dir_ / "step_3.saving";
  std::vector<std::filesystem::path> removed;
  const auto remove = [&](const std::filesystem::path& p) {
    removed.push_back(p);
    std::filesystem::remove_all(p);
  };
  {
    model::StagingFolder held(staging, ".marker", "test save", remove);
    model::write_file_atomic(staging / "shard", "bytes");
    EXPECT_FALSE(model::remove_unless_held(staging, "test cleanup", remove));
    EXPECT_TRUE(std::filesystem::is_regular_file(staging / "shard"));
    EXPECT_TRUE(removed.empty());
  }
  // The holder's destructor removed it (a failed write leaves nothing); a killed writer leaves the folder, unheld.
  std::filesystem::create_directories(staging);
  model::write_file_atomic(staging / "shard", "bytes");
  removed.clear();
  EXPECT_TRUE(model::remove_unless_held(staging, "test cleanup", remove));
  EXPECT_FALSE(std::filesystem::exists(staging));
  EXPECT_EQ(removed, std::vector<std::filesystem::path>{staging});
}

TEST(ModelConfigLimitsHostile, SizesAreBoundedAndFloatsFinite) {
  json j = model::config_to_json(testing::tiny_config(model::Arch::Llama));
  auto with = [&](const char* key, json v) {
    json k = j;
    k[key] = std::move(v);
    return k;
  };
  expect_error([&] { model::parse_config(with("num_hidden_layers", int64_t{1} << 40), "c.json"); },
               {"c.json", "'num_hidden_layers' = 1099511627776", "must be in [1, "});
  expect_error([&] { model::parse_config(with("hidden_size", int64_t{1} << 62), "c.json"); }, {"'hidden_size'"});
  expect_error([&] { model::parse_config(with("rope_theta", 0.0), "c.json"); }, {"'rope_theta'", "positive"});
  ModelConfig c = testing::tiny_config(model::Arch::Llama);
  c.rope.theta = std::nan("");
  expect_error([&] { model::config_to_json(c); }, {"'rope_theta' = nan", "finite"});
  c = testing::tiny_config(model::Arch::Llama);
  c.max_positions = 8;
  EXPECT_NO_THROW(model::check_sequence_supported(c, 8));
  expect_error([&] { model::check_sequence_supported(c, 9); }, {"9 tokens", "'max_position_embeddings' = 8"});
}

}  // namespace
}  // namespace ringtrain
