#include "ringtrain/attention/params.h"

#include <algorithm>
#include <cmath>

#include "ringtrain/core/checked.h"
#include "ringtrain/core/error.h"

namespace ringtrain::attention {

std::string mask_name(MaskType m) {
  switch (m) {
    case MaskType::None: return "none";
    case MaskType::CausalTopLeft: return "causal_top_left";
    case MaskType::CausalBottomRight: return "causal_bottom_right";
  }
  return "?";
}

MaskType parse_mask(const std::string& n) {
  if (n == "none") return MaskType::None;
  if (n == "causal" || n == "causal_top_left") return MaskType::CausalTopLeft;
  if (n == "causal_bottom_right") return MaskType::CausalBottomRight;
  throw Error(cat("unknown mask '", n, "' (expected none, causal, causal_top_left or causal_bottom_right)"));
}

float AttnParams::scale() const {
  return softmax_scale != 0.f ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

std::string AttnParams::key() const {
  return cat(device_name(device), '|', dtype_name(dtype), '|', batch, '|', heads_q, '|', heads_kv, '|', head_dim, '|',
             seqlen_q, '|', seqlen_kv, '|', static_cast<int>(mask), '|', packed, '|', deterministic, '|', has_bias, '|',
             kv_cache, '|', window);
}

std::string AttnParams::describe() const {
  return cat(device_name(device), ' ', dtype_name(dtype), " B=", batch, " Hq=", heads_q, " Hkv=", heads_kv,
             " D=", head_dim, " Sq=", seqlen_q, " Skv=", seqlen_kv, " mask=", mask_name(mask),
             packed ? " packed" : "", deterministic ? " deterministic" : "", has_bias ? " bias" : "",
             kv_cache ? " kv_cache" : "", window > 0 ? cat(" window=", window) : std::string());
}

void validate_params(const AttnParams& p) {
  RT_CHECK(p.batch > 0 && p.heads_q > 0 && p.heads_kv > 0 && p.head_dim > 0 && p.seqlen_q >= 0 && p.seqlen_kv >= 0,
           "attention: bad params ", p.describe(), " (batch, heads and head_dim must be positive, lengths >= 0)");
  // The window is a 32-bit value in the GPU kernels and the cuDNN graph.
  RT_CHECK(p.window >= 0 && p.window < (int64_t{1} << 31), "attention: sliding window ", p.window, " of ",
           p.describe(), " is not in [0, 2^31)");
  RT_CHECK(p.window == 0 || p.mask != MaskType::None, "attention: sliding window ", p.window,
           " needs a causal mask (causal_top_left or causal_bottom_right), got mask=none in ", p.describe());
  RT_CHECK(p.heads_q % p.heads_kv == 0, "attention: query heads (", p.heads_q, ") must be a multiple of kv heads (",
           p.heads_kv, ")");
  // The element counts of q/o and k/v, and of the score matrix a row block spans, must fit in 64 bits.
  const std::string what = cat("attention: params ", p.describe(), ": element count");
  const int64_t rows = checked_mul(p.batch, std::max(p.seqlen_q, p.seqlen_kv), what);
  checked_mul(checked_mul(rows, std::max(p.heads_q, p.heads_kv), what), p.head_dim, what);
  checked_mul(checked_mul(checked_mul(p.batch, p.heads_q, what), p.seqlen_q, what), p.seqlen_kv, what);
}

namespace {

void check_tensor(const AttnParams& p, const char* name, const TensorView& t, int64_t rows, int64_t heads,
                  DType dtype, bool any_float = false) {
  const int want_ndim = p.packed ? 3 : 4;
  RT_CHECK(t.data != nullptr, "attention: tensor '", name, "' is missing");
  RT_CHECK(t.device == p.device, "attention: '", name, "' is on ", device_name(t.device), ", params say ",
           device_name(p.device));
  RT_CHECK(any_float ? is_float(t.dtype) : t.dtype == dtype, "attention: '", name, "' is ", t.shape_str(),
           ", expected dtype ", dtype_name(dtype));
  RT_CHECK(t.ndim == want_ndim, "attention: '", name, "' is ", t.shape_str(), ", expected ", want_ndim,
           " dimensions (", p.packed ? "THD" : "BSHD", ")");
  const int o = p.packed ? 0 : 1;
  bool ok = t.shape[o + 1] == heads && t.shape[o + 2] == p.head_dim;
  if (!p.packed) ok = ok && t.shape[0] == p.batch && t.shape[1] == rows;
  RT_CHECK(ok, "attention: '", name, "' is ", t.shape_str(), ", expected ",
           p.packed ? cat("[T, ", heads, ", ", p.head_dim, "]")
                    : cat("[", p.batch, ", ", rows, ", ", heads, ", ", p.head_dim, "]"));
  RT_CHECK(t.stride[t.ndim - 1] == 1, "attention: '", name, "' must have unit stride in the head dimension");
}

void check_lse(const AttnParams& p, const TensorView& lse, const TensorView& q) {
  RT_CHECK(lse.data != nullptr, "attention: tensor 'lse' is missing");
  RT_CHECK(lse.dtype == DType::F32 && lse.device == p.device, "attention: 'lse' is ", lse.shape_str(),
           ", expected fp32 on ", device_name(p.device));
  if (p.packed) {
    RT_CHECK(lse.ndim == 2 && lse.shape[0] == p.heads_q && lse.shape[1] == q.shape[0], "attention: 'lse' is ",
             lse.shape_str(), ", expected [", p.heads_q, ", ", q.shape[0], "]");
  } else {
    RT_CHECK(lse.ndim == 3 && lse.shape[0] == p.batch && lse.shape[1] == p.heads_q && lse.shape[2] == p.seqlen_q,
             "attention: 'lse' is ", lse.shape_str(), ", expected [", p.batch, ", ", p.heads_q, ", ", p.seqlen_q, "]");
  }
}


void check_cu_seqlens(const AttnParams& p, const char* name, const TensorView& cu) {
  if (!p.packed) return;
  RT_CHECK(cu.data && cu.dtype == DType::I32 && cu.ndim == 1 && cu.shape[0] == p.batch + 1 && cu.device == p.device,
           "attention: packed call needs '", name, "' int32 [", p.batch + 1, "] on ", device_name(p.device),
           ", got ", cu.data ? cu.shape_str() : std::string("none"));
}

// bias [B|1, Hq|1, Sq, Skv] exactly when the params say so; size-1 batch/head dimensions broadcast.
void check_bias(const AttnParams& p, const TensorView& bias) {
  if (!p.has_bias) {
    RT_CHECK(bias.data == nullptr, "attention: a 'bias' ", bias.shape_str(),
             " was passed but the params do not say has_bias (set AttnParams::has_bias)");
    return;
  }
  RT_CHECK(!p.packed, "attention: 'bias' is not supported with packed (THD) sequences");
  RT_CHECK(bias.data != nullptr, "attention: params say has_bias but tensor 'bias' is missing");
  RT_CHECK(bias.device == p.device, "attention: 'bias' is on ", device_name(bias.device), ", params say ",
           device_name(p.device));
  RT_CHECK(is_float(bias.dtype), "attention: 'bias' is ", bias.shape_str(), ", expected a float dtype");
  const bool shape_ok = bias.ndim == 4 && (bias.shape[0] == p.batch || bias.shape[0] == 1) &&
                        (bias.shape[1] == p.heads_q || bias.shape[1] == 1) && bias.shape[2] == p.seqlen_q &&
                        bias.shape[3] == p.seqlen_kv;
  RT_CHECK(shape_ok, "attention: 'bias' is ", bias.shape_str(), ", expected [", p.batch, " or 1, ", p.heads_q,
           " or 1, ", p.seqlen_q, ", ", p.seqlen_kv, "]");
}

// kv_used int32 [B] on the params' device exactly for KV-cache calls (its values are the kernels' to trust: they are
// on the device).
void check_kv_used(const AttnParams& p, const TensorView& kv_used) {
  if (!p.kv_cache) {
    RT_CHECK(kv_used.data == nullptr, "attention: a 'kv_used' ", kv_used.shape_str(),
             " was passed but the params do not say kv_cache (set AttnParams::kv_cache)");
    return;
  }
  RT_CHECK(!p.packed, "attention: a KV-cache call takes dense BSHD tensors, not packed (THD) ones");
  RT_CHECK(kv_used.data && kv_used.dtype == DType::I32 && kv_used.ndim == 1 && kv_used.shape[0] == p.batch &&
               kv_used.device == p.device && kv_used.stride[0] == 1,
           "attention: a KV-cache call needs 'kv_used' int32 [", p.batch, "] contiguous on ", device_name(p.device),
           ", got ", kv_used.data ? kv_used.shape_str() : std::string("none"));
}

}  // namespace

TensorView bias_broadcast_view(const TensorView& bias) {
  TensorView v = bias;
  for (int d = 0; d < 2; ++d)
    if (v.shape[d] == 1) v.stride[d] = 0;
  return v;
}

void validate(const AttnParams& p, const AttnForwardArgs& a) {
  validate_params(p);
  check_tensor(p, "q", a.q, p.seqlen_q, p.heads_q, p.dtype);
  check_tensor(p, "k", a.k, p.seqlen_kv, p.heads_kv, p.dtype);
  check_tensor(p, "v", a.v, p.seqlen_kv, p.heads_kv, p.dtype);
  RT_CHECK(!p.packed || (a.k.shape[0] == a.v.shape[0]), "attention: packed 'k' and 'v' differ in length");
  check_tensor(p, "o", a.o, p.seqlen_q, p.heads_q, p.dtype, /*any_float=*/true);
  RT_CHECK(!p.packed || a.o.shape[0] == a.q.shape[0], "attention: packed 'o' ", a.o.shape_str(), " differs from 'q' ",
           a.q.shape_str());
  check_lse(p, a.lse, a.q);
  check_cu_seqlens(p, "cu_seqlens_q", a.cu_seqlens_q);
  check_cu_seqlens(p, "cu_seqlens_kv", a.cu_seqlens_kv);
  check_bias(p, a.bias);
  check_kv_used(p, a.kv_used);
}

void validate(const AttnParams& p, const AttnBackwardArgs& a) {
  validate_params(p);
  RT_CHECK(!p.kv_cache, "attention: a KV-cache call (", p.describe(), ") has no backward");
  check_tensor(p, "q", a.q, p.seqlen_q, p.heads_q, p.dtype);
  check_tensor(p, "k", a.k, p.seqlen_kv, p.heads_kv, p.dtype);
  check_tensor(p, "v", a.v, p.seqlen_kv, p.heads_kv, p.dtype);
  check_tensor(p, "o", a.o, p.seqlen_q, p.heads_q, p.dtype, /*any_float=*/true);
  check_tensor(p, "dout", a.dout, p.seqlen_q, p.heads_q, p.dtype, /*any_float=*/true);
  const DType gd = a.accumulate ? DType::F32 : p.dtype;
  check_tensor(p, "dq", a.dq, p.seqlen_q, p.heads_q, gd, /*any_float=*/!a.accumulate);
  check_tensor(p, "dk", a.dk, p.seqlen_kv, p.heads_kv, gd, /*any_float=*/!a.accumulate);
  check_tensor(p, "dv", a.dv, p.seqlen_kv, p.heads_kv, gd, /*any_float=*/!a.accumulate);
  check_lse(p, a.lse, a.q);
  check_cu_seqlens(p, "cu_seqlens_q", a.cu_seqlens_q);
  check_cu_seqlens(p, "cu_seqlens_kv", a.cu_seqlens_kv);
  check_bias(p, a.bias);
}

std::string kv_cache_reason() {
  return "a KV-cache call (a padded cache with per-sequence used lengths; only decode serves it)";
}

std::string window_reason(const AttnParams& p, const std::string& why) {
  return cat("sliding window ", p.window, " (", why, ")");
}

AttnParams params_for(const TensorView& q, const TensorView& k, MaskType mask, float softmax_scale) {
  RT_CHECK(q.ndim == 4 && k.ndim == 4, "attention: expected BSHD tensors, got q ", q.shape_str(), " k ",
           k.shape_str());
  AttnParams p;
  p.device = q.device;
  p.dtype = q.dtype;
  p.batch = q.shape[0];
  p.seqlen_q = q.shape[1];
  p.heads_q = q.shape[2];
  p.head_dim = q.shape[3];
  p.seqlen_kv = k.shape[1];
  p.heads_kv = k.shape[2];
  p.mask = mask;
  p.softmax_scale = softmax_scale;
  return p;
}

}  // namespace ringtrain::attention
