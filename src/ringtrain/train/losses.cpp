#include "ringtrain/train/losses.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ringtrain/core/error.h"
#include "ringtrain/train/loss_math.h"

namespace ringtrain::train {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

int64_t checked_size(const TokenMasks& m) {
  RT_CHECK(m.batch >= 0 && m.seq >= 0, "loss: negative shape batch=", m.batch, " seq=", m.seq);
  int64_t n = 0;
  RT_CHECK(!__builtin_mul_overflow(m.batch, m.seq, &n), "loss: batch*seq overflows (", m.batch, "x", m.seq, ")");
  RT_CHECK(static_cast<int64_t>(m.token_mask.size()) == n, "loss: token_mask has ", m.token_mask.size(),
           " entries, expected batch*seq = ", n);
  RT_CHECK(static_cast<int64_t>(m.sample_mask.size()) == m.batch, "loss: sample_mask has ", m.sample_mask.size(),
           " entries, expected batch = ", m.batch);
  return n;
}

template <typename S>
void check_span(const S& s, int64_t n, const char* what, bool optional = false) {
  if (optional && s.empty()) return;
  RT_CHECK(static_cast<int64_t>(s.size()) == n, "loss: ", what, " has ", s.size(), " entries, expected batch*seq = ", n);
}

bool counted(const TokenMasks& m, int64_t b, int64_t p) {
  return p > 0 && m.sample_mask[b] != 0 && m.token_mask[b * m.seq + p] != 0;
}

int64_t counted_in_row(const TokenMasks& m, int64_t b) {
  int64_t n = 0;
  for (int64_t p = 1; p < m.seq; ++p) n += counted(m, b, p);
  return n;
}

// The global normaliser must cover this microbatch's own count; 0 is allowed only when nothing here counts.
void check_normaliser(double global, double local, const char* what) {
  RT_CHECK(std::isfinite(global) && global >= local, "loss: global ", what, " = ", global,
           " is smaller than this microbatch's ", local, " (or not finite)");
}

}  // namespace

ValidCounts count_valid(const TokenMasks& masks) {
  checked_size(masks);
  ValidCounts c;
  for (int64_t b = 0; b < masks.batch; ++b) {
    const int64_t n = counted_in_row(masks, b);
    c.tokens += static_cast<double>(n);
    c.sequences += masks.sample_mask[b] != 0 ? 1 : 0;
  }
  return c;
}

template <typename T>
LossResult nll_loss(const TokenMasks& masks, std::span<const T> logprobs, const ValidCounts& global,
                    std::span<T> grad_logprobs) {
  const int64_t n = checked_size(masks);
  check_span(logprobs, n, "logprobs");
  check_span(grad_logprobs, n, "grad_logprobs");
  check_normaliser(global.tokens, count_valid(masks).tokens, "valid tokens");
  LossResult out;
  double sum = 0;
  for (int64_t b = 0; b < masks.batch; ++b)
    for (int64_t p = 0; p < masks.seq; ++p) {
      const int64_t i = b * masks.seq + p;
      if (!counted(masks, b, p)) {
        grad_logprobs[i] = T(0);
        continue;
      }
      sum += static_cast<double>(logprobs[i]);
      grad_logprobs[i] = static_cast<T>(-1.0 / global.tokens);
    }
  out.loss = sum == 0 ? 0.0 : -sum / global.tokens;  // sum == 0 also when nothing counts (global may be 0)
  return out;
}

namespace {

// d(microbatch loss)/d(token loss) for the tokens of row b: 1/global tokens, or 1/(tokens of the row · global
// sequences).
double pg_row_scale(const TokenMasks& masks, int64_t b, const ClippedPGConfig& cfg, const ValidCounts& global) {
  if (cfg.aggregation == Aggregation::TokenMean) return 1.0 / global.tokens;
  const int64_t row_tokens = counted_in_row(masks, b);
  return row_tokens > 0 ? 1.0 / (static_cast<double>(row_tokens) * global.sequences) : 0;
}

// The checks of clipped_pg_loss's inputs other than the current logprobs, entropy and gradient; returns batch*seq.
template <typename T>
int64_t check_pg_inputs(const TokenMasks& masks, const ClippedPGInputs<T>& in, const ClippedPGConfig& cfg,
                        const ValidCounts& global) {
  const int64_t n = checked_size(masks);
  check_span(in.prev_logprobs, n, "prev_logprobs");
  check_span(in.advantages, n, "advantages");
  check_span(in.ref_logprobs, n, "ref_logprobs", true);
  check_span(in.gen_logprobs, n, "gen_logprobs", true);
  RT_CHECK(cfg.eps_low >= 0 && cfg.eps_low <= 1 && cfg.eps_high >= 0, "clipped PG: eps_low ", cfg.eps_low,
           " must be in [0, 1] and eps_high ", cfg.eps_high, " >= 0");
  RT_CHECK(cfg.dual_clip == 0 || cfg.dual_clip > 1, "clipped PG: dual_clip ", cfg.dual_clip, " must be > 1 (or 0: off)");
  RT_CHECK(std::isfinite(cfg.kl_beta), "clipped PG: kl_beta ", cfg.kl_beta, " is not finite");
  RT_CHECK(cfg.kl_beta == 0 || !in.ref_logprobs.empty(), "clipped PG: kl_beta ", cfg.kl_beta,
           " needs ref_logprobs");
  const ValidCounts local = count_valid(masks);
  if (cfg.aggregation == Aggregation::SequenceMean)
    check_normaliser(global.sequences, local.sequences, "valid sequences");
  else
    check_normaliser(global.tokens, local.tokens, "valid tokens");
  return n;
}

}  // namespace

template <typename T>
LossResult clipped_pg_loss(const TokenMasks& masks, const ClippedPGInputs<T>& in, const ClippedPGConfig& cfg,
                           const ValidCounts& global, std::span<T> grad_logprobs) {
  const int64_t n = check_pg_inputs(masks, in, cfg, global);
  check_span(in.logprobs, n, "logprobs");
  check_span(in.entropy, n, "entropy", true);
  check_span(grad_logprobs, n, "grad_logprobs");
  const ValidCounts local = count_valid(masks);

  double clipped = 0, dual_clipped = 0, approx_kl = 0, ratio = 0, ref_kl = 0, weights = 0, entropy = 0;
  double loss = 0;
  for (int64_t b = 0; b < masks.batch; ++b) {
    const double scale = pg_row_scale(masks, b, cfg, global);
    for (int64_t p = 0; p < masks.seq; ++p) {
      const int64_t i = b * masks.seq + p;
      if (!counted(masks, b, p)) {
        grad_logprobs[i] = T(0);
        continue;
      }
      const double cur = static_cast<double>(in.logprobs[i]);
      const double prev = static_cast<double>(in.prev_logprobs[i]);
      const double ref = cfg.kl_beta == 0 ? 0.0 : static_cast<double>(in.ref_logprobs[i]);
      const double w = in.gen_logprobs.empty() ? 1.0 : importance_weight(prev, static_cast<double>(in.gen_logprobs[i]));
      const PGToken t = pg_token(cur, prev, static_cast<double>(in.advantages[i]), ref, w, cfg);
      loss += t.loss * scale;
      grad_logprobs[i] = static_cast<T>(t.grad * scale);
      clipped += t.clipped;
      dual_clipped += t.dual_clipped;
      approx_kl += approx_kl_term(cur, prev);
      ratio += std::exp(cur - prev);
      ref_kl += t.kl;
      weights += w;
      if (!in.entropy.empty()) entropy += static_cast<double>(in.entropy[i]);
    }
  }
  LossResult out;
  out.loss = loss;
  const double c = local.tokens;
  out.metrics = {{"clip_fraction", clipped, c}, {"dual_clip_fraction", dual_clipped, c},
                 {"approx_kl", approx_kl, c}, {"ratio", ratio, c}};
  if (!in.ref_logprobs.empty() && cfg.kl_beta != 0) out.metrics.push_back({"ref_kl", ref_kl, c});
  if (!in.gen_logprobs.empty()) out.metrics.push_back({"importance_weight", weights, c});
  if (!in.entropy.empty()) out.metrics.push_back({"entropy", entropy, c});
  return out;
}

TokenLocalGradient TokenLocalGradient::nll(const TokenMasks& masks, const ValidCounts& global) {
  check_normaliser(global.tokens, count_valid(masks).tokens, "valid tokens");
  TokenLocalGradient g;
  g.masks_ = masks;
  g.row_scale_.assign(static_cast<size_t>(masks.batch), 1.0 / global.tokens);
  return g;
}

template <typename T>
TokenLocalGradient TokenLocalGradient::clipped_pg(const TokenMasks& masks, const ClippedPGInputs<T>& in,
                                                  const ClippedPGConfig& cfg, const ValidCounts& global) {
  check_pg_inputs(masks, in, cfg, global);
  TokenLocalGradient g;
  g.masks_ = masks;
  g.pg_ = true;
  g.cfg_ = cfg;
  for (int64_t b = 0; b < masks.batch; ++b) g.row_scale_.push_back(pg_row_scale(masks, b, cfg, global));
  const auto widen = [](std::span<const T> s) { return std::vector<double>(s.begin(), s.end()); };
  g.prev_ = widen(in.prev_logprobs), g.adv_ = widen(in.advantages);
  g.ref_ = widen(in.ref_logprobs), g.gen_ = widen(in.gen_logprobs);
  return g;
}

double TokenLocalGradient::operator()(int64_t b, int64_t p, double logprob) const {
  RT_CHECK(b >= 0 && b < masks_.batch && p >= 0 && p < masks_.seq, "loss gradient: token (", b, ", ", p,
           ") outside the microbatch [", masks_.batch, ", ", masks_.seq, "]");
  if (!counted(masks_, b, p)) return 0;
  const double scale = row_scale_[static_cast<size_t>(b)];
  if (!pg_) return -scale;
  const size_t i = static_cast<size_t>(b * masks_.seq + p);
  const double prev = prev_[i];
  const double ref = cfg_.kl_beta == 0 ? 0.0 : ref_[i];
  const double w = gen_.empty() ? 1.0 : importance_weight(prev, gen_[i]);
  return pg_token(logprob, prev, adv_[i], ref, w, cfg_).grad * scale;
}

DPOCounts count_dpo_pairs(const TokenMasks& masks) {
  checked_size(masks);
  RT_CHECK(masks.batch % 2 == 0, "DPO: batch ", masks.batch, " must be even (chosen/rejected pairs)");
  DPOCounts c;
  for (int64_t pair = 0; pair < masks.batch / 2; ++pair) {
    const bool chosen = masks.sample_mask[2 * pair] != 0, rejected = masks.sample_mask[2 * pair + 1] != 0;
    RT_CHECK(chosen == rejected, "DPO: pair ", pair, " has sample_mask ", int(chosen), " on the chosen sequence but ",
             int(rejected), " on the rejected one");
    if (!chosen) continue;
    c.pairs += 1;
    c.chosen_tokens += static_cast<double>(counted_in_row(masks, 2 * pair));
  }
  return c;
}

template <typename T>
LossResult dpo_loss(const TokenMasks& masks, std::span<const T> logprobs, std::span<const T> ref_logprobs,
                    const DPOConfig& cfg, const DPOCounts& global, std::span<T> grad_logprobs) {
  const int64_t n = checked_size(masks);
  check_span(logprobs, n, "logprobs");
  check_span(ref_logprobs, n, "ref_logprobs");
  check_span(grad_logprobs, n, "grad_logprobs");
  RT_CHECK(std::isfinite(cfg.beta) && cfg.beta > 0, "DPO: beta ", cfg.beta, " must be > 0");
  RT_CHECK(std::isfinite(cfg.nll_coef) && cfg.nll_coef >= 0, "DPO: nll_coef ", cfg.nll_coef, " must be >= 0");
  const DPOCounts local = count_dpo_pairs(masks);
  check_normaliser(global.pairs, local.pairs, "pairs");

  auto reward = [&](int64_t b) {
    double r = 0;
    for (int64_t p = 1; p < masks.seq; ++p)
      if (counted(masks, b, p))
        r += static_cast<double>(logprobs[b * masks.seq + p]) - static_cast<double>(ref_logprobs[b * masks.seq + p]);
    return r;
  };
  LossResult out;
  double accuracy = 0, margin = 0, chosen_reward = 0, rejected_reward = 0, chosen_nll = 0;
  for (int64_t i = 0; i < n; ++i) grad_logprobs[i] = T(0);
  for (int64_t pair = 0; pair < masks.batch / 2; ++pair) {
    const int64_t bc = 2 * pair, br = 2 * pair + 1;
    if (masks.sample_mask[bc] == 0) continue;
    const double rc = reward(bc), rr = reward(br);
    const double z = cfg.beta * (rc - rr);
    out.loss += softplus(-z) / global.pairs;
    // d softplus(-z)/dz = -sigmoid(-z); dz/dlogπ = +beta on chosen tokens, -beta on rejected ones.
    const double dz = -sigmoid(-z) * cfg.beta / global.pairs;
    for (int64_t p = 1; p < masks.seq; ++p) {
      if (counted(masks, bc, p)) {
        const double lp = static_cast<double>(logprobs[bc * masks.seq + p]);
        double g = dz;
        if (cfg.nll_coef != 0) {
          out.loss -= cfg.nll_coef * lp / global.pairs;
          g -= cfg.nll_coef / global.pairs;
          chosen_nll -= lp;
        }
        grad_logprobs[bc * masks.seq + p] = static_cast<T>(std::isnan(z) ? kNaN : g);
      }
      if (counted(masks, br, p)) grad_logprobs[br * masks.seq + p] = static_cast<T>(std::isnan(z) ? kNaN : -dz);
    }
    accuracy += rc > rr;
    margin += rc - rr;
    chosen_reward += rc;
    rejected_reward += rr;
  }
  out.metrics = {{"reward_accuracy", accuracy, local.pairs},
                 {"reward_margin", margin, local.pairs},
                 {"chosen_reward", chosen_reward, local.pairs},
                 {"rejected_reward", rejected_reward, local.pairs}};
  if (cfg.nll_coef != 0) out.metrics.push_back({"chosen_nll", chosen_nll, local.chosen_tokens});
  return out;
}

LossKind parse_loss_kind(const std::string& name) {
  if (name == "nll") return LossKind::NLL;
  if (name == "pg") return LossKind::ClippedPG;
  if (name == "dpo") return LossKind::DPO;
  throw Error(cat("unknown loss '", name, "': expected nll, pg or dpo"));
}

std::vector<std::string> loss_metric_names(const LossConfig& cfg, bool with_ref, bool with_gen, bool with_entropy) {
  switch (cfg.kind) {
    case LossKind::NLL: return {};
    case LossKind::ClippedPG: {
      std::vector<std::string> names{"clip_fraction", "dual_clip_fraction", "approx_kl", "ratio"};
      if (with_ref && cfg.pg.kl_beta != 0) names.push_back("ref_kl");
      if (with_gen) names.push_back("importance_weight");
      if (with_entropy) names.push_back("entropy");
      return names;
    }
    case LossKind::DPO: {
      std::vector<std::string> names{"reward_accuracy", "reward_margin", "chosen_reward", "rejected_reward"};
      if (cfg.dpo.nll_coef != 0) names.push_back("chosen_nll");
      return names;
    }
  }
  return {};
}

#define RT_INSTANTIATE_LOSSES(T)                                                                                    \
  template LossResult nll_loss<T>(const TokenMasks&, std::span<const T>, const ValidCounts&, std::span<T>);          \
  template LossResult clipped_pg_loss<T>(const TokenMasks&, const ClippedPGInputs<T>&, const ClippedPGConfig&,       \
                                         const ValidCounts&, std::span<T>);                                         \
  template TokenLocalGradient TokenLocalGradient::clipped_pg<T>(const TokenMasks&, const ClippedPGInputs<T>&,     \
                                                               const ClippedPGConfig&, const ValidCounts&);         \
  template LossResult dpo_loss<T>(const TokenMasks&, std::span<const T>, std::span<const T>, const DPOConfig&,       \
                                  const DPOCounts&, std::span<T>);
RT_INSTANTIATE_LOSSES(float)
RT_INSTANTIATE_LOSSES(double)
#undef RT_INSTANTIATE_LOSSES

}  // namespace ringtrain::train
