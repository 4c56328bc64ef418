// `ringtrain logprobs`: next-token log-probabilities of token sequences under a checkpoint, one JSON line per
// input line ({"logprobs": [S numbers]}, position 0 = 0), in input order. On the CPU in fp32 (--cp N: ranks are
// threads); with --device cuda in bf16 on one GPU, or with --cp N on N GPUs (one process per GPU, NCCL).
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ringtrain/attention/backend.h"
#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/multi_gpu.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/model/policy.h"

namespace ringtrain::cli {
namespace {

std::vector<std::vector<int32_t>> read_samples(const std::string& path, int64_t vocab) {
  std::ifstream in(path);
  RT_CHECK(in, "cannot open ", path);
  std::vector<std::vector<int32_t>> out;
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(cat(path, ":", lineno, ": invalid JSON: ", e.what()));
    }
    RT_CHECK(j.is_object() && j.contains("input_ids"), path, ":", lineno, ": expected an object with key 'input_ids'");
    const nlohmann::json& ids = j["input_ids"];
    RT_CHECK(ids.is_array() && !ids.empty(), path, ":", lineno, ": 'input_ids' must be a non-empty list");
    std::vector<int32_t> seq;
    for (const nlohmann::json& t : ids) {
      RT_CHECK(t.is_number_integer() && t.get<int64_t>() >= 0 && t.get<int64_t>() < vocab, path, ":", lineno,
               ": 'input_ids' entry ", t.dump(), " is not a token id in [0, ", vocab, ")");
      seq.push_back(t.get<int32_t>());
    }
    out.push_back(std::move(seq));
  }
  return out;
}

void write_results(const std::vector<std::vector<float>>& results, const std::string& out) {
  std::string text;
  for (const auto& lp : results) text += nlohmann::json{{"logprobs", lp}}.dump() + "\n";
  if (out.empty()) std::fputs(text.c_str(), stdout);
  else model::write_file_atomic(out, text);
}

// Every sample scored alone (one padded forward each: no memory for a whole file's batch) by this rank's policy.
std::vector<std::vector<float>> score_samples(model::Policy& policy, const std::vector<std::vector<int32_t>>& samples) {
  std::vector<std::vector<float>> results(samples.size());
  for (size_t i = 0; i < samples.size(); ++i)
    results[i] = std::move(policy.score(model::TokenBatch{{samples[i]}}, /*for_backward=*/false).logprobs[0]);
  return results;
}

}  // namespace

void add_logprobs_command(CLI::App& app) {
  struct Opts {
    std::string model, data, device = "cpu", out, backends, cp_comm = "ring";
    int cp = 1;
    int timeout_s = 600;
    int64_t chunk = 0;  // 0: the device's default
    ConfigLogprobsOptions with_config;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("logprobs", "Next-token log-probabilities of token sequences");
  cmd->add_option("--model", o->model, "checkpoint folder (config.json + safetensors); or --config");
  cmd->add_option("--config", o->with_config.config, "run config: model, device, mesh and batching from it");
  cmd->add_option("--set", o->with_config.overrides, "with --config: KEY=VALUE overrides");
  cmd->add_option("--checkpoint", o->with_config.checkpoint, "with --config: a training checkpoint's weights");
  cmd->add_flag("--reference", o->with_config.reference, "with --config: the config's starting (reference) weights");
  cmd->add_option("--data", o->data, "JSONL file, one {\"input_ids\": [...]} per line")->required();
  cmd->add_option("--cp", o->cp, "context-parallel size (CPU: ranks are threads of this process)")
      ->capture_default_str();
  cmd->add_option("--cp-comm", o->cp_comm, "ring, allgather or a2a (heads divisible by cp)")->capture_default_str();
  cmd->add_option("--timeout", o->timeout_s, "seconds a rank waits for the others")->capture_default_str();
  cmd->add_option("--device", o->device, "cpu (fp32) or cuda (bf16; --cp N uses N GPUs)")->capture_default_str();
  cmd->add_option("--out", o->out, "output JSONL (default: stdout)");
  cmd->add_option("--backends", o->backends, "the model's attention allow-list, e.g. flash,math");
  cmd->add_option("--chunk", o->chunk, "tokens per LM-head chunk (default: 1024 on the CPU, within 896 MiB on a GPU)");
  cmd->callback([o] {
    using namespace model;
    if (!o->with_config.config.empty()) {
      RT_CHECK(o->model.empty(), "logprobs: --config names the model; drop --model (or --config)");
      o->with_config.data = o->data, o->with_config.out = o->out, o->with_config.timeout_s = o->timeout_s;
      return run_config_logprobs(o->with_config);
    }
    RT_CHECK(!o->model.empty(), "logprobs: --model or --config is required");
    const Device device = parse_device(o->device);
    RT_CHECK(o->cp >= 1, "--cp ", o->cp, ": must be at least 1");
    ModelOptions opts;
    if (!o->backends.empty()) opts.attention_backends = attention::parse_backend_list(o->backends);
    cp::CpConfig cfg;
    cfg.comm = cp::parse_cp_comm(o->cp_comm);
    if (device.is_cuda()) {
      if (const std::string why = cuda_unavailable_reason(); !why.empty()) {
        std::fprintf(stderr, "ringtrain logprobs: --device cuda cannot run here: %s\n", why.c_str());
        throw Exit{2};
      }
      if (cuda_device_count() < o->cp) {
        std::fprintf(stderr, "ringtrain logprobs: --cp %d needs %d GPUs on this node, found %d\n", o->cp, o->cp,
                     cuda_device_count());
        throw Exit{2};
      }
      if (o->cp > 1 && !inside_ranks(o->cp)) throw Exit{relaunch_self(o->cp)};
    }
    const ModelConfig config = load_config(o->model);
    const auto samples = read_samples(o->data, config.vocab);
    PolicyOptions po;
    po.device = device;
    po.dtype = device.is_cuda() ? DType::BF16 : DType::F32;
    po.model = opts;
    po.logprob_chunk = o->chunk;
    po.cp = cfg;
    const auto timeout = std::chrono::seconds(o->timeout_s);
    std::vector<std::vector<float>> results;
    if (o->cp == 1) {
      results = score_samples(*load_policy(o->model, po), samples);
    } else if (device.is_cuda()) {  // this process is one rank of the group, on its own GPU
      auto comm = nccl_from_environment(timeout);
      po.device = comm->device(), po.cp_group = comm.get();
      results = score_samples(*load_policy(o->model, po), samples);
      if (comm->rank() != 0) return;
    } else {  // ranks are threads of this process, each with its own policy over the same weights
      const std::vector<float> params = load_checkpoint_params(o->model, config);
      comm::run_ranks(o->cp, timeout, [&](comm::Communicator& comm) {
        PolicyOptions rank_options = po;
        rank_options.cp_group = &comm;
        std::vector<std::vector<float>> mine = score_samples(*make_policy(config, params, rank_options), samples);
        if (comm.rank() == 0) results = std::move(mine);
      });
    }
    write_results(results, o->out);
  });
}

}  // namespace ringtrain::cli
