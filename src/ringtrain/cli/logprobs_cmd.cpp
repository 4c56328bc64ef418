// `ringtrain logprobs`: next-token log-probabilities of token sequences under a checkpoint, one JSON line per
// input line ({"logprobs": [S numbers]}, position 0 = 0), in input order.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ringtrain/attention/backend.h"
#include "ringtrain/cli/commands.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/model/cp_scoring.h"
#include "ringtrain/model/logprobs.h"

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

}  // namespace

void add_logprobs_command(CLI::App& app) {
  struct Opts {
    std::string model, data, device = "cpu", out, backends, cp_comm = "ring";
    int cp = 1;
    int timeout_s = 600;
    int64_t chunk = model::kDefaultLogprobChunk;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("logprobs", "Next-token log-probabilities of token sequences");
  cmd->add_option("--model", o->model, "checkpoint folder (config.json + safetensors)")->required();
  cmd->add_option("--data", o->data, "JSONL file, one {\"input_ids\": [...]} per line")->required();
  cmd->add_option("--cp", o->cp, "context-parallel size (CPU: ranks are threads of this process)")
      ->capture_default_str();
  cmd->add_option("--cp-comm", o->cp_comm, "ring, allgather or a2a (heads divisible by cp)")->capture_default_str();
  cmd->add_option("--timeout", o->timeout_s, "seconds a rank waits for the others")->capture_default_str();
  cmd->add_option("--device", o->device, "cpu")->capture_default_str();
  cmd->add_option("--out", o->out, "output JSONL (default: stdout)");
  cmd->add_option("--backends", o->backends, "the model's attention allow-list, e.g. flash,math");
  cmd->add_option("--chunk", o->chunk, "tokens per LM-head chunk")->capture_default_str();
  cmd->callback([o] {
    using namespace model;
    RT_CHECK(parse_device(o->device).is_cpu(), "--device ", o->device,
             ": the model runs on the CPU only so far (the GPU path is not implemented)");
    RT_CHECK(o->cp >= 1, "--cp ", o->cp, ": must be at least 1");
    ModelOptions opts;
    if (!o->backends.empty()) opts.attention_backends = attention::parse_backend_list(o->backends);
    const Model<float> loaded = Model<float>::load(o->model, opts);
    const auto samples = read_samples(o->data, loaded.config().vocab);
    std::vector<std::vector<float>> results(samples.size());
    if (o->cp == 1) {
      Model<float> m = loaded;
      auto attention = make_local_attention();
      for (size_t i = 0; i < samples.size(); ++i) results[i] = sequence_logprobs(m, samples[i], *attention, o->chunk);
    } else {
      cp::CpConfig cfg;
      cfg.comm = cp::parse_cp_comm(o->cp_comm);
      comm::run_ranks(o->cp, std::chrono::seconds(o->timeout_s), [&](comm::Communicator& comm) {
        Model<float> m = loaded;  // every rank holds the same weights
        for (size_t i = 0; i < samples.size(); ++i) {
          std::vector<float> lp = cp_sequence_logprobs(m, comm, cfg, samples[i], o->chunk);
          if (comm.rank() == 0) results[i] = std::move(lp);
        }
      });
    }
    std::string text;
    for (const auto& lp : results) text += nlohmann::json{{"logprobs", lp}}.dump() + "\n";
    if (o->out.empty()) std::fputs(text.c_str(), stdout);
    else write_file_atomic(o->out, text);
  });
}

}  // namespace ringtrain::cli
