// The `flash` backend on CUDA: our own Hopper wgmma kernels (flash_fwd_sm90.cu, flash_bwd_sm90.cu; the mma.sync
// flash_bwd.cu in deterministic mode). This file checks what the kernels need and turns the call's tensors into
// the kernels' plain description (flash_kernels.h). Head dims 64, 128, 192 and 256 (whole 64-column panels); the
// deterministic backward (mma.sync) tiles 64 or 128 wide, so above 128 only the fast backward exists.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "ringtrain/attention/cuda/cuda_backends.h"
#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/attention/cuda/flash_call.h"
#include "ringtrain/core/device_info.h"

namespace ringtrain::attention {
namespace {

using cuda::FlashElem;
using cuda::FlashRows;

// The kernels copy rows in 16-byte pieces: every row start must be 16-byte aligned.
FlashRows rows_of(const AttnParams& p, const TensorView& t, const char* name) {
  RT_CHECK(cuda::rows_aligned(p, t, 16), "flash (cuda): '", name, "' ", t.shape_str(), " needs a 16-byte aligned ",
           "start and sequence/head strides that are multiples of ", 16 / dtype_size(t.dtype), " elements");
  return cuda::flash_rows(p, t, "flash", name);
}

class FlashBackend final : public Backend {
 public:
  BackendId id() const override { return BackendId::Flash; }
  DeviceKind device_kind() const override { return DeviceKind::CUDA; }
  bool cp_capable() const override { return true; }  // verified by tests/check_gpu/cp_nccl_test.cpp (two H200s)

  std::vector<std::string> unsupported_reasons(const AttnParams& p) const override {
    std::vector<std::string> r;
    if (p.kv_cache) r.push_back(kv_cache_reason());
    if (std::string why = hopper_unavailable_reason(p.device); !why.empty()) r.push_back(std::move(why));
    if (p.dtype != DType::BF16 && p.dtype != DType::F16)
      r.push_back(cat("dtype ", dtype_name(p.dtype), " (needs bf16 or fp16)"));
    if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 192 && p.head_dim != 256)
      r.push_back(cat("head dim ", p.head_dim, " (needs 64, 128, 192 or 256)"));
    if (p.seqlen_q >= (int64_t(1) << 31) || p.seqlen_kv >= (int64_t(1) << 31))
      r.push_back(cat("sequence length ", std::max(p.seqlen_q, p.seqlen_kv), " (needs < 2^31)"));
    if (p.has_bias) r.push_back("additive bias (the flash kernels take none; efficient and math do)");
    // Checked per call, not from the params: unit stride in D (validate), 16-byte aligned rows (rows_of).
    return r;
  }

  std::vector<std::string> backward_unsupported_reasons(const AttnParams& p) const override {
    if (p.head_dim > 128 && p.deterministic)
      return {cat("head dim ", p.head_dim,
                  " in a deterministic backward (flash's deterministic kernels need head dim 64 or 128)")};
    return {};
  }

  void forward(const AttnParams& p, const AttnForwardArgs& a) const override {
    validate(p, a);
    cuda::DeviceGuard guard(p.device.index);
    cuda::FlashFwdCall c;
    c.s = cuda::flash_shape(p, a.q, a.k, a.cu_seqlens_q, a.cu_seqlens_kv);
    c.q = rows_of(p, a.q, "q");
    c.k = rows_of(p, a.k, "k");
    c.v = rows_of(p, a.v, "v");
    c.o = rows_of(p, a.o, "o");
    RT_CHECK(c.o.elem == FlashElem::F32 || a.o.dtype == p.dtype, "flash (cuda): 'o' is ", a.o.shape_str(),
             "; expected ", dtype_name(p.dtype), " or fp32");
    c.lse = cuda::flash_stats(p, a.lse);
    cuda::flash_forward(c, static_cast<cudaStream_t>(a.stream));
  }

  void backward(const AttnParams& p, const AttnBackwardArgs& a) const override {
    validate(p, a);
    require_backward_supported(*this, p);
    cuda::DeviceGuard guard(p.device.index);
    cuda::FlashBwdCall c;
    c.s = cuda::flash_shape(p, a.q, a.k, a.cu_seqlens_q, a.cu_seqlens_kv);
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
    c.lse = cuda::flash_stats(p, a.lse);
    c.accumulate = a.accumulate;
    c.deterministic = p.deterministic;
    cuda::flash_backward(c, static_cast<cudaStream_t>(a.stream));
  }
};

}  // namespace

std::unique_ptr<Backend> make_cuda_flash_backend() { return std::make_unique<FlashBackend>(); }

}  // namespace ringtrain::attention
