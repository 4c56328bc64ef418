#include "ringtrain/attention/layout.h"

#include "ringtrain/core/error.h"

namespace ringtrain::attention {

std::vector<Segment> segments(const AttnParams& p, const TensorView& cu_q, const TensorView& cu_kv) {
  std::vector<Segment> segs;
  if (!p.packed) {
    for (int64_t b = 0; b < p.batch; ++b) segs.push_back({b, 0, p.seqlen_q, 0, p.seqlen_kv});
    return segs;
  }
  RT_CHECK(cu_q.device.is_cpu() && cu_kv.device.is_cpu(), "cu_seqlens must be in host memory to split a call into its sequences");
  const auto* cq = cu_q.ptr<const int32_t>();
  const auto* ck = cu_kv.ptr<const int32_t>();
  RT_CHECK(cq[0] == 0 && ck[0] == 0, "cu_seqlens must start with 0");
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t sq = cq[b + 1] - cq[b], skv = ck[b + 1] - ck[b];
    RT_CHECK(sq >= 0 && skv >= 0, "cu_seqlens must be non-decreasing (sequence ", b, ")");
    RT_CHECK(sq <= p.seqlen_q && skv <= p.seqlen_kv, "sequence ", b, " (", sq, " queries, ", skv,
             " keys) is longer than the params' maximum (", p.seqlen_q, ", ", p.seqlen_kv, ")");
    segs.push_back({0, cq[b], sq, ck[b], skv});
  }
  return segs;
}

TensorView rows_view(const AttnParams& p, const TensorView& t, int64_t batch) {
  if (p.packed) return t;
  TensorView v;
  v.data = static_cast<char*>(t.data) + batch * t.stride[0] * static_cast<int64_t>(dtype_size(t.dtype));
  v.dtype = t.dtype;
  v.device = t.device;
  v.ndim = 3;
  for (int d = 0; d < 3; ++d) {
    v.shape[d] = t.shape[d + 1];
    v.stride[d] = t.stride[d + 1];
  }
  return v;
}

TensorView lse_view(const AttnParams& p, const TensorView& lse, int64_t batch) {
  if (p.packed) return lse;
  TensorView v = rows_view(p, lse, batch);
  v.ndim = 2;
  return v;
}

}  // namespace ringtrain::attention
