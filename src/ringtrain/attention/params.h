// What an attention call is: the shape/dtype/mask description used for backend selection (AttnParams)
// and the tensors of one forward or backward call.
//
// Conventions, the same for every backend:
//  - Layout BSHD: q [B, Sq, Hq, D], k/v [B, Skv, Hkv, D]; BHSD is the same view with other strides.
//    Packed (THD): q [Tq, Hq, D], k/v [Tkv, Hkv, D] with cu_seqlens (int32, B+1 entries, leading 0).
//  - LSE is fp32, natural log: [B, Hq, Sq] (BSHD) or [Hq, Tq] (THD). A query row with no visible key
//    has LSE = -inf and O = 0, and contributes nothing to any gradient.
//  - GQA/MQA: query head h reads kv head h / (Hq / Hkv); KV is never repeated.
//  - Causal masks are prefixes: query i sees keys [0, key_limit(i)). Top-left: key_limit = i + 1.
//    Bottom-right (aligned to the end, as FlashAttention does for Sq != Skv): i + 1 + Skv - Sq.
//  - Sliding window (AttnParams::window = w > 0, causal masks only): query i also sees no key before
//    key_start(i) = key_limit(i) - w (before clamping, then clamped to [0, Skv]), so it sees the w most recent keys
//    up to and including its diagonal: [key_limit(i) - w, key_limit(i)). This is Hugging Face's Mistral/Qwen2
//    `sliding_window` (transformers' masking_utils: key j is visible to query i when j <= i and i - j < w, with i
//    the query's position, i.e. its row plus Skv - Sq for a bottom-right mask). w = 0 means no window.
//  - Additive bias (PyTorch SDPA attn_mask semantics): score(i, j) = scale * q_i . k_j + bias(b, h, i, j), added
//    before the causal mask and the softmax; -inf entries hide keys. bias is [B or 1, Hq or 1, Sq, Skv] in any
//    float dtype; a size-1 (or stride-0) batch/head dimension broadcasts. Dense (BSHD) calls only. The bias is a
//    constant: no backend produces its gradient.
//  - KV cache (kv_cache, forward only, dense BSHD, no bias): k/v are a padded cache [B, Skv = capacity, Hkv, D] of
//    which sequence b uses its first kv_used[b] rows (AttnForwardArgs::kv_used, int32 [B] on the device, each in
//    [0, Skv]). Causal masks align to the used length: query row i of Sq sees keys [0, kv_used[b] - Sq + i + 1)
//    (bottom-right), or all kv_used[b] keys (none). The decode backend serves these calls; every other one rejects
//    them.
#pragma once

#include <cstdint>
#include <string>

#include "ringtrain/core/host_device.h"
#include "ringtrain/core/tensor.h"

namespace ringtrain::attention {

enum class MaskType : uint8_t { None, CausalTopLeft, CausalBottomRight };
std::string mask_name(MaskType m);
MaskType parse_mask(const std::string& name);  // none, causal (= top-left), causal_top_left, causal_bottom_right

struct AttnParams {
  Device device;
  DType dtype = DType::F32;  // of Q, K, V, dO
  int64_t batch = 1;         // sequences (packed: number of sequences)
  int64_t heads_q = 1;
  int64_t heads_kv = 1;
  int64_t head_dim = 64;
  int64_t seqlen_q = 0;   // packed: the longest sequence
  int64_t seqlen_kv = 0;  // packed: the longest sequence
  MaskType mask = MaskType::None;
  float softmax_scale = 0.f;  // 0 means 1/sqrt(head_dim)
  bool packed = false;        // THD with cu_seqlens
  bool deterministic = false;
  bool has_bias = false;      // the call passes an additive bias tensor (see the conventions above)
  bool kv_cache = false;      // k/v are a padded KV cache with per-sequence used lengths (see the conventions above)
  int64_t window = 0;         // sliding window in keys, causal masks only (see the conventions above); 0: none

  float scale() const;
  // Everything that can change which backend serves the call (the selection cache key).
  std::string key() const;
  // One human-readable line: "cpu fp32 B=1 Hq=8 Hkv=2 D=64 Sq=4096 Skv=4096 mask=causal_top_left".
  std::string describe() const;
};

// Number of keys query row i (0-based) may see in a segment of sq queries and skv keys.
RT_HOST_DEVICE inline int64_t key_limit(MaskType m, int64_t i, int64_t sq, int64_t skv) {
  int64_t lim = skv;
  if (m == MaskType::CausalTopLeft) lim = i + 1;
  if (m == MaskType::CausalBottomRight) lim = i + 1 + skv - sq;
  return lim < 0 ? 0 : (lim > skv ? skv : lim);
}

// The window to put in the params of a call whose sequences have at most `keys` keys: 0 when `window` hides nothing
// there (a causal query never has more keys), so that backends which take no window stay eligible.
RT_HOST_DEVICE inline int64_t masking_window(int64_t window, int64_t keys) { return window >= keys ? 0 : window; }

// First key query row i may see: 0 without a window, else the unclamped causal limit minus the window, clamped to
// [0, skv]. Row i sees [key_start, key_limit), nothing when key_start >= key_limit.
RT_HOST_DEVICE inline int64_t key_start(MaskType m, int64_t window, int64_t i, int64_t sq, int64_t skv) {
  if (window <= 0 || m == MaskType::None) return 0;
  const int64_t start = i + 1 + (m == MaskType::CausalBottomRight ? skv - sq : 0) - window;
  return start < 0 ? 0 : (start > skv ? skv : start);
}

struct AttnForwardArgs {
  TensorView q, k, v;
  TensorView o;    // like q; its dtype may differ from q's (fp32 partial results under CP)
  TensorView lse;  // fp32
  TensorView cu_seqlens_q, cu_seqlens_kv;  // int32 [B + 1], packed only, on the tensors' device
  void* stream = nullptr;                  // cudaStream_t for GPU backends
  TensorView bias;                         // [B|1, Hq|1, Sq, Skv], any float dtype; only when params.has_bias
  TensorView kv_used;                      // int32 [B] on the tensors' device; only when params.kv_cache
};

struct AttnBackwardArgs {
  TensorView q, k, v, o, dout, lse;  // o and lse are the final forward results (under CP: the merged ones)
  TensorView dq, dk, dv;
  bool accumulate = false;  // add into dq/dk/dv (then fp32) instead of overwriting them
  TensorView cu_seqlens_q, cu_seqlens_kv;
  void* stream = nullptr;
  TensorView bias;  // the forward's bias (only when params.has_bias); treated as a constant (no gradient)
};

// The sizes themselves: positive batch/heads/head_dim, non-negative lengths, heads_q a multiple of heads_kv, element
// counts within 64 bits; a window in [0, 2^31) and only with a causal mask. The error names the params.
void validate_params(const AttnParams& p);
// Shape/dtype/device checks of the tensors against the params (and validate_params); the error names the tensor and
// its shape.
void validate(const AttnParams& p, const AttnForwardArgs& a);
void validate(const AttnParams& p, const AttnBackwardArgs& a);

// A validated bias with stride 0 in its size-1 batch/head dimensions, so that element (b, h, i, j) is at
// b*stride[0] + h*stride[1] + i*stride[2] + j*stride[3] for every b < B and h < Hq.
TensorView bias_broadcast_view(const TensorView& bias);

// Every backend but decode rejects KV-cache calls with this reason.
std::string kv_cache_reason();
// The reason of a backend that cannot serve a sliding window (p.window > 0); `why` says what lacks it.
std::string window_reason(const AttnParams& p, const std::string& why);

// Params describing dense BSHD tensors q [B,Sq,Hq,D] and k [B,Skv,Hkv,D].
AttnParams params_for(const TensorView& q, const TensorView& k, MaskType mask, float softmax_scale = 0.f);

}  // namespace ringtrain::attention
