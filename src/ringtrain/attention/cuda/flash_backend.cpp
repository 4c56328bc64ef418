// The `flash` backend on CUDA: our own tensor-core kernels (flash_fwd.cu, flash_bwd.cu). This file checks what
// the kernels need and turns the call's tensors into the kernels' plain description (flash_kernels.h).
#include <cuda_runtime_api.h>

#include <algorithm>

#include "ringtrain/attention/cuda/cuda_backends.h"
#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/attention/cuda/flash_kernels.h"
#include "ringtrain/core/device_info.h"

namespace ringtrain::attention {
namespace {

using cuda::FlashElem;
using cuda::FlashRows;
using cuda::FlashShape;
using cuda::FlashStats;

FlashElem elem_of(const TensorView& t, const char* name) {
  switch (t.dtype) {
    case DType::BF16: return FlashElem::BF16;
    case DType::F16: return FlashElem::F16;
    case DType::F32: return FlashElem::F32;
    default: throw Error(cat("flash (cuda): '", name, "' is ", t.shape_str(), "; expected bf16, fp16 or fp32"));
  }
}

// The kernels copy rows in 16-byte pieces: every row start must be 16-byte aligned.
FlashRows rows_of(const AttnParams& p, const TensorView& t, const char* name) {
  const int64_t align = 16 / static_cast<int64_t>(dtype_size(t.dtype));
  const int o = p.packed ? 0 : 1;
  const bool aligned = reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.stride[o] % align == 0 &&
                       t.stride[o + 1] % align == 0 && (p.packed || t.stride[0] % align == 0);
  RT_CHECK(aligned, "flash (cuda): '", name, "' ", t.shape_str(), " needs a 16-byte aligned start and sequence/head ",
           "strides that are multiples of ", align, " elements");
  FlashRows r;
  r.ptr = t.data;
  r.elem = elem_of(t, name);
  r.batch_stride = p.packed ? 0 : t.stride[0];
  r.row_stride = t.stride[o];
  r.head_stride = t.stride[o + 1];
  return r;
}

FlashStats stats_of(const AttnParams& p, const TensorView& lse) {
  FlashStats s;
  s.ptr = static_cast<float*>(lse.data);
  s.batch_stride = p.packed ? 0 : lse.stride[0];
  s.head_stride = lse.stride[p.packed ? 0 : 1];
  s.row_stride = lse.stride[p.packed ? 1 : 2];
  return s;
}

FlashShape shape_of(const AttnParams& p, const TensorView& q, const TensorView& cu_q, const TensorView& cu_kv) {
  RT_CHECK(p.seqlen_q < (int64_t(1) << 31) && p.seqlen_kv < (int64_t(1) << 31), "flash (cuda): sequence too long: ",
           p.describe());
  FlashShape s;
  s.batch = static_cast<int>(p.batch);
  s.heads_q = static_cast<int>(p.heads_q);
  s.heads_kv = static_cast<int>(p.heads_kv);
  s.head_dim = static_cast<int>(p.head_dim);
  s.seqlen_q = static_cast<int>(p.seqlen_q);
  s.seqlen_kv = static_cast<int>(p.seqlen_kv);
  s.total_q = p.packed ? q.shape[0] : p.batch * p.seqlen_q;
  if (p.packed) {
    s.cu_q = static_cast<const int*>(cu_q.data);
    s.cu_kv = static_cast<const int*>(cu_kv.data);
  }
  s.mask = p.mask == MaskType::None            ? cuda::kMaskNone
           : p.mask == MaskType::CausalTopLeft ? cuda::kMaskCausalTopLeft
                                               : cuda::kMaskCausalBottomRight;
  s.scale = p.scale();
  s.bf16 = p.dtype == DType::BF16;
  return s;
}

class FlashBackend final : public Backend {
 public:
  BackendId id() const override { return BackendId::Flash; }
  DeviceKind device_kind() const override { return DeviceKind::CUDA; }
  bool cp_capable() const override { return true; }  // verified by tests/cp_gpu (ring, all-gather; two H200s)

  std::vector<std::string> unsupported_reasons(const AttnParams& p) const override {
    std::vector<std::string> r;
    if (!p.device.is_cuda()) {
      r.push_back(cat("runs on CUDA devices, not ", device_name(p.device)));
    } else if (const int arch = cuda_arch(p.device.index); arch != 90) {
      r.push_back(cat("kernels are built for sm_90a (Hopper); ", device_name(p.device), " is sm_", arch));
    }
    if (p.dtype != DType::BF16 && p.dtype != DType::F16)
      r.push_back(cat("dtype ", dtype_name(p.dtype), " (needs bf16 or fp16)"));
    if (p.head_dim != 64 && p.head_dim != 128) r.push_back(cat("head dim ", p.head_dim, " (needs 64 or 128)"));
    if (p.seqlen_q >= (int64_t(1) << 31) || p.seqlen_kv >= (int64_t(1) << 31))
      r.push_back(cat("sequence length ", std::max(p.seqlen_q, p.seqlen_kv), " (needs < 2^31)"));
    // Checked per call, not from the params: unit stride in D (validate), 16-byte aligned rows (rows_of).
    return r;
  }

  void forward(const AttnParams& p, const AttnForwardArgs& a) const override {
    validate(p, a);
    cuda::DeviceGuard guard(p.device.index);
    cuda::FlashFwdCall c;
    c.s = shape_of(p, a.q, a.cu_seqlens_q, a.cu_seqlens_kv);
    c.q = rows_of(p, a.q, "q");
    c.k = rows_of(p, a.k, "k");
    c.v = rows_of(p, a.v, "v");
    c.o = rows_of(p, a.o, "o");
    RT_CHECK(c.o.elem == FlashElem::F32 || a.o.dtype == p.dtype, "flash (cuda): 'o' is ", a.o.shape_str(),
             "; expected ", dtype_name(p.dtype), " or fp32");
    c.lse = stats_of(p, a.lse);
    cuda::flash_forward(c, static_cast<cudaStream_t>(a.stream));
  }

  void backward(const AttnParams& p, const AttnBackwardArgs& a) const override {
    validate(p, a);
    cuda::DeviceGuard guard(p.device.index);
    cuda::FlashBwdCall c;
    c.s = shape_of(p, a.q, a.cu_seqlens_q, a.cu_seqlens_kv);
    c.q = rows_of(p, a.q, "q");
    c.k = rows_of(p, a.k, "k");
    c.v = rows_of(p, a.v, "v");
    c.o = rows_of(p, a.o, "o");
    c.dout = rows_of(p, a.dout, "dout");
    RT_CHECK(a.dout.dtype == p.dtype, "flash (cuda): 'dout' is ", a.dout.shape_str(), "; expected ",
             dtype_name(p.dtype), " (the kernels multiply it on tensor cores)");
    c.dq = rows_of(p, a.dq, "dq");
    c.dk = rows_of(p, a.dk, "dk");
    c.dv = rows_of(p, a.dv, "dv");
    for (const auto& [t, name] : {std::pair{&a.dq, "dq"}, {&a.dk, "dk"}, {&a.dv, "dv"}})
      RT_CHECK(t->dtype == DType::F32 || t->dtype == p.dtype, "flash (cuda): '", name, "' is ", t->shape_str(),
               "; expected ", dtype_name(p.dtype), " or fp32");
    c.lse = stats_of(p, a.lse);
    c.accumulate = a.accumulate;
    c.deterministic = p.deterministic;
    cuda::flash_backward(c, static_cast<cudaStream_t>(a.stream));
  }
};

}  // namespace

std::unique_ptr<Backend> make_cuda_flash_backend() { return std::make_unique<FlashBackend>(); }

}  // namespace ringtrain::attention
