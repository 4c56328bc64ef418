// The `efficient` backend on CUDA: the general kernel for what flash does not cover (fp32, head dims that are
// multiples of 8 up to 256, an additive bias, any row strides). This file checks the call and picks the kernel
// family (efficient_kernels.h): tensor cores for bf16/fp16 with head dim <= 128 and 16-byte aligned rows, SIMT
// otherwise.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "ringtrain/attention/cuda/cuda_backends.h"
#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/attention/cuda/efficient_kernels.h"
#include "ringtrain/attention/cuda/flash_call.h"
#include "ringtrain/core/device_info.h"

namespace ringtrain::attention {
namespace {

using cuda::EffBias;

constexpr int64_t kMaxHeadDim = 256;
constexpr int64_t kMaxGridYZ = 65535;  // heads go to grid.y, sequences to grid.z

EffBias bias_of(const AttnParams& p, const TensorView& bias) {
  EffBias e;
  if (!p.has_bias) return e;
  const TensorView v = bias_broadcast_view(bias);
  e.ptr = v.data;
  switch (v.dtype) {
    case DType::F32: e.elem = cuda::BiasElem::F32; break;
    case DType::BF16: e.elem = cuda::BiasElem::BF16; break;
    case DType::F16: e.elem = cuda::BiasElem::F16; break;
    case DType::F64: e.elem = cuda::BiasElem::F64; break;
    default: throw Error(cat("efficient (cuda): 'bias' is ", bias.shape_str(), "; expected a float dtype"));
  }
  e.batch_stride = v.stride[0];
  e.head_stride = v.stride[1];
  e.row_stride = v.stride[2];
  e.col_stride = v.stride[3];
  return e;
}

// o/dq/dk/dv: the call's dtype or fp32 (fp32 required when accumulating: validate checks that).
void check_output_dtype(const AttnParams& p, const TensorView& t, const char* name) {
  RT_CHECK(t.dtype == DType::F32 || t.dtype == p.dtype, "efficient (cuda): '", name, "' is ", t.shape_str(),
           "; expected ", dtype_name(p.dtype), " or fp32");
}

// The tensor-core kernels: 16-bit inputs, head dim <= 128, inputs copied in 16-byte pieces, outputs stored in pairs.
bool tensor_core_path(const AttnParams& p, std::initializer_list<const TensorView*> inputs,
                      std::initializer_list<const TensorView*> outputs) {
  if ((p.dtype != DType::BF16 && p.dtype != DType::F16) || p.head_dim > 128) return false;
  for (const TensorView* t : inputs)
    if (!cuda::rows_aligned(p, *t, 16)) return false;
  for (const TensorView* t : outputs)
    if (!cuda::rows_aligned(p, *t, 2 * static_cast<int64_t>(dtype_size(t->dtype)))) return false;
  return true;
}

class EfficientBackend final : public Backend {
 public:
  BackendId id() const override { return BackendId::Efficient; }
  DeviceKind device_kind() const override { return DeviceKind::CUDA; }
  // Verified by tests/check_gpu/cp_nccl_test.cpp (ring, all-gather, all-to-all, packed documents, S = 131072; two H200s).
  bool cp_capable() const override { return true; }

  std::vector<std::string> unsupported_reasons(const AttnParams& p) const override {
    std::vector<std::string> r;
    if (p.kv_cache) r.push_back(kv_cache_reason());
    if (std::string why = hopper_unavailable_reason(p.device); !why.empty()) r.push_back(std::move(why));
    if (p.dtype != DType::F32 && p.dtype != DType::BF16 && p.dtype != DType::F16)
      r.push_back(cat("dtype ", dtype_name(p.dtype), " (needs fp32, bf16 or fp16)"));
    if (p.head_dim % 8 != 0 || p.head_dim > kMaxHeadDim)
      r.push_back(cat("head dim ", p.head_dim, " (needs a multiple of 8, at most ", kMaxHeadDim, ")"));
    if (p.seqlen_q >= (int64_t(1) << 31) || p.seqlen_kv >= (int64_t(1) << 31))
      r.push_back(cat("sequence length ", std::max(p.seqlen_q, p.seqlen_kv), " (needs < 2^31)"));
    if (p.heads_q > kMaxGridYZ) r.push_back(cat(p.heads_q, " query heads (at most ", kMaxGridYZ, ": grid.y)"));
    if (p.batch > kMaxGridYZ) r.push_back(cat("batch ", p.batch, " (at most ", kMaxGridYZ, " sequences: grid.z)"));
    // Checked per call, not from the params: unit stride in D (validate), o/dq/dk/dv dtypes, dout's dtype.
    return r;
  }

  void forward(const AttnParams& p, const AttnForwardArgs& a) const override {
    require_supported(*this, p);
    validate(p, a);
    check_output_dtype(p, a.o, "o");
    cuda::DeviceGuard guard(p.device.index);
    cuda::EffFwdCall c;
    c.s = cuda::flash_shape(p, a.q, a.k, a.cu_seqlens_q, a.cu_seqlens_kv);
    c.elem = cuda::flash_elem(a.q, "efficient", "q");
    c.q = cuda::flash_rows(p, a.q, "efficient", "q");
    c.k = cuda::flash_rows(p, a.k, "efficient", "k");
    c.v = cuda::flash_rows(p, a.v, "efficient", "v");
    c.o = cuda::flash_rows(p, a.o, "efficient", "o");
    c.lse = cuda::flash_stats(p, a.lse);
    c.bias = bias_of(p, a.bias);
    const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
    if (tensor_core_path(p, {&a.q, &a.k, &a.v}, {&a.o})) cuda::efficient_forward_tc(c, stream);
    else cuda::efficient_forward_simt(c, stream);
  }

  void backward(const AttnParams& p, const AttnBackwardArgs& a) const override {
    require_supported(*this, p);
    validate(p, a);
    RT_CHECK(a.dout.dtype == p.dtype, "efficient (cuda): 'dout' is ", a.dout.shape_str(), "; expected ",
             dtype_name(p.dtype));
    check_output_dtype(p, a.o, "o");
    check_output_dtype(p, a.dq, "dq");
    check_output_dtype(p, a.dk, "dk");
    check_output_dtype(p, a.dv, "dv");
    cuda::DeviceGuard guard(p.device.index);
    cuda::EffBwdCall c;
    c.s = cuda::flash_shape(p, a.q, a.k, a.cu_seqlens_q, a.cu_seqlens_kv);
    c.elem = cuda::flash_elem(a.q, "efficient", "q");
    c.q = cuda::flash_rows(p, a.q, "efficient", "q");
    c.k = cuda::flash_rows(p, a.k, "efficient", "k");
    c.v = cuda::flash_rows(p, a.v, "efficient", "v");
    c.o = cuda::flash_rows(p, a.o, "efficient", "o");
    c.dout = cuda::flash_rows(p, a.dout, "efficient", "dout");
    c.dq = cuda::flash_rows(p, a.dq, "efficient", "dq");
    c.dk = cuda::flash_rows(p, a.dk, "efficient", "dk");
    c.dv = cuda::flash_rows(p, a.dv, "efficient", "dv");
    c.lse = cuda::flash_stats(p, a.lse);
    c.bias = bias_of(p, a.bias);
    c.accumulate = a.accumulate;
    c.deterministic = p.deterministic;
    const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
    if (tensor_core_path(p, {&a.q, &a.k, &a.v, &a.dout}, {&a.dq, &a.dk, &a.dv}))
      cuda::efficient_backward_tc(c, stream);
    else
      cuda::efficient_backward_simt(c, stream);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cuda_efficient_backend() { return std::make_unique<EfficientBackend>(); }

}  // namespace ringtrain::attention
