// Test harness for the GPU attention backends: random problems (dense BSHD or packed THD), one backend's
// forward then backward from its own O/LSE on poisoned outputs, results back on the host for comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "ringtrain/attention/backend.h"
#include "ringtrain/attention/selection.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/error.h"
#include "test_util.h"

namespace ringtrain::testing::gpu {

struct Case {
  DType dtype = DType::BF16;
  int64_t batch = 1, hq = 4, hkv = 4, d = 128, sq = 0, skv = 0;
  attention::MaskType mask = attention::MaskType::None;
  std::vector<int32_t> q_lens, kv_lens;  // packed (THD) when not empty
  DType out_dtype = DType::BF16;         // O and gradients (fp32 when accumulate)
  bool accumulate = false;               // gradients added into random fp32 values
  bool bhsd_dout = false;                // dO as a [B, S, H, D] view of [B, H, S, D] storage (other strides than O)
  bool packed() const { return !q_lens.empty(); }
};

// Host tensors of one problem.
struct Problem {
  attention::AttnParams p;
  Tensor q, k, v, dout, cu_q, cu_kv, dq0, dk0, dv0;
  Tensor bias;  // host; set together with p.has_bias by tests that use one
};

struct Result {
  Tensor o, lse, dq, dk, dv;  // on the host
};

inline Tensor host_tensor(const std::vector<int64_t>& s, DType t) {
  if (s.size() == 1) return Tensor::empty({s[0]}, t);
  if (s.size() == 2) return Tensor::empty({s[0], s[1]}, t);
  if (s.size() == 3) return Tensor::empty({s[0], s[1], s[2]}, t);
  return Tensor::empty({s[0], s[1], s[2], s[3]}, t);
}
inline Tensor device_tensor(const std::vector<int64_t>& s, DType t) {
  if (s.size() == 1) return Tensor::empty({s[0]}, t, Device::cuda());
  if (s.size() == 2) return Tensor::empty({s[0], s[1]}, t, Device::cuda());
  if (s.size() == 3) return Tensor::empty({s[0], s[1], s[2]}, t, Device::cuda());
  return Tensor::empty({s[0], s[1], s[2], s[3]}, t, Device::cuda());
}
inline std::vector<int64_t> shape_of(const TensorView& t) { return {t.shape.begin(), t.shape.begin() + t.ndim}; }

inline Tensor upload(const Tensor& h) {
  Tensor d = device_tensor(shape_of(h), h.dtype());
  copy(d, h);
  return d;
}
inline Tensor download(const TensorView& d) {
  RT_CHECK(d.is_contiguous(), "download: expected a contiguous device view");
  Tensor h = host_tensor(shape_of(d), d.dtype);
  copy(h, d);
  return h;
}
inline Tensor poisoned_device(const std::vector<int64_t>& s, DType t) {
  Tensor h = host_tensor(s, t);
  poison(h);
  return upload(h);
}

inline Problem make_problem(const Case& c, std::mt19937_64& rng) {
  Problem pr;
  auto& p = pr.p;
  p.dtype = c.dtype;
  p.heads_q = c.hq;
  p.heads_kv = c.hkv;
  p.head_dim = c.d;
  p.mask = c.mask;
  std::vector<int64_t> qs, ks, lse;
  if (c.packed()) {
    p.packed = true;
    p.batch = static_cast<int64_t>(c.q_lens.size());
    pr.cu_q = Tensor::empty({p.batch + 1}, DType::I32);
    pr.cu_kv = Tensor::empty({p.batch + 1}, DType::I32);
    int32_t tq = 0, tk = 0;
    for (int64_t b = 0; b <= p.batch; ++b) {
      pr.cu_q.ptr<int32_t>()[b] = tq;
      pr.cu_kv.ptr<int32_t>()[b] = tk;
      if (b == p.batch) break;
      tq += c.q_lens[b];
      tk += c.kv_lens[b];
      p.seqlen_q = std::max<int64_t>(p.seqlen_q, c.q_lens[b]);
      p.seqlen_kv = std::max<int64_t>(p.seqlen_kv, c.kv_lens[b]);
    }
    qs = {tq, c.hq, c.d};
    ks = {tk, c.hkv, c.d};
  } else {
    p.batch = c.batch;
    p.seqlen_q = c.sq;
    p.seqlen_kv = c.skv;
    qs = {c.batch, c.sq, c.hq, c.d};
    ks = {c.batch, c.skv, c.hkv, c.d};
  }
  p.device = Device::cpu();
  pr.q = host_tensor(qs, c.dtype);
  pr.k = host_tensor(ks, c.dtype);
  pr.v = host_tensor(ks, c.dtype);
  pr.dout = host_tensor(qs, c.dtype);
  for (const Tensor* t : {&pr.q, &pr.k, &pr.v, &pr.dout}) fill_normal(*t, rng);
  if (c.accumulate) {
    pr.dq0 = host_tensor(qs, DType::F32);
    pr.dk0 = host_tensor(ks, DType::F32);
    pr.dv0 = host_tensor(ks, DType::F32);
    for (const Tensor* t : {&pr.dq0, &pr.dk0, &pr.dv0}) fill_normal(*t, rng);
  }
  return pr;
}

inline std::vector<int64_t> lse_shape(const Problem& pr) {
  const auto& p = pr.p;
  return p.packed ? std::vector<int64_t>{p.heads_q, pr.q.size(0)} : std::vector<int64_t>{p.batch, p.heads_q, p.seqlen_q};
}

// The reference: a CPU backend in fp64 outputs (fp32 where accumulating), on the same rounded inputs.
inline Result run_cpu(const attention::Backend& be, const Case& c, const Problem& pr) {
  const auto& p = pr.p;
  const DType out = c.accumulate ? DType::F32 : DType::F64;
  Result r;
  r.o = host_tensor(shape_of(pr.q), DType::F64);
  r.lse = host_tensor(lse_shape(pr), DType::F32);
  for (const Tensor* t : {&r.o, &r.lse}) poison(*t);
  if (c.accumulate) {
    r.dq = host_tensor(shape_of(pr.q), out);
    r.dk = host_tensor(shape_of(pr.k), out);
    r.dv = host_tensor(shape_of(pr.k), out);
    copy(r.dq, pr.dq0);
    copy(r.dk, pr.dk0);
    copy(r.dv, pr.dv0);
  } else {
    r.dq = host_tensor(shape_of(pr.q), out);
    r.dk = host_tensor(shape_of(pr.k), out);
    r.dv = host_tensor(shape_of(pr.k), out);
    for (const Tensor* t : {&r.dq, &r.dk, &r.dv}) poison(*t);
  }
  attention::AttnForwardArgs f{pr.q, pr.k, pr.v, r.o, r.lse, pr.cu_q, pr.cu_kv};
  f.bias = pr.bias;
  attention::validate(p, f);
  be.forward(p, f);
  attention::AttnBackwardArgs b{pr.q, pr.k, pr.v, r.o, pr.dout, r.lse, r.dq, r.dk, r.dv, c.accumulate, pr.cu_q, pr.cu_kv};
  b.bias = pr.bias;
  attention::validate(p, b);
  be.backward(p, b);
  return r;
}

// A GPU backend (called directly, or through attention::forward/backward when via_selection).
inline Result run_gpu(const attention::Backend& be, const Case& c, const Problem& pr, bool via_selection = false) {
  attention::AttnParams p = pr.p;
  p.device = Device::cuda();
  const Tensor q = upload(pr.q), k = upload(pr.k), v = upload(pr.v);
  const Tensor cu_q = p.packed ? upload(pr.cu_q) : Tensor(), cu_kv = p.packed ? upload(pr.cu_kv) : Tensor();
  const DType out = c.accumulate ? DType::F32 : c.out_dtype;
  const Tensor o = poisoned_device(shape_of(pr.q), c.accumulate ? c.out_dtype : out);
  const Tensor lse = poisoned_device(lse_shape(pr), DType::F32);
  Tensor dq, dk, dv;
  if (c.accumulate) {
    dq = upload(pr.dq0);
    dk = upload(pr.dk0);
    dv = upload(pr.dv0);
  } else {
    dq = poisoned_device(shape_of(pr.q), out);
    dk = poisoned_device(shape_of(pr.k), out);
    dv = poisoned_device(shape_of(pr.k), out);
  }
  // dO with other strides than O: [B, H, S, D] storage seen as [B, S, H, D].
  Tensor dout_storage;
  TensorView dout;
  if (c.bhsd_dout) {
    const auto s = shape_of(pr.dout);
    Tensor host_bhsd = host_tensor({s[0], s[2], s[1], s[3]}, pr.dout.dtype());
    TensorView as_bshd = host_bhsd.view();
    as_bshd.shape = pr.dout.view().shape;
    as_bshd.stride = {s[2] * s[1] * s[3], s[3], s[1] * s[3], 1};
    copy(as_bshd, pr.dout);
    dout_storage = upload(host_bhsd);
    dout = dout_storage.view();
    dout.shape = pr.dout.view().shape;
    dout.stride = as_bshd.stride;
  } else {
    dout_storage = upload(pr.dout);
    dout = dout_storage.view();
  }
  const Tensor bias = p.has_bias ? upload(pr.bias) : Tensor();
  attention::AttnForwardArgs f{q, k, v, o, lse, cu_q, cu_kv};
  attention::AttnBackwardArgs b{q, k, v, o, dout, lse, dq, dk, dv, c.accumulate, cu_q, cu_kv};
  f.bias = b.bias = bias;
  if (via_selection) {
    attention::forward(p, f);
    attention::backward(p, b);
  } else {
    attention::validate(p, f);
    be.forward(p, f);
    attention::validate(p, b);
    be.backward(p, b);
  }
  synchronize(Device::cuda(0));
  return {download(o), download(lse), download(dq), download(dk), download(dv)};
}

struct Errors {
  double o, lse_abs, dq, dk, dv;
  void print(const char* what) const {
    std::printf("[errors %s] O %.2e  LSE(max abs) %.2e  dQ %.2e  dK %.2e  dV %.2e\n", what, o, lse_abs, dq, dk, dv);
  }
};

inline Errors compare(const Result& got, const Result& ref) {
  return {rel_error(got.o, ref.o), max_abs_error(got.lse, ref.lse), rel_error(got.dq, ref.dq),
          rel_error(got.dk, ref.dk), rel_error(got.dv, ref.dv)};
}

inline void expect_within(const Errors& e, double tol, double lse_tol) {
  EXPECT_LE(e.o, tol);
  EXPECT_LE(e.lse_abs, lse_tol);
  EXPECT_LE(e.dq, tol);
  EXPECT_LE(e.dk, tol);
  EXPECT_LE(e.dv, tol);
}

inline const attention::Backend& cpu_math() {
  return *attention::find_backend(attention::BackendId::Math, DeviceKind::CPU);
}

// The GPU implementation of `id`; fails the test when this CUDA build lacks it.
inline const attention::Backend* gpu_backend(attention::BackendId id) {
  const attention::Backend* be = attention::find_backend(id, DeviceKind::CUDA);
  EXPECT_NE(be, nullptr) << "this CUDA build has no " << attention::backend_name(id) << " backend";
  return be;
}

}  // namespace ringtrain::testing::gpu
