// The causal-LM policy model on one GPU: the same computation as model/model.h (embedding, pre-norm decoder
// layers, final RMSNorm; the LM head is applied by gpu_logprobs.h in chunks) in bf16 with fp32 accumulation.
//
// What is fp32: RMSNorm statistics (rstd), the attention LSE, RoPE frequencies, the LM-head logits and
// log-softmax (gpu_logprobs.h), and every weight gradient (the master gradients). Weights and activations are bf16.
//
// Weights live in one bf16 device buffer, gradients in one fp32 device buffer of the same layout, which groups
// each layer's q/k/v projections into one [(hq + 2 hkv) d, hidden] matrix (and their biases into one vector) and
// gate/up into one [2 ffn, hidden] matrix, the fused layouts of layer_kernels.h. Every Hugging Face tensor is still
// one contiguous slice of those buffers, so gradients read back by name.
//
// Everything runs on the legacy default stream, where the attention backends and CP run when given no stream.
// Attention goes through a SequenceAttention (make_local_attention, or make_cp_attention over an NCCL
// communicator) on dense BSHD device views, inside BackendScope("model", allow-list) as the CPU model does.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/core/cuda/gemm.h"
#include "ringtrain/core/tensor.h"
#include "ringtrain/model/cuda/layer_kernels.h"
#include "ringtrain/model/model.h"

namespace ringtrain::model::cuda {

using ringtrain::cuda::Gemm;  // the cuBLASLt products are core's

// A weight gradient to add into; `fresh` while it holds nothing since zero_grads(), so that the first contribution
// writes it instead of adding (and nothing has to clear it first).
struct GradSlot {
  float* data = nullptr;
  bool fresh = false;
};

// Offsets (elements) of one layer's weights in the device buffers; -1 where the architecture has none.
struct GpuLayerOffsets {
  int64_t input_norm = -1, qkv = -1, qkv_bias = -1, o_w = -1, o_b = -1, q_norm = -1, k_norm = -1;
  int64_t post_norm = -1, gate_up = -1, down = -1;
};

// Where every Hugging Face tensor of a ParamLayout lives in the device buffers. The matrices come first; the
// vectors whose gradients are sums of per-row atomics (norm weights, biases) follow from summed_begin() on, so that
// one memset clears all of those.
class GpuParamLayout {
 public:
  explicit GpuParamLayout(const ParamLayout& host);
  int64_t total() const { return total_; }
  int64_t summed_begin() const { return summed_begin_; }
  // device_offset[i] is where host.specs()[i] starts.
  const std::vector<int64_t>& device_offsets() const { return device_offset_; }
  int64_t embed = -1, final_norm = -1, lm_head = -1;  // lm_head == embed when tied
  std::vector<GpuLayerOffsets> layers;

 private:
  int64_t place(const ParamLayout& host, int64_t host_offset, bool new_group = true);
  std::vector<int64_t> device_offset_;
  int64_t total_ = 0, summed_begin_ = 0;
};

// Device buffers of one decoder layer's forward (bf16 unless marked fp32), for N = batch * seqlen tokens.
struct GpuLayerActs {
  Tensor norm1, rstd1;       // input RMSNorm [N, hidden], fp32 [N]
  Tensor qkv;                // fused projection [N, (hq + 2 hkv) d] before norm/RoPE (qkv_split_backward reads it)
  Tensor rstd_q, rstd_k;     // fp32 [N, hq], [N, hkv]: Qwen3's per-head norms
  Tensor q, k, v;            // attention inputs [N, heads, d] after norm and RoPE
  Tensor attn, lse;          // attention output [N, hq d], fp32 LSE [B, hq, S]
  Tensor mid, norm2, rstd2;  // after the attention residual; post-attention RMSNorm
  Tensor gate_up, act;       // MLP [N, 2 ffn], [N, ffn]
  void allocate(const ModelConfig& c, int64_t batch, int64_t seqlen, Device device);
};

class GpuModel {
 public:
  // params: host fp32 values in ParamLayout order (as Model<float> holds them), converted to bf16 on upload.
  // Every constructor makes `device` the calling thread's current CUDA device: the model's kernels run there.
  GpuModel(ModelConfig config, const std::vector<float>& params, ModelOptions options = {}, int device = 0);
  // Weights drawn on the device as transformers initialises causal LMs (N(0, 0.02) matrices, unit norms, zero
  // biases), from `seed` with fill_normal_hashed: for benchmarks, where a host copy of 1B values is waste.
  static GpuModel random(ModelConfig config, uint64_t seed, ModelOptions options = {}, int device = 0);
  static GpuModel load(const std::filesystem::path& dir, ModelOptions options = {}, int device = 0);
  GpuModel(GpuModel&&) noexcept;
  GpuModel& operator=(GpuModel&&) noexcept;
  ~GpuModel();

  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  Device device() const { return device_; }
  cudaStream_t stream() const { return nullptr; }
  Gemm& gemm() { return *gemm_; }

  const bf16* lm_head() const { return weights_.ptr<bf16>() + dev_.lm_head; }
  // The LM head's gradient, for the chunked LM-head backward (gpu_logprobs.h), which writes it whole: from here on
  // it counts as written.
  GradSlot lm_head_grad();
  // Makes every fp32 gradient zero (allocated by the first call or the first backward) without a pass over them:
  // the next backward's weight-gradient GEMMs and the LM head's first chunk overwrite instead of adding, and only
  // the gradients summed by atomics (the vectors past summed_begin, an untied embedding) are cleared then.
  void zero_grads();
  // Every gradient as host fp32 in ParamLayout order (the CPU model's grads() layout); complete when it returns.
  std::vector<float> grads() const;
  // One gradient by its Hugging Face name; an unknown name is an error naming it.
  std::vector<float> grad(const std::string& name) const;
  // The device buffers themselves (dev_layout() order), for an optimizer: the bf16 weights, and the fp32 gradients
  // with every slice that zero_grads() marked but no backward wrote made zero on the device first.
  TensorView weight_buffer() { return weights_.view(); }
  TensorView grad_buffer();
  const GpuParamLayout& dev_layout() const { return dev_; }
  // Host fp32 values in ParamLayout order: downloaded from the bf16 weights, and uploaded (rounded to bf16).
  std::vector<float> params() const;
  void set_params(const std::vector<float>& values);
  // Bytes of the weights and gradients (what the benchmark counts as "weights").
  size_t weight_bytes() const;

  // tokens/positions: host [batch * seqlen] (this rank's tokens under CP, at their true positions). Returns the
  // final-normed hidden states [batch * seqlen, hidden] on the device (valid until the next forward). With
  // for_backward, what backward() needs is kept: every layer's activations, or only the input of a checkpointed
  // layer. Enqueued on stream(); tokens are checked against the vocabulary on the host.
  const bf16* forward(const int32_t* tokens, const int32_t* positions, int64_t batch, int64_t seqlen,
                      SequenceAttention& attention, bool for_backward);
  // The same forward from device tokens and positions, which the caller guarantees to be inside the vocabulary:
  // nothing waits for the device (the GPU sampler's decoding steps, scoring and training from token rows).
  const bf16* forward_on_device(const int32_t* tokens, const int32_t* positions, int64_t batch, int64_t seqlen,
                                SequenceAttention& attention, bool for_backward = false);
  // d_hidden: device bf16 [batch * seqlen, hidden], d(loss)/d(forward's result). Adds every weight gradient.
  void backward(const bf16* d_hidden, SequenceAttention& attention);
  // Has the next backward() also leave Σ g² over every gradient (the gaps between them excluded), as that backward
  // leaves them, in *device_result, one fp64 on device(), ready for work enqueued on stream() after the backward.
  // Each layer's matrices (and an untied LM head, with the top layer's) are summed on a second stream as soon as the
  // layer's backward has written them, beside the layers below; the embedding and the summed vectors after the last
  // layer. The order of the additions is fixed by the model's shape (bitwise reproducible). zero_grads() withdraws
  // the request.
  void sum_grad_squares_in_next_backward(double* device_result);
  // The last forward's final-normed hidden states [tokens(), hidden] on the device.
  const bf16* hidden() const { return hidden_.ptr<bf16>(); }
  int64_t tokens() const { return batch_ * seqlen_; }

 private:
  GpuModel(ModelConfig config, ModelOptions options, int device);
  bool checkpointed(size_t layer) const;
  void prepare(int64_t batch, int64_t seqlen, bool for_backward);
  // The forward over tokens_ / positions_ (filled for the prepared shape).
  const bf16* run_forward(SequenceAttention& attention, bool for_backward);
  bf16* layer_input(size_t layer);
  void layer_forward(size_t layer, GpuLayerActs& a, const bf16* x_in, bf16* x_out, SequenceAttention& attention);
  void layer_backward(size_t layer, const GpuLayerActs& a, const bf16* x_in, SequenceAttention& attention);
  void release_buffers();
  bool grad_fresh(int64_t device_offset) const;
  void clear_summed_grads();
  class SideSquares;  // gpu_model.cpp
  SideSquares* begin_side_squares();

  ModelConfig config_;
  ParamLayout layout_;
  GpuParamLayout dev_;
  ModelOptions options_;
  Device device_;
  std::unique_ptr<Gemm> gemm_;
  Tensor weights_, grads_, inv_freq_;  // bf16, fp32, fp32 [head_dim / 2]
  // Gradients marked zero by zero_grads() and not written since: the LM head's slice, and all the others.
  bool lm_head_fresh_ = false, body_fresh_ = false;
  // Where the next backward leaves the gradients' sum of squares (null: not asked), and what computes it there.
  double* squares_result_ = nullptr;
  std::unique_ptr<SideSquares> side_squares_;

  // The shape the buffers below were allocated for, and what the last forward kept.
  int64_t batch_ = 0, seqlen_ = 0;
  bool sized_for_backward_ = false, have_activations_ = false;
  Tensor tokens_, positions_;   // int32 [N]
  std::vector<Tensor> inputs_;  // layer inputs: one per layer with for_backward, else two used in turn
  Tensor final_in_, final_rstd_, hidden_;
  std::vector<GpuLayerActs> saved_;  // per layer when for_backward and not checkpointed (else empty tensors)
  GpuLayerActs scratch_;             // the activations of scoring and of checkpointed layers
  // Backward work buffers, shared by all layers: dx_ carries d(loss)/d(residual stream) down the layers.
  Tensor dx_, d_norm_, d_act_, d_gate_up_, d_attn_, dq_, dk_, dv_, d_qkv_;
};

}  // namespace ringtrain::model::cuda
