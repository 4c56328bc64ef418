#include "ringtrain/model/model.h"

#include <type_traits>

#include "ringtrain/attention/selection.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/layers.h"

namespace ringtrain::model {

std::vector<attention::BackendId> ModelOptions::allowed_backends() const {
  if (!attention_backends.empty()) return attention_backends;
  return {std::begin(attention::kAllBackends), std::end(attention::kAllBackends)};
}

template <typename T>
Model<T>::Model(ModelConfig config, std::vector<float> params, ModelOptions options)
    : config_(std::move(config)), layout_(config_), options_(std::move(options)) {
  RT_CHECK(static_cast<int64_t>(params.size()) == layout_.total(), "model: ", params.size(),
           " parameter values for a layout of ", layout_.total());
  inv_freq_ = rope_inv_freq(config_.rope, config_.head_dim);
  if constexpr (std::is_same_v<T, float>) params_ = std::move(params);  // no second copy of the weights
  else params_.assign(params.begin(), params.end());
}

template <typename T>
Model<T>::Model(ModelConfig config, std::shared_ptr<const std::vector<float>> params, ModelOptions options)
    : config_(std::move(config)), layout_(config_), options_(std::move(options)) {
  RT_CHECK(params != nullptr, "model: no weights");
  RT_CHECK(static_cast<int64_t>(params->size()) == layout_.total(), "model: ", params->size(),
           " parameter values for a layout of ", layout_.total());
  inv_freq_ = rope_inv_freq(config_.rope, config_.head_dim);
  if constexpr (std::is_same_v<T, float>) shared_ = std::move(params);
  else params_.assign(params->begin(), params->end());
}

template <typename T>
std::vector<T>& Model<T>::params() {
  if (shared_) {
    params_.assign(shared_->begin(), shared_->end());
    shared_.reset();
  }
  return params_;
}

template <typename T>
Model<T> Model<T>::load(const std::filesystem::path& dir, ModelOptions options) {
  ModelConfig c = load_config(dir);
  std::vector<float> values = load_checkpoint_params(dir, c);
  return Model(std::move(c), std::move(values), std::move(options));
}

template <typename T>
void Model<T>::zero_grads() {
  grads_.assign(static_cast<size_t>(layout_.total()), T(0));
}

template <typename T>
LayerCall Model<T>::layer_call(size_t layer, SequenceAttention& attention) const {
  return LayerCall{&config_, &layout_.layers[layer], positions_.data(), batch_, seqlen_, &inv_freq_, &attention,
                   config_.layer_window(static_cast<int64_t>(layer))};
}

template <typename T>
bool Model<T>::checkpointed(size_t layer) const {
  return layer < options_.checkpoint_layers.size() && options_.checkpoint_layers[layer];
}

template <typename T>
const std::vector<T>& Model<T>::forward(const int32_t* tokens, const int32_t* positions, int64_t batch,
                                        int64_t seqlen, SequenceAttention& attention, bool for_backward) {
  check_sequence_supported(config_, attention.total_seqlen(seqlen));
  const int64_t N = batch * seqlen, H = config_.hidden;
  tokens_.assign(tokens, tokens + N);
  positions_.assign(positions, positions + N);
  batch_ = batch, seqlen_ = seqlen;
  acts_.resize(for_backward ? config_.layers : 1);
  attention::BackendScope scope("model", options_.allowed_backends());
  const attention::BackendScope no_backward = attention::BackendScope::forward_only(!for_backward);

  std::vector<T> x(N * H);
  embedding_forward(x.data(), tokens, weights() + layout_.embed, N, H, config_.vocab);
  for (size_t l = 0; l < static_cast<size_t>(config_.layers); ++l) {
    LayerActs<T>& a = acts_[for_backward ? l : 0];
    a.x_in = std::move(x);
    x.assign(N * H, T(0));
    decoder_layer_forward(layer_call(l, attention), weights(), a, x.data());
    if (!for_backward || checkpointed(l)) a.release_all_but_input();
  }
  final_in_ = std::move(x);
  hidden_.resize(N * H), final_rstd_.resize(N);
  rmsnorm_forward(hidden_.data(), final_rstd_.data(), final_in_.data(), weights() + layout_.final_norm, N, H,
                  config_.rms_eps);
  have_activations_ = for_backward;
  return hidden_;
}

template <typename T>
void Model<T>::backward(const T* d_hidden, SequenceAttention& attention) {
  RT_CHECK(have_activations_, "model backward: forward(..., for_backward=true) must run first");
  have_activations_ = false;
  if (grads_.empty()) zero_grads();
  const int64_t N = batch_ * seqlen_, H = config_.hidden;
  attention::BackendScope scope("model", options_.allowed_backends());
  std::vector<T> dx(N * H, T(0));
  rmsnorm_backward(dx.data(), grads_.data() + layout_.final_norm, d_hidden, final_in_.data(),
                   weights() + layout_.final_norm, final_rstd_.data(), N, H);
  for (size_t l = acts_.size(); l-- > 0;) {
    LayerActs<T>& a = acts_[l];
    const LayerCall call = layer_call(l, attention);
    if (checkpointed(l)) {  // recompute this layer's activations from its saved input
      std::vector<T> unused(N * H);
      decoder_layer_forward(call, weights(), a, unused.data());
    }
    decoder_layer_backward(call, weights(), grads_.data(), a, dx.data());
    a.release_all_but_input();
  }
  embedding_backward(grads_.data() + layout_.embed, tokens_.data(), dx.data(), N, H);
}

template class Model<float>;
template class Model<double>;

}  // namespace ringtrain::model
