#include "ringtrain/attention/cuda/flash_call.h"

#include "ringtrain/core/error.h"

namespace ringtrain::attention::cuda {

FlashElem flash_elem(const TensorView& t, const char* backend, const char* name) {
  switch (t.dtype) {
    case DType::BF16: return FlashElem::BF16;
    case DType::F16: return FlashElem::F16;
    case DType::F32: return FlashElem::F32;
    default: throw Error(cat(backend, " (cuda): '", name, "' is ", t.shape_str(), "; expected bf16, fp16 or fp32"));
  }
}

bool rows_aligned(const AttnParams& p, const TensorView& t, int64_t bytes) {
  const int64_t elems = bytes / static_cast<int64_t>(dtype_size(t.dtype));
  const int o = p.packed ? 0 : 1;
  bool ok = reinterpret_cast<uintptr_t>(t.data) % bytes == 0 && t.stride[o] % elems == 0 &&
            t.stride[o + 1] % elems == 0;
  if (!p.packed) ok = ok && t.stride[0] % elems == 0;
  return ok;
}

FlashRows flash_rows(const AttnParams& p, const TensorView& t, const char* backend, const char* name) {
  const int o = p.packed ? 0 : 1;
  FlashRows r;
  r.ptr = t.data;
  r.elem = flash_elem(t, backend, name);
  r.batch_stride = p.packed ? 0 : t.stride[0];
  r.row_stride = t.stride[o];
  r.head_stride = t.stride[o + 1];
  return r;
}

FlashStats flash_stats(const AttnParams& p, const TensorView& lse) {
  FlashStats s;
  s.ptr = static_cast<float*>(lse.data);
  s.batch_stride = p.packed ? 0 : lse.stride[0];
  s.head_stride = lse.stride[p.packed ? 0 : 1];
  s.row_stride = lse.stride[p.packed ? 1 : 2];
  return s;
}

std::string flash_shape_str(const FlashShape& s) {
  return cat(" for B=", s.batch, " Hq=", s.heads_q, " Hkv=", s.heads_kv, " D=", s.head_dim, " Sq=", s.seqlen_q,
             " Skv=", s.seqlen_kv);
}

FlashShape flash_shape(const AttnParams& p, const TensorView& q, const TensorView& k, const TensorView& cu_q,
                       const TensorView& cu_kv) {
  RT_CHECK(p.seqlen_q < (int64_t(1) << 31) && p.seqlen_kv < (int64_t(1) << 31),
           "attention (cuda): sequence too long for the kernels' 32-bit row counts: ", p.describe());
  FlashShape s;
  s.batch = static_cast<int>(p.batch);
  s.heads_q = static_cast<int>(p.heads_q);
  s.heads_kv = static_cast<int>(p.heads_kv);
  s.head_dim = static_cast<int>(p.head_dim);
  s.seqlen_q = static_cast<int>(p.seqlen_q);
  s.seqlen_kv = static_cast<int>(p.seqlen_kv);
  s.total_q = p.packed ? q.shape[0] : p.batch * p.seqlen_q;
  s.total_kv = p.packed ? k.shape[0] : p.batch * p.seqlen_kv;
  if (p.packed) {
    s.cu_q = static_cast<const int*>(cu_q.data);
    s.cu_kv = static_cast<const int*>(cu_kv.data);
  }
  s.mask = p.mask == MaskType::None            ? kMaskNone
           : p.mask == MaskType::CausalTopLeft ? kMaskCausalTopLeft
                                               : kMaskCausalBottomRight;
  s.window = static_cast<int>(p.window);  // validate_params: < 2^31
  s.scale = p.scale();
  s.bf16 = p.dtype == DType::BF16;
  return s;
}

}  // namespace ringtrain::attention::cuda
