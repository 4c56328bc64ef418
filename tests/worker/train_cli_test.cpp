// `ringtrain train` and `ringtrain export` end to end through the binary: the per-step losses of a dp x cp = 2 x 2
// run equal a 1 x 1 run's (SFT, clipped PG, DPO), a run killed with SIGKILL and resumed writes the uninterrupted
// run's losses bit for bit, and bad input (data rows, config values, a missing file) ends with an error naming the
// file, line and field or the key, a non-zero exit code and no checkpoint. Every run passes --timeout so a rank that
// waits for a dead one gives up instead of hanging.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <tuple>

#include "ringtrain/core/error.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/model/hf_config.h"
#include "ringtrain/model/params.h"
#include "ringtrain/worker/train_loop.h"
#include "test_util.h"

namespace ringtrain::worker {
namespace {

namespace fs = std::filesystem;
using testing::run_cli;
using testing::TempDir;

// A test that outlives its deadline ends the test program (SIGALRM) instead of hanging CI: the ranks' own
// --timeout covers collectives, this covers everything else.
struct Deadline {
  explicit Deadline(unsigned seconds) { ::alarm(seconds); }
  ~Deadline() { ::alarm(0); }
};

std::vector<int> random_ids(std::mt19937_64& rng, size_t len) {
  std::vector<int> ids(len);
  for (int& t : ids) t = static_cast<int>(rng() % 256);  // builtin:tiny's vocabulary
  return ids;
}

// Rows for the loss: SFT (a prompt masked out), clipped PG (a scalar advantage and the sampler's logprobs) or DPO.
void write_data(const fs::path& file, const std::string& loss, size_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::ofstream out(file);
  for (size_t i = 0; i < rows; ++i) {
    nlohmann::json row;
    const size_t len = 6 + rng() % 30, prompt = 1 + rng() % 4;
    if (loss == "dpo") {
      row["chosen_input_ids"] = random_ids(rng, len);
      row["rejected_input_ids"] = random_ids(rng, 6 + rng() % 30);
    } else {
      row["input_ids"] = random_ids(rng, len);
      std::vector<int> mask(len, 1);
      std::fill_n(mask.begin(), prompt, 0);
      row["token_mask"] = mask;
    }
    if (loss == "pg") {
      row["advantages"] = std::uniform_real_distribution<double>(-1, 1)(rng);
      std::vector<double> gen(len, 0.0);
      for (size_t p = 1; p < len; ++p) gen[p] = -5.5 + std::uniform_real_distribution<double>(-0.3, 0.3)(rng);
      row["generation_logprobs"] = gen;
    }
    out << row.dump() << "\n";
  }
}

std::string config_file(const std::string& loss) {
  const std::string name = loss == "sft" ? "sft" : loss == "pg" ? "grpo" : "dpo";
  return std::string(RINGTRAIN_SOURCE_DIR) + "/configs/" + name + ".yaml";
}

// Tiny sizes over the example config; dp and cp as given (grpo.yaml sets cp through the dtensor alias).
std::string train_args(const std::string& loss, const fs::path& data, const fs::path& dir, int dp, int cp,
                       const std::string& extra = "") {
  return "train --config " + config_file(loss) + " --no-progress --timeout 30 train.data=" + data.string() +
         " train.metrics_dir=" + (dir / "metrics").string() + " train.checkpoint_dir=" + (dir / "ckpt").string() +
         " parallel.dp=" + std::to_string(dp) + " policy.dtensor_cfg.context_parallel_size=" + std::to_string(cp) +
         " policy.train_global_batch_size=4 policy.train_micro_batch_size=1 policy.logprob_batch_size=2"
         " policy.max_total_sequence_length=64 train.epochs=100 train.checkpoint_every=0 " +
         extra;
}

// The steps of metrics.jsonl, in file order.
std::vector<int64_t> logged_steps(const fs::path& metrics_dir) {
  std::vector<int64_t> out;
  std::ifstream in(metrics_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  return out;
}

// step -> loss of metrics.jsonl; a step written twice keeps its last value.
std::map<int64_t, double> losses(const fs::path& metrics_dir) {
  std::map<int64_t, double> out;
  std::ifstream in(metrics_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    out[j.at("step").get<int64_t>()] = j.at("loss").is_null() ? NAN : j.at("loss").get<double>();
  }
  return out;
}

// What a stopped run is told when no checkpoint continues it must be what works: --resume refuses the run's metrics
// (it would start again and drop them), so the hint names --overwrite-metrics; once a checkpoint exists, --resume.
TEST(TrainLoop, ResumeHintWithoutACheckpointIsWhatARunAgainAccepts) {
  const testing::TempDir dir("rt_resume_hint");
  Config c;
  c.train.checkpoint_dir = (dir.path / "ck").string();
  c.train.metrics_dir = (dir.path / "m").string();
  fs::create_directories(dir.path / "ck");
  fs::create_directories(dir.path / "m");
  model::write_file_atomic(dir.path / "m" / "metrics.jsonl", "{\"step\": 1, \"loss\": 2.5}\n");
  EXPECT_EQ(resume_hint(c), "no checkpoint in " + c.train.checkpoint_dir + " yet, so none continues this run; running "
                            "it again needs --overwrite-metrics (train.metrics_dir = " + c.train.metrics_dir +
                            " holds this run's metrics)");
  EXPECT_THROW(check_resume_start(c, false), Error);
  EXPECT_NO_THROW(check_resume_start(c, true));
  c.train.metrics_dir.clear();
  EXPECT_EQ(resume_hint(c), "no checkpoint in " + c.train.checkpoint_dir + " yet, so none continues this run");
}

// The cosine schedule spans the steps the run takes: train.steps cut to the data's epochs (or none given) decays to
// the same learning rates as train.steps set to that count. Data too short for one batch is refused before a file
// or folder of the run is made, naming train.data.
TEST(TrainCli, CosineSpansTheStepsTheDataGives) {
  const TempDir dir("rt_cosine");
  const fs::path data = dir.path / "rows.jsonl";
  write_data(data, "sft", 10, 7);  // 2 steps per epoch of 4
  const std::string cosine = " train.epochs=3 policy.scheduler.kind=cosine policy.scheduler.warmup_steps=1"
                             " policy.scheduler.min_lr=1.0e-5";
  std::map<std::string, std::vector<double>> lrs;
  for (const std::string steps : {"6", "100", "0"}) {
    const fs::path run = dir.path / ("steps" + steps);
    const testing::CliResult r = run_cli(train_args("sft", data, run, 1, 1, cosine + " train.steps=" + steps));
    ASSERT_EQ(r.code, 0) << r.output;
    std::ifstream in(run / "metrics" / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) lrs[steps].push_back(nlohmann::json::parse(line).at("lr"));
  }
  ASSERT_EQ(lrs["6"].size(), 6u);
  EXPECT_LT(lrs["6"].back(), 0.2 * lrs["6"][1]);  // decayed most of the way
  EXPECT_EQ(lrs["100"], lrs["6"]);
  EXPECT_EQ(lrs["0"], lrs["6"]);
  // As train.steps within the warm-up is refused at load, so are the data's steps within it when the run starts.
  const testing::CliResult inside = run_cli(train_args("sft", data, dir.path / "inside", 1, 1,
                                                       " train.epochs=3 policy.scheduler.kind=cosine "
                                                       "policy.scheduler.warmup_steps=6 train.steps=0") +
                                            " 2>&1");
  EXPECT_NE(inside.code, 0);
  EXPECT_NE(inside.output.find("this run takes 6 steps (train.steps cut to train.epochs = 3 of train.data = " +
                               data.string() + "), not more than policy.scheduler.warmup_steps = 6"),
            std::string::npos)
      << inside.output;

  // Resumed with more steps, the schedule keeps the length it was made for (steps 3-6 as in the 6-step run, min_lr
  // after), saying so; an explicit total_steps stretches it (and so moves step 3's lr).
  const fs::path longer = dir.path / "longer";
  ASSERT_EQ(run_cli(train_args("sft", data, longer, 1, 1, cosine + " train.steps=2 train.checkpoint_every=2")).code, 0);
  const auto lr_of = [&](const fs::path& run) {
    std::map<int64_t, double> out;
    std::ifstream in(run / "metrics" / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      out[j.at("step").get<int64_t>()] = j.at("lr").get<double>();
    }
    return out;
  };
  fs::copy(longer, dir.path / "stretched", fs::copy_options::recursive);
  const testing::CliResult kept =
      run_cli(train_args("sft", data, longer, 1, 1, cosine + " train.steps=8 train.epochs=4") + " --resume 2>&1");
  ASSERT_EQ(kept.code, 0) << kept.output;
  EXPECT_NE(kept.output.find("ringtrain train: the cosine schedule of " + (longer / "ckpt" / "step_2").string() +
                             " continues over the 2 steps it was made for (policy.scheduler.total_steps = 0 follows "
                             "the run's steps, 8 now;"),
            std::string::npos)
      << kept.output;
  const std::map<int64_t, double> kept_lr = lr_of(longer);
  ASSERT_EQ(kept_lr.size(), 8u);
  for (int64_t step = 3; step <= 8; ++step) EXPECT_EQ(kept_lr.at(step), 1.0e-5) << "step " << step;  // min_lr
  const testing::CliResult stretched = run_cli(
      train_args("sft", data, dir.path / "stretched", 1, 1,
                 cosine + " train.steps=8 train.epochs=4 policy.scheduler.total_steps=8") + " --resume 2>&1");
  ASSERT_EQ(stretched.code, 0) << stretched.output;
  EXPECT_EQ(stretched.output.find("continues over"), std::string::npos) << stretched.output;
  EXPECT_NE(stretched.output.find("was trained with the learning-rate schedule 'cosine from lr 0.001 over 2 steps (1 of "
                                  "warm-up) to 1e-05'; this run's is 'cosine from lr 0.001 over 8 steps"),
            std::string::npos)
      << stretched.output;
  EXPECT_GT(lr_of(dir.path / "stretched").at(3), 1.0e-4);

  const fs::path few = dir.path / "few.jsonl", run = dir.path / "few";
  write_data(few, "sft", 3, 8);
  const testing::CliResult r = run_cli(train_args("sft", few, run, 1, 1) + " 2>&1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("train.data = " + few.string() + ": 3 samples, fewer than policy.train_global_batch_size = "
                          "4"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(run)) << "a refused run made its folders";
}

TEST(TrainCli, DpCpMeshGivesTheSingleRankLosses) {
  const Deadline test_deadline(240);
  const uint64_t seed = testing::fresh_seed();
  for (const std::string loss : {"sft", "pg", "dpo"}) {
    TempDir dir("rt_train_mesh_" + loss);
    const fs::path data = dir.path / "data.jsonl";
    write_data(data, loss, 12, seed);
    const std::string steps = "train.steps=3 policy.scheduler.total_steps=3 policy.dynamic_batching.enabled=false";
    const testing::CliResult one = run_cli(train_args(loss, data, dir.path / "one", 1, 1, steps));
    ASSERT_EQ(one.code, 0) << loss << ": " << one.output;
    const testing::CliResult four = run_cli(train_args(loss, data, dir.path / "four", 2, 2, steps));
    ASSERT_EQ(four.code, 0) << loss << ": " << four.output;
    const auto a = losses(dir.path / "one" / "metrics"), b = losses(dir.path / "four" / "metrics");
    ASSERT_EQ(a.size(), 3u) << loss;
    ASSERT_EQ(b.size(), 3u) << loss;
    for (const auto& [step, value] : a) {
      // fp32 with other reduction orders (dp, cp shards, gradient sums over 4 ranks): relative 1e-5 after 3 steps.
      EXPECT_TRUE(std::isfinite(value)) << loss << " step " << step;
      EXPECT_NEAR(b.at(step), value, 1e-5 * std::max(1.0, std::abs(value))) << loss << " step " << step;
    }
    // The run moves the weights: the loss is not the same at every step.
    EXPECT_NE(a.at(1), a.at(3)) << loss;
    EXPECT_TRUE(fs::is_directory(dir.path / "four" / "ckpt" / "step_3")) << loss;
  }
}

std::vector<std::vector<double>> read_logprobs(const fs::path& file) {
  std::vector<std::vector<double>> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at("logprobs"));
  return out;
}

double max_diff(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  if (a.empty() || a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return INFINITY;
    for (size_t p = 0; p < a[i].size(); ++p) m = std::max(m, std::abs(a[i][p] - b[i][p]));
  }
  return m;
}

// A sliding window shorter than the sequences under context parallelism, end to end: a random Mistral checkpoint
// (window 5, every layer) trains under dp x cp = 1 x 2 with all-gather and 2 x 2 with all-to-all to the single-rank
// losses; the ring is refused before any weight is read; the same checkpoint without its window trains to other
// losses (so the window is in effect).
TEST(TrainCli, ASlidingWindowTrainsUnderAllGatherAndAllToAllAndTheRingIsRefused) {
  const Deadline test_deadline(240);
  TempDir dir("rt_train_window");
  const fs::path data = dir.path / "data.jsonl", windowed = dir.path / "windowed", full = dir.path / "full";
  write_data(data, "sft", 12, testing::fresh_seed());
  model::ModelConfig c;
  c.arch = model::Arch::Mistral;
  c.vocab = 256, c.hidden = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.head_dim = 8, c.ffn = 64;
  c.max_positions = 256;
  const std::vector<float> weights = model::random_params(model::ParamLayout(c), testing::fresh_seed());
  model::save_checkpoint(full, c, weights);
  c.sliding_window = 5;
  model::save_checkpoint(windowed, c, weights);
  const auto run = [&](const fs::path& model, const std::string& name, int dp, int cp, const std::string& comm) {
    return run_cli(train_args("sft", data, dir.path / name, dp, cp,
                              "train.steps=3 policy.scheduler.total_steps=3 policy.dynamic_batching.enabled=false "
                              "policy.model_name=" + model.string() + " parallel.cp_comm=" + comm));
  };
  const testing::CliResult one = run(windowed, "one", 1, 1, "ring");
  ASSERT_EQ(one.code, 0) << one.output;
  const auto want = losses(dir.path / "one" / "metrics");
  ASSERT_EQ(want.size(), 3u);
  for (const auto& [name, dp, comm] : {std::tuple{"allgather", 1, "allgather"}, std::tuple{"a2a", 2, "a2a"}}) {
    const testing::CliResult r = run(windowed, name, dp, 2, comm);
    ASSERT_EQ(r.code, 0) << name << ": " << r.output;
    const auto got = losses(dir.path / name / "metrics");
    ASSERT_EQ(got.size(), 3u) << name;
    for (const auto& [step, value] : want)  // fp32, other reduction orders: as DpCpMeshGivesTheSingleRankLosses
      EXPECT_NEAR(got.at(step), value, 1e-5 * std::max(1.0, std::abs(value))) << name << " step " << step;
  }
  const testing::CliResult ring = run(windowed, "ring", 1, 2, "ring");
  EXPECT_NE(ring.code, 0) << ring.output;
  for (const char* part :
       {"'sliding_window' = 5", "parallel.cp_comm = ring", "use parallel.cp_comm = allgather or a2a"})
    EXPECT_NE(ring.output.find(part), std::string::npos) << ring.output;
  EXPECT_FALSE(fs::exists(dir.path / "ring" / "metrics" / "metrics.jsonl")) << ring.output;
  // The window changes the scores of every position past it: the same weights score the rows without it (a
  // batch-mean loss can move too little to tell).
  const auto score = [&](const fs::path& model, const std::string& name) {
    const fs::path out = dir.path / name;
    const testing::CliResult r =
        run_cli("logprobs --model " + model.string() + " --data " + data.string() + " --out " + out.string());
    EXPECT_EQ(r.code, 0) << name << ": " << r.output;
    return read_logprobs(out);
  };
  const double window_effect = max_diff(score(windowed, "windowed.jsonl"), score(full, "full.jsonl"));
  EXPECT_GT(window_effect, 1e-3) << "the window changed nothing";
  EXPECT_LT(window_effect, INFINITY) << "the two scorings differ in shape";
  std::printf("largest logprob change by the window: %.3g\n", window_effect);
}

// Starts `ringtrain ARGS` in the background, its output to `log` (discarded when empty), SIGINT ignored from the
// start with `ignore_sigint` (as `nohup` or a script's background job would have it); returns its pid.
pid_t spawn_cli(const std::string& args, const fs::path& log = {}, bool ignore_sigint = false) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (ignore_sigint) ::signal(SIGINT, SIG_IGN);
    const std::string to = log.empty() ? std::string("/dev/null") : log.string();
    const std::string cmd = "exec " + testing::cli_program() + " " + args + " >" + to + " 2>&1";
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// An 8-step clipped-PG run (a checkpoint every 2 steps) on fresh data and its uninterrupted losses, `want`: the
// reference of the kill and stop tests. args(FOLDER) runs it again with its folders under FOLDER.
struct EightSteps {
  EightSteps(const std::string& name, int dp_, int cp_) : dir(name), dp(dp_), cp(cp_) {
    write_data(data, "pg", 16, testing::fresh_seed());
    const testing::CliResult full = run_cli(args(dir.path / "full"));
    EXPECT_EQ(full.code, 0) << full.output;
    want = losses(dir.path / "full" / "metrics");
  }
  std::string args(const fs::path& folder) const {
    return train_args("pg", data, folder, dp, cp,
                      "train.steps=8 policy.scheduler.total_steps=8 train.checkpoint_every=2");
  }
  TempDir dir;
  int dp, cp;
  fs::path data = dir.path / "data.jsonl";
  std::map<int64_t, double> want;
};

TEST(TrainCli, ResumeAfterKillRepeatsTheUninterruptedLossesBitwise) {
  const Deadline test_deadline(240);
  const EightSteps run("rt_train_resume", 2, 1);
  const TempDir& dir = run.dir;
  const auto& want = run.want;
  ASSERT_EQ(want.size(), 8u);

  // SIGKILL as soon as the first checkpoint is complete: the run dies somewhere after step 2 (in a step or a save).
  const fs::path killed = dir.path / "killed";
  const pid_t pid = spawn_cli(run.args(killed));
  ASSERT_GT(pid, 0);
  const auto wait_until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(killed / "ckpt" / "step_2" / "trainer_state.json") &&
         std::chrono::steady_clock::now() < wait_until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(fs::exists(killed / "ckpt" / "step_2" / "trainer_state.json"));
  ASSERT_FALSE(fs::exists(killed / "ckpt" / "step_8")) << "the run ended before the kill: nothing was resumed";

  // Without --resume the killed run's folders are refused, naming what is there.
  const testing::CliResult fresh = run_cli(run.args(killed));
  EXPECT_NE(fresh.code, 0);
  EXPECT_NE(fresh.output.find((killed / "metrics" / "metrics.jsonl").string() + " holds the metrics of an earlier run"),
            std::string::npos) << fresh.output;
  const testing::CliResult overwrite = run_cli(run.args(killed) + " --overwrite-metrics");
  EXPECT_NE(overwrite.code, 0);
  EXPECT_NE(overwrite.output.find("is a checkpoint of an earlier run"), std::string::npos) << overwrite.output;

  // Leftovers of saves that died (ours: marked, or empty) are removed by the resumed run, which says so.
  fs::create_directories(killed / "ckpt" / "step_7.saving");
  model::write_file_atomic(killed / "ckpt" / "step_7.saving" / ".ringtrain-saving", "");
  model::write_file_atomic(killed / "ckpt" / "step_7.saving" / "optimizer.rank0.safetensors", "partial");
  fs::create_directories(killed / "ckpt" / "step_1.old");
  const testing::CliResult resumed = run_cli(run.args(killed) + " --resume");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("ringtrain train: removed " + (killed / "ckpt" / "step_7.saving").string() +
                                ", left by a save that did not finish"),
            std::string::npos) << resumed.output;
  for (const fs::directory_entry& e : fs::directory_iterator(killed / "ckpt"))
    EXPECT_FALSE(e.path().extension() == ".saving" || e.path().extension() == ".old") << e.path();
  EXPECT_EQ(losses(killed / "metrics"), want);  // bit for bit, every step
  // Each step once: the steps the killed run wrote after its checkpoint were dropped, not repeated.
  const std::vector<int64_t> once = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(logged_steps(killed / "metrics"), once);
  // Resumed with fewer steps than it has taken: refused, its metrics kept.
  const testing::CliResult shorter = run_cli(run.args(killed) + " train.steps=5 --resume");
  EXPECT_NE(shorter.code, 0);
  EXPECT_NE(shorter.output.find("step_8: the run has taken 8 steps, more than the 5 this run takes"),
            std::string::npos)
      << shorter.output;
  EXPECT_EQ(logged_steps(killed / "metrics"), once);

  // A resumed run that has nothing left to do, then export of the last checkpoint.
  const testing::CliResult again = run_cli(run.args(killed) + " --resume");
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_EQ(losses(killed / "metrics"), want);
  EXPECT_EQ(logged_steps(killed / "metrics"), once);
  const fs::path hf = dir.path / "hf";
  const testing::CliResult ex = run_cli("export " + (killed / "ckpt" / "step_8").string() + " --out " + hf.string());
  ASSERT_EQ(ex.code, 0) << ex.output;
  const model::ModelConfig m = model::load_config(hf);
  EXPECT_EQ(model::load_checkpoint_params(hf, m),
            model::load_checkpoint_params(dir.path / "full" / "ckpt" / "step_8", m));
}

std::string file_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// export carries the tokenizer, chat template and generation files over (from the checkpoint folder or
// --files-from, a link followed as in the Hugging Face cache), may replace them in an export of its own, and never
// replaces a model folder of the user's that holds them.
TEST(TrainCli, ExportCarriesTheTokenizerFilesAndLeavesAUsersModelFolderAlone) {
  const Deadline test_deadline(120);
  TempDir dir("rt_export_files");
  const fs::path base = dir.path / "base", hf = dir.path / "hf", blob = dir.path / "blob";
  const testing::CliResult made = run_cli("init-model --arch llama --layers 2 --hidden 32 --heads 4 --kv-heads 2 "
                                          "--vocab 256 --out " + base.string());
  ASSERT_EQ(made.code, 0) << made.output;
  std::mt19937_64 rng(testing::fresh_seed());
  const std::string tokenizer = nlohmann::json{{"ids", random_ids(rng, 8)}}.dump();
  std::ofstream(base / "tokenizer.json") << tokenizer;
  std::ofstream(base / "generation_config.json") << "{\"eos_token_id\": 2}";
  std::ofstream(blob) << "sentencepiece " << rng();
  fs::create_symlink(blob, base / "tokenizer.model");
  for (int round = 0; round < 2; ++round) {  // the second over the first
    const testing::CliResult ex = run_cli("export " + base.string() + " --out " + hf.string());
    ASSERT_EQ(ex.code, 0) << ex.output;
  }
  EXPECT_EQ(file_text(hf / "tokenizer.json"), tokenizer);
  EXPECT_EQ(file_text(hf / "generation_config.json"), file_text(base / "generation_config.json"));
  EXPECT_EQ(fs::symlink_status(hf / "tokenizer.model").type(), fs::file_type::regular);
  EXPECT_EQ(file_text(hf / "tokenizer.model"), file_text(blob));

  const std::string before = file_text(base / "model.safetensors");
  const testing::CliResult over_base = run_cli("export " + hf.string() + " --out " + base.string());
  EXPECT_NE(over_base.code, 0);
  EXPECT_NE(over_base.output.find(base.string() + " holds "), std::string::npos) << over_base.output;
  EXPECT_NE(over_base.output.find("(or writes only beside .ringtrain-export, in a folder of its own); refusing to "
                                  "replace it"),
            std::string::npos)
      << over_base.output;
  EXPECT_EQ(file_text(base / "model.safetensors"), before);
  EXPECT_EQ(file_text(base / "tokenizer.json"), tokenizer);
  // Into the folder it reads, or onto it: refused before anything is written.
  const testing::CliResult inside = run_cli("export " + base.string() + " --out " + (base / "hf").string());
  EXPECT_NE(inside.code, 0);
  EXPECT_NE(inside.output.find("--out " + (base / "hf").string() + " lies inside " + base.string() +
                               " (the checkpoint folder, which this command reads)"),
            std::string::npos)
      << inside.output;
  EXPECT_FALSE(fs::exists(base / "hf"));
  const testing::CliResult onto = run_cli("export " + hf.string() + " --out " + hf.string() + "/");
  EXPECT_NE(onto.code, 0);
  EXPECT_NE(onto.output.find("is the checkpoint folder; refusing to overwrite it"), std::string::npos) << onto.output;

  const testing::CliResult no_dir =
      run_cli("export " + base.string() + " --out " + (dir.path / "hf2").string() + " --files-from " + blob.string());
  EXPECT_NE(no_dir.code, 0);
  EXPECT_NE(no_dir.output.find(blob.string() + ", where the tokenizer and generation files come from, is not a "
                                               "directory"),
            std::string::npos)
      << no_dir.output;
  EXPECT_FALSE(fs::exists(dir.path / "hf2"));
  fs::create_directory(dir.path / "odd");
  fs::create_directory(dir.path / "odd" / "vocab.json");
  const testing::CliResult odd =
      run_cli("export " + base.string() + " --out " + (dir.path / "hf3").string() + " --files-from " +
              (dir.path / "odd").string());
  EXPECT_NE(odd.code, 0);
  EXPECT_NE(odd.output.find((dir.path / "odd" / "vocab.json").string() + ": not a regular file"), std::string::npos)
      << odd.output;
  EXPECT_FALSE(fs::exists(dir.path / "hf3"));
}

// A run from a Hugging Face folder writes its tokenizer and generation files into every checkpoint as they were when
// the run started, so that an export of a step_N carries them with no --files-from; a base folder whose companion
// name holds something else stops the run before any step, naming it.
TEST(TrainCli, CheckpointsCarryTheBaseModelsTokenizerIntoTheirExports) {
  const Deadline test_deadline(120);
  TempDir dir("rt_ckpt_files");
  const fs::path base = dir.path / "base", data = dir.path / "data.jsonl";
  const testing::CliResult made = run_cli("init-model --arch llama --layers 2 --hidden 32 --heads 4 --kv-heads 2 "
                                          "--vocab 256 --out " + base.string());
  ASSERT_EQ(made.code, 0) << made.output;
  std::mt19937_64 rng(testing::fresh_seed());
  const std::string tokenizer = nlohmann::json{{"ids", random_ids(rng, 8)}}.dump(), chat = "{{ messages }}";
  std::ofstream(base / "tokenizer.json") << tokenizer;
  std::ofstream(base / "chat_template.jinja") << chat;
  write_data(data, "sft", 8, rng());
  const std::string model =
      " policy.model_name=" + base.string() + " policy.precision=float32 policy.scheduler.total_steps=10";
  const testing::CliResult run =
      run_cli(train_args("sft", data, dir.path, 2, 1, "train.steps=2 train.checkpoint_every=1" + model));
  ASSERT_EQ(run.code, 0) << run.output;
  std::ofstream(base / "tokenizer.json") << "changed after the run started";
  for (const char* step : {"step_1", "step_2"}) {
    SCOPED_TRACE(step);
    const fs::path ckpt = dir.path / "ckpt" / step, hf = dir.path / (std::string("hf_") + step);
    EXPECT_EQ(file_text(ckpt / "tokenizer.json"), tokenizer);
    EXPECT_EQ(file_text(ckpt / "chat_template.jinja"), chat);
    EXPECT_FALSE(fs::exists(ckpt / "generation_config.json"));  // the base has none
    const testing::CliResult ex = run_cli("export " + ckpt.string() + " --out " + hf.string());
    ASSERT_EQ(ex.code, 0) << ex.output;
    EXPECT_EQ(file_text(hf / "tokenizer.json"), tokenizer);
    EXPECT_EQ(file_text(hf / "chat_template.jinja"), chat);
    EXPECT_EQ(file_text(hf / "model.safetensors"), file_text(ckpt / "model.safetensors"));
  }
  const testing::CliResult resumed =
      run_cli(train_args("sft", data, dir.path, 2, 1, "train.steps=3 train.checkpoint_every=1" + model) + " --resume");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_EQ(file_text(dir.path / "ckpt" / "step_3" / "tokenizer.json"), "changed after the run started");

  fs::create_directory(base / "vocab.json");
  const testing::CliResult odd = run_cli(train_args("sft", data, dir.path / "odd", 1, 1, "train.steps=1" + model));
  EXPECT_NE(odd.code, 0);
  EXPECT_NE(odd.output.find((base / "vocab.json").string() + ": not a regular file"), std::string::npos) << odd.output;
  EXPECT_FALSE(fs::exists(dir.path / "odd" / "ckpt" / "step_1"));
}

// Ctrl-C during a run: the step in progress stops at its next microbatch on every rank (dp x cp = 2 x 2) having
// changed nothing, the run saves the steps it finished (train.checkpoint_on_stop, on by default; off, the newest
// checkpoint is the last of train.checkpoint_every's), says which step it stopped in and which checkpoint --resume
// continues from, and then ends by the SIGINT (as a shell expects of a program a Ctrl-C stopped); its metrics are the
// uninterrupted run's first steps, and the resumed run writes the rest of them bit for bit.
TEST(TrainCli, CtrlCStopsBetweenMicrobatchesAndResumeRepeatsTheUninterruptedLosses) {
  const Deadline test_deadline(240);
  const EightSteps eight("rt_train_ctrl_c", 2, 2);
  ASSERT_EQ(eight.want.size(), 8u);

  for (const bool save_on_stop : {true, false}) {
    SCOPED_TRACE(save_on_stop ? "train.checkpoint_on_stop=true" : "train.checkpoint_on_stop=false");
    const fs::path run = eight.dir.path / (save_on_stop ? "save" : "nosave"), log = run.string() + ".log";
    const std::string args = eight.args(run) + (save_on_stop ? "" : " train.checkpoint_on_stop=false");
    const pid_t pid = spawn_cli(args, log);
    ASSERT_GT(pid, 0);
    const auto wait_until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!fs::exists(run / "ckpt" / "step_2" / "trainer_state.json") && std::chrono::steady_clock::now() < wait_until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ::kill(pid, SIGINT);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    std::ifstream in(log);
    const std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(fs::exists(run / "ckpt" / "step_8")) << "the run ended before the signal: nothing was stopped\n"
                                                      << output;
    // It stopped by itself (the messages), then ended by the SIGINT, so that a shell running it stops too.
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << "status " << status << "\n" << output;
    EXPECT_NE(output.find("SIGINT: ringtrain train stops at its next microbatch, every rank together, then " +
                          std::string(save_on_stop ? "saves the steps it finished" : "ends without saving")),
              std::string::npos) << output;
    EXPECT_NE(output.find("ringtrain train: stopped by SIGINT"), std::string::npos) << output;

    // "stopped in step N of 8, which changed nothing; N-1 steps done (N-1 in this run); --resume continues from
    // .../step_K": the metrics hold steps 1 ... N-1, the uninterrupted run's values.
    const std::string said = "ringtrain train: stopped in step ";
    const size_t at = output.find(said);
    ASSERT_NE(at, std::string::npos) << output;
    const int64_t n = std::stoll(output.substr(at + said.size()));
    const int64_t newest = save_on_stop ? n - 1 : (n - 1) / 2 * 2;
    EXPECT_NE(output.find(cat(" of 8, which changed nothing; ", n - 1, " steps done (", n - 1, " in this run); "
                              "--resume continues from ", (run / "ckpt" / cat("step_", newest)).string())),
              std::string::npos) << output;
    EXPECT_TRUE(fs::is_regular_file(run / "ckpt" / cat("step_", newest) / "trainer_state.json"));
    EXPECT_EQ(fs::exists(run / "ckpt" / cat("step_", n - 1)), save_on_stop || (n - 1) % 2 == 0);
    EXPECT_FALSE(fs::exists(run / "ckpt" / cat("step_", n)));
    const auto partial = losses(run / "metrics");
    ASSERT_EQ(static_cast<int64_t>(partial.size()), n - 1) << output;
    for (const auto& [step, value] : partial) EXPECT_EQ(value, eight.want.at(step)) << "step " << step;

    const testing::CliResult resumed = run_cli(args + " --resume");
    ASSERT_EQ(resumed.code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find(cat("resuming from ", (run / "ckpt" / cat("step_", newest)).string())),
              std::string::npos) << resumed.output;
    EXPECT_EQ(losses(run / "metrics"), eight.want);
    const std::vector<int64_t> once = {1, 2, 3, 4, 5, 6, 7, 8};
    EXPECT_EQ(logged_steps(run / "metrics"), once);
  }
}

// The first signal asks for a stop; a repeat within two seconds is the same request (torchrun forwards a signal to
// ranks that the terminal's Ctrl-C already reached) and the run still stops by itself; a signal after that ends the
// process at once, by its default action.
TEST(TrainCli, ASignalRepeatedAtOnceStillStopsTheRunButALaterOneEndsIt) {
  const Deadline test_deadline(240);
  TempDir dir("rt_train_two_signals");
  // Rows of 400-600 tokens: a microbatch takes long enough (about 0.1 s) for the run to be held before it stops.
  const fs::path data = dir.path / "data.jsonl";
  {
    std::mt19937_64 rng(testing::fresh_seed());
    std::ofstream out(data);
    for (int i = 0; i < 8; ++i) {
      const size_t len = 400 + rng() % 200;
      std::vector<int> mask(len, 1);
      mask[0] = 0;
      out << nlohmann::json{{"input_ids", random_ids(rng, len)}, {"token_mask", mask}}.dump() << "\n";
    }
  }
  const std::string extra = "train.steps=100000 policy.scheduler.total_steps=100000 train.checkpoint_every=1 "
                            "policy.max_total_sequence_length=600";
  // Returns the exit status of a run that got `signal` once its first step was done (its first metrics are written).
  const auto run_and = [&](const std::string& name, const std::string& more, bool ignore_sigint,
                           const std::function<void(pid_t)>& signal) {
    const fs::path run = dir.path / name;
    const pid_t pid =
        spawn_cli(train_args("sft", data, run, 2, 1, extra + " " + more), dir.path / (name + ".log"), ignore_sigint);
    EXPECT_GT(pid, 0);
    const auto wait_until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    const fs::path metrics = run / "metrics" / "metrics.jsonl";
    std::error_code ec;
    int status = 0;
    while (!(fs::file_size(metrics, ec) > 0 && !ec) && std::chrono::steady_clock::now() < wait_until) {
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        ADD_FAILURE() << name << " ended before its first step";
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    signal(pid);
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    return status;
  };
  const auto log_of = [&](const std::string& name) {
    std::ifstream in(dir.path / (name + ".log"));
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  // Without train.checkpoint_dir: the stop says that nothing continues the run, and what running it again needs.
  const int repeated = run_and("repeated", "train.checkpoint_dir= train.checkpoint_every=0", false, [](pid_t pid) {
    ::kill(pid, SIGINT);
    ::kill(pid, SIGTERM);
  });
  // Both come at once: either may be the one taken first, the other the repeat; the run stops by itself.
  EXPECT_TRUE(WIFSIGNALED(repeated) && (WTERMSIG(repeated) == SIGINT || WTERMSIG(repeated) == SIGTERM))
      << "status " << repeated;
  EXPECT_NE(log_of("repeated").find("ringtrain train: stopped by SIG"), std::string::npos) << log_of("repeated");
  EXPECT_NE(log_of("repeated").find("train.checkpoint_dir is not set, so no checkpoint continues this run; running it "
                                    "again needs --overwrite-metrics (train.metrics_dir = " +
                                    (dir.path / "repeated" / "metrics").string() + " holds this run's metrics)"),
            std::string::npos) << log_of("repeated");
  // A run started with SIGINT ignored keeps ignoring it; SIGTERM still stops it.
  const int ignored = run_and("ignored", "", true, [](pid_t pid) {
    ::kill(pid, SIGINT);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, WNOHANG), 0) << "a SIGINT the run was started ignoring ended it";
    ::kill(pid, SIGTERM);
  });
  EXPECT_TRUE(WIFSIGNALED(ignored) && WTERMSIG(ignored) == SIGTERM) << "status " << ignored;
  EXPECT_NE(log_of("ignored").find("ringtrain train: stopped by SIGTERM"), std::string::npos) << log_of("ignored");
  // The run is held (SIGSTOP) as soon as its handler has taken the SIGINT (its announcement is in the log: the
  // first signal's time is recorded before it), in the microbatch it then finishes before it stops, so that the
  // SIGTERM reaches it 2.5 s after the SIGINT whatever its speed. When the SIGINT comes at the very end of a
  // microbatch, the run can stop and end before the SIGSTOP lands (more likely on a loaded machine): it then ends by
  // the SIGINT, having reported the stop, and the case is run again (a later signal taken as a repeat would end
  // every attempt that way).
  int later = 0;
  std::string later_log;
  for (int attempt = 0; attempt < 4; ++attempt) {
    const std::string name = "later" + std::to_string(attempt);
    later = run_and(name, "", false, [&](pid_t pid) {
      ::kill(pid, SIGINT);
      while (log_of(name).find("SIGINT: ringtrain train stops") == std::string::npos) {
        siginfo_t ended{};
        if (::waitid(P_PID, static_cast<id_t>(pid), &ended, WEXITED | WNOHANG | WNOWAIT) == 0 && ended.si_pid == pid)
          return;  // it ended (run_and reaps it)
      }
      ::kill(pid, SIGSTOP);
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      ::kill(pid, SIGTERM);
      ::kill(pid, SIGCONT);
    });
    later_log = log_of(name);
    if (!(WIFSIGNALED(later) && WTERMSIG(later) == SIGINT)) break;
  }
  // Ended by the SIGTERM itself: no stop was reported.
  EXPECT_TRUE(WIFSIGNALED(later) && WTERMSIG(later) == SIGTERM) << "status " << later;
  EXPECT_EQ(later_log.find("stopped by"), std::string::npos) << later_log;
}

// Two runs on one run's folders: the second is refused while the first lives, naming the first's process; the lock
// goes with that process however it ends (SIGKILL here), and the next run takes it. That run's train.steps beyond the
// data's one epoch is cut, and its summary says so.
TEST(TrainCli, ASecondRunOnTheFoldersIsRefusedWhileTheFirstLives) {
  const Deadline test_deadline(120);
  TempDir dir("rt_train_lock");
  const fs::path data = dir.path / "data.jsonl";
  write_data(data, "sft", 16, testing::fresh_seed());
  const std::string forever = " train.steps=1000000 policy.scheduler.kind=constant train.epochs=1000000";
  const pid_t first = spawn_cli(train_args("sft", data, dir.path, 1, 1, forever));
  ASSERT_GT(first, 0);
  const std::string owner = std::to_string(first) + "\n";
  const auto wait_until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  const auto locked_by_first = [&] {
    for (const char* folder : {"ckpt", "metrics"}) {
      std::ifstream in(dir.path / folder / ".ringtrain.lock");
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (text != owner) return false;
    }
    return true;
  };
  while (!locked_by_first() && std::chrono::steady_clock::now() < wait_until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const bool locked = locked_by_first();
  const testing::CliResult second =
      run_cli(train_args("sft", data, dir.path, 1, 1, "train.steps=2 policy.scheduler.kind=constant") + " --resume");
  ::kill(first, SIGKILL);
  int status = 0;
  ::waitpid(first, &status, 0);
  ASSERT_TRUE(locked) << "the first run did not take its folders' locks";
  EXPECT_NE(second.code, 0);
  EXPECT_NE(second.output.find("train.checkpoint_dir = " + (dir.path / "ckpt").string() +
                               ": another run is writing there (process " + std::to_string(first) + ")"),
            std::string::npos)
      << second.output;

  // The first run's locks die with it; having saved no checkpoint, it can only be started again.
  const testing::CliResult next =
      run_cli(train_args("sft", data, dir.path, 1, 1, "") +
              " --resume --overwrite-metrics train.steps=100 policy.scheduler.kind=constant train.epochs=1");
  ASSERT_EQ(next.code, 0) << next.output;
  EXPECT_NE(next.output.find("4 of 4 steps done (4 in this run); train.epochs = 1 (4 steps over this data) ended the "
                             "run before train.steps = 100"),
            std::string::npos)
      << next.output;
}

// logprobs --config: the config's mesh and packing, --reference the starting weights, --checkpoint a trained state.
TEST(TrainCli, LogprobsWithAConfigScoreTheStartingAndTheTrainedWeights) {
  const Deadline test_deadline(240);
  TempDir dir("rt_logprobs_config");
  const fs::path data = dir.path / "data.jsonl";
  write_data(data, "sft", 8, testing::fresh_seed());
  const testing::CliResult run =
      run_cli(train_args("sft", data, dir.path, 1, 1, "train.steps=3 policy.scheduler.total_steps=3"));
  ASSERT_EQ(run.code, 0) << run.output;
  const std::string base = "logprobs --config " + config_file("sft") + " --data " + data.string() + " --timeout 30";
  const auto score = [&](const std::string& name, const std::string& args) {
    const fs::path out = dir.path / name;
    const testing::CliResult r = run_cli(base + " --out " + out.string() + " " + args);
    EXPECT_EQ(r.code, 0) << name << ": " << r.output;
    return read_logprobs(out);
  };
  const auto start = score("start.jsonl", "");
  const auto mesh = score("mesh.jsonl", "parallel.dp=2 parallel.cp=2 policy.sequence_packing.enabled=true");
  const auto reference = score("reference.jsonl", "--reference");
  const auto trained = score("trained.jsonl", "--checkpoint " + (dir.path / "ckpt" / "step_3").string());
  // A scoring config names no training data; the same model, seed and precision score the same.
  const fs::path scoring = dir.path / "scoring.yaml";
  std::ofstream(scoring) << "policy:\n  model_name: builtin:tiny\n  precision: float32\n"
                            "  max_total_sequence_length: 256\ndevice: cpu\ntrain:\n  seed: 1\n";
  const fs::path scoring_out = dir.path / "scoring.jsonl";
  const testing::CliResult scored = run_cli("logprobs --config " + scoring.string() + " --data " + data.string() +
                                            " --timeout 30 --out " + scoring_out.string());
  EXPECT_EQ(scored.code, 0) << scored.output;
  ASSERT_EQ(start.size(), 8u);
  EXPECT_LE(max_diff(mesh, start), 1e-4);  // fp32 rounding of other shards and batchings (policy_worker_test)
  EXPECT_EQ(max_diff(reference, start), 0.0);
  EXPECT_LE(max_diff(read_logprobs(scoring_out), start), 1e-4);  // other batch sizes: fp32 rounding at most
  EXPECT_GT(max_diff(trained, start), 1e-3);  // three steps at lr 1e-3 move the scores

  // Options the chosen mode would not read are refused, naming them (never silently ignored).
  const std::string ckpt = " --checkpoint " + (dir.path / "ckpt" / "step_3").string();
  const std::string model = "logprobs --model " + (dir.path / "ckpt" / "step_3").string() + " --data " + data.string();
  const std::vector<std::pair<std::string, std::string>> refused = {
      {base + ckpt + " --reference", "--checkpoint and --reference name two different weights"},
      {base + " --cp 2", "with --config, --cp is the config's parallel.cp"},
      {base + " --cp-comm a2a", "with --config, --cp-comm is the config's parallel.cp_comm"},
      {base + " --device cpu", "with --config, --device is the config's device"},
      {base + " --backends math", "with --config, --backends is the config's attention.backends"},
      {base + " --model-backends math", "with --config, --model-backends is the config's attention.backends"},
      {base + " --chunk 64", "with --config, --chunk is the config's policy.logprob_chunk_size"},
      {model + " --reference", "--reference needs --config"},
      {model + ckpt, "--checkpoint needs --config"},
      {model + " parallel.cp=2", "KEY=VALUE overrides (parallel.cp=2) need --config"},
      {model + " --cp-comm a2a", "with --cp 1 there is none"},
  };
  for (const auto& [args, message] : refused) {
    const testing::CliResult r = run_cli(args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << ": " << r.output;
  }
}

// train.epochs = 0 leaves train.steps the only limit (the run crosses epochs); a step whose batch has no loss target
// changes nothing and the run's last line counts it.
TEST(TrainCli, EpochsZeroLeavesTrainStepsTheLimitAndSkippedStepsAreCounted) {
  const Deadline test_deadline(120);
  TempDir dir("rt_train_epochs0");
  const fs::path data = dir.path / "data.jsonl";
  write_data(data, "sft", 8, testing::fresh_seed());
  const testing::CliResult five = run_cli(train_args("sft", data, dir.path, 1, 1, "train.steps=5 train.epochs=0"));
  ASSERT_EQ(five.code, 0) << five.output;
  EXPECT_NE(five.output.find("5 of 5 steps done (5 in this run)"), std::string::npos) << five.output;
  EXPECT_EQ(logged_steps(dir.path / "metrics"), (std::vector<int64_t>{1, 2, 3, 4, 5}));  // two steps per epoch

  // One sequence per step, the second one masked out whichever order the seed gives.
  const fs::path masked = dir.path / "masked.jsonl";
  std::mt19937_64 rng(testing::fresh_seed());
  {
    std::ofstream out(masked);
    for (int i = 0; i < 2; ++i)
      out << nlohmann::json{{"input_ids", random_ids(rng, 12)}, {"sample_mask", i}}.dump() << "\n";
  }
  const testing::CliResult one_skip =
      run_cli(train_args("sft", masked, dir.path / "second", 1, 1,
                         "train.steps=4 train.epochs=1 policy.train_global_batch_size=1 policy.logprob_batch_size=1 "
                         "policy.scheduler.warmup_steps=1"));
  ASSERT_EQ(one_skip.code, 0) << one_skip.output;
  EXPECT_NE(one_skip.output.find("2 of 2 steps done (2 in this run); 1 of them skipped (a non-finite gradient norm or "
                                 "no valid token: no weight changed"),
            std::string::npos)
      << one_skip.output;
  // The skipped step's loss is over nothing: null, not 0; the other one's a number.
  std::ifstream in(dir.path / "second" / "metrics" / "metrics.jsonl");
  int records = 0;
  for (std::string line; std::getline(in, line); ++records) {
    const nlohmann::json row = nlohmann::json::parse(line);
    EXPECT_EQ(row.at("loss").is_null(), row.at("skipped") == 1) << line;
  }
  EXPECT_EQ(records, 2);
}

// --resume with no checkpoint to continue from would start at step 0 and drop an earlier run's metrics: refused
// before any step, naming the file and leaving it whole; with --overwrite-metrics the run starts again.
TEST(TrainCli, AResumeWithoutACheckpointKeepsTheEarlierMetrics) {
  const Deadline test_deadline(120);
  TempDir dir("rt_train_resume_none");
  const fs::path data = dir.path / "data.jsonl";
  write_data(data, "sft", 8, testing::fresh_seed());
  const std::string schedule = " train.epochs=0 policy.scheduler.total_steps=10";
  const testing::CliResult first = run_cli(train_args("sft", data, dir.path, 1, 1, "train.steps=3" + schedule));
  ASSERT_EQ(first.code, 0) << first.output;
  const std::string elsewhere = schedule + " train.checkpoint_dir=" + (dir.path / "other").string();
  const testing::CliResult resumed =
      run_cli(train_args("sft", data, dir.path, 1, 1, "train.steps=5" + elsewhere) + " --resume");
  EXPECT_NE(resumed.code, 0);
  EXPECT_NE(resumed.output.find((dir.path / "metrics" / "metrics.jsonl").string() + " holds the metrics of an earlier "
                                "run; --resume found no checkpoint in " + (dir.path / "other").string()),
            std::string::npos)
      << resumed.output;
  EXPECT_EQ(logged_steps(dir.path / "metrics"), (std::vector<int64_t>{1, 2, 3}));
  const testing::CliResult again = run_cli(
      train_args("sft", data, dir.path, 1, 1, "train.steps=2" + elsewhere) + " --resume --overwrite-metrics");
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_EQ(logged_steps(dir.path / "metrics"), (std::vector<int64_t>{1, 2}));
}

TEST(TrainCli, BadInputNamesFileLineAndFieldAndWritesNoCheckpoint) {
  const Deadline test_deadline(240);
  TempDir dir("rt_train_bad");
  const fs::path good = dir.path / "good.jsonl";
  write_data(good, "sft", 8, 1);
  std::vector<std::string> rows;
  {
    std::ifstream in(good);
    for (std::string line; std::getline(in, line);) rows.push_back(line);
  }
  const auto with_row3 = [&](const std::string& name, const std::string& row) {
    const fs::path f = dir.path / name;
    std::ofstream out(f);
    for (size_t i = 0; i < rows.size(); ++i) out << (i == 2 ? row : rows[i]) << "\n";
    return f;
  };
  std::string long_row = "{\"input_ids\": [1";
  for (int i = 0; i < 70; ++i) long_row += ", 2";
  long_row += "]}";
  struct Case {
    std::string what, extra;
    std::vector<std::string> expect;
  };
  const fs::path bad_json = with_row3("json.jsonl", "{\"input_ids\": [1, 2,");
  const fs::path bad_token = with_row3("token.jsonl", "{\"input_ids\": [1, 2, 256]}");
  const fs::path bad_mask = with_row3("mask.jsonl", "{\"input_ids\": [1, 2, 3], \"token_mask\": [1, 1]}");
  const fs::path too_long = with_row3("long.jsonl", long_row);
  const std::vector<Case> cases = {
      {"malformed row", "train.data=" + bad_json.string(), {bad_json.string() + ":3"}},
      {"token >= vocab", "train.data=" + bad_token.string(), {bad_token.string() + ":3", "input_ids[2] = 256"}},
      {"mask length", "train.data=" + bad_mask.string(), {bad_mask.string() + ":3", "token_mask has 2 entries"}},
      {"too long", "train.data=" + too_long.string(), {too_long.string() + ":3", "input_ids"}},
      {"wrong type",
       "train.data=" + good.string() + " policy.train_micro_batch_size=two",
       {"policy.train_micro_batch_size", "two"}},
      {"missing file", "train.data=" + (dir.path / "absent.jsonl").string(), {"absent.jsonl"}},
  };
  for (const Case& c : cases) {
    const fs::path run = dir.path / "run";
    // The data path comes last so that it overrides the one train_args sets.
    const testing::CliResult r =
        run_cli(train_args("sft", good, run, 2, 2, "train.steps=3 policy.scheduler.total_steps=3 " + c.extra));
    EXPECT_NE(r.code, 0) << c.what;
    for (const std::string& s : c.expect) EXPECT_NE(r.output.find(s), std::string::npos) << c.what << ": " << r.output;
    EXPECT_FALSE(fs::exists(run / "ckpt")) << c.what;
    fs::remove_all(run);
  }
}

// `train` refuses a GRPO-only config (naming `ringtrain grpo`) before writing anything, and says that a grpo section
// beside train.data is not used, without checking it against the batch (8 x 8 prompts' samples against 4 here).
TEST(TrainCli, AGrpoConfigIsRefusedAndAnUnusedGrpoSectionIsNamed) {
  const Deadline test_deadline(120);
  TempDir dir("rt_train_grpo");
  const fs::path run = dir.path / "run";
  const testing::CliResult r = run_cli("train --config " + std::string(RINGTRAIN_SOURCE_DIR) +
                                       "/configs/grpo_tiny.yaml --no-progress train.metrics_dir=" +
                                       (run / "metrics").string() + " train.checkpoint_dir=" + (run / "ckpt").string());
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("grpo.prompts is set and train.data is not"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ringtrain grpo --config"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(run)) << r.output;

  const fs::path data = dir.path / "data.jsonl";
  write_data(data, "sft", 8, 1);
  const testing::CliResult both = run_cli(
      train_args("sft", data, run, 1, 1,
                 "train.steps=3 policy.scheduler.total_steps=3 grpo.prompts=builtin:reverse_digits"));
  EXPECT_EQ(both.code, 0) << both.output;
  EXPECT_NE(both.output.find("the grpo section (grpo.prompts = builtin:reverse_digits) is not used"), std::string::npos)
      << both.output;
  EXPECT_EQ(logged_steps(run / "metrics"), (std::vector<int64_t>{1, 2, 3}));
}

}  // namespace
}  // namespace ringtrain::worker
