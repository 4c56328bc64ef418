#include "ringtrain/model/cuda/gpu_model.h"

#include <memory>

#include "ringtrain/attention/selection.h"
#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/cuda/reduce.h"
#include "ringtrain/core/error.h"
#include "ringtrain/model/layers.h"

namespace ringtrain::model::cuda {
namespace {

// Groups of weights start at a multiple of 64 elements (128 bytes in bf16), the alignment cuBLASLt's fastest
// kernels want; inside a fused group (q/k/v, gate/up) tensors follow each other without a gap.
constexpr int64_t kGroupAlign = 64;


template <typename T>
T* at(T* base, int64_t offset) {
  return offset < 0 ? nullptr : base + offset;
}

TensorView bshd(const Tensor& t, int64_t b, int64_t s, int64_t h, int64_t d) {
  return contiguous_view(t.data(), DType::BF16, t.view().device, {b, s, h, d});
}

}  // namespace

GpuParamLayout::GpuParamLayout(const ParamLayout& host) : device_offset_(host.specs().size(), -1) {
  embed = place(host, host.embed);
  layers.resize(host.layers.size());
  for (size_t l = 0; l < host.layers.size(); ++l) {
    const LayerOffsets& h = host.layers[l];
    GpuLayerOffsets& d = layers[l];
    d.qkv = place(host, h.q_w);
    place(host, h.k_w, /*new_group=*/false);
    place(host, h.v_w, false);
    d.o_w = place(host, h.o_w);
    d.gate_up = place(host, h.gate);
    place(host, h.up, false);
    d.down = place(host, h.down);
  }
  lm_head = host.lm_head == host.embed ? embed : place(host, host.lm_head);
  summed_begin_ = (total_ + kGroupAlign - 1) / kGroupAlign * kGroupAlign;
  for (size_t l = 0; l < host.layers.size(); ++l) {
    const LayerOffsets& h = host.layers[l];
    GpuLayerOffsets& d = layers[l];
    d.input_norm = place(host, h.input_norm);
    if (h.q_b >= 0) {
      d.qkv_bias = place(host, h.q_b);
      place(host, h.k_b, false);
      place(host, h.v_b, false);
    }
    if (h.o_b >= 0) d.o_b = place(host, h.o_b);
    if (h.q_norm >= 0) d.q_norm = place(host, h.q_norm), d.k_norm = place(host, h.k_norm);
    d.post_norm = place(host, h.post_norm);
  }
  final_norm = place(host, host.final_norm);
  for (size_t i = 0; i < device_offset_.size(); ++i)
    RT_CHECK(device_offset_[i] >= 0, "gpu model: weight '", host.specs()[i].name, "' has no place on the device");
}

int64_t GpuParamLayout::place(const ParamLayout& host, int64_t host_offset, bool new_group) {
  const std::vector<ParamSpec>& specs = host.specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].offset != host_offset) continue;
    if (new_group) total_ = (total_ + kGroupAlign - 1) / kGroupAlign * kGroupAlign;
    device_offset_[i] = total_;
    total_ += specs[i].numel;
    return device_offset_[i];
  }
  throw Error(cat("gpu model: no weight at host offset ", host_offset));
}

void GpuLayerActs::allocate(const ModelConfig& c, int64_t batch, int64_t seqlen, Device device) {
  const int64_t N = batch * seqlen, H = c.hidden, D = c.head_dim;
  norm1 = Tensor::empty({N, H}, DType::BF16, device);
  rstd1 = Tensor::empty({N}, DType::F32, device);
  qkv = Tensor::empty({N, (c.heads + 2 * c.kv_heads) * D}, DType::BF16, device);
  if (c.qk_norm) {
    rstd_q = Tensor::empty({N, c.heads}, DType::F32, device);
    rstd_k = Tensor::empty({N, c.kv_heads}, DType::F32, device);
  }
  q = Tensor::empty({N, c.heads, D}, DType::BF16, device);
  k = Tensor::empty({N, c.kv_heads, D}, DType::BF16, device);
  v = Tensor::empty({N, c.kv_heads, D}, DType::BF16, device);
  attn = Tensor::empty({N, c.heads * D}, DType::BF16, device);
  lse = Tensor::empty({batch, c.heads, seqlen}, DType::F32, device);
  mid = Tensor::empty({N, H}, DType::BF16, device);
  norm2 = Tensor::empty({N, H}, DType::BF16, device);
  rstd2 = Tensor::empty({N}, DType::F32, device);
  gate_up = Tensor::empty({N, 2 * c.ffn}, DType::BF16, device);
  act = Tensor::empty({N, c.ffn}, DType::BF16, device);
}

GpuModel::GpuModel(ModelConfig config, ModelOptions options, int device)
    : config_(std::move(config)), layout_(config_), dev_(layout_), options_(std::move(options)),
      device_(Device::cuda(device)) {
  RT_CUDA_CHECK(cudaSetDevice(device));
  gemm_ = std::make_unique<Gemm>(stream());
  weights_ = Tensor::empty({dev_.total()}, DType::BF16, device_);
  const std::vector<float> inv_freq = rope_inv_freq(config_.rope, config_.head_dim);
  inv_freq_ = Tensor::empty({static_cast<int64_t>(inv_freq.size())}, DType::F32, device_);
  copy(inv_freq_, contiguous_view(const_cast<float*>(inv_freq.data()), DType::F32, Device::cpu(),
                                  {static_cast<int64_t>(inv_freq.size())}));
}

// The gradients' sum of squares of one backward, range by range into slots summed at the end. The ranges a layer's
// backward finishes are summed on `stream` (non-blocking, so that it runs beside the legacy default stream) with few
// blocks, to leave the multiprocessors to the backward; the rest on the model's stream after the last layer.
class GpuModel::SideSquares {
 public:
  static constexpr int kBesideBlocks = 128;

  SideSquares() {
    RT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "the gradient norm's stream");
    RT_CUDA_CHECK(cudaEventCreateWithFlags(&written_, cudaEventDisableTiming), "the gradient norm's events");
    RT_CUDA_CHECK(cudaEventCreateWithFlags(&summed_, cudaEventDisableTiming), "the gradient norm's events");
  }
  ~SideSquares() {
    cudaEventDestroy(summed_);
    cudaEventDestroy(written_);
    cudaStreamDestroy(stream_);
  }
  SideSquares(const SideSquares&) = delete;
  SideSquares& operator=(const SideSquares&) = delete;

  void begin(int64_t max_ranges, Device device) {
    RT_CHECK(max_ranges <= cuda_ops::kMaxSumBlocks, "gpu model: ", max_ranges,
             " gradient ranges to sum beside the backward exceed ", cuda_ops::kMaxSumBlocks);
    if (slots_.numel() < max_ranges) {
      slots_ = Tensor::empty({max_ranges}, DType::F64, device);
      partial_ = Tensor::empty({max_ranges * cuda_ops::kMaxSumBlocks}, DType::F64, device);
    }
    used_ = 0;
  }
  // Everything enqueued on `main` so far is ordered before the ranges added beside it from now on.
  void wait_for(cudaStream_t main) {
    RT_CUDA_CHECK(cudaEventRecord(written_, main), "the gradient norm's events");
    RT_CUDA_CHECK(cudaStreamWaitEvent(stream_, written_, 0), "the gradient norm's events");
  }
  void add_beside(const float* x, int64_t n) { add(x, n, stream_, kBesideBlocks); }
  void add(const float* x, int64_t n, cudaStream_t st, int blocks) {
    RT_CHECK(used_ < slots_.numel(), "gpu model: more gradient ranges than planned");
    cuda_ops::sum_of_squares(x, n, cuda_ops::sum_blocks_for(n, blocks),
                             partial_.ptr<double>() + used_ * cuda_ops::kMaxSumBlocks, slots_.ptr<double>() + used_,
                             st);
    ++used_;
  }
  // The slots' sum into *result on `main`, after the ranges summed beside it.
  void finish(cudaStream_t main, double* result) {
    RT_CUDA_CHECK(cudaEventRecord(summed_, stream_), "the gradient norm's events");
    RT_CUDA_CHECK(cudaStreamWaitEvent(main, summed_, 0), "the gradient norm's events");
    cuda_ops::sum(slots_.ptr<double>(), static_cast<int>(used_), result, main);
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t written_ = nullptr, summed_ = nullptr;
  Tensor slots_, partial_;
  int64_t used_ = 0;
};

GpuModel::GpuModel(GpuModel&&) noexcept = default;
GpuModel& GpuModel::operator=(GpuModel&&) noexcept = default;
GpuModel::~GpuModel() = default;

GpuModel::GpuModel(ModelConfig config, const std::vector<float>& params, ModelOptions options, int device)
    : GpuModel(std::move(config), std::move(options), device) {
  set_params(params);
}

void GpuModel::set_params(const std::vector<float>& values) {
  RT_CHECK(static_cast<int64_t>(values.size()) == layout_.total(), "gpu model: ", values.size(),
           " parameter values for a layout of ", layout_.total());
  const std::vector<ParamSpec>& specs = layout_.specs();
  for (size_t i = 0; i < specs.size(); ++i)  // fp32 -> bf16 (round to nearest) in copy()
    copy(contiguous_view(weights_.ptr<bf16>() + dev_.device_offsets()[i], DType::BF16, device_, {specs[i].numel}),
         contiguous_view(const_cast<float*>(values.data()) + specs[i].offset, DType::F32, Device::cpu(),
                         {specs[i].numel}));
}

std::vector<float> GpuModel::params() const {
  std::vector<float> out(static_cast<size_t>(layout_.total()));
  const std::vector<ParamSpec>& specs = layout_.specs();
  for (size_t i = 0; i < specs.size(); ++i)
    copy(contiguous_view(out.data() + specs[i].offset, DType::F32, Device::cpu(), {specs[i].numel}),
         contiguous_view(weights_.ptr<bf16>() + dev_.device_offsets()[i], DType::BF16, device_, {specs[i].numel}));
  return out;
}

GpuModel GpuModel::random(ModelConfig config, uint64_t seed, ModelOptions options, int device) {
  GpuModel m(std::move(config), std::move(options), device);
  const std::vector<ParamSpec>& specs = m.layout_.specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorView w = contiguous_view(m.weights_.ptr<bf16>() + m.dev_.device_offsets()[i], DType::BF16,
                                         m.device_, {specs[i].numel});
    if (specs[i].name.ends_with("norm.weight")) fill(w, 1.0);
    else if (specs[i].name.ends_with(".bias")) fill(w, 0.0);
    else fill_normal_hashed(w, seed + i, 0.02);
  }
  return m;
}

GpuModel GpuModel::load(const std::filesystem::path& dir, ModelOptions options, int device) {
  ModelConfig c = load_config(dir);
  const std::vector<float> values = load_checkpoint_params(dir, c);
  return GpuModel(std::move(c), values, std::move(options), device);
}

GradSlot GpuModel::lm_head_grad() {
  if (!grads_.defined()) zero_grads();
  const GradSlot slot{grads_.ptr<float>() + dev_.lm_head, lm_head_fresh_};
  lm_head_fresh_ = false;
  return slot;
}

void GpuModel::zero_grads() {
  if (!grads_.defined()) grads_ = Tensor::empty({dev_.total()}, DType::F32, device_);
  lm_head_fresh_ = body_fresh_ = true;
  squares_result_ = nullptr;
}

void GpuModel::sum_grad_squares_in_next_backward(double* device_result) {
  RT_CHECK(device_result != nullptr, "gpu model: no device address for the gradients' sum of squares");
  squares_result_ = device_result;
}

GpuModel::SideSquares* GpuModel::begin_side_squares() {
  if (!side_squares_) side_squares_ = std::make_unique<SideSquares>();
  side_squares_->begin(4 * config_.layers + 3, device_);  // per layer qkv, o, gate/up, down; embedding, head, vectors
  return side_squares_.get();
}

bool GpuModel::grad_fresh(int64_t device_offset) const {
  return device_offset == dev_.lm_head ? lm_head_fresh_ : body_fresh_;
}

// Before a backward that starts from fresh gradients: what it adds with atomics must start from zero. A tied
// embedding is the LM head, already written by the LM-head backward unless that did not run.
void GpuModel::clear_summed_grads() {
  float* G = grads_.ptr<float>();
  const auto clear = [&](int64_t begin, int64_t end) {
    RT_CUDA_CHECK(cudaMemsetAsync(G + begin, 0, static_cast<size_t>(end - begin) * sizeof(float), stream()),
            "clearing the summed gradients");
  };
  clear(dev_.summed_begin(), dev_.total());
  const int64_t embed_end = dev_.embed + config_.vocab * config_.hidden;
  if (dev_.lm_head != dev_.embed || lm_head_fresh_) clear(dev_.embed, embed_end);
  if (dev_.lm_head == dev_.embed) lm_head_fresh_ = false;
}

TensorView GpuModel::grad_buffer() {
  if (!grads_.defined()) zero_grads();
  float* G = grads_.ptr<float>();
  const auto clear = [&](int64_t begin, int64_t end) {
    if (end > begin)
      RT_CUDA_CHECK(cudaMemsetAsync(G + begin, 0, static_cast<size_t>(end - begin) * sizeof(float), stream()),
              "clearing the unwritten gradients");
  };
  const int64_t head_end = dev_.lm_head + config_.vocab * config_.hidden;
  if (body_fresh_) clear(0, dev_.lm_head), clear(head_end, dev_.total());
  if (lm_head_fresh_) clear(dev_.lm_head, head_end);
  body_fresh_ = lm_head_fresh_ = false;
  return grads_.view();
}

std::vector<float> GpuModel::grads() const {
  std::vector<float> out(static_cast<size_t>(layout_.total()), 0.f);
  if (!grads_.defined()) return out;
  RT_CUDA_CHECK(cudaStreamSynchronize(stream()), "waiting for the gradients");
  const std::vector<ParamSpec>& specs = layout_.specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t at_device = dev_.device_offsets()[i];
    if (grad_fresh(at_device)) continue;  // zero, and not cleared on the device
    copy(contiguous_view(out.data() + specs[i].offset, DType::F32, Device::cpu(), {specs[i].numel}),
         contiguous_view(grads_.ptr<float>() + at_device, DType::F32, device_, {specs[i].numel}));
  }
  return out;
}

std::vector<float> GpuModel::grad(const std::string& name) const {
  const ParamSpec* spec = layout_.find(name);
  RT_CHECK(spec != nullptr, "gpu model: no weight named '", name, "' in a ", arch_class_name(config_.arch));
  std::vector<float> out(static_cast<size_t>(spec->numel), 0.f);
  if (!grads_.defined()) return out;
  RT_CUDA_CHECK(cudaStreamSynchronize(stream()), "waiting for the gradients");
  const int64_t device_offset = dev_.device_offsets()[static_cast<size_t>(spec - layout_.specs().data())];
  if (grad_fresh(device_offset)) return out;
  copy(contiguous_view(out.data(), DType::F32, Device::cpu(), {spec->numel}),
       contiguous_view(grads_.ptr<float>() + device_offset, DType::F32, device_, {spec->numel}));
  return out;
}

size_t GpuModel::weight_bytes() const { return weights_.nbytes() + grads_.nbytes(); }

bool GpuModel::checkpointed(size_t layer) const {
  return layer < options_.checkpoint_layers.size() && options_.checkpoint_layers[layer];
}

bf16* GpuModel::layer_input(size_t layer) {
  // With for_backward every layer keeps its input; scoring only needs the current and the next one.
  return inputs_[layer % inputs_.size()].ptr<bf16>();
}

void GpuModel::release_buffers() {
  tokens_ = positions_ = final_in_ = final_rstd_ = hidden_ = Tensor();
  inputs_.clear(), saved_.clear();
  scratch_ = GpuLayerActs();
  dx_ = d_norm_ = d_act_ = d_gate_up_ = d_attn_ = dq_ = dk_ = dv_ = d_qkv_ = Tensor();
}

void GpuModel::prepare(int64_t batch, int64_t seqlen, bool for_backward) {
  if (batch == batch_ && seqlen == seqlen_ && for_backward == sized_for_backward_) return;
  release_buffers();  // before allocating, so that old and new buffers never coexist
  const ModelConfig& c = config_;
  const int64_t N = batch * seqlen, H = c.hidden, D = c.head_dim, L = c.layers;
  tokens_ = Tensor::empty({N}, DType::I32, device_);
  positions_ = Tensor::empty({N}, DType::I32, device_);
  inputs_.resize(for_backward ? static_cast<size_t>(L) : 2);
  for (Tensor& t : inputs_) t = Tensor::empty({N, H}, DType::BF16, device_);
  final_in_ = Tensor::empty({N, H}, DType::BF16, device_);
  final_rstd_ = Tensor::empty({N}, DType::F32, device_);
  hidden_ = Tensor::empty({N, H}, DType::BF16, device_);
  bool need_scratch = !for_backward;
  if (for_backward) {
    saved_.resize(static_cast<size_t>(L));
    for (size_t l = 0; l < saved_.size(); ++l) {
      if (checkpointed(l)) need_scratch = true;
      else saved_[l].allocate(c, batch, seqlen, device_);
    }
    const int64_t qd = c.heads * D, kvd = c.kv_heads * D;
    dx_ = Tensor::empty({N, H}, DType::BF16, device_);
    d_norm_ = Tensor::empty({N, H}, DType::BF16, device_);
    d_act_ = Tensor::empty({N, c.ffn}, DType::BF16, device_);
    d_gate_up_ = Tensor::empty({N, 2 * c.ffn}, DType::BF16, device_);
    d_attn_ = Tensor::empty({N, qd}, DType::BF16, device_);
    dq_ = Tensor::empty({N, c.heads, D}, DType::BF16, device_);
    dk_ = Tensor::empty({N, c.kv_heads, D}, DType::BF16, device_);
    dv_ = Tensor::empty({N, c.kv_heads, D}, DType::BF16, device_);
    d_qkv_ = Tensor::empty({N, qd + 2 * kvd}, DType::BF16, device_);
  }
  if (need_scratch) scratch_.allocate(c, batch, seqlen, device_);
  batch_ = batch, seqlen_ = seqlen, sized_for_backward_ = for_backward;
}

const bf16* GpuModel::forward(const int32_t* tokens, const int32_t* positions, int64_t batch, int64_t seqlen,
                              SequenceAttention& attention, bool for_backward) {
  RT_CHECK(batch > 0 && seqlen > 0, "gpu model: empty batch (", batch, " x ", seqlen, ")");
  check_sequence_supported(config_, attention.total_seqlen(seqlen));
  const int64_t N = batch * seqlen;
  for (int64_t i = 0; i < N; ++i)
    RT_CHECK(tokens[i] >= 0 && tokens[i] < config_.vocab, "gpu model: token id ", tokens[i], " at row ", i,
             " is outside the vocabulary [0, ", config_.vocab, ")");
  have_activations_ = false;
  prepare(batch, seqlen, for_backward);
  copy(tokens_, contiguous_view(const_cast<int32_t*>(tokens), DType::I32, Device::cpu(), {N}));
  copy(positions_, contiguous_view(const_cast<int32_t*>(positions), DType::I32, Device::cpu(), {N}));
  return run_forward(attention, for_backward);
}

const bf16* GpuModel::forward_on_device(const int32_t* tokens, const int32_t* positions, int64_t batch, int64_t seqlen,
                                        SequenceAttention& attention, bool for_backward) {
  RT_CHECK(batch > 0 && seqlen > 0, "gpu model: empty batch (", batch, " x ", seqlen, ")");
  check_sequence_supported(config_, attention.total_seqlen(seqlen));
  const size_t bytes = static_cast<size_t>(batch * seqlen) * sizeof(int32_t);
  have_activations_ = false;
  prepare(batch, seqlen, for_backward);
  RT_CUDA_CHECK(cudaMemcpyAsync(tokens_.data(), tokens, bytes, cudaMemcpyDeviceToDevice, stream()), "copying tokens");
  RT_CUDA_CHECK(cudaMemcpyAsync(positions_.data(), positions, bytes, cudaMemcpyDeviceToDevice, stream()),
                "copying positions");
  return run_forward(attention, for_backward);
}

const bf16* GpuModel::run_forward(SequenceAttention& attention, bool for_backward) {
  const int64_t N = batch_ * seqlen_, H = config_.hidden;
  attention::BackendScope scope("model", options_.allowed_backends());
  const attention::BackendScope no_backward = attention::BackendScope::forward_only(!for_backward);

  const bf16* W = weights_.ptr<bf16>();
  embedding_forward(stream(), layer_input(0), tokens_.ptr<int32_t>(), W + dev_.embed, N, H);
  const size_t L = static_cast<size_t>(config_.layers);
  for (size_t l = 0; l < L; ++l) {
    GpuLayerActs& a = for_backward && !checkpointed(l) ? saved_[l] : scratch_;
    bf16* x_out = l + 1 < L ? layer_input(l + 1) : final_in_.ptr<bf16>();
    layer_forward(l, a, layer_input(l), x_out, attention);
  }
  rmsnorm_forward(stream(), hidden_.ptr<bf16>(), final_rstd_.ptr<float>(), final_in_.ptr<bf16>(), W + dev_.final_norm,
                  N, H, static_cast<float>(config_.rms_eps));
  have_activations_ = for_backward;
  return hidden_.ptr<bf16>();
}

void GpuModel::layer_forward(size_t layer, GpuLayerActs& a, const bf16* x_in, bf16* x_out,
                             SequenceAttention& attention) {
  const ModelConfig& c = config_;
  const GpuLayerOffsets& w = dev_.layers[layer];
  const bf16* W = weights_.ptr<bf16>();
  const int64_t B = batch_, S = seqlen_, N = B * S, H = c.hidden, D = c.head_dim, F = c.ffn;
  const int64_t qd = c.heads * D, qkvd = qd + 2 * c.kv_heads * D;
  const float eps = static_cast<float>(c.rms_eps);
  cudaStream_t s = stream();

  rmsnorm_forward(s, a.norm1.ptr<bf16>(), a.rstd1.ptr<float>(), x_in, W + w.input_norm, N, H, eps);
  gemm_->linear_forward(a.qkv.ptr<bf16>(), a.norm1.ptr<bf16>(), W + w.qkv, at(W, w.qkv_bias), N, H, qkvd);
  const QkvShape sh{N, c.heads, c.kv_heads, D, eps};
  qkv_split_forward(s, sh, a.q.ptr<bf16>(), a.k.ptr<bf16>(), a.v.ptr<bf16>(), a.rstd_q.ptr<float>(),
                    a.rstd_k.ptr<float>(), a.qkv.ptr<bf16>(), at(W, w.q_norm), at(W, w.k_norm),
                    positions_.ptr<int32_t>(), inv_freq_.ptr<float>());
  attention.forward(bshd(a.q, B, S, c.heads, D), bshd(a.k, B, S, c.kv_heads, D), bshd(a.v, B, S, c.kv_heads, D),
                    bshd(a.attn, B, S, c.heads, D), a.lse, c.layer_window(static_cast<int64_t>(layer)));
  gemm_->linear_forward(a.mid.ptr<bf16>(), a.attn.ptr<bf16>(), W + w.o_w, at(W, w.o_b), N, qd, H, /*residual=*/x_in);

  rmsnorm_forward(s, a.norm2.ptr<bf16>(), a.rstd2.ptr<float>(), a.mid.ptr<bf16>(), W + w.post_norm, N, H, eps);
  gemm_->linear_forward(a.gate_up.ptr<bf16>(), a.norm2.ptr<bf16>(), W + w.gate_up, nullptr, N, H, 2 * F);
  swiglu_forward(s, a.act.ptr<bf16>(), a.gate_up.ptr<bf16>(), N, F);
  gemm_->linear_forward(x_out, a.act.ptr<bf16>(), W + w.down, nullptr, N, F, H, /*residual=*/a.mid.ptr<bf16>());
}

void GpuModel::backward(const bf16* d_hidden, SequenceAttention& attention) {
  RT_CHECK(have_activations_, "gpu model backward: forward(..., for_backward=true) must run first");
  have_activations_ = false;
  if (!grads_.defined()) zero_grads();
  if (body_fresh_) clear_summed_grads();
  const int64_t N = batch_ * seqlen_, H = config_.hidden;
  const bf16* W = weights_.ptr<bf16>();
  float* G = grads_.ptr<float>();
  attention::BackendScope scope("model", options_.allowed_backends());
  SideSquares* squares = squares_result_ ? begin_side_squares() : nullptr;
  const int64_t V = config_.vocab, qkvd = (config_.heads + 2 * config_.kv_heads) * config_.head_dim;
  const int64_t qd = config_.heads * config_.head_dim, F = config_.ffn;
  // An untied LM head that no LM-head backward wrote since zero_grads() holds zeros by definition: nothing to add.
  const bool untied_head = dev_.lm_head != dev_.embed && !lm_head_fresh_;
  rmsnorm_backward(stream(), dx_.ptr<bf16>(), /*accumulate=*/false, G + dev_.final_norm, d_hidden,
                   final_in_.ptr<bf16>(), W + dev_.final_norm, final_rstd_.ptr<float>(), N, H);
  const size_t L = static_cast<size_t>(config_.layers);
  for (size_t l = L; l-- > 0;) {
    const bf16* x_in = layer_input(l);
    if (checkpointed(l)) {
      // Recompute the layer's activations from its input; its output goes to the next layer's input buffer,
      // whose backward has already run (or to the final norm's input, already used).
      bf16* x_out = l + 1 < L ? layer_input(l + 1) : final_in_.ptr<bf16>();
      layer_forward(l, scratch_, x_in, x_out, attention);
    }
    layer_backward(l, checkpointed(l) ? scratch_ : saved_[l], x_in, attention);
    if (squares) {  // the layer's matrices are final
      const GpuLayerOffsets& w = dev_.layers[l];
      squares->wait_for(stream());
      if (l + 1 == L && untied_head) squares->add_beside(G + dev_.lm_head, V * H);
      squares->add_beside(G + w.qkv, qkvd * H);
      squares->add_beside(G + w.o_w, H * qd);
      squares->add_beside(G + w.gate_up, 2 * F * H);
      squares->add_beside(G + w.down, H * F);
    }
  }
  embedding_backward(stream(), G + dev_.embed, tokens_.ptr<int32_t>(), dx_.ptr<bf16>(), N, H);
  body_fresh_ = false;
  if (squares) {
    squares->add(G + dev_.embed, V * H, stream(), cuda_ops::kMaxSumBlocks);
    squares->add(G + dev_.summed_begin(), dev_.total() - dev_.summed_begin(), stream(), cuda_ops::kMaxSumBlocks);
    squares->finish(stream(), squares_result_);
    squares_result_ = nullptr;
  }
}

void GpuModel::layer_backward(size_t layer, const GpuLayerActs& a, const bf16* x_in, SequenceAttention& attention) {
  const ModelConfig& c = config_;
  const GpuLayerOffsets& w = dev_.layers[layer];
  const bf16* W = weights_.ptr<bf16>();
  float* G = grads_.ptr<float>();
  const int64_t B = batch_, S = seqlen_, N = B * S, H = c.hidden, D = c.head_dim, F = c.ffn;
  const int64_t qd = c.heads * D, qkvd = qd + 2 * c.kv_heads * D;
  cudaStream_t s = stream();
  bf16* dx = dx_.ptr<bf16>();
  const bool add_dw = !body_fresh_;  // each matrix gets one contribution per backward: it overwrites after zero_grads

  // MLP branch; dx is d(x_out) and, through the residual, part of d(mid).
  gemm_->linear_backward(d_act_.ptr<bf16>(), false, G + w.down, add_dw, nullptr, dx, a.act.ptr<bf16>(), W + w.down, N,
                         F, H);
  swiglu_backward(s, d_gate_up_.ptr<bf16>(), d_act_.ptr<bf16>(), a.gate_up.ptr<bf16>(), N, F);
  gemm_->linear_backward(d_norm_.ptr<bf16>(), false, G + w.gate_up, add_dw, nullptr, d_gate_up_.ptr<bf16>(),
                         a.norm2.ptr<bf16>(), W + w.gate_up, N, H, 2 * F);
  rmsnorm_backward(s, dx, /*accumulate=*/true, G + w.post_norm, d_norm_.ptr<bf16>(), a.mid.ptr<bf16>(),
                   W + w.post_norm, a.rstd2.ptr<float>(), N, H);

  // Attention branch; dx is now d(mid) and becomes d(x_in).
  gemm_->linear_backward(d_attn_.ptr<bf16>(), false, G + w.o_w, add_dw, at(G, w.o_b), dx, a.attn.ptr<bf16>(), W + w.o_w,
                         N, qd, H);
  attention.backward(bshd(a.q, B, S, c.heads, D), bshd(a.k, B, S, c.kv_heads, D), bshd(a.v, B, S, c.kv_heads, D),
                     bshd(a.attn, B, S, c.heads, D), bshd(d_attn_, B, S, c.heads, D), a.lse,
                     bshd(dq_, B, S, c.heads, D), bshd(dk_, B, S, c.kv_heads, D), bshd(dv_, B, S, c.kv_heads, D),
                     c.layer_window(static_cast<int64_t>(layer)));
  const QkvShape sh{N, c.heads, c.kv_heads, D, static_cast<float>(c.rms_eps)};
  qkv_split_backward(s, sh, d_qkv_.ptr<bf16>(), at(G, w.q_norm), at(G, w.k_norm), dq_.ptr<bf16>(), dk_.ptr<bf16>(),
                     dv_.ptr<bf16>(), a.qkv.ptr<bf16>(), at(W, w.q_norm), at(W, w.k_norm), a.rstd_q.ptr<float>(),
                     a.rstd_k.ptr<float>(), positions_.ptr<int32_t>(), inv_freq_.ptr<float>());
  gemm_->linear_backward(d_norm_.ptr<bf16>(), false, G + w.qkv, add_dw, at(G, w.qkv_bias), d_qkv_.ptr<bf16>(),
                         a.norm1.ptr<bf16>(), W + w.qkv, N, H, qkvd);
  rmsnorm_backward(s, dx, /*accumulate=*/true, G + w.input_norm, d_norm_.ptr<bf16>(), x_in, W + w.input_norm,
                   a.rstd1.ptr<float>(), N, H);
}

}  // namespace ringtrain::model::cuda
