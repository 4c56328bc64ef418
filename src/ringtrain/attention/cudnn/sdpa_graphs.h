// cuDNN 9 SDPA graphs (frontend graph API), built once per shape/stride key and cached. This header keeps the
// frontend out of every other translation unit: sdpa_graphs.cpp is the only file that includes it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "ringtrain/attention/params.h"

namespace ringtrain::attention::cudnn {

// Loads libcudnn.so.9 (once). Returns "" when cuDNN is usable, else why not (dlopen error, version too old).
const std::string& load_error();
// cudnnGetVersion(), e.g. 91900; 0 when not loaded.
int64_t backend_version();

// One tensor in cuDNN's (B, H, S, D) order; for packed calls S is the longest sequence and `ragged` points
// at int32 [B + 1] element offsets of each sequence's first token.
struct Tensor4 {
  void* data = nullptr;
  int64_t dim[4] = {};
  int64_t stride[4] = {};
  void* ragged = nullptr;
};

struct SdpaConfig {
  DType dtype = DType::BF16;  // of Q, K, V, O, dO, dQ, dK, dV (cuDNN computes in fp32)
  float scale = 1.f;
  bool causal_top_left = false, causal_bottom_right = false;
  // Sliding window (params.h), with causal_top_left only; 0: none. cuDNN keeps key j for row i when j <= i and
  // i - j < window (frontend 1.8: row < col + window), Hugging Face's rule.
  int64_t window = 0;
  bool deterministic = false;
  // Packed: int32 [B] sequence lengths on the device (padding mask); null for dense calls.
  void* seq_len_q = nullptr;
  void* seq_len_kv = nullptr;
};

// O and Stats (fp32 natural-log LSE, (B, H, Sq, 1)) from Q, K, V.
void sdpa_forward(int device, cudaStream_t stream, const SdpaConfig& c, const Tensor4& q, const Tensor4& k,
                  const Tensor4& v, const Tensor4& o, const Tensor4& stats);

// dQ, dK, dV from Q, K, V, O, dO and Stats. O and dO must have identical strides.
void sdpa_backward(int device, cudaStream_t stream, const SdpaConfig& c, const Tensor4& q, const Tensor4& k,
                   const Tensor4& v, const Tensor4& o, const Tensor4& dout, const Tensor4& stats, const Tensor4& dq,
                   const Tensor4& dk, const Tensor4& dv);

}  // namespace ringtrain::attention::cudnn
