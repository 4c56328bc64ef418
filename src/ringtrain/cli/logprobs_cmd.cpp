// `ringtrain logprobs`: next-token log-probabilities of token sequences under a checkpoint, one JSON line per
// input line ({"logprobs": [S numbers]}, position 0 = 0), in input order. On the CPU in fp32 (--cp N: ranks are
// threads); with --device cuda in bf16 on one GPU, or with --cp N on N GPUs (one process per GPU, NCCL).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ringtrain/attention/backend.h"
#include "ringtrain/cli/commands.h"
#include "ringtrain/cli/multi_gpu.h"
#include "ringtrain/cli/options.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/sys_error.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/model/hf_config.h"
#include "ringtrain/model/policy.h"
#include "ringtrain/worker/data.h"

namespace ringtrain::cli {
namespace {

// Every row is checked as a training row would be (a field's length, a mask's values, a log-probability's sign), so
// that a training file with a broken row is refused here too; only input_ids is scored. Output line N belongs to
// input line N, so a blank line is an error rather than skipped.
std::vector<std::vector<int32_t>> read_samples(const std::string& path, const model::ModelConfig& m) {
  worker::DataSpec spec;
  spec.vocab = m.vocab;
  spec.max_length = m.max_positions;
  spec.max_length_key = "the model's max_position_embeddings";
  worker::Dataset data = worker::parse_jsonl(model::read_file(path, model::FileSource::Stream), path, spec);
  std::vector<std::vector<int32_t>> out;
  for (worker::Sample& s : data.samples) out.push_back(std::move(s.input_ids));
  return out;
}

// A non-finite log-probability would be written as null; it means the model or the input is broken.
void check_results_finite(const std::vector<std::vector<float>>& results, const std::string& data) {
  for (size_t i = 0; i < results.size(); ++i)
    for (size_t t = 0; t < results[i].size(); ++t)
      RT_CHECK(std::isfinite(results[i][t]), data, ":", i + 1, ": the log-probability at position ", t, " is ",
               results[i][t]);
}

void write_results(const std::vector<std::vector<float>>& results, const std::string& out) {
  std::string text;
  for (const auto& lp : results) text += nlohmann::json{{"logprobs", lp}}.dump() + "\n";
  if (out.empty()) write_stdout(text);
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
    std::string model, data, device = "cpu", out, backends, model_backends, cp_comm = "ring";
    int cp = 1;
    int64_t timeout_s = 600;
    int64_t chunk = 0;  // 0: the device's default
    ConfigLogprobsOptions with_config;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("logprobs", "Next-token log-probabilities of token sequences");
  cmd->add_option("--model", o->model, "checkpoint folder (config.json + safetensors); or --config");
  cmd->add_option("--config", o->with_config.config, "run config: model, device, mesh and batching from it");
  cmd->add_option("overrides", o->with_config.overrides, "with --config: KEY=VALUE overrides, e.g. parallel.cp=2");
  cmd->add_option("--checkpoint", o->with_config.checkpoint, "with --config: a training checkpoint's weights");
  cmd->add_flag("--reference", o->with_config.reference,
                "with --config: the config's starting (reference) weights (not with --checkpoint)");
  cmd->add_option("--data", o->data, "JSONL file, one {\"input_ids\": [...]} per line")->required();
  add_bounded(*cmd, "--cp", o->cp, "context-parallel size (CPU: ranks are threads of this process)", 1, kMaxRanks)
      ->capture_default_str();
  cmd->add_option("--cp-comm", o->cp_comm, "ring, allgather or a2a (heads divisible by cp)")
      ->check(cp_comm_check())
      ->capture_default_str();
  add_bounded(*cmd, "--timeout", o->timeout_s, "seconds a rank waits for the others", int64_t{1}, kMaxTimeoutMs / 1000)
      ->capture_default_str();
  cmd->add_option("--device", o->device, "cpu (fp32) or cuda (bf16; --cp N uses N GPUs)")
      ->check(device_name_check())
      ->capture_default_str();
  cmd->add_option("--out", o->out, "output JSONL (default: stdout)");
  cmd->add_option("--backends", o->backends, "the root attention allow-list, e.g. flash,math")
      ->check(backend_list_check());
  cmd->add_option("--model-backends", o->model_backends, "the model's own attention allow-list (default: all)")
      ->check(backend_list_check());
  add_bounded(*cmd, "--chunk", o->chunk, "tokens per LM-head chunk (default: 1024 on the CPU, within 896 MiB on a GPU)",
              int64_t{1}, kMaxSeq);
  cmd->callback([o, cmd] {
    using namespace model;
    check_out_is_not_input("--out", o->out,
                           {{o->data, "--data"}, {o->model, "--model"}, {o->with_config.config, "--config"},
                            {o->with_config.checkpoint, "--checkpoint"}});
    // No option is ignored: one that the chosen mode does not read is an error naming it and what to use instead.
    const auto given = [&](const char* name) { return cmd->count(name) > 0; };
    if (!o->with_config.config.empty()) {
      RT_CHECK(o->model.empty(), "logprobs: --config names the model; drop --model (or --config)");
      // The run config decides these; the option beside it would silently lose.
      const std::pair<const char*, const char*> from_config[] = {
          {"--cp", "parallel.cp"},           {"--cp-comm", "parallel.cp_comm"},
          {"--device", "device"},            {"--backends", "attention.backends"},
          {"--model-backends", "attention.backends"}, {"--chunk", "policy.logprob_chunk_size"}};
      for (const auto& [option, key] : from_config)
        RT_CHECK(!given(option), "logprobs: with --config, ", option, " is the config's ", key,
                 "; override it with ", key, "=... (or drop --config)");
      RT_CHECK(o->with_config.checkpoint.empty() || !o->with_config.reference,
               "logprobs: --checkpoint and --reference name two different weights (a training checkpoint's, the "
               "config's starting ones); give one of them");
      o->with_config.data = o->data, o->with_config.out = o->out, o->with_config.timeout_s = o->timeout_s;
      if (const auto results = run_config_logprobs(o->with_config)) write_results(*results, o->out);
      return;
    }
    RT_CHECK(!o->model.empty(), "logprobs: --model or --config is required");
    RT_CHECK(!given("overrides"), "logprobs: KEY=VALUE overrides (", o->with_config.overrides.front(),
             ") need --config (they override a run config's keys)");
    for (const char* option : {"--checkpoint", "--reference"})
      RT_CHECK(!given(option), "logprobs: ", option, " needs --config (with --model the weights are the folder's)");
    RT_CHECK(o->cp > 1 || !given("--cp-comm"), "logprobs: --cp-comm chooses how --cp ranks exchange keys and values; "
             "with --cp 1 there is none (drop it, or give --cp N)");
    const Device device = parse_device(o->device);
    const RootBackends root(o->backends, "--backends");
    ModelOptions opts;
    if (!o->model_backends.empty()) opts.attention_backends = attention::parse_backend_list(o->model_backends);
    cp::CpConfig cfg;
    cfg.comm = cp::parse_cp_comm(o->cp_comm);
    if (device.is_cuda()) {
      require_gpus(o->cp, "logprobs");
      if (o->cp > 1 && !inside_ranks(o->cp)) throw relaunch_self(o->cp);
    }
    const ModelConfig config = load_config(o->model);
    const auto samples = read_samples(o->data, config);
    size_t longest = 0;
    for (const auto& s : samples) longest = std::max(longest, s.size());
    try {  // before any weight is read
      check_context_parallel_supported(config, static_cast<int64_t>(longest), o->cp, cfg.comm,
                                       {"--cp", "--cp-comm", "the longest sample of " + o->data});
    } catch (const Error& e) {
      throw Error(cat("logprobs --model ", o->model, ": ", e.what()));
    }
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
    } else {  // ranks are threads of this process, each with its own policy reading one copy of the weights
      const auto params = std::make_shared<const std::vector<float>>(load_checkpoint_params(o->model, config));
      comm::run_ranks(o->cp, timeout, [&](comm::Communicator& comm) {
        PolicyOptions rank_options = po;
        rank_options.cp_group = &comm;
        std::vector<std::vector<float>> mine = score_samples(*make_policy(config, params, rank_options), samples);
        if (comm.rank() == 0) results = std::move(mine);
      });
    }
    check_results_finite(results, o->data);
    write_results(results, o->out);
  });
}

}  // namespace ringtrain::cli
