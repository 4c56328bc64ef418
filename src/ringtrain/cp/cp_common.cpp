#include "ringtrain/cp/cp_common.h"

#include "ringtrain/attention/selection.h"

#include <cmath>
#include <limits>

#include "ringtrain/core/device_ops.h"
#include "ringtrain/core/error.h"

namespace ringtrain::cp {

using attention::AttnParams;
using attention::MaskType;

ZigzagLayout check_cp_call(const char* what, const comm::Communicator& comm, const AttnParams& p,
                           int64_t global_len) {
  RT_CHECK(!p.packed, what, ": packed sequences (THD) go through cp::packed_attention_forward/backward (",
           p.describe(), ")");
  RT_CHECK(!p.has_bias, what, ": an additive attention bias is not supported under context parallelism (",
           p.describe(), ")");
  RT_CHECK(p.device == comm.device(), what, ": tensors are on ", device_name(p.device), " but the communicator's ",
           "buffers are on ", device_name(comm.device()));
  ZigzagLayout l(comm.size(), comm.rank(), global_len);
  RT_CHECK(p.seqlen_q == l.local_len() && p.seqlen_kv == l.local_len(), what, ": local shard has Sq=", p.seqlen_q,
           " Skv=", p.seqlen_kv, ", expected ", l.local_len(), " (zigzag layout of ", global_len, " tokens over cp=",
           l.cp, ": 2 chunks of ", l.chunk_len(), ")");
  return l;
}

bool is_causal(const AttnParams& p) {
  // Sq == Skv locally, so top-left and bottom-right alignment are the same global causal mask.
  return p.mask != MaskType::None;
}

GlobalOrder::GlobalOrder(std::vector<Segment> segs, int64_t rows) : segments(std::move(segs)), local_rows(rows) {
  for (const Segment& seg : segments) at.push_back(total), total += seg.layout.padded_len();
}

void GlobalOrder::to_global(int s, const TensorView& block, const TensorView& global, void* stream) const {
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& seg = segments[i];
    block_to_global(seg.layout, s, rows(block, seg.start, seg.len()), rows(global, at[i], seg.layout.padded_len()),
                    stream);
  }
}

void GlobalOrder::to_block(int s, const TensorView& global, const TensorView& block, void* stream) const {
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& seg = segments[i];
    global_to_block(seg.layout, s, rows(global, at[i], seg.layout.padded_len()), rows(block, seg.start, seg.len()),
                    stream);
  }
}

attention::AttnForwardArgs packed_as_dense(const attention::AttnForwardArgs& a, int64_t n) {
  attention::AttnForwardArgs d = a;
  d.q = packed_rows(a.q, 0, n), d.k = packed_rows(a.k, 0, n), d.v = packed_rows(a.v, 0, n);
  d.o = packed_rows(a.o, 0, n), d.lse = packed_lse(a.lse, 0, n);
  d.cu_seqlens_q = d.cu_seqlens_kv = TensorView();
  return d;
}

attention::AttnBackwardArgs packed_as_dense(const attention::AttnBackwardArgs& a, int64_t n) {
  attention::AttnBackwardArgs d = a;
  d.q = packed_rows(a.q, 0, n), d.k = packed_rows(a.k, 0, n), d.v = packed_rows(a.v, 0, n);
  d.o = packed_rows(a.o, 0, n), d.dout = packed_rows(a.dout, 0, n), d.lse = packed_lse(a.lse, 0, n);
  d.dq = packed_rows(a.dq, 0, n), d.dk = packed_rows(a.dk, 0, n), d.dv = packed_rows(a.dv, 0, n);
  d.cu_seqlens_q = d.cu_seqlens_kv = TensorView();
  return d;
}

namespace {

template <class Args>
DenseSegments segments_of(const char* what, const comm::Communicator& comm, const AttnParams& p,
                          const PackedZigzag& l, CheckCall check, const Args& a) {
  DenseSegments out;
  for (size_t d = 0; d < l.doc_lens.size(); ++d) {
    AttnParams doc = p;
    doc.packed = false;
    doc.batch = 1;
    doc.seqlen_q = doc.seqlen_kv = l.doc(d).local_len();
    out.segments.push_back({check(what, comm, doc, l.doc_lens[d]), l.local_start(d)});
  }
  out.rows = l.local_total();
  out.params = p;
  out.params.packed = false;
  out.params.batch = 1;
  out.params.seqlen_q = out.params.seqlen_kv = out.rows;
  attention::validate(out.params, packed_as_dense(a, out.rows));
  return out;
}

}  // namespace

DenseSegments packed_segments(const char* what, const comm::Communicator& comm, const AttnParams& p,
                              const PackedZigzag& l, CheckCall check, const attention::AttnForwardArgs& a) {
  return segments_of(what, comm, p, l, check, a);
}

DenseSegments packed_segments(const char* what, const comm::Communicator& comm, const AttnParams& p,
                              const PackedZigzag& l, CheckCall check, const attention::AttnBackwardArgs& a) {
  return segments_of(what, comm, p, l, check, a);
}

AttnParams block_params(const AttnParams& local, int64_t sq, int64_t skv, MaskType m) {
  AttnParams b = local;
  b.seqlen_q = sq;
  b.seqlen_kv = skv;
  b.mask = m;
  b.softmax_scale = local.scale();
  // The last row's window starts latest: when it starts at key 0, the window hides nothing in this block, and the
  // backends that take no window stay eligible for it.
  if (m == MaskType::None || attention::key_start(m, local.window, sq - 1, sq, skv) == 0) b.window = 0;
  return b;
}

KvPack view_kv_pack(void* data, const TensorView& k_like, int64_t len, DType dtype, Device device) {
  const int64_t b = k_like.shape[0], h = k_like.shape[2], d = k_like.shape[3];
  KvPack p;
  p.k = contiguous_view(data, dtype, device, {b, len, h, d});
  p.v = contiguous_view(static_cast<char*>(data) + p.k.nbytes(), dtype, device, {b, len, h, d});
  return p;
}

KvPack make_kv_pack(const TensorView& k_like, int64_t len, DType dtype, Device device, bool zeroed) {
  const int64_t n = 2 * k_like.shape[0] * len * k_like.shape[2] * k_like.shape[3];
  Tensor buf = zeroed ? Tensor::zeros({n}, dtype, device) : Tensor::empty({n}, dtype, device);
  KvPack p = view_kv_pack(buf.data(), k_like, len, dtype, device);
  p.buf = std::move(buf);
  return p;
}

void block_to_global(const ZigzagLayout& l, int s, const TensorView& block, const TensorView& global, void* stream) {
  const int64_t c = l.chunk_len();
  copy_async(rows(global, s * c, c), rows(block, 0, c), stream);
  copy_async(rows(global, (2 * l.cp - 1 - s) * c, c), rows(block, c, c), stream);
}

void global_to_block(const ZigzagLayout& l, int s, const TensorView& global, const TensorView& block, void* stream) {
  const int64_t c = l.chunk_len();
  copy_async(rows(block, 0, c), rows(global, s * c, c), stream);
  copy_async(rows(block, c, c), rows(global, (2 * l.cp - 1 - s) * c, c), stream);
}

void block_forward(const AttnParams& local, const attention::AttnForwardArgs& a, int64_t q_start, int64_t nq,
                   const TensorView& k, const TensorView& v, int64_t nk, MaskType mask, const TensorView& o,
                   const TensorView& lse) {
  attention::AttnForwardArgs s;
  s.q = rows(a.q, q_start, nq);
  s.k = rows(k, 0, nk);
  s.v = rows(v, 0, nk);
  s.o = o;
  s.lse = lse;
  s.stream = a.stream;
  attention::forward(block_params(local, nq, nk, mask), s);
}

void block_backward(const AttnParams& local, const attention::AttnBackwardArgs& a, int64_t q_start, int64_t nq,
                    const TensorView& k, const TensorView& v, int64_t nk, MaskType mask, const TensorView& dq,
                    const TensorView& dk, const TensorView& dv, bool accumulate) {
  attention::AttnBackwardArgs s;
  s.q = rows(a.q, q_start, nq);
  s.k = rows(k, 0, nk);
  s.v = rows(v, 0, nk);
  s.o = rows(a.o, q_start, nq);
  s.dout = rows(a.dout, q_start, nq);
  s.lse = lse_rows(a.lse, q_start, nq);
  s.dq = rows(dq, q_start, nq);
  s.dk = rows(dk, 0, nk);
  s.dv = rows(dv, 0, nk);
  s.accumulate = accumulate;
  s.stream = a.stream;
  attention::backward(block_params(local, nq, nk, mask), s);
}

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void check_f32(const char* what, const TensorView& t, Device device) {
  RT_CHECK(t.dtype == DType::F32 && t.device == device, what, ": expected fp32 on ", device_name(device), ", got ",
           t.shape_str());
}

inline float sigmoid(float x) {
  if (x >= 0) return 1.f / (1.f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.f + e);
}
inline float softplus(float x) { return std::max(x, 0.f) + std::log1p(std::exp(-std::fabs(x))); }

}  // namespace

void merge_partial(const TensorView& o_a, const TensorView& lse_a, const TensorView& o_b, const TensorView& lse_b,
                   void* stream) {
  for (const TensorView* t : {&lse_a, &lse_b}) check_f32("CP merge (LSE)", *t, o_a.device);
  for (const TensorView* t : {&o_a, &o_b})
    RT_CHECK(is_float(t->dtype) && t->device == o_a.device, "CP merge: O must be a float tensor on ",
             device_name(o_a.device), ", got ", t->shape_str());
  RT_CHECK(o_a.ndim == 4 && o_b.ndim == 4 && lse_a.ndim == 3 && lse_b.ndim == 3, "CP merge: bad ranks ",
           o_a.shape_str(), " ", o_b.shape_str());
  for (int d = 0; d < 4; ++d)
    RT_CHECK(o_a.shape[d] == o_b.shape[d], "CP merge: ", o_a.shape_str(), " vs ", o_b.shape_str());
  const int64_t batch = o_a.shape[0], n = o_a.shape[1], heads = o_a.shape[2], dim = o_a.shape[3];
  RT_CHECK(lse_a.shape[0] == batch && lse_a.shape[1] == heads && lse_a.shape[2] == n && lse_b.shape[2] == n,
           "CP merge: lse ", lse_a.shape_str(), " does not match ", o_a.shape_str());
  if (!o_a.device.is_cpu()) {
    const MergePartialFn device_merge = find_device_merge_partial(o_a.device.kind);
    if (!device_merge) throw_no_device_ops(o_a.device, cat("CP merge of ", o_a.shape_str()));
    return device_merge(o_a, lse_a, o_b, lse_b, stream);
  }
  float* la = lse_a.ptr<float>();
  const float* lb = lse_b.ptr<const float>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < n; ++i) {
        float& l_a = la[b * lse_a.stride[0] + h * lse_a.stride[1] + i * lse_a.stride[2]];
        const float l_b = lb[b * lse_b.stride[0] + h * lse_b.stride[1] + i * lse_b.stride[2]];
        if (l_b == kNegInf) continue;  // b saw no key: nothing to add
        const int64_t ra = b * o_a.stride[0] + i * o_a.stride[1] + h * o_a.stride[2];
        const int64_t rb = b * o_b.stride[0] + i * o_b.stride[1] + h * o_b.stride[2];
        // a saw no key yet: take b (w = 1)
        const float w = l_a == kNegInf ? 1.f : sigmoid(l_b - l_a);
        for (int64_t c = 0; c < dim; ++c) {
          const double x = load_as_double(o_a.data, o_a.dtype, ra + c * o_a.stride[3]);
          const double y = load_as_double(o_b.data, o_b.dtype, rb + c * o_b.stride[3]);
          store_from_double(o_a.data, o_a.dtype, ra + c * o_a.stride[3], x - w * (x - y));
        }
        l_a = l_a == kNegInf ? l_b : l_a + softplus(l_b - l_a);  // = L_a - logsigmoid(L_a - L_b)
      }
    }
  }
}

void fill_neg_inf(const TensorView& t, void* stream) {
  check_f32("CP LSE init", t, t.device);
  fill_async(t, kNegInf, stream);
}

}  // namespace ringtrain::cp
