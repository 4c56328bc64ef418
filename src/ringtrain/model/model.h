// A causal-LM policy model on the CPU: embedding, decoder layers, final RMSNorm; the LM head is applied by
// logprobs.h in chunks. Weights and their gradients are flat buffers laid out by ParamLayout (Hugging Face
// names). T is float for real use and double for gradient checks.
//
// The model is constructed with an attention-backend allow-list (the original system's sdpa_method) and
// opens BackendScope("model", list) around its attention calls: inside a context-parallel scope that list
// can only narrow the choice further, never widen it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "ringtrain/attention/backend.h"
#include "ringtrain/model/decoder_layer.h"
#include "ringtrain/model/hf_config.h"
#include "ringtrain/model/params.h"
#include "ringtrain/model/sequence_attention.h"

namespace ringtrain::model {

struct ModelOptions {
  std::vector<attention::BackendId> attention_backends;  // the model's allow-list; empty = all backends
  // Activation checkpointing per layer: layer i keeps only its input and recomputes its forward in backward
  // when checkpoint_layers[i] is true (layers past the end of the list are not checkpointed).
  std::vector<bool> checkpoint_layers;
  static std::vector<bool> checkpoint_all(int64_t layers) { return std::vector<bool>(static_cast<size_t>(layers), true); }
  // The list the model's BackendScope opens with: attention_backends, or every backend when it is empty.
  std::vector<attention::BackendId> allowed_backends() const;
};

template <typename T>
class Model {
 public:
  Model(ModelConfig config, std::vector<float> params, ModelOptions options = {});
  // Over weights shared read-only with other models (in-process ranks scoring with the same weights): a Model<float>
  // reads them in place until something asks for writable params(), which copies them first (copy on write); a
  // Model<double> converts them into its own buffer.
  Model(ModelConfig config, std::shared_ptr<const std::vector<float>> params, ModelOptions options = {});
  // config.json + safetensors from a checkpoint folder.
  static Model load(const std::filesystem::path& dir, ModelOptions options = {});

  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  // Writable weights (a model over shared weights takes its own copy here).
  std::vector<T>& params();
  const std::vector<T>& params() const { return shared_ ? *shared_ : params_; }
  bool shares_params() const { return shared_ != nullptr; }
  // Allocated (zeroed) by zero_grads() or the first backward(); empty before, so scoring-only models pay nothing.
  std::vector<T>& grads() { return grads_; }
  const std::vector<T>& grads() const { return grads_; }
  void zero_grads();
  const T* lm_head() const { return weights() + layout_.lm_head; }
  T* lm_head_grad() {
    if (grads_.empty()) zero_grads();
    return grads_.data() + layout_.lm_head;
  }
  // The final-normed hidden states of the last forward.
  const std::vector<T>& hidden() const { return hidden_; }

  // tokens/positions [batch * seqlen] (this rank's tokens under CP). Returns the final-normed hidden states
  // [batch * seqlen, hidden]. With for_backward the activations backward() needs are kept.
  const std::vector<T>& forward(const int32_t* tokens, const int32_t* positions, int64_t batch, int64_t seqlen,
                                SequenceAttention& attention, bool for_backward);
  // d_hidden: d(loss)/d(forward's result). Adds every parameter's gradient into grads().
  void backward(const T* d_hidden, SequenceAttention& attention);

 private:
  LayerCall layer_call(size_t layer, SequenceAttention& attention) const;
  const T* weights() const { return shared_ ? shared_->data() : params_.data(); }
  bool checkpointed(size_t layer) const;

  ModelConfig config_;
  ParamLayout layout_;
  ModelOptions options_;
  std::vector<float> inv_freq_;
  std::vector<T> params_, grads_;
  std::shared_ptr<const std::vector<T>> shared_;  // when set, the weights (params_ is empty)
  // Saved by forward for backward.
  std::vector<int32_t> tokens_, positions_;
  int64_t batch_ = 0, seqlen_ = 0;
  bool have_activations_ = false;
  std::vector<LayerActs<T>> acts_;
  std::vector<T> final_in_, final_rstd_, hidden_;
};

extern template class Model<float>;
extern template class Model<double>;

}  // namespace ringtrain::model
