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
#include "ringtrain/cli/options.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/model/cp_scoring.h"
#include "ringtrain/model/logprobs.h"
#ifdef RINGTRAIN_WITH_CUDA
#include "ringtrain/model/cuda/gpu_logprobs.h"
#endif

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
    std::string model, data, device = "cpu", out, backends, model_backends, cp_comm = "ring";
    int cp = 1;
    int64_t timeout_s = 600;
    int64_t chunk = 0;  // 0: the device's default
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("logprobs", "Next-token log-probabilities of token sequences");
  cmd->add_option("--model", o->model, "checkpoint folder (config.json + safetensors)")->required();
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
  cmd->callback([o] {
    using namespace model;
    const Device device = parse_device(o->device);
    const RootBackends root(o->backends, "--backends");
    ModelOptions opts;
    if (!o->model_backends.empty()) opts.attention_backends = attention::parse_backend_list(o->model_backends);
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
      if (lead) write_results(results, o->out);
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
    write_results(results, o->out);
  });
}

}  // namespace ringtrain::cli
