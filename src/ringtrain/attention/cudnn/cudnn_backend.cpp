// `cudnn` backend: cuDNN 9 SDPA (sdpa_graphs.h). This file adapts the project's tensors to what cuDNN takes:
// BSHD views pass their strides as (B, H, S, D); packed calls go through ragged offsets and padded stats;
// outputs of another dtype (fp32 partial O under CP, fp32 accumulated gradients) are written to a temp and
// converted; O and dO are brought to identical strides before the backward (cuDNN requires it).
#include <memory>
#include <vector>

#include "ringtrain/attention/cuda/cuda_backends.h"
#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/attention/cudnn/ragged.h"
#include "ringtrain/attention/cudnn/sdpa_graphs.h"
#include "ringtrain/attention/layout.h"
#include "ringtrain/core/cuda/tensor_ops.h"
#include "ringtrain/core/device_info.h"

namespace ringtrain::attention {
namespace {

using cudnn::Tensor4;

// Head dims cuDNN 9 SDPA serves on Hopper (forward and backward): multiples of 8 up to 256.
constexpr int64_t kMaxHeadDim = 256;

// Owns the device temporaries of one call.
class Temps {
 public:
  explicit Temps(cudaStream_t s) : stream_(s) {}
  // A contiguous tensor shaped like `like`, of dtype `dtype`.
  TensorView make(const TensorView& like, DType dtype, const char* what) {
    TensorView v = like;
    v.dtype = dtype;
    int64_t st = 1;
    for (int d = v.ndim - 1; d >= 0; --d) {
      v.stride[d] = st;
      st *= v.shape[d];
    }
    buffers_.push_back(std::make_unique<cuda::StreamScratch>(v.nbytes(), stream_, what));
    v.data = buffers_.back()->bytes();
    return v;
  }
  void* raw(size_t bytes, const char* what) {
    buffers_.push_back(std::make_unique<cuda::StreamScratch>(bytes, stream_, what));
    return buffers_.back()->bytes();
  }
  // `t` itself when it already has `dtype` (and is contiguous, if asked), else a converted contiguous copy.
  TensorView usable(const TensorView& t, DType dtype, bool need_contiguous, const char* what) {
    if (t.dtype == dtype && (!need_contiguous || t.is_contiguous())) return t;
    TensorView c = make(t, dtype, what);
    cuda_ops::strided_copy(c, t, stream_);
    return c;
  }

 private:
  cudaStream_t stream_;
  std::vector<std::unique_ptr<cuda::StreamScratch>> buffers_;
};

bool same_strides(const TensorView& a, const TensorView& b) {
  for (int d = 0; d < a.ndim; ++d)
    if (a.stride[d] != b.stride[d]) return false;
  return true;
}

// What a packed call needs on the device: lengths and ragged offsets of both sides.
struct Ragged {
  int32_t* seq_q = nullptr;
  int32_t* seq_kv = nullptr;
  int32_t* off_q = nullptr;
  int32_t* off_kv = nullptr;
};

Ragged make_ragged(const AttnParams& p, const TensorView& cu_q, const TensorView& cu_kv, Temps& temps,
                   cudaStream_t st) {
  auto* buf = static_cast<int32_t*>(temps.raw((4 * p.batch + 2) * sizeof(int32_t), "ragged offsets"));
  Ragged r{buf, buf + p.batch, buf + 2 * p.batch, buf + 3 * p.batch + 1};
  cudnn::ragged_metadata(st, cu_q.ptr<const int32_t>(), cu_kv.ptr<const int32_t>(), p.batch, p.heads_q * p.head_dim,
                         p.heads_kv * p.head_dim, r.seq_q, r.seq_kv, r.off_q, r.off_kv);
  return r;
}

// cuDNN's (B, H, S, D) description of a tensor: BSHD views keep their strides; packed (contiguous THD) ones get
// (B, H, S_max, D) with ragged offsets.
Tensor4 tensor4(const AttnParams& p, const TensorView& t, int64_t s, int32_t* ragged) {
  Tensor4 r;
  r.data = t.data;
  if (!p.packed) {
    const int64_t dims[4] = {t.shape[0], t.shape[2], t.shape[1], t.shape[3]};
    const int64_t strides[4] = {t.stride[0], t.stride[2], t.stride[1], t.stride[3]};
    for (int i = 0; i < 4; ++i) {
      r.dim[i] = dims[i];
      r.stride[i] = strides[i];
    }
    return r;
  }
  const int64_t h = t.shape[1], d = t.shape[2];
  const int64_t dims[4] = {p.batch, h, s, d};
  const int64_t strides[4] = {s * h * d, d, h * d, 1};
  for (int i = 0; i < 4; ++i) {
    r.dim[i] = dims[i];
    r.stride[i] = strides[i];
  }
  r.ragged = ragged;
  return r;
}

// Stats (B, H, S, 1) over the LSE [B, H, S] of a dense call (any strides).
Tensor4 stats_over_lse(const TensorView& lse) {
  Tensor4 r;
  r.data = lse.data;
  const int64_t dims[4] = {lse.shape[0], lse.shape[1], lse.shape[2], 1};
  const int64_t strides[4] = {lse.stride[0], lse.stride[1], lse.stride[2], 1};
  for (int i = 0; i < 4; ++i) {
    r.dim[i] = dims[i];
    r.stride[i] = strides[i];
  }
  return r;
}

Tensor4 padded_stats(const AttnParams& p, float* data) {
  Tensor4 r;
  r.data = data;
  const int64_t dims[4] = {p.batch, p.heads_q, p.seqlen_q, 1};
  const int64_t strides[4] = {p.heads_q * p.seqlen_q, p.seqlen_q, 1, 1};
  for (int i = 0; i < 4; ++i) {
    r.dim[i] = dims[i];
    r.stride[i] = strides[i];
  }
  return r;
}

cudnn::SdpaConfig config(const AttnParams& p) {
  cudnn::SdpaConfig c;
  c.dtype = p.dtype;
  c.scale = p.scale();
  // Bottom-right alignment equals top-left when Sq == Skv; cuDNN is given the plain causal mask then.
  c.causal_top_left = p.mask == MaskType::CausalTopLeft || (p.mask == MaskType::CausalBottomRight && p.seqlen_q == p.seqlen_kv);
  c.causal_bottom_right = p.mask == MaskType::CausalBottomRight && p.seqlen_q != p.seqlen_kv;
  c.window = p.window;
  c.deterministic = p.deterministic;
  return c;
}

// What the forward and the backward set up alike: the graph configuration (with the ragged lengths of a packed
// call), and q, k, v as cuDNN takes them (the input dtype; contiguous when packed).
struct SdpaInputs {
  cudnn::SdpaConfig config;
  Ragged ragged;
  TensorView q, k, v;
};

SdpaInputs sdpa_inputs(const AttnParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_kv, Temps& temps,
                       cudaStream_t st) {
  SdpaInputs in;
  in.config = config(p);
  if (p.packed) {
    in.ragged = make_ragged(p, cu_seqlens_q, cu_seqlens_kv, temps, st);
    in.config.seq_len_q = in.ragged.seq_q;
    in.config.seq_len_kv = in.ragged.seq_kv;
  }
  in.q = temps.usable(q, p.dtype, p.packed, "q");
  in.k = temps.usable(k, p.dtype, p.packed, "k");
  in.v = temps.usable(v, p.dtype, p.packed, "v");
  return in;
}

class CudnnBackend final : public Backend {
 public:
  BackendId id() const override { return BackendId::Cudnn; }
  DeviceKind device_kind() const override { return DeviceKind::CUDA; }
  bool cp_capable() const override { return true; }  // verified by tests/check_gpu/cp_nccl_test.cpp (two H200s)

  std::vector<std::string> unsupported_reasons(const AttnParams& p) const override {
    std::vector<std::string> r;
    if (p.kv_cache) r.push_back(kv_cache_reason());
    if (std::string why = hopper_unavailable_reason(p.device); !why.empty()) {
      r.push_back(std::move(why));
    } else if (const std::string& err = cudnn::load_error(); !err.empty()) {
      r.push_back(err);
    } else if (p.packed && p.heads_q != p.heads_kv && cudnn::backend_version() < 90600) {
      r.push_back(cat("packed GQA needs cuDNN >= 9.6, loaded ", cudnn::backend_version()));
    }
    if (p.dtype != DType::BF16 && p.dtype != DType::F16)
      r.push_back(cat("dtype ", dtype_name(p.dtype), " (cuDNN SDPA takes bf16 or fp16)"));
    if (p.head_dim % 8 != 0 || p.head_dim > kMaxHeadDim)
      r.push_back(cat("head dim ", p.head_dim, " (cuDNN SDPA needs a multiple of 8, at most ", kMaxHeadDim, ")"));
    if (p.seqlen_q == 0 || p.seqlen_kv == 0) r.push_back("empty sequences");
    if (p.mask == MaskType::CausalBottomRight && p.seqlen_q != p.seqlen_kv) {
      if (p.packed)
        r.push_back("causal_bottom_right with packed sequences (cuDNN's bottom-right mask excludes ragged/padded inputs)");
      else if (p.seqlen_q > p.seqlen_kv)
        r.push_back(cat("causal_bottom_right with Sq > Skv (", p.seqlen_q, " > ", p.seqlen_kv,
                        "): cuDNN does not serve rows that see no key"));
      else if (p.seqlen_q % 64 != 0 || p.seqlen_kv % 64 != 0)
        r.push_back(cat("causal_bottom_right with Sq != Skv needs both multiples of 64 in cuDNN (Sq=", p.seqlen_q,
                        ", Skv=", p.seqlen_kv, ")"));
    }
    if (p.packed && p.batch * p.seqlen_q * p.heads_q * p.head_dim >= (int64_t{1} << 31))
      r.push_back("packed tensors beyond 2^31 elements (cuDNN's int32 ragged offsets)");
    if (p.has_bias) r.push_back("additive bias (not wired into this backend's cuDNN graphs)");
    // cuDNN's sliding window (frontend 1.8, cuDNN >= 9.2) combines only with the top-left causal mask (the same as
    // bottom-right when Sq == Skv), Sq <= Skv, and no ragged or padded inputs.
    if (p.window > 0) {
      if (p.packed)
        r.push_back(window_reason(p, "cuDNN's sliding window excludes packed (ragged) sequences"));
      else if (p.mask == MaskType::CausalBottomRight && p.seqlen_q != p.seqlen_kv)
        r.push_back(window_reason(p, cat("cuDNN's sliding window takes only the top-left causal mask; ",
                                         "causal_bottom_right with Sq != Skv (", p.seqlen_q, " != ", p.seqlen_kv,
                                         ")")));
      else if (p.seqlen_q > p.seqlen_kv)
        r.push_back(
            window_reason(p, cat("cuDNN's sliding window needs Sq <= Skv (", p.seqlen_q, " > ", p.seqlen_kv, ")")));
      else if (cudnn::load_error().empty() && cudnn::backend_version() < 90200)
        r.push_back(
            window_reason(p, cat("cuDNN's sliding window needs cuDNN >= 9.2, loaded ", cudnn::backend_version())));
    }
    return r;
  }

  void forward(const AttnParams& p, const AttnForwardArgs& a) const override {
    cuda::DeviceGuard guard(p.device.index);
    cudaStream_t st = static_cast<cudaStream_t>(a.stream);
    Temps temps(st);
    const SdpaInputs in = sdpa_inputs(p, a.q, a.k, a.v, a.cu_seqlens_q, a.cu_seqlens_kv, temps, st);
    const cudnn::SdpaConfig& c = in.config;
    const Ragged& rg = in.ragged;
    const TensorView &q = in.q, &k = in.k, &v = in.v;
    // cuDNN writes O in the input dtype: other dtypes (fp32 CP partials) go through a temp.
    const bool o_direct = a.o.dtype == p.dtype && (!p.packed || a.o.is_contiguous());
    const TensorView o = o_direct ? a.o : temps.make(a.o, p.dtype, "o");
    Tensor4 stats;
    float* padded = nullptr;
    if (p.packed) {
      padded = static_cast<float*>(temps.raw(p.batch * p.heads_q * p.seqlen_q * sizeof(float), "stats"));
      stats = padded_stats(p, padded);
    } else {
      stats = stats_over_lse(a.lse);
    }
    cudnn::sdpa_forward(p.device.index, st, c, tensor4(p, q, p.seqlen_q, rg.off_q), tensor4(p, k, p.seqlen_kv, rg.off_kv),
                        tensor4(p, v, p.seqlen_kv, rg.off_kv), tensor4(p, o, p.seqlen_q, rg.off_q), stats);
    if (!o_direct) cuda_ops::strided_copy(a.o, o, st);
    if (p.packed) {
      const TensorView lse = lse_view(p, a.lse, 0);
      cudnn::stats_to_lse(st, padded, a.cu_seqlens_q.ptr<const int32_t>(), p.batch, p.heads_q, p.seqlen_q,
                          static_cast<float*>(lse.data), lse.stride[0], lse.stride[1]);
    }
  }

  void backward(const AttnParams& p, const AttnBackwardArgs& a) const override {
    cuda::DeviceGuard guard(p.device.index);
    cudaStream_t st = static_cast<cudaStream_t>(a.stream);
    Temps temps(st);
    const SdpaInputs in = sdpa_inputs(p, a.q, a.k, a.v, a.cu_seqlens_q, a.cu_seqlens_kv, temps, st);
    const cudnn::SdpaConfig& c = in.config;
    const Ragged& rg = in.ragged;
    const TensorView &q = in.q, &k = in.k, &v = in.v;
    // cuDNN needs O and dO of the input dtype with identical strides (the crash this project started from):
    // dO is copied into O's layout when they differ, both into contiguous temps when O itself is unusable.
    TensorView o = temps.usable(a.o, p.dtype, p.packed, "o");
    TensorView dout = a.dout;
    if (dout.dtype != p.dtype || !same_strides(dout, o)) {
      if (!o.is_contiguous()) o = temps.usable(o, p.dtype, true, "o");
      dout = temps.make(a.dout, p.dtype, "dO");
      cuda_ops::strided_copy(dout, a.dout, st);
    }
    Tensor4 stats;
    if (p.packed) {
      auto* padded = static_cast<float*>(temps.raw(p.batch * p.heads_q * p.seqlen_q * sizeof(float), "stats"));
      const TensorView lse = lse_view(p, a.lse, 0);
      cudnn::lse_to_stats(st, static_cast<const float*>(lse.data), lse.stride[0], lse.stride[1],
                          a.cu_seqlens_q.ptr<const int32_t>(), p.batch, p.heads_q, p.seqlen_q, padded);
      stats = padded_stats(p, padded);
    } else {
      stats = stats_over_lse(a.lse);
    }
    // Gradients: written in place when they have the input dtype and are overwritten; otherwise (fp32 outputs,
    // accumulate mode) through a temp that is then converted or added.
    auto grad_target = [&](const TensorView& g, const char* what) {
      const bool direct = !a.accumulate && g.dtype == p.dtype && (!p.packed || g.is_contiguous());
      return direct ? g : temps.make(g, p.dtype, what);
    };
    const TensorView dq = grad_target(a.dq, "dq"), dk = grad_target(a.dk, "dk"), dv = grad_target(a.dv, "dv");
    cudnn::sdpa_backward(p.device.index, st, c, tensor4(p, q, p.seqlen_q, rg.off_q), tensor4(p, k, p.seqlen_kv, rg.off_kv),
                         tensor4(p, v, p.seqlen_kv, rg.off_kv), tensor4(p, o, p.seqlen_q, rg.off_q),
                         tensor4(p, dout, p.seqlen_q, rg.off_q), stats, tensor4(p, dq, p.seqlen_q, rg.off_q),
                         tensor4(p, dk, p.seqlen_kv, rg.off_kv), tensor4(p, dv, p.seqlen_kv, rg.off_kv));
    if (dq.data != a.dq.data) cuda_ops::strided_copy(a.dq, dq, st, a.accumulate);
    if (dk.data != a.dk.data) cuda_ops::strided_copy(a.dk, dk, st, a.accumulate);
    if (dv.data != a.dv.data) cuda_ops::strided_copy(a.dv, dv, st, a.accumulate);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cudnn_backend() { return std::make_unique<CudnnBackend>(); }

}  // namespace ringtrain::attention
