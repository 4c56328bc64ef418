// Checkpoints of training state (train/checkpoint.h) on CPU in-process meshes:
// - save after step 2, load into a new policy and trainer, steps 3-5 bitwise equal to an uninterrupted run;
// - save under 2 × 2, load under 1 × 1 and 1 × 4: the weights right after loading are bitwise the saved ones (the
//   pieces are copied, not recomputed), steps 3-5 equal the uninterrupted 2 × 2 run within fp32 tolerance (the
//   gradient sums run in another order);
// - the Hugging Face weights (one file, or shards with an index) read back by the model layer;
// - errors naming the file: a truncated or missing optimizer file, another model's checkpoint;
// - a save that dies midway leaves the previous checkpoint loadable, a save never replaces what is not a
//   checkpoint folder, and a second save to a folder that a save is writing is refused.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "ringtrain/model/file_io.h"
#include "ringtrain/model/params.h"
#include "ringtrain/model/safetensors.h"
#include "ringtrain/train/checkpoint.h"
#include "train_test_util.h"

namespace ringtrain::train {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::TrainSetup;

struct RunOutcome {
  std::vector<std::vector<StepResult>> results;  // [world rank][step]
  std::vector<std::vector<double>> weights;      // [world rank]: after the last step
  std::vector<std::vector<double>> loaded;       // [world rank]: right after loading
  std::vector<TrainingProgress> progress;
};

// Steps [first, last] on a mesh; with `load`, the state is loaded first; with `save`, saved after step save_after.
RunOutcome run(const TrainSetup& s, MeshShape shape, int first, int last, const fs::path& load = {},
        const fs::path& save = {}, int save_after = 0) {
  const int world = shape.dp * shape.cp;
  RunOutcome out;
  out.results.resize(world), out.weights.resize(world), out.loaded.resize(world), out.progress.resize(world);
  testing::on_mesh(s, DType::F32, shape, [&](Trainer& t, model::Policy& p, const Mesh& mesh) {
    const int r = mesh.world().rank();
    if (!load.empty()) {
      out.progress[r] = load_training_checkpoint(load, t);
      out.loaded[r] = testing::layout_weights(p);
      EXPECT_EQ(t.steps_taken(), first - 1);
      EXPECT_EQ(t.schedule_position(), first - 1);
    }
    for (int step = first; step <= last; ++step) {
      out.results[r].push_back(t.step(s.batch));
      if (!save.empty() && step == save_after) {
        std::mt19937_64 data_rng(1234);
        data_rng.discard(step);
        std::ostringstream rng;
        rng << data_rng;
        save_training_checkpoint(save, t, {3, 17 * step, rng.str()});
      }
    }
    out.weights[r] = testing::layout_weights(p);
  });
  return out;
}

std::vector<double> losses(const std::vector<StepResult>& steps) {
  std::vector<double> out;
  for (const StepResult& r : steps) out.push_back(r.loss);
  return out;
}

TEST(TrainCheckpoint, ResumeAfterStep2IsBitwiseTheUninterruptedRun) {
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(LossKind::ClippedPG, rng);
  TempDir tmp("ringtrain-ckpt");
  const fs::path dir = tmp.path / "step2";
  for (MeshShape shape : {MeshShape{1, 1}, MeshShape{2, 2}}) {
    const RunOutcome whole = run(s, shape, 1, 5, {}, dir, 2);
    const RunOutcome resumed = run(s, shape, 3, 5, dir);
    const int world = shape.dp * shape.cp;
    for (int r = 0; r < world; ++r) {
      const std::vector<double> want = losses(whole.results[r]);
      EXPECT_EQ(losses(resumed.results[r]), std::vector<double>(want.begin() + 2, want.end())) << "rank " << r;
      EXPECT_EQ(resumed.results[r][0].lr, whole.results[r][2].lr);
      EXPECT_EQ(resumed.weights[r], whole.weights[r]) << "rank " << r << " of " << shape.dp << "x" << shape.cp;
      EXPECT_EQ(resumed.progress[r].epoch, 3);
      EXPECT_EQ(resumed.progress[r].index, 34);
      std::mt19937_64 want_rng(1234), got_rng;
      want_rng.discard(2);
      std::istringstream(resumed.progress[r].rng) >> got_rng;
      EXPECT_TRUE(got_rng == want_rng);
    }
    // The weights moved during steps 3-5: the comparison above is not of two untouched copies.
    EXPECT_NE(resumed.loaded[0], resumed.weights[0]);
  }
}

// fp32 after 3 more steps in another summation order: AdamW's updates are ~lr per element and the gradients agree to
// ~1e-6 relative, so the weights agree to ~1e-6 relative; the losses to 1e-5.
TEST(TrainCheckpoint, SavedUnder2x2LoadsUnder1x1And1x4) {
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(LossKind::NLL, rng);
  TempDir tmp("ringtrain-ckpt");
  const fs::path dir = tmp.path / "mesh2x2";
  const RunOutcome at2 = run(s, {2, 2}, 1, 2);
  const RunOutcome whole = run(s, {2, 2}, 1, 5, {}, dir, 2);
  for (MeshShape shape : {MeshShape{1, 1}, MeshShape{1, 4}}) {
    const RunOutcome resumed = run(s, shape, 3, 5, dir);
    for (int r = 0; r < shape.dp * shape.cp; ++r) {
      EXPECT_EQ(resumed.loaded[r], at2.weights[0]) << "rank " << r << ": the loaded weights are not the saved ones";
      for (int i = 0; i < 3; ++i)
        EXPECT_NEAR(resumed.results[r][i].loss, whole.results[0][i + 2].loss,
                    1e-5 * std::abs(whole.results[0][i + 2].loss))
            << "step " << i + 3;
      double num = 0, den = 0;
      for (size_t e = 0; e < whole.weights[0].size(); ++e) {
        num += std::pow(resumed.weights[r][e] - whole.weights[0][e], 2);
        den += std::pow(whole.weights[0][e], 2);
      }
      EXPECT_LE(std::sqrt(num / den), 1e-5) << shape.dp << "x" << shape.cp << " rank " << r;
    }
  }
}

// A flat layout with gaps and another tensor order (as the GPU's): one step gives the plain policy's weights bit for
// bit (the gaps start as NaN: a norm or update that read them would show), and its checkpoint, saved under 2 × 1,
// loads into plain policies under 1 × 2 with the weights bitwise the saved ones.
TEST(TrainCheckpoint, OtherFlatOrderAndGaps) {
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(LossKind::ClippedPG, rng);
  TempDir tmp("ringtrain-ckpt");
  std::vector<double> plain, gapped_after, gapped_saved;
  StepResult plain_result, gapped_result;
  testing::on_mesh(s, DType::F32, {1, 1}, [&](Trainer& t, model::Policy& p, const Mesh&) {
    plain_result = t.step(s.batch);
    plain = testing::layout_weights(p);
  });
  testing::on_mesh(
      s, DType::F32, {1, 1},
      [&](Trainer& t, model::Policy& p, const Mesh&) {
        gapped_result = t.step(s.batch);
        gapped_after = testing::layout_weights(p);
      },
      /*gapped=*/true);
  EXPECT_FALSE(gapped_result.skipped);
  EXPECT_EQ(gapped_result.loss, plain_result.loss);
  // The norm's fp64 sum runs over the tensors in the other order (last bits); the fp32 clip coefficient and so the
  // weights come out the same.
  EXPECT_NEAR(gapped_result.grad_norm, plain_result.grad_norm, 1e-12 * plain_result.grad_norm);
  EXPECT_EQ(gapped_after, plain);

  testing::on_mesh(
      s, DType::F32, {2, 1},
      [&](Trainer& t, model::Policy& p, const Mesh& mesh) {
        t.step(s.batch);
        t.step(s.batch);
        save_training_checkpoint(tmp.path / "gapped", t, {});
        if (mesh.world().rank() == 0) gapped_saved = testing::layout_weights(p);
      },
      /*gapped=*/true);
  const RunOutcome resumed = run(s, {1, 2}, 3, 3, tmp.path / "gapped");
  EXPECT_EQ(resumed.loaded[0], gapped_saved);
  EXPECT_EQ(resumed.loaded[1], gapped_saved);
  EXPECT_FALSE(resumed.results[0][0].skipped);
}

// An fp64 trainer's master pieces load into fp32 trainers, rounded once.
TEST(TrainCheckpoint, Fp64MasterLoadsIntoFp32) {
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(LossKind::NLL, rng);
  TempDir tmp("ringtrain-ckpt");
  std::vector<double> saved;
  testing::on_mesh(s, DType::F64, {1, 1}, [&](Trainer& t, model::Policy& p, const Mesh&) {
    t.step(s.batch);
    t.step(s.batch);
    save_training_checkpoint(tmp.path / "f64", t, {});
    saved = testing::layout_weights(p);
  });
  const RunOutcome resumed = run(s, {1, 2}, 3, 3, tmp.path / "f64");
  ASSERT_EQ(resumed.loaded[0].size(), saved.size());
  for (size_t i = 0; i < saved.size(); ++i) ASSERT_EQ(resumed.loaded[0][i], double(float(saved[i]))) << i;
  EXPECT_EQ(resumed.loaded[1], resumed.loaded[0]);
}

TEST(TrainCheckpoint, HuggingFaceWeightsOneFileOrShards) {
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(LossKind::NLL, rng);
  TempDir tmp("ringtrain-ckpt");
  testing::on_mesh(s, DType::F32, {2, 1}, [&](Trainer& t, model::Policy& p, const Mesh& mesh) {
    t.step(s.batch);
    save_training_checkpoint(tmp.path / "one", t, {});
    // A data position that load would refuse is refused before the good checkpoint is touched.
    EXPECT_THROW(save_training_checkpoint(tmp.path / "one", t, {-1, 0, ""}), Error);
    EXPECT_THROW(save_training_checkpoint(tmp.path / "one", t, {0, -5, ""}), Error);
    CheckpointOptions small;
    small.max_shard_bytes = 20000;
    save_training_checkpoint(tmp.path / "sharded", t, {}, small);
    if (mesh.world().rank() != 0) return;
    const std::vector<float> want = p.params();
    EXPECT_EQ(model::load_checkpoint_params(tmp.path / "one", s.config), want);
    EXPECT_TRUE(fs::exists(tmp.path / "sharded" / "model.safetensors.index.json"));
    EXPECT_FALSE(fs::exists(tmp.path / "sharded" / "model.safetensors"));
    int shards = 0;
    for (const auto& entry : fs::directory_iterator(tmp.path / "sharded"))
      shards += entry.path().filename().string().starts_with("model-0");
    EXPECT_GE(shards, 3);  // ~87 KB of weights in shards of at most 20 KB (each of the two 12 KB embeddings alone)
    EXPECT_EQ(model::load_checkpoint_params(tmp.path / "sharded", s.config), want);
  });
}

std::string load_error(const TrainSetup& s, const fs::path& dir, MeshShape shape = {1, 2}) {
  try {
    run(s, shape, 3, 3, dir);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(TrainCheckpoint, DamagedOrForeignCheckpointsAreNamed) {
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(LossKind::NLL, rng);
  TempDir tmp("ringtrain-ckpt");
  const fs::path dir = tmp.path / "ckpt";
  run(s, {2, 2}, 1, 2, {}, dir, 2);
  ASSERT_EQ(load_error(s, dir), "");

  // Truncated by 8 bytes.
  const fs::path shard = dir / "optimizer" / "rank-00001-of-00004.safetensors";
  const auto size = fs::file_size(shard);
  fs::resize_file(shard, size - 8);
  std::string e = load_error(s, dir);
  EXPECT_NE(e.find(shard.string()), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  // Missing.
  fs::remove(shard);
  e = load_error(s, dir);
  EXPECT_NE(e.find(shard.string() + ": missing"), std::string::npos) << e;

  // The recorded mesh and master dtype must describe the files (any mesh may load them): hand edits are refused.
  run(s, {2, 2}, 1, 2, {}, dir, 2);
  const fs::path state = dir / "trainer_state.json";
  const std::string saved = model::read_file(state);
  const auto with_state = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(saved);
    edit(j);
    model::write_file_atomic(state, j.dump());
    return load_error(s, dir);
  };
  EXPECT_EQ(with_state([](nlohmann::json&) {}), "");
  e = with_state([](nlohmann::json& j) { j["mesh"]["dp"] = 0; });
  EXPECT_NE(e.find(state.string() + ": mesh 0 x 2 does not match its 4 optimizer files"), std::string::npos) << e;
  e = with_state([](nlohmann::json& j) { j["mesh"]["cp"] = 4; });
  EXPECT_NE(e.find("mesh 2 x 4 does not match its 4 optimizer files"), std::string::npos) << e;
  e = with_state([](nlohmann::json& j) { j["mesh"]["dp"] = -1; });
  EXPECT_NE(e.find("mesh.dp = -1: expected an integer in [0, 2^53]"), std::string::npos) << e;
  // A step counter the next step would overflow.
  e = with_state([](nlohmann::json& j) { j["step"] = std::numeric_limits<int64_t>::max(); });
  EXPECT_NE(e.find("step = 9223372036854775807: expected an integer in [0, 2^53]"), std::string::npos) << e;
  // Counters that no run writes: more optimizer steps than steps, a schedule off the step count. The step is 2.
  e = with_state([](nlohmann::json& j) { j["step"] = 1; });
  EXPECT_NE(e.find(state.string() + ": optimizer_steps = 2 exceeds step = 1"), std::string::npos) << e;
  e = with_state([](nlohmann::json& j) { j["schedule_position"] = 0; });
  EXPECT_NE(e.find(state.string() + ": schedule_position = 0 but step = 2"), std::string::npos) << e;
  // The recorded schedule, read by a resumed run: each bad value named by its key.
  const auto schedule_error = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(saved);
    edit(j);
    model::write_file_atomic(state, j.dump());
    try {
      train::saved_schedule(dir);
    } catch (const std::exception& x) {
      return std::string(x.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(schedule_error([](nlohmann::json&) {}), "(no error)");
  EXPECT_TRUE(train::saved_schedule(dir) == s.cfg.schedule);  // the trainer's, as it trained
  e = schedule_error([](nlohmann::json& j) { j["schedule"]["base_lr"] = "abc"; });
  EXPECT_NE(e.find(state.string() + ": schedule.base_lr = \"abc\": expected a number"), std::string::npos) << e;
  e = schedule_error([](nlohmann::json& j) { j["schedule"] = {1, 2}; });
  EXPECT_NE(e.find(state.string() + ": schedule = [1,2]: expected an object"), std::string::npos) << e;
  e = schedule_error([](nlohmann::json& j) { j["schedule"].erase("decay"); });
  EXPECT_NE(e.find(state.string() + ": schedule: no decay"), std::string::npos) << e;
  e = schedule_error([](nlohmann::json& j) { j["schedule"]["decay_steps"] = 4.5; });
  EXPECT_NE(e.find("schedule.decay_steps = 4.5: expected an integer"), std::string::npos) << e;
  e = schedule_error([](nlohmann::json& j) { j["schedule"]["decay"] = "linear"; });
  EXPECT_NE(e.find("schedule.decay = \"linear\": expected \"cosine\" or \"constant\""), std::string::npos) << e;
  e = with_state([](nlohmann::json& j) { j["master_dtype"] = "int32"; });
  EXPECT_NE(e.find("master_dtype = 'int32': expected fp64, fp32, bf16 or fp16"), std::string::npos) << e;
  // A float dtype other than the files': the first piece read names it.
  const std::string master = nlohmann::json::parse(saved).at("master_dtype");
  const std::string wrong = master == "fp64" ? "fp32" : "fp64";
  e = with_state([&](nlohmann::json& j) { j["master_dtype"] = wrong; });
  EXPECT_NE(e.find("must be a 1-D " + wrong + " tensor (the state's master_dtype), got ["), std::string::npos) << e;
  EXPECT_NE(e.find("] " + master), std::string::npos) << e;
  model::write_file_atomic(state, saved);
  EXPECT_EQ(load_error(s, dir), "");

  // Another model: hidden 48 instead of 32.
  TrainSetup other = s;
  run(s, {1, 1}, 1, 1, {}, tmp.path / "small", 1);
  other.config.hidden = 48;
  std::mt19937_64 rng2(7);
  other.params = testing::tiny_params(other.config, rng2);
  e = load_error(other, tmp.path / "small", {1, 1});
  EXPECT_NE(e.find((tmp.path / "small" / "config.json").string()), std::string::npos) << e;
  EXPECT_NE(e.find("another model: 'hidden_size' is 32 there and 48"), std::string::npos) << e;
}

// Hostile optimizer files, each rewritten with its size recorded again (so that only the content is wrong): a piece
// past its tensor's end, a piece of a weight the model does not have, and a missing piece.
TEST(TrainCheckpoint, BadOptimizerPiecesAreNamed) {
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(LossKind::NLL, rng);
  TempDir tmp("ringtrain-ckpt");
  const fs::path dir = tmp.path / "ckpt", file = dir / "optimizer" / "rank-00000-of-00001.safetensors";
  run(s, {1, 1}, 1, 2, {}, dir, 2);
  const model::TensorMap good = model::read_safetensors(file);
  const auto rewrite = [&](const model::TensorMap& tensors) {
    model::write_safetensors(file, tensors);
    const fs::path state = dir / "trainer_state.json";
    nlohmann::json j = nlohmann::json::parse(model::read_file(state));
    j["files"]["optimizer/rank-00000-of-00001.safetensors"] = fs::file_size(file);
    model::write_file_atomic(state, j.dump());
  };
  const auto one_element = [] { return model::from_float32({1.f}, {1}, DType::F32); };

  model::TensorMap past_end = good;
  past_end["master@model.norm.weight@32"] = one_element();  // the norm has 32 elements: 32 is past its end
  rewrite(past_end);
  std::string e = load_error(s, dir, {1, 1});
  EXPECT_NE(e.find(file.string() + ": tensor 'master@model.norm.weight@32' covers 1 elements from 32 of a tensor of 32"),
            std::string::npos)
      << e;
  // A start at the end of int64: the message's own arithmetic must not overflow (UBSan).
  model::TensorMap far_past_end = good;
  far_past_end["master@model.norm.weight@9223372036854775807"] = one_element();
  rewrite(far_past_end);
  e = load_error(s, dir, {1, 1});
  EXPECT_NE(e.find("covers 1 elements from 9223372036854775807 of a tensor of 32"), std::string::npos) << e;

  model::TensorMap unknown = good;
  unknown["exp_avg@model.layers.9.mlp.up_proj.weight@0"] = one_element();
  rewrite(unknown);
  e = load_error(s, dir, {1, 1});
  EXPECT_NE(e.find("'exp_avg@model.layers.9.mlp.up_proj.weight@0' names no weight of this model"), std::string::npos)
      << e;

  model::TensorMap missing = good;
  ASSERT_EQ(missing.erase("exp_avg_sq@model.norm.weight@0"), 1u);
  rewrite(missing);
  e = load_error(s, dir, {1, 1});
  EXPECT_NE(e.find("/optimizer: no piece holds exp_avg_sq of model.norm.weight element 0"), std::string::npos) << e;

  // Corrupted values: a NaN in the master weights, a negative second moment.
  const auto with_value = [&](const std::string& key, float v) {
    model::TensorMap t = good;
    std::vector<float> values = model::to_float32(key, t.at(key));
    values[values.size() / 2] = v;
    t[key] = model::from_float32(values, t.at(key).shape, t.at(key).dtype);
    return t;
  };
  rewrite(with_value("master@model.norm.weight@0", std::numeric_limits<float>::quiet_NaN()));
  e = load_error(s, dir, {1, 1});
  EXPECT_NE(e.find("'master@model.norm.weight@0' element 16 is nan (optimizer state must be finite)"),
            std::string::npos)
      << e;
  rewrite(with_value("exp_avg_sq@model.norm.weight@0", -1.f));
  e = load_error(s, dir, {1, 1});
  EXPECT_NE(e.find("element 16 is -1 (a second moment must be finite and >= 0)"), std::string::npos) << e;

  rewrite(good);
  EXPECT_EQ(load_error(s, dir, {1, 1}), "");
}

TEST(TrainCheckpoint, InterruptedSaveLeavesThePreviousCheckpoint) {
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(LossKind::DPO, rng);
  TempDir tmp("ringtrain-ckpt");
  const fs::path dir = tmp.path / "latest";
  std::vector<std::vector<double>> at2(2);
  std::string error;
  try {
    testing::on_mesh(s, DType::F32, {2, 1}, [&](Trainer& t, model::Policy& p, const Mesh& mesh) {
      t.step(s.batch);
      t.step(s.batch);
      save_training_checkpoint(dir, t, {1, 2, "rng"});
      at2[mesh.world().rank()] = testing::layout_weights(p);
      t.step(s.batch);
      CheckpointOptions dying;
      int written = 0;
      dying.after_file = [&](const fs::path& f) {
        if (++written == 2) throw Error(cat("disk full after ", f.filename().string()));
      };
      save_training_checkpoint(dir, t, {1, 3, "rng"}, dying);  // rank 0 writes its shard, then config.json: dies
    });
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("disk full after config.json"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(dir.string() + ".saving"));  // a failed save removes what it wrote
  const RunOutcome resumed = run(s, {1, 1}, 3, 3, dir);
  EXPECT_EQ(resumed.loaded[0], at2[0]);
  EXPECT_EQ(resumed.progress[0].index, 2);

  // A killed save's leftover: the next save clears it and replaces the checkpoint.
  fs::create_directories(dir.string() + ".saving/optimizer");
  std::ofstream(dir.string() + ".saving/.ringtrain-saving");
  testing::on_mesh(s, DType::F32, {1, 1}, [&](Trainer& t, model::Policy&, const Mesh&) {
    load_training_checkpoint(dir, t);
    t.step(s.batch);
    save_training_checkpoint(dir, t, {1, 3, "rng"});
  });
  EXPECT_FALSE(fs::exists(dir.string() + ".saving"));
  EXPECT_FALSE(fs::exists(dir / ".ringtrain-saving"));
  EXPECT_EQ(run(s, {2, 1}, 4, 4, dir).progress[1].index, 3);
}

// What a save killed while it removed the replaced checkpoint leaves in DIR.saving (the marked remains of that
// checkpoint, or an empty folder) is cleared by the next save; a folder there with files that are not ours is not.
TEST(TrainCheckpoint, AKillWhileRemovingTheOldCheckpointBlocksNoLaterSave) {
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(LossKind::NLL, rng);
  TempDir tmp("ringtrain-ckpt");
  const fs::path dir = tmp.path / "latest", saving = dir.string() + ".saving";
  const auto save = [&] {
    testing::on_mesh(s, DType::F32, {1, 1}, [&](Trainer& t, model::Policy&, const Mesh&) {
      t.step(s.batch);
      save_training_checkpoint(dir, t, {1, 1, "rng"});
    });
  };
  save();
  fs::create_directories(saving / "optimizer");  // marked remains: a shard folder and the marker
  std::ofstream(saving / ".ringtrain-saving");
  save();
  EXPECT_FALSE(fs::exists(saving));
  fs::create_directory(saving);  // removed all but the folder itself
  save();
  EXPECT_FALSE(fs::exists(saving));
  EXPECT_EQ(run(s, {1, 1}, 2, 2, dir).progress[0].index, 1);
  fs::create_directory(saving);
  std::ofstream(saving / "notes.txt") << "mine";
  try {
    save();
    ADD_FAILURE() << "a folder of someone else's files was replaced";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("it is neither an unfinished save"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::exists(saving / "notes.txt"));

  // A checkpoint that the user saved under that name is theirs: never removed.
  fs::remove_all(saving);
  testing::on_mesh(s, DType::F32, {1, 1}, [&](Trainer& t, model::Policy&, const Mesh&) {
    save_training_checkpoint(saving, t, {1, 5, "rng"});
  });
  try {
    save();
    ADD_FAILURE() << "a checkpoint named " << saving << " was removed";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("it is neither an unfinished save"), std::string::npos) << e.what();
  }
  EXPECT_EQ(run(s, {1, 1}, 1, 1, saving).progress[0].index, 5);
}

// Two saves to one folder at once (two workers of one process, or two processes): the second is refused while the
// first writes, and the first one's checkpoint is whole. A save waits for another writer's short section in the same
// parent folder (its preparation or publication) instead of failing.
TEST(TrainCheckpoint, ASecondSaveToTheSameFolderIsRefusedWhileTheFirstWrites) {
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(LossKind::NLL, rng);
  TempDir tmp("ringtrain-ckpt");
  const fs::path dir = tmp.path / "latest";
  std::string second_error;
  testing::on_mesh(s, DType::F32, {1, 1}, [&](Trainer& t, model::Policy&, const Mesh&) {
    t.step(s.batch);
    CheckpointOptions first;
    bool tried = false;
    first.after_file = [&](const fs::path&) {
      if (std::exchange(tried, true)) return;
      try {
        run(s, {1, 1}, 1, 1, {}, dir, 1);
      } catch (const std::exception& e) {
        second_error = e.what();
      }
    };
    save_training_checkpoint(dir, t, {1, 7, "rng"}, first);
  });
  EXPECT_NE(second_error.find("another save or export to the same folder is writing"), std::string::npos)
      << second_error;
  EXPECT_FALSE(fs::exists(dir.string() + ".saving"));
  EXPECT_EQ(run(s, {1, 1}, 2, 2, dir).progress[0].index, 7);

  // The parent folder held by another writer for a moment: the save waits, then completes.
  const int parent = ::open(tmp.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(parent, 0);
  ASSERT_EQ(::flock(parent, LOCK_EX | LOCK_NB), 0);
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::close(parent);
  });
  const auto start = std::chrono::steady_clock::now();
  run(s, {1, 1}, 1, 1, {}, dir, 1);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  release.join();
  EXPECT_GE(waited, 0.25);
  EXPECT_EQ(run(s, {1, 1}, 2, 2, dir).progress[0].index, 17);
}

TEST(TrainCheckpoint, NeverReplacesWhatIsNotACheckpoint) {
  std::mt19937_64 rng(testing::fresh_seed());
  const TrainSetup s = testing::make_train_setup(LossKind::NLL, rng);
  TempDir tmp("ringtrain-ckpt");
  const fs::path file = tmp.path / "notes.txt", folder = tmp.path / "data";
  std::ofstream(file) << "keep me";
  fs::create_directories(folder);
  std::ofstream(folder / "x") << "keep me too";
  for (const fs::path& target : {file, folder}) {
    std::string e;
    try {
      run(s, {1, 1}, 1, 1, {}, target, 1);
    } catch (const std::exception& x) {
      e = x.what();
    }
    EXPECT_NE(e.find("refusing to replace " + target.string()), std::string::npos) << e;
  }
  std::string text;
  std::getline(std::ifstream(file), text);
  EXPECT_EQ(text, "keep me");
  EXPECT_TRUE(fs::exists(folder / "x"));

  // A link to a checkpoint: named as a link, neither it nor the checkpoint it points to replaced.
  const fs::path real = tmp.path / "real", link = tmp.path / "link";
  run(s, {1, 1}, 1, 1, {}, real, 1);
  const auto state_time = fs::last_write_time(real / "trainer_state.json");
  fs::create_directory_symlink(real, link);
  std::string e;
  try {
    run(s, {1, 1}, 1, 2, {}, link, 2);
  } catch (const std::exception& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("refusing to replace " + link.string() + ": it is a symbolic link (to " + real.string()),
            std::string::npos) << e;
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(fs::last_write_time(real / "trainer_state.json"), state_time);
  EXPECT_FALSE(fs::exists(tmp.path / "link.saving"));

  // A checkpoint that holds what a save does not write (an export into it, a user's notes, a file where the optimizer
  // shards go): refused, naming the entry, and kept whole; one holding only a save's files is replaced.
  fs::remove(link);
  const std::vector<std::pair<fs::path, bool>> extras = {
      {real / "hf" / "config.json", false}, {real / "NOTES.txt", false}, {real / "optimizer" / "notes", false},
      {real / "tokenizer.json", true}};
  for (const auto& [extra, replaceable] : extras) {
    SCOPED_TRACE(extra.string());
    fs::create_directories(extra.parent_path());
    std::ofstream(extra) << "keep me";
    std::string refused;
    try {
      run(s, {1, 1}, 1, 2, {}, real, 2);
    } catch (const std::exception& x) {
      refused = x.what();
    }
    if (replaceable) {
      EXPECT_EQ(refused, "");
      EXPECT_FALSE(fs::exists(extra));  // the save wrote no tokenizer: the new checkpoint has none
      continue;
    }
    const fs::path named = extra.parent_path() == real ? extra : extra.parent_path() == real / "optimizer"
                                                                      ? real / "optimizer" : extra.parent_path();
    EXPECT_NE(refused.find("refusing to replace " + real.string() + ": it holds " + named.string() +
                           ", which a save does not write"),
              std::string::npos)
        << refused;
    EXPECT_TRUE(fs::exists(extra));
    EXPECT_EQ(fs::last_write_time(real / "trainer_state.json"), state_time);
    fs::remove_all(extra.parent_path() == real ? extra : extra.parent_path() == real / "optimizer" ? extra
                                                                                                  : extra.parent_path());
  }
}

}  // namespace
}  // namespace ringtrain::train
