#include "ringtrain/cp/device_run.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/error.h"
#include "ringtrain/cp/zigzag.h"

namespace ringtrain::cp {
namespace {

using attention::AttnBackwardArgs;
using attention::AttnForwardArgs;
using attention::AttnParams;
using attention::MaskType;


// q/k/v/dO, outputs and gradients of one attention problem on one device.
struct Buffers {
  Tensor q, k, v, dout, o, lse, dq, dk, dv;
  Buffers(const AttnProblem& p, int64_t len, Device dev)
      : q(Tensor::empty({p.batch, len, p.heads_q, p.head_dim}, p.dtype, dev)),
        k(Tensor::empty({p.batch, len, p.heads_kv, p.head_dim}, p.dtype, dev)),
        v(Tensor::empty({p.batch, len, p.heads_kv, p.head_dim}, p.dtype, dev)),
        dout(Tensor::empty({p.batch, len, p.heads_q, p.head_dim}, p.dtype, dev)),
        o(Tensor::empty({p.batch, len, p.heads_q, p.head_dim}, p.dtype, dev)),
        lse(Tensor::empty({p.batch, p.heads_q, len}, DType::F32, dev)),
        dq(Tensor::empty({p.batch, len, p.heads_q, p.head_dim}, p.dtype, dev)),
        dk(Tensor::empty({p.batch, len, p.heads_kv, p.head_dim}, p.dtype, dev)),
        dv(Tensor::empty({p.batch, len, p.heads_kv, p.head_dim}, p.dtype, dev)) {}
  AttnForwardArgs fwd() const { return {q, k, v, o, lse}; }
  AttnBackwardArgs bwd() const { return {q, k, v, o, dout, lse, dq, dk, dv}; }
  void poison() const {
    for (const Tensor* t : {&o, &lse, &dq, &dk, &dv}) fill(*t, std::nan(""));
  }
};

// Per-rank medians (ms) of fwd and fwd+bwd over `iters` runs after `warmup`, each run started after a barrier.
std::pair<double, double> time_runs(comm::Communicator& comm, int warmup, int iters, const std::function<void()>& fwd,
                                    const std::function<void()>& bwd) {
  cudaEvent_t e0, e1, e2;
  RT_CUDA_CHECK(cudaEventCreate(&e0));
  RT_CUDA_CHECK(cudaEventCreate(&e1));
  RT_CUDA_CHECK(cudaEventCreate(&e2));
  std::vector<double> f, fb;
  for (int it = 0; it < warmup + iters; ++it) {
    comm.barrier();
    RT_CUDA_CHECK(cudaDeviceSynchronize(), "synchronize before a timed run");
    RT_CUDA_CHECK(cudaEventRecord(e0, nullptr));
    fwd();
    RT_CUDA_CHECK(cudaEventRecord(e1, nullptr));
    bwd();
    RT_CUDA_CHECK(cudaEventRecord(e2, nullptr));
    RT_CUDA_CHECK(cudaDeviceSynchronize(), "synchronize after a timed run");
    float a = 0, b = 0;
    RT_CUDA_CHECK(cudaEventElapsedTime(&a, e0, e1));
    RT_CUDA_CHECK(cudaEventElapsedTime(&b, e0, e2));
    if (it >= warmup) {
      f.push_back(a);
      fb.push_back(b);
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaEventDestroy(e2);
  std::sort(f.begin(), f.end());
  std::sort(fb.begin(), fb.end());
  return {f[f.size() / 2], fb[fb.size() / 2]};
}

// Sum over ranks (device all-reduce of a few doubles).
std::vector<double> all_reduce_host(comm::Communicator& comm, std::vector<double> v, comm::ReduceOp op) {
  Tensor d = Tensor::empty({static_cast<int64_t>(v.size())}, DType::F64, comm.device());
  const TensorView host = contiguous_view(v.data(), DType::F64, Device::cpu(), {static_cast<int64_t>(v.size())});
  copy(d, host);
  comm.all_reduce(d.data(), v.size(), DType::F64, op);
  copy(host, d);
  return v;
}

// Squared-difference and squared-reference sums of got vs ref (device views of one shape), via the host in fp64.
std::pair<double, double> error_sums(const TensorView& got, const TensorView& ref) {
  auto download = [](const TensorView& t) {
    Tensor h = Tensor::empty({t.numel()}, DType::F32);
    TensorView hv = t;
    hv.data = h.data();
    hv.device = Device::cpu();
    hv.dtype = DType::F32;
    int64_t st = 1;
    for (int d = t.ndim - 1; d >= 0; --d) hv.stride[d] = st, st *= t.shape[d];
    copy(hv, t);
    return h;
  };
  const Tensor g = download(got), r = download(ref);
  double num = 0, den = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double x = g.ptr<float>()[i], y = r.ptr<float>()[i];
    if (std::isinf(y) && x == y) continue;  // rows that see no key on both sides
    if (!std::isfinite(x) || !std::isfinite(y)) return {INFINITY, 1.0};
    num += (x - y) * (x - y);
    den += y * y;
  }
  return {num, den};
}

}  // namespace

DeviceRunResult run_cp_on_device(comm::Communicator& comm, const DeviceRunOptions& opt) {
  const Device dev = comm.device();
  RT_CHECK(dev.is_cuda(), "run_cp_on_device: the communicator's buffers are on ", device_name(dev), ", not a GPU");
  RT_CUDA_CHECK(cudaSetDevice(dev.index));
  const AttnProblem& p = opt.prob;
  const ZigzagLayout l(comm.size(), comm.rank(), p.seq);
  const MaskType mask = p.causal ? MaskType::CausalTopLeft : MaskType::None;
  DeviceRunResult res;

  Buffers whole(p, p.seq, dev);
  int64_t i = 0;
  for (const Tensor* t : {&whole.q, &whole.k, &whole.v, &whole.dout}) fill_normal_hashed(*t, opt.seed * 8 + i++);
  Buffers local(p, l.local_len(), dev);
  shard(whole.q, 1, l, local.q);
  shard(whole.k, 1, l, local.k);
  shard(whole.v, 1, l, local.v);
  shard(whole.dout, 1, l, local.dout);
  const AttnParams lp = attention::params_for(local.q, local.k, mask);
  const AttnParams wp = attention::params_for(whole.q, whole.k, mask);
  {
    const attention::BackendScope cp_scope = attention::BackendScope::context_parallel(comm.size());
    res.selection = attention::explain(lp).report();
  }

  KeptKv kept;
  KeptKv* keep = opt.keep_kv ? &kept : nullptr;
  auto cp_fwd = [&] { attention_forward(comm, opt.config, lp, local.fwd(), p.seq, keep); };
  auto cp_bwd = [&] { attention_backward(comm, opt.config, lp, local.bwd(), p.seq, keep); };
  auto single_fwd = [&] {
    const attention::BackendScope one = attention::BackendScope::context_parallel(1);
    attention::forward(wp, whole.fwd());
  };
  auto single_bwd = [&] {
    const attention::BackendScope one = attention::BackendScope::context_parallel(1);
    attention::backward(wp, whole.bwd());
  };

  attention::reset_dispatch_counts();
  local.poison();
  cp_fwd();
  cp_bwd();
  RT_CUDA_CHECK(cudaDeviceSynchronize(), "CP attention");
  res.dispatches = attention::dispatch_counts();

  if (opt.check) {
    whole.poison();
    single_fwd();
    single_bwd();
    RT_CUDA_CHECK(cudaDeviceSynchronize(), "single-GPU attention");
    Buffers ref(p, l.local_len(), dev);
    shard(whole.o, 1, l, ref.o);
    shard(whole.lse, 2, l, ref.lse);
    shard(whole.dq, 1, l, ref.dq);
    shard(whole.dk, 1, l, ref.dk);
    shard(whole.dv, 1, l, ref.dv);
    const int64_t n = l.valid_len();
    std::vector<double> sums;
    for (auto [got, want] : {std::pair{&local.o, &ref.o}, {&local.dq, &ref.dq}, {&local.dk, &ref.dk},
                             {&local.dv, &ref.dv}}) {
      auto [num, den] = error_sums(got->view().slice(1, 0, n), want->view().slice(1, 0, n));
      sums.push_back(num);
      sums.push_back(den);
    }
    auto [num, den] = error_sums(local.lse.view().slice(2, 0, n), ref.lse.view().slice(2, 0, n));
    sums.push_back(num);
    sums.push_back(den);
    sums = all_reduce_host(comm, sums, comm::ReduceOp::Sum);
    auto rel = [&](int k) { return std::sqrt(sums[2 * k] / std::max(sums[2 * k + 1], 1e-300)); };
    res.err_o = rel(0);
    res.err_dq = rel(1);
    res.err_dk = rel(2);
    res.err_dv = rel(3);
    res.err_lse = rel(4);
  }

  if (opt.iters > 0) {
    auto [f, fb] = time_runs(comm, opt.warmup, opt.iters, cp_fwd, cp_bwd);
    std::vector<double> t = {f, fb};
    if (opt.time_single) {
      auto [sf, sfb] = time_runs(comm, opt.warmup, opt.iters, single_fwd, single_bwd);
      t.push_back(sf);
      t.push_back(sfb);
    }
    t = all_reduce_host(comm, t, comm::ReduceOp::Max);  // the slowest rank sets the pace
    res.cp_fwd_ms = t[0];
    res.cp_fwdbwd_ms = t[1];
    if (opt.time_single) {
      res.single_fwd_ms = t[2];
      res.single_fwdbwd_ms = t[3];
    }
  }
  return res;
}

}  // namespace ringtrain::cp
