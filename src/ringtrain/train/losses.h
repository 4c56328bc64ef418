// Training losses on per-token logprobs: NLL (SFT), the clipped policy gradient (GRPO/PPO,
// with dual clip, KL to a reference and importance weights) and DPO.
//
// One call handles one microbatch of `batch` sequences of `seq` tokens, row-major [batch, seq], in token order:
// entry p is the logprob of token p given the tokens before it, so position 0 is never a valid token (it is not
// read and its gradient is 0, whatever the mask says). A token counts when token_mask[b][p] and sample_mask[b] are
// both non-zero; values at tokens that do not count are not read (padding may hold anything). A NaN at a counted
// token makes the loss NaN.
//
// Normalisation is global: the caller sums the counts of every microbatch of the step on every dp rank
// (count_valid / count_dpo_pairs, then an all-reduce) and passes them in, so that the losses of all microbatches
// and ranks add up to the step's loss and their gradients to the step's gradient.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ringtrain::train {

struct TokenMasks {
  int64_t batch = 0;
  int64_t seq = 0;
  std::span<const uint8_t> token_mask;   // [batch * seq]
  std::span<const uint8_t> sample_mask;  // [batch]
};

// Counts of one microbatch, or (summed by the caller over microbatches and dp ranks) of the whole step.
struct ValidCounts {
  double tokens = 0;     // counted tokens
  double sequences = 0;  // sequences with sample_mask set, counted tokens or not (NeMo RL's global_valid_seqs)
};
ValidCounts count_valid(const TokenMasks& masks);

// A metric as two sums that the caller all-reduces (sum) over microbatches and ranks: value = sum / count.
struct MetricSum {
  std::string name;
  double sum = 0;
  double count = 0;
};

struct LossResult {
  double loss = 0;                 // this microbatch's contribution: summed over microbatches and ranks = step loss
  std::vector<MetricSum> metrics;  // see each loss for the names
};

// NLL = -Σ logp·mask / global.tokens. Metrics: none.
template <typename T>
LossResult nll_loss(const TokenMasks& masks, std::span<const T> logprobs, const ValidCounts& global,
                    std::span<T> grad_logprobs);

enum class KLEstimator { K1, K2, K3 };
enum class Aggregation {
  TokenMean,     // Σ over counted tokens / global.tokens
  SequenceMean,  // per-sequence mean over its counted tokens, Σ over sequences / global.sequences
};

struct ClippedPGConfig {
  double eps_low = 0.2;   // ratio clipped to [1 - eps_low, 1 + eps_high]
  double eps_high = 0.2;
  double dual_clip = 0;   // c > 1 enables the dual clip for A < 0: loss = min(loss, -A·c); 0 disables it
  double kl_beta = 0;     // coefficient of the KL to the reference (needs ref_logprobs when non-zero)
  KLEstimator kl_estimator = KLEstimator::K3;
  Aggregation aggregation = Aggregation::TokenMean;
};

// All [batch * seq] in token order. Optional inputs are empty spans.
template <typename T>
struct ClippedPGInputs {
  std::span<const T> logprobs;       // current policy (the gradient is taken w.r.t. these)
  std::span<const T> prev_logprobs;  // policy that the ratio is taken against
  std::span<const T> advantages;
  std::span<const T> ref_logprobs;   // optional: reference policy, for the KL term
  std::span<const T> gen_logprobs;   // optional: generator's logprobs; importance weight exp(prev - gen)
  std::span<const T> entropy;        // optional: per-token policy entropy, only aggregated as a metric
};

// Per counted token: r = exp(cur - prev); pg = max(-A·r, -A·clip(r, 1-eps_low, 1+eps_high)), then min(pg, -A·c)
// where A < 0 and the dual clip is on; kl = clamp(k(clamp(ref - cur, ±20)), ±10) with k1 = -x, k2 = x²/2,
// k3 = eˣ - 1 - x; token loss = w·pg + beta·kl with w = exp(prev - gen) (1 without gen_logprobs, 0 where it
// overflows; no gradient through w), as NeMo RL's ClippedPGLossFn. Where a clamp or clip is active its branch has
// zero gradient.
// Metrics (count = counted tokens, summed): "clip_fraction" (tokens where the clipped branch is strictly larger),
// "dual_clip_fraction", "approx_kl" (k3 of KL(prev || cur): e^(cur-prev) - 1 - (cur-prev)), "ratio", and with the
// optional inputs "ref_kl" (the clamped kl value), "importance_weight", "entropy".
template <typename T>
LossResult clipped_pg_loss(const TokenMasks& masks, const ClippedPGInputs<T>& in, const ClippedPGConfig& cfg,
                           const ValidCounts& global, std::span<T> grad_logprobs);

// The gradient of nll_loss or clipped_pg_loss at one token from that token's logprob alone (both losses are
// token-local): operator()(b, p, logprob) is exactly what the loss writes into grad_logprobs[b * seq + p] when
// given that logprob (0 where the token does not count), so a policy can apply it inside its LM head
// (Policy::score_and_backward). Holds spans of the inputs, which must outlive it. DPO has none: its gradient at a
// token depends on the sums over whole sequences.
class TokenLocalGradient {
 public:
  static TokenLocalGradient nll(const TokenMasks& masks, const ValidCounts& global);
  // in.logprobs and in.entropy are not read.
  template <typename T>
  static TokenLocalGradient clipped_pg(const TokenMasks& masks, const ClippedPGInputs<T>& in,
                                       const ClippedPGConfig& cfg, const ValidCounts& global);
  double operator()(int64_t b, int64_t p, double logprob) const;

 private:
  TokenMasks masks_;
  std::vector<double> row_scale_;  // d(microbatch loss)/d(token loss) per row
  bool pg_ = false;
  ClippedPGConfig cfg_;
  // fp64 copies of the clipped PG's per-token inputs (empty when absent)
  std::vector<double> prev_, adv_, ref_, gen_;
};

// DPO: sequence 2i is the chosen answer of pair i and 2i+1 the rejected one; a pair counts when both sample masks
// are set (they must agree). reward = Σ mask·(logπ - logπ_ref) per sequence.
struct DPOCounts {
  double pairs = 0;          // counted pairs
  double chosen_tokens = 0;  // counted tokens of the chosen sequences of counted pairs
};
DPOCounts count_dpo_pairs(const TokenMasks& masks);

struct DPOConfig {
  double beta = 0.1;
  // adds nll_coef · Σ_pairs (-Σ logπ over the chosen tokens) / global.pairs: each chosen answer's summed NLL, averaged
  // over pairs (NeMo RL's DPO with sft_average_log_probs off)
  double nll_coef = 0;
};

// loss = Σ_pairs softplus(-beta·(r_chosen - r_rejected)) / global.pairs (+ the NLL term).
// Metrics (count = counted pairs): "reward_accuracy" (r_chosen > r_rejected), "reward_margin",
// "chosen_reward", "rejected_reward" (rewards without beta); with nll_coef, "chosen_nll" (count = chosen tokens).
template <typename T>
LossResult dpo_loss(const TokenMasks& masks, std::span<const T> logprobs, std::span<const T> ref_logprobs,
                    const DPOConfig& cfg, const DPOCounts& global, std::span<T> grad_logprobs);

enum class LossKind { NLL, ClippedPG, DPO };
LossKind parse_loss_kind(const std::string& name);  // nll, pg, dpo

struct LossConfig {
  LossKind kind = LossKind::NLL;
  ClippedPGConfig pg;
  DPOConfig dpo;
};

// The names of the metrics the loss reports, in its LossResult's order, for a batch with or without reference and
// generation logprobs and with or without the entropy; each one's count is the global count its loss names.
std::vector<std::string> loss_metric_names(const LossConfig& cfg, bool with_ref, bool with_gen, bool with_entropy);

}  // namespace ringtrain::train
