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
#include "ringtrain/comm/in_process.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/json.h"
#include "ringtrain/core/sys_error.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/model/cp_scoring.h"
#include "ringtrain/model/logprobs.h"
#ifdef RINGTRAIN_WITH_CUDA
#include "ringtrain/model/cuda/gpu_logprobs.h"
#endif

namespace ringtrain::cli {
namespace {

// Output line N belongs to input line N, so a blank line is an error rather than skipped.
std::vector<std::vector<int32_t>> read_samples(const std::string& path, int64_t vocab) {
  const std::string text = model::read_file(path);
  std::vector<std::vector<int32_t>> out;
  size_t pos = 0;
  for (int64_t lineno = 1; pos < text.size(); ++lineno) {
    const size_t eol = std::min(text.find('\n', pos), text.size());
    const std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    const std::string where = cat(path, ":", lineno);
    RT_CHECK(line.find_first_not_of(" \t\r") != std::string_view::npos, where,
             ": blank line (every line must be one {\"input_ids\": [...]} object)");
    const nlohmann::json j = parse_json(line, where);
    RT_CHECK(j.is_object() && j.contains("input_ids"), where, ": expected an object with key 'input_ids'");
    const nlohmann::json& ids = j["input_ids"];
    RT_CHECK(ids.is_array() && !ids.empty(), where, ": 'input_ids' must be a non-empty list");
    std::vector<int32_t> seq;
    for (const nlohmann::json& t : ids) {
      RT_CHECK(t.is_number_integer() && t.get<int64_t>() >= 0 && t.get<int64_t>() < vocab, where,
               ": 'input_ids' entry ", json_excerpt(t), " is not a token id in [0, ", vocab, ")");
      seq.push_back(t.get<int32_t>());
    }
    out.push_back(std::move(seq));
  }
  RT_CHECK(!out.empty(), path, ": no samples (the file is empty)");
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

// The GPU path: `device` (cp = 1), or each rank's GPU of cp processes; `lead` says whether this process holds the
// results to print (rank 0).
std::vector<std::vector<float>> gpu_logprobs(const std::filesystem::path& dir, Device device,
                                             const model::ModelOptions& opts,
                                             const std::vector<std::vector<int32_t>>& samples, int cp,
                                             const cp::CpConfig& cfg, int64_t chunk, std::chrono::seconds timeout,
                                             bool& lead) {
#ifdef RINGTRAIN_WITH_CUDA
  std::vector<std::vector<float>> results(samples.size());
  if (chunk <= 0) chunk = model::cuda::default_logprob_chunk(model::load_config(dir).vocab);
  if (cp == 1) {
    model::cuda::GpuModel m = model::cuda::GpuModel::load(dir, opts, device.index);
    auto attention = model::make_local_attention();
    for (size_t i = 0; i < samples.size(); ++i)
      results[i] = model::cuda::sequence_logprobs(m, samples[i], *attention, chunk);
    lead = true;
    return results;
  }
  auto comm = nccl_from_environment(timeout);
  model::cuda::GpuModel m = model::cuda::GpuModel::load(dir, opts, comm->device().index);
  for (size_t i = 0; i < samples.size(); ++i)
    results[i] = model::cuda::cp_sequence_logprobs(m, *comm, cfg, samples[i], chunk);
  lead = comm->rank() == 0;
  return results;
#else
  (void)dir, (void)device, (void)opts, (void)samples, (void)cp, (void)cfg, (void)chunk, (void)timeout, (void)lead;
  throw Error("this build of ringtrain has no CUDA support");
#endif
}

}  // namespace

void add_logprobs_command(CLI::App& app) {
  struct Opts {
    std::string model, data, device = "cpu", out, backends, cp_comm = "ring";
    int cp = 1;
    int timeout_s = 600;
    int64_t chunk = 0;  // 0: the device's default
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("logprobs", "Next-token log-probabilities of token sequences");
  cmd->add_option("--model", o->model, "checkpoint folder (config.json + safetensors)")->required();
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
      const ModelConfig config = load_config(o->model);
      const auto samples = read_samples(o->data, config.vocab);
      bool lead = false;
      const auto results = gpu_logprobs(o->model, device, opts, samples, o->cp, cfg, o->chunk,
                                        std::chrono::seconds(o->timeout_s), lead);
      if (lead) check_results_finite(results, o->data), write_results(results, o->out);
      return;
    }
    const int64_t chunk = o->chunk > 0 ? o->chunk : kDefaultLogprobChunk;
    const Model<float> loaded = Model<float>::load(o->model, opts);
    const auto samples = read_samples(o->data, loaded.config().vocab);
    std::vector<std::vector<float>> results(samples.size());
    if (o->cp == 1) {
      Model<float> m = loaded;
      auto attention = make_local_attention();
      for (size_t i = 0; i < samples.size(); ++i) results[i] = sequence_logprobs(m, samples[i], *attention, chunk);
    } else {
      comm::run_ranks(o->cp, std::chrono::seconds(o->timeout_s), [&](comm::Communicator& comm) {
        Model<float> m = loaded;  // every rank holds the same weights
        for (size_t i = 0; i < samples.size(); ++i) {
          std::vector<float> lp = cp_sequence_logprobs(m, comm, cfg, samples[i], chunk);
          if (comm.rank() == 0) results[i] = std::move(lp);
        }
      });
    }
    check_results_finite(results, o->data);
    write_results(results, o->out);
  });
}

}  // namespace ringtrain::cli
