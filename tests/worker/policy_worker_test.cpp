// The policy worker: scoring gathered over dp in input order (against a plain one-rank policy scoring each sequence
// alone), packed scoring equal to unpacked, packed and bucketed train steps equal fixed microbatches, the reference
// weights swapped in and out exactly, export_hf refusing to replace a file, and the worker's checks before any weight
// is read.
#include "ringtrain/worker/policy_worker.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "ringtrain/comm/agreed.h"
#include "ringtrain/comm/in_process.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/model/generate.h"
#include "ringtrain/model/params.h"
#include "ringtrain/model/policy.h"
#include "ringtrain/worker/packing.h"
#include "test_util.h"

namespace ringtrain::worker {
namespace {

namespace fs = std::filesystem;
constexpr auto kTimeout = std::chrono::seconds(60);

Config tiny_config(int dp, int cp, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> overrides = {"parallel.dp=" + std::to_string(dp), "parallel.cp=" + std::to_string(cp)};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return parse_config(
      "policy:\n"
      "  model_name: builtin:tiny\n"
      "  train_global_batch_size: 4\n"
      "  train_micro_batch_size: 1\n"
      "  logprob_batch_size: 3\n"
      "  max_total_sequence_length: 64\n"
      "  precision: float32\n"
      "  optimizer:\n"
      "    kwargs:\n"
      "      lr: 1.0e-2\n"
      "device: cpu\n"
      "train:\n"
      "  data: not-read-by-the-worker.jsonl\n"
      "  seed: 7\n",
      "test.yaml", overrides);
}

std::vector<Sample> random_samples(std::mt19937_64& rng, size_t n, int64_t vocab) {
  std::vector<Sample> out(n);
  for (Sample& s : out) {
    const size_t len = 2 + rng() % 40;
    for (size_t p = 0; p < len; ++p) s.input_ids.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
    s.token_mask.assign(len, 1.0f);
  }
  return out;
}

using testing::max_ragged_diff;

// Each sequence alone through a one-rank policy with the builtin weights: the independent reference.
LogprobResult reference_scores(const Config& c, const std::vector<Sample>& samples) {
  const model::ModelConfig m = resolve_model_config(c.policy);
  model::PolicyOptions po;
  po.dtype = DType::F32;
  const auto policy = model::make_policy(m, model::random_params(model::ParamLayout(m), c.train.seed), po);
  LogprobResult out;
  for (const Sample& s : samples) {
    model::TokenScores r = policy->score({{s.input_ids}}, false, true);
    out.logprobs.push_back(std::move(r.logprobs[0]));
    out.entropy.push_back(std::move(r.entropy[0]));
  }
  return out;
}

// fp32 scores of the same weights through different batchings and CP shards differ by rounding only: a few ulps of
// logprobs around -5.5 (log 256), far below 1e-4, while a wrong weight or a misplaced sequence moves them by O(1).
constexpr double kScoreTol = 1e-4;

TEST(PolicyWorker, LogprobsOverDpAndCpEqualEachSequenceScoredAlone) {
  const uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  const std::vector<Sample> samples = random_samples(rng, 7, 256);  // 7: dp shares of 3 and 4
  for (const bool packing : {false, true}) {
    const Config c =
        tiny_config(2, 2, {packing ? "policy.sequence_packing.enabled=true" : "policy.logprob_batch_size=3"});
    const LogprobResult want = reference_scores(c, samples);
    std::vector<LogprobResult> got(4);
    comm::run_ranks(4, kTimeout, [&](comm::Communicator& world) {
      PolicyWorker w(c, world);
      got[static_cast<size_t>(world.rank())] = w.get_logprobs(samples, true);
    });
    for (const LogprobResult& r : got) {
      EXPECT_LE(max_ragged_diff(r.logprobs, want.logprobs), kScoreTol) << "packing " << packing;
      EXPECT_LE(max_ragged_diff(r.entropy, want.entropy), kScoreTol) << "packing " << packing;
      for (const auto& lp : r.logprobs) EXPECT_TRUE(!lp.empty() && lp[0] == 0.0f);
    }
  }
}

// The samples as rows of an int64 [B, C] view with a column stride of 2 (a non-contiguous caller's array); columns
// past a row's length hold ids outside the vocabulary, which must never be read.
struct StridedRows {
  std::vector<int64_t> storage;
  TokenRowsBatch batch;
};
StridedRows strided_rows(const std::vector<Sample>& samples, int64_t vocab) {
  StridedRows r;
  int64_t C = 0;
  for (const Sample& s : samples) C = std::max(C, s.length() + 3);
  const auto B = static_cast<int64_t>(samples.size());
  r.storage.assign(static_cast<size_t>(B * C * 2), vocab + 5);
  for (int64_t b = 0; b < B; ++b) {
    const Sample& s = samples[static_cast<size_t>(b)];
    for (int64_t p = 0; p < s.length(); ++p) r.storage[static_cast<size_t>((b * C + p) * 2)] = s.input_ids[p];
    r.batch.lengths.push_back(s.length());
  }
  r.batch.ids = contiguous_view(r.storage.data(), DType::I64, Device::cpu(), {B, C});
  r.batch.ids.stride = {2 * C, 2, 0, 0};
  return r;
}

// f() throws an Error whose message holds `part`.
template <typename F>
void expect_error(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one with: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// Row b of a [B, C] result against sequence b's scores: equal over the sequence, exactly 0 past it.
void expect_rows_match(const std::vector<float>& rows, int64_t C, const std::vector<std::vector<float>>& want,
                       const std::string& what) {
  for (size_t b = 0; b < want.size(); ++b)
    for (int64_t p = 0; p < C; ++p) {
      const float got = rows[b * static_cast<size_t>(C) + static_cast<size_t>(p)];
      if (p < static_cast<int64_t>(want[b].size())) {
        ASSERT_TRUE(std::isfinite(got)) << what << " row " << b << " position " << p;
        EXPECT_EQ(got, want[b][static_cast<size_t>(p)]) << what << " row " << b << " position " << p;
      } else {
        EXPECT_EQ(got, 0.0f) << what << " row " << b << " position " << p << " (past the row's length)";
      }
    }
}

// get_logprobs_into over a strided int64 view equals get_logprobs on the samples, value for value (the same
// microbatches through the same policy), on every rank of dp x cp = 2 x 2 and 2 x 1, padded and packed, with the
// results poisoned with NaN first; the reference scores likewise.
TEST(PolicyWorker, RowsScoringEqualsSampleScoring) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::vector<Sample> samples = random_samples(rng, 7, 256);
  const StridedRows rows = strided_rows(samples, 256);
  const int64_t B = rows.batch.ids.shape[0], C = rows.batch.ids.shape[1];
  for (const auto& [dp, cp] : {std::pair{2, 2}, std::pair{2, 1}})
    for (const bool packing : {false, true}) {
      const Config c =
          tiny_config(dp, cp, {packing ? "policy.sequence_packing.enabled=true" : "policy.logprob_batch_size=2"});
      const std::string what = cat("dp ", dp, " cp ", cp, " packing ", packing);
      comm::run_ranks(dp * cp, kTimeout, [&](comm::Communicator& world) {
        PolicyWorker w(c, world);
        const LogprobResult want = w.get_logprobs(samples, true);
        const LogprobResult want_ref = w.get_reference_logprobs(samples);
        std::vector<float> lp(static_cast<size_t>(B * C), NAN), ent(lp), ref(lp);
        w.get_logprobs_into(rows.batch, contiguous_view(lp.data(), DType::F32, Device::cpu(), {B, C}),
                            contiguous_view(ent.data(), DType::F32, Device::cpu(), {B, C}));
        w.get_reference_logprobs_into(rows.batch, contiguous_view(ref.data(), DType::F32, Device::cpu(), {B, C}));
        expect_rows_match(lp, C, want.logprobs, what + " logprobs");
        expect_rows_match(ent, C, want.entropy, what + " entropy");
        expect_rows_match(ref, C, want_ref.logprobs, what + " reference");
      });
    }
}

// What the rows path refuses, naming the sample and position, before any rank scores; a rank that refused can
// still score.
TEST(PolicyWorker, RowsScoringChecksIdsLengthsAndResultViews) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::vector<Sample> samples = random_samples(rng, 3, 256);
  StridedRows rows = strided_rows(samples, 256);
  const int64_t B = rows.batch.ids.shape[0], C = rows.batch.ids.shape[1];
  std::vector<float> lp(static_cast<size_t>(B * C), NAN);
  const TensorView out = contiguous_view(lp.data(), DType::F32, Device::cpu(), {B, C});
  comm::run_ranks(1, kTimeout, [&](comm::Communicator& world) {
    PolicyWorker w(tiny_config(1, 1), world);
    int64_t& planted = rows.storage[static_cast<size_t>((1 * C + 1) * 2)];
    const int64_t original = planted;
    planted = 256;
    expect_error([&] { w.get_logprobs_into(rows.batch, out); },
                 "get_logprobs: sample 1 input_ids[1] = 256 is not a token id in [0, 256)");
    planted = -3;
    expect_error([&] { w.get_logprobs_into(rows.batch, out); }, "sample 1 input_ids[1] = -3");
    planted = original;
    TokenRowsBatch longer = rows.batch;
    longer.lengths[2] = C + 1;
    expect_error([&] { w.get_logprobs_into(longer, out); }, "sample 2 has length");
    longer.lengths[2] = 0;
    expect_error([&] { w.get_logprobs_into(longer, out); }, "sample 2 has 0 tokens");
    longer.lengths.pop_back();
    expect_error([&] { w.get_logprobs_into(longer, out); }, "2 lengths for 3 rows");
    const TensorView narrow = contiguous_view(lp.data(), DType::F32, Device::cpu(), {B, C - 1});
    expect_error([&] { w.get_logprobs_into(rows.batch, narrow); }, "contiguous float32");
    TensorView strided_out = out;
    strided_out.stride[0] = C + 1;
    expect_error([&] { w.get_logprobs_into(rows.batch, strided_out); }, "contiguous float32");
    TensorView ids32 = rows.batch.ids;
    ids32.dtype = DType::F32;
    expect_error([&] { w.get_logprobs_into({ids32, rows.batch.lengths}, out); }, "int32 or int64");
    const LogprobResult want = w.get_logprobs(samples);
    w.get_logprobs_into(rows.batch, out);
    expect_rows_match(lp, C, want.logprobs, "after the refusals");
  });
}

TEST(PolicyWorker, PackedScoringEqualsUnpacked) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::vector<Sample> samples = random_samples(rng, 9, 256);
  LogprobResult plain, packed;
  comm::run_ranks(1, kTimeout, [&](comm::Communicator& world) {
    plain = PolicyWorker(tiny_config(1, 1), world).get_logprobs(samples);
    packed =
        PolicyWorker(
            tiny_config(1, 1, {"policy.sequence_packing.enabled=true", "policy.sequence_packing.logprob_mb_tokens=80"}),
            world)
            .get_logprobs(samples);
  });
  EXPECT_LE(max_ragged_diff(packed.logprobs, plain.logprobs), kScoreTol);
}

// A train step in packed bins (one packed row each) or in length buckets equals the step in fixed microbatches: the
// same loss and gradient norm up to fp32 rounding, for SFT, clipped PG and DPO (pairs kept together), on one rank
// and on dp x cp = 2 x 2. Each rank's microbatch count is its plan's, so the layouts were really used.
TEST(PolicyWorker, PackedAndBucketedTrainStepsEqualFixedMicrobatches) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (const std::string loss : {"nll", "clipped_pg", "dpo"}) {
    const bool dpo = loss == "dpo";
    std::vector<Sample> samples = random_samples(rng, dpo ? 8 : 4, 256);
    if (loss == "clipped_pg")
      for (Sample& s : samples) s.advantages.assign(s.input_ids.size(), rng() % 2 ? 1.0f : -1.0f);
    const std::string budget = dpo ? "128" : "64";
    for (const auto& [dp, cp] : {std::pair{1, 1}, std::pair{2, 2}}) {
      std::map<std::string, std::vector<TrainResult>> got;  // layout -> per rank
      for (const std::string layout : {"fixed", "packed", "dynamic"}) {
        std::vector<std::string> o = {"loss_fn.type=" + loss, "loss_fn.reference_policy_kl_penalty=0.1"};
        if (layout == "packed")
          o.insert(o.end(),
                   {"policy.sequence_packing.enabled=true", "policy.sequence_packing.train_mb_tokens=" + budget});
        if (layout == "dynamic")
          o.insert(o.end(),
                   {"policy.dynamic_batching.enabled=true", "policy.dynamic_batching.train_mb_tokens=" + budget});
        const Config c = tiny_config(dp, cp, o);
        std::vector<TrainResult>& r = got[layout];
        r.resize(static_cast<size_t>(dp * cp));
        comm::run_ranks(dp * cp, kTimeout, [&](comm::Communicator& world) {
          PolicyWorker w(c, world);
          r[static_cast<size_t>(world.rank())] = w.train(samples);
          // This rank's microbatches as its plan has them (dp rank = rank / cp; contiguous halves of the batch).
          const size_t d = static_cast<size_t>(w.mesh().dp_index()), n = samples.size() / static_cast<size_t>(dp);
          std::vector<int64_t> lengths;
          for (size_t i = d * n; i < (d + 1) * n; ++i) lengths.push_back(samples[i].length());
          EXPECT_EQ(r[static_cast<size_t>(world.rank())].step.microbatch_losses.size(),
                    plan_microbatches(c, lengths, Pass::Train).size())
              << loss << " " << layout << " dp " << dp << " cp " << cp;
        });
      }
      for (const std::string layout : {"packed", "dynamic"}) {
        for (size_t k = 0; k < got[layout].size(); ++k) {
          const train::StepResult &want = got["fixed"][k].step, &step = got[layout][k].step;
          const std::string what = loss + " " + layout + " dp " + std::to_string(dp) + " rank " + std::to_string(k);
          EXPECT_NEAR(step.loss, want.loss, 1e-5 * (1 + std::abs(want.loss))) << what;
          EXPECT_NEAR(step.grad_norm, want.grad_norm, 1e-5 * (1 + want.grad_norm)) << what;
          EXPECT_EQ(step.valid_tokens, want.valid_tokens) << what;
          EXPECT_GT(want.grad_norm, 0.0) << what;
        }
      }
    }
  }
}

TEST(PolicyWorker, ReferenceLogprobsEqualBeforeTrainingDifferAfterAndSwapBackExactly) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::vector<Sample> samples = random_samples(rng, 4, 256);
  comm::run_ranks(2, kTimeout, [&](comm::Communicator& world) {
    PolicyWorker w(tiny_config(2, 1), world);
    const LogprobResult before = w.get_logprobs(samples), ref0 = w.get_reference_logprobs(samples);
    EXPECT_EQ(max_ragged_diff(ref0.logprobs, before.logprobs), 0.0);  // the same weights through the same code
    const TrainResult t = w.train(samples);
    EXPECT_TRUE(std::isfinite(t.step.loss) && !t.step.skipped);
    const std::vector<float> trained = w.policy().params();
    const LogprobResult after = w.get_logprobs(samples), ref1 = w.get_reference_logprobs(samples);
    EXPECT_EQ(max_ragged_diff(ref1.logprobs, ref0.logprobs), 0.0);
    EXPECT_GT(max_ragged_diff(after.logprobs, before.logprobs), 1e-3);  // lr 1e-2 moves the weights visibly
    EXPECT_EQ(w.policy().params(), trained);                     // swapped back bit for bit
    EXPECT_EQ(max_ragged_diff(w.get_logprobs(samples).logprobs, after.logprobs), 0.0);
  });
}

// In-process ranks given one StartingWeights hold one copy of the starting (reference) weights between them, and a
// worker that only scores reads it in place; fp32 scores the reference with a second policy over it, fp64 swaps it
// into the policy's buffer: either way the reference scores stay the starting weights' after a step, and the
// trained weights are untouched by the reference call.
TEST(PolicyWorker, InProcessRanksShareOneCopyOfTheStartingWeights) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::vector<Sample> samples = random_samples(rng, 4, 256);
  for (const char* precision : {"float32", "float64"}) {
    SCOPED_TRACE(precision);
    const Config c = tiny_config(2, 2, {std::string("policy.precision=") + precision});
    const model::ModelConfig m = resolve_model_config(c.policy);
    StartingWeights shared;
    const std::shared_ptr<const std::vector<float>> held = shared.get(c, m);
    long holders = 0;
    comm::run_ranks(4, kTimeout, [&](comm::Communicator& world) {
      PolicyWorker w(c, world, &shared);
      world.barrier();
      if (world.rank() == 0) holders = held.use_count();  // every worker's reference (and scoring policy) is `held`
      world.barrier();
      const LogprobResult before = w.get_logprobs(samples), ref0 = w.get_reference_logprobs(samples);
      EXPECT_EQ(max_ragged_diff(ref0.logprobs, before.logprobs), 0.0);
      EXPECT_TRUE(std::isfinite(w.train(samples).step.loss));
      const std::vector<float> trained = w.policy().params();
      EXPECT_EQ(max_ragged_diff(w.get_reference_logprobs(samples).logprobs, ref0.logprobs), 0.0);
      EXPECT_EQ(w.policy().params(), trained);
      EXPECT_GT(max_ragged_diff(w.get_logprobs(samples).logprobs, before.logprobs), 1e-4);
    });
    EXPECT_GE(holders, 5);  // `held` and the four workers: none loaded a copy of its own
    EXPECT_EQ(held.use_count(), 1);
    EXPECT_EQ(shared.get(c, m).get(), held.get());
    Config other = c;
    other.train.seed += 1;  // a builtin model's weights depend on the seed
    EXPECT_NE(*shared.get(other, m), *held);
  }
}

// Clipped PG without prev_logprobs or reference_logprobs: the worker computes both from the weights of the step, so
// on the first step every ratio is 1 and the KL to the reference 0, and the token-level loss is -Σ A / counted
// tokens (positions >= 1 with mask 1), whatever the mesh: a hand-computed value the computed logprobs must meet.
TEST(PolicyWorker, ComputedPrevAndReferenceLogprobsMakeTheFirstPgStepAnAdvantageMean) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<Sample> samples = random_samples(rng, 4, 256);
  double sum = 0, count = 0;
  for (Sample& s : samples) {
    s.advantages.resize(s.input_ids.size());
    for (size_t p = 0; p < s.input_ids.size(); ++p) {
      s.token_mask[p] = static_cast<float>(rng() % 4 != 0);
      s.advantages[p] = std::uniform_real_distribution<float>(-1, 1)(rng);
      if (p >= 1 && s.token_mask[p] != 0) sum += s.advantages[p], count += 1;
    }
  }
  const std::vector<std::string> pg = {"loss_fn.type=clipped_pg", "loss_fn.reference_policy_kl_penalty=0.5"};
  std::vector<double> loss(4, NAN), kl(4, NAN);
  comm::run_ranks(4, kTimeout, [&](comm::Communicator& world) {
    PolicyWorker w(tiny_config(2, 2, pg), world);
    const TrainResult r = w.train(samples);
    loss[static_cast<size_t>(world.rank())] = r.step.loss;
    for (const train::Metric& m : r.step.metrics)
      if (m.name == "ref_kl") kl[static_cast<size_t>(world.rank())] = m.value;
  });
  for (size_t r = 0; r < 4; ++r) {
    // Ratios exp(cur - prev) of the same fp32 weights scored through training and scoring paths: 1 within ~1e-6.
    EXPECT_NEAR(loss[r], -sum / count, 1e-5) << "rank " << r;
    EXPECT_NEAR(kl[r], 0.0, 1e-6) << "rank " << r;
  }
}

// DPO without reference_logprobs: the reference is the starting weights, so on the first step every reward is 0
// and the loss softplus(0) = log 2 exactly as a formula, on any mesh.
TEST(PolicyWorker, ComputedReferenceLogprobsMakeTheFirstDpoStepLog2) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::vector<Sample> pairs = random_samples(rng, 8, 256);  // 4 pairs: chosen, rejected, ...
  std::vector<double> loss(2, NAN);
  comm::run_ranks(2, kTimeout, [&](comm::Communicator& world) {
    PolicyWorker w(tiny_config(2, 1, {"loss_fn.type=dpo", "loss_fn.reference_policy_kl_penalty=0.1"}), world);
    loss[static_cast<size_t>(world.rank())] = w.train(pairs).step.loss;
  });
  // The rewards are differences of the same weights' logprobs through two paths: |r| ~ 1e-5, beta r ~ 1e-6.
  for (double l : loss) EXPECT_NEAR(l, std::log(2.0), 1e-6);
}

TEST(PolicyWorker, ChecksTheMeshAndTheBatchBeforeWork) {
  comm::run_ranks(2, kTimeout, [&](comm::Communicator& world) {
    try {
      PolicyWorker w(tiny_config(1, 1), world);
      ADD_FAILURE() << "a 1-rank config on 2 ranks was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the world has 2"), std::string::npos) << e.what();
    }
  });
  comm::run_ranks(1, kTimeout, [&](comm::Communicator& world) {
    PolicyWorker w(tiny_config(1, 1), world);
    std::vector<Sample> bad(1);
    bad[0].input_ids = {1, 2, 256};
    try {
      w.get_logprobs(bad);
      ADD_FAILURE() << "token 256 of a 256-token vocabulary was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("input_ids[2] = 256"), std::string::npos) << e.what();
    }
    std::mt19937_64 rng(1);
    std::vector<Sample> three = random_samples(rng, 3, 256);
    try {
      w.train(three);
      ADD_FAILURE() << "3 sequences for a global batch of 4 were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("train_global_batch_size = 4"), std::string::npos) << e.what();
    }
  });
}

// A stop requested on one rank of dp 2 x cp 2 stops scoring and training on every rank together (comm::Interrupted,
// an agreed error: the group stays in step), having changed no weight and no counter; the same calls then run as
// before. The sampler stops at its next token.
TEST(PolicyWorker, AStopRequestedOnOneRankStopsEveryRankTogether) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::vector<Sample> samples = random_samples(rng, 7, 256);
  const std::vector<Sample> batch(samples.begin(), samples.begin() + 4);
  StopRequest stops[4];
  comm::run_ranks(4, kTimeout, [&](comm::Communicator& world) {
    const int r = world.rank();
    PolicyWorker w(tiny_config(2, 2), world, nullptr, &stops[r]);
    const LogprobResult before = w.get_logprobs(samples);
    const std::vector<float> weights = w.policy().params();
    const auto stopped_everywhere = [&](int on_rank, const std::function<void()>& call) {
      if (r == on_rank) stops[r].request();
      world.barrier();
      try {
        call();
        ADD_FAILURE() << "rank " << r << " was not stopped by rank " << on_rank << "'s request";
      } catch (const comm::Interrupted& e) {
        EXPECT_NE(std::string(e.what()).find("was interrupted"), std::string::npos) << e.what();
      }
      world.barrier();
      stops[r].clear();
    };
    stopped_everywhere(3, [&] { w.get_logprobs(samples); });
    stopped_everywhere(0, [&] { w.train(batch); });
    stopped_everywhere(2, [&] { w.get_reference_logprobs(samples); });
    EXPECT_EQ(w.steps_taken(), 0);
    EXPECT_EQ(w.policy().params(), weights);
    EXPECT_EQ(w.get_logprobs(samples).logprobs, before.logprobs);
    EXPECT_FALSE(w.train(batch).step.skipped);
    EXPECT_EQ(w.steps_taken(), 1);
    if (r == 0) {
      StopRequest stop;
      stop.request();
      model::SamplerOptions options;
      options.stop = &stop;
      model::SamplingParams sampling;
      sampling.max_new_tokens = 4;
      EXPECT_THROW(model::Sampler(w.policy(), options).generate({{1, 2, 3}}, sampling), comm::Interrupted);
    }
  });
}

TEST(PolicyWorker, ExportWritesAFolderTheModelLoaderReadsAndRefusesToReplaceAFile) {
  const fs::path dir = fs::temp_directory_path() / ("rt_pw_export_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  comm::run_ranks(2, kTimeout, [&](comm::Communicator& world) {
    PolicyWorker w(tiny_config(1, 2), world);
    w.export_hf(dir / "hf");
    w.export_hf(dir / "hf");  // a folder is replaced
    if (world.rank() == 0) {
      std::ofstream(dir / "file") << "x";
      fs::create_directories(dir / "mine");
      std::ofstream(dir / "mine" / "notes.txt") << "keep";
    }
    world.barrier();
    try {
      w.export_hf(dir / "file");
      ADD_FAILURE() << "a regular file was replaced";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not a directory"), std::string::npos) << e.what();
    }
    try {  // a folder with files an export does not write (a user's, or checkpoints) is never replaced
      w.export_hf(dir / "mine");
      ADD_FAILURE() << "a folder holding other files was replaced";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("notes.txt, which an export does not write"), std::string::npos)
          << e.what();
    }
    if (world.rank() == 0) {
      const model::ModelConfig m = model::load_config(dir / "hf");
      EXPECT_EQ(model::load_checkpoint_params(dir / "hf", m), w.policy().params());
      std::vector<std::string> names;
      for (const RefitEntry& e : w.refit_info()) names.push_back(e.name);
      EXPECT_EQ(names.front(), "model.embed_tokens.weight");
      EXPECT_EQ(static_cast<int64_t>(names.size()), static_cast<int64_t>(w.policy().layout().specs().size()));
    }
  });
  EXPECT_EQ(model::read_file(dir / "file"), "x");
  EXPECT_EQ(model::read_file(dir / "mine" / "notes.txt"), "keep");
  fs::remove_all(dir);
}

// An export into a folder that another export is writing is refused (the other's files are not removed as a
// leftover); a leftover that nobody holds, with the temporary names of a writer that was killed, is cleared.
TEST(PolicyWorker, AnExportBesideAnotherToTheSameFolderIsRefused) {
  const fs::path dir = fs::temp_directory_path() / ("rt_pw_export2_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const fs::path staging = dir / "hf.exporting";
  comm::run_ranks(1, kTimeout, [&](comm::Communicator& world) {
    PolicyWorker w(tiny_config(1, 1), world);
    {
      model::StagingFolder other(staging, ".ringtrain-exporting", "export (another worker)", [](const fs::path& p) { fs::remove_all(p); });
      std::ofstream(staging / "config.json") << "the other export's";
      try {
        w.export_hf(dir / "hf");
        ADD_FAILURE() << "an export removed the folder that another export was writing";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("another save or export to the same folder is writing"), std::string::npos)
            << e.what();
      }
      EXPECT_EQ(model::read_file(staging / "config.json"), "the other export's");
      EXPECT_FALSE(fs::exists(dir / "hf"));
    }
    EXPECT_FALSE(fs::exists(staging));  // given up by its writer: removed
    fs::create_directories(staging);  // a writer that was killed: its marker and a file cut short
    std::ofstream(staging / ".ringtrain-exporting");
    std::ofstream(staging / ".model.safetensors.tmp.4242") << "cut short";
    w.export_hf(dir / "hf");
    EXPECT_FALSE(fs::exists(staging));
    w.export_hf(dir / "hf");  // over an earlier export: nothing left beside it, no marker in it
    EXPECT_FALSE(fs::exists(dir / "hf.replaced"));
    EXPECT_FALSE(fs::exists(dir / "hf" / ".ringtrain-exporting"));

    // An export that the user made under the staging folder's name is theirs: never removed.
    w.export_hf(staging);
    try {
      w.export_hf(dir / "hf");
      ADD_FAILURE() << "an export named " << staging << " was removed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not a leftover of one"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(fs::exists(staging / "model.safetensors"));
    fs::remove_all(staging);
    EXPECT_EQ(model::load_checkpoint_params(dir / "hf", model::load_config(dir / "hf")), w.policy().params());

    // "link/" names the link, not the folder it points to: refused, nothing left beside it.
    fs::create_directory_symlink(dir / "hf", dir / "link");
    try {
      w.export_hf((dir / "link").string() + "/");
      ADD_FAILURE() << "an export went through a link";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("link is a symbolic link (to "), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(dir / "link.exporting"));
  });
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ringtrain::worker
