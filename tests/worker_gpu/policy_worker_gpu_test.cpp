// The policy worker on GPUs (bf16 policy, NCCL world): the reference weights swapped in from host memory without a
// second copy of the weights on the GPU and the trained ones rewritten bit for bit, the zero-copy scoring of id rows
// in GPU memory, and `ringtrain train` with device=cuda (one
// process per GPU through `ringtrain launch`) against the CPU's fp32 run of the same config. Skips without a GPU.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/tensor.h"
#include "ringtrain/worker/policy_worker.h"
#include "test_util.h"
#ifdef RINGTRAIN_WITH_NCCL
#include "ringtrain/comm/nccl/nccl_communicator.h"
#endif

namespace ringtrain::worker {
namespace {

namespace fs = std::filesystem;

#ifdef RINGTRAIN_WITH_NCCL
// builtin:small in bf16 on this process's GPU, logprob microbatches of 4 sequences.
Config small_gpu_config() {
  return parse_config(
      "policy:\n  model_name: builtin:small\n  train_global_batch_size: 4\n  train_micro_batch_size: 2\n"
      "  logprob_batch_size: 4\n  max_total_sequence_length: 128\n  precision: bfloat16\n"
      "  optimizer:\n    kwargs:\n      lr: 1.0e-2\n"
      "device: cuda\ntrain:\n  data: not-read-by-the-worker.jsonl\n  seed: 3\n",
      "gpu.yaml");
}

std::unique_ptr<comm::Communicator> single_gpu_world() {
  comm::RankInfo single;
  single.source = "single process";
  return comm::make_nccl_communicator(single, std::chrono::seconds(60));
}
#endif

// get_logprobs_into / get_reference_logprobs_into on int32 ids in GPU memory and GPU results (the Python module's
// zero-copy path): the scores of get_logprobs on the same samples exactly, zero past each length, and a bad id named
// as get_logprobs names it.
TEST(PolicyWorkerGpu, RowsOnTheGpuScoreAsTheSamples) {
  RT_REQUIRE_GPU();
#ifndef RINGTRAIN_WITH_NCCL
  GTEST_SKIP() << "this build has no NCCL communicator";
#else
  const auto world = single_gpu_world();
  PolicyWorker w(small_gpu_config(), *world);
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t B = 5, C = 120;
  std::vector<Sample> samples(B);
  std::vector<int32_t> ids(static_cast<size_t>(B * C), 1 << 30);  // past each length: never read
  TokenRowsBatch rows;
  for (int64_t b = 0; b < B; ++b) {
    Sample& s = samples[static_cast<size_t>(b)];
    s.input_ids.resize(2 + rng() % (C - 2));
    for (size_t p = 0; p < s.input_ids.size(); ++p)
      ids[static_cast<size_t>(b * C) + p] = s.input_ids[p] = static_cast<int32_t>(rng() % 4096);
    s.token_mask.assign(s.input_ids.size(), 1.0f);
    rows.lengths.push_back(s.length());
  }
  const Device dev = w.policy().device();
  Tensor dev_ids = Tensor::empty({B, C}, DType::I32, dev);
  copy(dev_ids, contiguous_view(ids.data(), DType::I32, Device::cpu(), {B, C}));
  rows.ids = dev_ids.view();
  const LogprobResult want = w.get_logprobs(samples, true), want_ref = w.get_reference_logprobs(samples);
  Tensor lp = Tensor::empty({B, C}, DType::F32, dev), ent = Tensor::empty({B, C}, DType::F32, dev),
         ref = Tensor::empty({B, C}, DType::F32, dev);
  fill(lp, NAN), fill(ent, NAN), fill(ref, NAN);
  w.get_logprobs_into(rows, lp, ent);
  w.get_reference_logprobs_into(rows, ref);
  const auto expect_rows = [&](const Tensor& got, const std::vector<std::vector<float>>& expected, const char* what) {
    std::vector<float> host(static_cast<size_t>(B * C));
    copy(contiguous_view(host.data(), DType::F32, Device::cpu(), {B, C}), got);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t p = 0; p < C; ++p) {
        const float v = host[static_cast<size_t>(b * C + p)];
        const size_t len = expected[static_cast<size_t>(b)].size();
        ASSERT_EQ(v, static_cast<size_t>(p) < len ? expected[static_cast<size_t>(b)][static_cast<size_t>(p)] : 0.0f)
            << what << " row " << b << " position " << p;
      }
  };
  expect_rows(lp, want.logprobs, "logprobs");
  expect_rows(ent, want.entropy, "entropy");
  expect_rows(ref, want_ref.logprobs, "reference");
  ids[static_cast<size_t>(2 * C + 1)] = 4096 * 64;  // outside builtin:small's vocabulary
  copy(dev_ids, contiguous_view(ids.data(), DType::I32, Device::cpu(), {B, C}));
  try {
    w.get_logprobs_into(rows, lp, {});
    ADD_FAILURE() << "a token id outside the vocabulary was scored";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(cat("get_logprobs: sample 2 input_ids[1] = ", 4096 * 64)), std::string::npos)
        << e.what();
  }
#endif
}

TEST(PolicyWorkerGpu, ReferenceWeightsComeFromHostMemoryAndTheTrainedOnesComeBackExactly) {
  RT_REQUIRE_GPU();
#ifndef RINGTRAIN_WITH_NCCL
  GTEST_SKIP() << "this build has no NCCL communicator";
#else
  const auto world = single_gpu_world();
  PolicyWorker w(small_gpu_config(), *world);
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<Sample> samples(4);
  for (Sample& s : samples) {
    s.input_ids.resize(16 + rng() % 100);
    for (int32_t& t : s.input_ids) t = static_cast<int32_t>(rng() % 4096);
    s.token_mask.assign(s.input_ids.size(), 1.0f);
  }
  const int dev = w.policy().device().index;
  const size_t weight_bytes = w.policy().weights().nbytes();

  const LogprobResult before = w.get_logprobs(samples), ref0 = w.get_reference_logprobs(samples);
  EXPECT_EQ(ref0.logprobs, before.logprobs);  // the same bf16 weights through the same code

  const TrainResult t = w.train(samples);
  ASSERT_TRUE(std::isfinite(t.step.loss) && !t.step.skipped);
  const std::vector<float> trained = w.policy().params();
  synchronize(Device::cuda(dev));
  cuda_reset_pool_peak(dev);
  const LogprobResult after = w.get_logprobs(samples);
  synchronize(Device::cuda(dev));
  const uint64_t peak_score = cuda_pool_peak_bytes(dev);
  cuda_reset_pool_peak(dev);
  const LogprobResult ref1 = w.get_reference_logprobs(samples);
  synchronize(Device::cuda(dev));
  const uint64_t peak_reference = cuda_pool_peak_bytes(dev);
  // A second copy of the weights on the GPU would add weight_bytes to the peak; the upload goes one tensor at a time
  // and the trained weights come back from the master shards in place.
  EXPECT_LT(peak_reference, peak_score + weight_bytes) << "weights " << weight_bytes << " B";
  EXPECT_EQ(w.policy().params(), trained);  // bit for bit
  EXPECT_EQ(ref1.logprobs, ref0.logprobs);
  EXPECT_EQ(w.get_logprobs(samples).logprobs, after.logprobs);
  // The second swap uploads the reference bytes the first one kept.
  ASSERT_FALSE(w.train(samples).step.skipped);
  const std::vector<float> trained_twice = w.policy().params();
  EXPECT_EQ(w.get_reference_logprobs(samples).logprobs, ref0.logprobs);
  EXPECT_EQ(w.policy().params(), trained_twice);
  double moved = 0;
  for (size_t i = 0; i < after.logprobs.size(); ++i)
    for (size_t p = 1; p < after.logprobs[i].size(); ++p)
      moved = std::max(moved, std::abs(double(after.logprobs[i][p]) - before.logprobs[i][p]));
  EXPECT_GT(moved, 1e-2);  // lr 1e-2 moves bf16 scores far beyond their rounding
#endif
}

std::map<int64_t, double> losses(const fs::path& metrics_dir) {
  std::map<int64_t, double> out;
  std::ifstream in(metrics_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    out[j.at("step").get<int64_t>()] = j.at("loss").is_null() ? NAN : j.at("loss").get<double>();
  }
  return out;
}

// configs/sft.yaml on its own data: on the CPU in fp32, on one GPU and (with two GPUs) on dp = 2 and cp = 2 in bf16.
TEST(PolicyWorkerGpu, TrainCommandOnGpusFollowsTheCpuRun) {
  RT_REQUIRE_GPU();
  const fs::path dir = fs::temp_directory_path() / ("rt_gpu_train_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string cfg = std::string(RINGTRAIN_SOURCE_DIR) + "/configs/sft.yaml";
  const std::string data = std::string(RINGTRAIN_SOURCE_DIR) + "/configs/data/sft.jsonl";
  const auto run = [&](const std::string& name, const std::string& extra) {
    const testing::CliResult r =
        testing::run_cli("train --config " + cfg + " --no-progress --timeout 120 train.data=" + data +
                         " train.steps=4 policy.scheduler.total_steps=4 train.metrics_dir=" + (dir / name).string() +
                         " train.checkpoint_dir=" + (dir / name / "ckpt").string() + " " + extra);
    EXPECT_EQ(r.code, 0) << name << ": " << r.output;
    return losses(dir / name);
  };
  const auto cpu = run("cpu", "");
  std::vector<std::pair<std::string, std::string>> gpu_runs = {{"gpu1", "device=cuda policy.precision=bfloat16"}};
  if (cuda_device_count() >= 2) {
    gpu_runs.push_back({"gpu_dp2", "device=cuda policy.precision=bfloat16 parallel.dp=2"});
    gpu_runs.push_back({"gpu_cp2", "device=cuda policy.precision=bfloat16 parallel.cp=2"});
  }
  ASSERT_EQ(cpu.size(), 4u);
  for (const auto& [name, extra] : gpu_runs) {
    const auto gpu = run(name, extra);
    ASSERT_EQ(gpu.size(), 4u) << name;
    // Step 1 scores the same weights: bf16 weights and activations against fp32 move a ~5.5 loss by ~1e-2.
    EXPECT_NEAR(gpu.at(1), cpu.at(1), 3e-2 * std::abs(cpu.at(1))) << name;
    for (const auto& [step, loss] : gpu) EXPECT_TRUE(std::isfinite(loss)) << name << " step " << step;
    EXPECT_TRUE(fs::exists(dir / name / "ckpt" / "step_4" / "trainer_state.json")) << name;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ringtrain::worker
