// One decoder layer (pre-norm): x + Attn(RMSNorm(x)), then + MLP(RMSNorm(·)), with the activations its
// backward needs. Attention runs through a SequenceAttention (one rank, or a CP ring) on BSHD views.
#pragma once

#include <cstdint>
#include <vector>

#include "ringtrain/model/hf_config.h"
#include "ringtrain/model/params.h"
#include "ringtrain/model/sequence_attention.h"

namespace ringtrain::model {

template <typename T>
struct LayerActs {
  std::vector<T> x_in;                        // [N, hidden] layer input (the residual)
  std::vector<T> norm1, rstd1;                // input RMSNorm output and 1/rms per row
  std::vector<T> q_raw, k_raw, rstd_q, rstd_k;  // Qwen3: q/k before their per-head RMSNorm
  std::vector<T> q, k, v;                     // after bias, norm and RoPE: [N, heads, head_dim]
  std::vector<T> attn;                        // attention output [N, heads * head_dim]
  std::vector<float> lse;                     // [B, heads, S] (the attention layer's fp32 convention)
  std::vector<T> mid, norm2, rstd2;           // after the attention residual; post-attention RMSNorm
  std::vector<T> gate, up, act;               // MLP [N, ffn]
  // Drops everything but x_in (activation checkpointing keeps only the layer input).
  void release_all_but_input();
};

// The shape of one call: B sequences of S local tokens at explicit positions [B * S].
struct LayerCall {
  const ModelConfig* config;
  const LayerOffsets* offsets;
  const int32_t* positions;
  int64_t batch, seqlen;
  const std::vector<float>* inv_freq;
  SequenceAttention* attention;
  int64_t window;  // the layer's sliding window (ModelConfig::layer_window), 0: none
};

// Reads acts.x_in, fills the rest of acts and writes x_out [N, hidden].
template <typename T>
void decoder_layer_forward(const LayerCall& call, const T* params, LayerActs<T>& acts, T* x_out);
// dx: on entry d(loss)/d(x_out), on return d(loss)/d(x_in). Parameter gradients are added into grads.
template <typename T>
void decoder_layer_backward(const LayerCall& call, const T* params, T* grads, const LayerActs<T>& acts, T* dx);

}  // namespace ringtrain::model
