// The GPU checks and benchmarks (their code is in check/cuda/). In a build without CUDA each of them throws an
// Error that says so; callers check cuda_unavailable_reason() first to report a missing GPU.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "ringtrain/attention/selection.h"
#include "ringtrain/check/attention_check.h"
#include "ringtrain/check/timing.h"
#include "ringtrain/comm/communicator.h"

namespace ringtrain::check {

// CUDA events on `stream` of `dev` (DeviceClock::make's GPU case).
std::unique_ptr<DeviceClock> make_cuda_clock(Device dev, void* stream);
// The GPU's marketing name, e.g. "NVIDIA H200".
std::string gpu_name(int device);

// Context-parallel attention on GPUs, one process per rank: parity against the single-GPU result of the same backend
// on the same inputs, and timing. Works with any Communicator whose device is a GPU.
struct DeviceRunOptions {
  AttnProblem prob;
  cp::CpConfig config;
  uint64_t seed = 1;
  bool check = true;  // compare with the single-GPU result of the same backend on the whole sequence
  int warmup = 0;     // timed runs: warm-up iterations, then `iters` timed ones (median); 0 iters = no timing
  int iters = 0;
  bool time_single = false;  // also time the single-GPU call on the whole sequence (for scaling efficiency)
  bool keep_kv = true;       // hand the forward's last KV block to the backward (KeptKv)
};

struct DeviceRunResult {
  // ||cp - single||_2 / ||single||_2 over all ranks' valid tokens (the single-GPU run on each rank's GPU).
  double err_o = 0, err_lse = 0, err_dq = 0, err_dk = 0, err_dv = 0;
  // Medians over ranks' max, milliseconds (CUDA events, barrier before each iteration).
  double cp_fwd_ms = 0, cp_fwdbwd_ms = 0, single_fwd_ms = 0, single_fwdbwd_ms = 0;
  std::string selection;                 // the block decision of rank 0 under the CP scope
  attention::DispatchCounts dispatches;  // this rank's
  ParityReport parity(double tolerance) const;
};

// Collective: every rank calls it with the same options. Inputs are drawn on each GPU from the seed
// (fill_normal_hashed), so every rank holds the same whole sequence without sending it.
DeviceRunResult run_cp_on_device(comm::Communicator& comm, const DeviceRunOptions& opt);

// One backend's CUDA implementation timed on one GPU: warm-up, then the median of the timed runs for the forward and
// for forward+backward (FLOPs as AttnProblem::forward_flops counts them).
struct AttentionBenchRow {
  std::string backend, status;  // status: "ok" or why it did not run
  int64_t seq = 0;
  double fwd_ms = 0, fwd_tflops = 0, fwdbwd_ms = 0, fwdbwd_tflops = 0;
  std::string no_backward;  // why only the forward was timed (the backend's backward cannot serve the shape)
};
AttentionBenchRow bench_attention_backend(attention::BackendId id, const AttnProblem& prob, int warmup, int iters);

// Training steps of a causal LM with random weights (see check/cuda/model_bench.cpp for what a step is and how
// FLOPs, MFU and memory are counted).
struct ModelBenchOptions {
  std::string arch = "llama", checkpoint = "none", cp_comm = "ring";
  std::vector<int64_t> seqs;
  int64_t layers = 16, hidden = 2048, heads = 32, kv_heads = 8, head_dim = 64, ffn = 8192, vocab = 128256;
  bool untied = false;
  int iters = 5, warmup = 2;
  int64_t chunk = 0;  // 0: default_logprob_chunk(vocab)
  uint64_t seed = 1;
  std::vector<attention::BackendId> model_backends;  // the model's attention allow-list (empty: all)
};
struct ModelBenchReport {
  // Called once before the first shape: the GPU's name and the matmul weight count N of the FLOP formula.
  std::function<void(const std::string& gpu, double matmul_weights)> header;
  // Called per shape with its row: {"seq", "cp", "checkpoint", "status", ...} ("status" is "ok" or why not).
  std::function<void(const nlohmann::json& row)> row;
};
constexpr double kPeakBf16Flops = 989e12;  // H200 dense bf16, the MFU reference
// comm: the ranks of a CP run (nullptr: one GPU, device 0).
void run_model_bench(const ModelBenchOptions& opt, comm::Communicator* comm, const ModelBenchReport& report);

// Batched generation with the GPU sampler on GPU 0 (check/cuda/generate_bench.cpp says what is timed and counted):
// random weights, `batch` random prompts of `prompt` tokens, exactly `new_tokens` new tokens each. Returns one JSON
// object (prefill and decoding medians, decode tokens/s, bytes per decoding step, the attention calls made).
struct GenerateBenchOptions {
  std::string arch = "llama";
  int64_t layers = 16, hidden = 2048, heads = 32, kv_heads = 8, head_dim = 64, ffn = 8192, vocab = 128256;
  int64_t batch = 64, prompt = 512, new_tokens = 512;
  double temperature = 1.0, top_p = 1.0;
  int64_t top_k = 0;
  int64_t stop_ids = 0;  // the token ids [0, stop_ids) end a sequence (0: none, every sequence runs new_tokens)
  int iters = 3, warmup = 1;
  uint64_t seed = 1;
};
nlohmann::json run_generate_bench(const GenerateBenchOptions& opt);
// The benchmark model's positions and the bf16 KV cache its sampler may allocate.
constexpr int64_t kGenerateBenchMaxPositions = int64_t{1} << 20;
constexpr int64_t kGenerateBenchMaxCacheBytes = int64_t{64} << 30;
// The sizes of a run, checked before anything is allocated (the host prompts alone are batch x prompt tokens) and
// on any machine: the sequence within the positions, the cache within its bytes and int32 row indices.
void check_generate_bench_sizes(const GenerateBenchOptions& opt);

}  // namespace ringtrain::check
