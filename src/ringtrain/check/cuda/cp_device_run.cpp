// run_cp_on_device: CP attention on GPU ranks against the single-GPU result of the same backend.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ringtrain/check/cuda/cuda_checks.h"
#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/error.h"
#include "ringtrain/cp/zigzag.h"

namespace ringtrain::check::cuda {
namespace {


// Reduces a few doubles over the ranks (a device all-reduce).
std::vector<double> all_reduce_host(comm::Communicator& comm, std::vector<double> v, comm::ReduceOp op) {
  Tensor d = Tensor::empty({static_cast<int64_t>(v.size())}, DType::F64, comm.device());
  const TensorView host = contiguous_view(v.data(), DType::F64, Device::cpu(), {static_cast<int64_t>(v.size())});
  copy(d, host);
  comm.all_reduce(d.data(), v.size(), DType::F64, op);
  copy(host, d);
  return v;
}

}  // namespace

DeviceRunResult run_cp_on_device(comm::Communicator& comm, const DeviceRunOptions& opt) {
  const Device dev = comm.device();
  RT_CHECK(dev.is_cuda(), "run_cp_on_device: the communicator's buffers are on ", device_name(dev), ", not a GPU");
  RT_CUDA_CHECK(cudaSetDevice(dev.index));
  const AttnProblem& p = opt.prob;
  const cp::ZigzagLayout l(comm.size(), comm.rank(), p.seq);
  DeviceRunResult res;

  const AttnBuffers whole(p, p.seq, dev);
  whole.fill_inputs(opt.seed);
  const AttnBuffers local(p, l.local_len(), dev);
  cp::shard(whole.q, 1, l, local.q);
  cp::shard(whole.k, 1, l, local.k);
  cp::shard(whole.v, 1, l, local.v);
  cp::shard(whole.dout, 1, l, local.dout);
  const attention::AttnParams lp = p.params(local.q, local.k);
  const attention::AttnParams wp = p.params(whole.q, whole.k);
  {
    const attention::BackendScope cp_scope = attention::BackendScope::context_parallel(comm.size());
    res.selection = attention::explain(lp).report();
  }

  cp::KeptKv kept;
  cp::KeptKv* keep = opt.keep_kv ? &kept : nullptr;
  auto cp_fwd = [&] { cp::attention_forward(comm, opt.config, lp, local.forward_args(), p.seq, keep); };
  auto cp_bwd = [&] { cp::attention_backward(comm, opt.config, lp, local.backward_args(), p.seq, keep); };
  auto single_fwd = [&] {
    const attention::BackendScope one = attention::BackendScope::context_parallel(1);
    attention::forward(wp, whole.forward_args());
  };
  auto single_bwd = [&] {
    const attention::BackendScope one = attention::BackendScope::context_parallel(1);
    attention::backward(wp, whole.backward_args());
  };

  attention::reset_dispatch_counts();
  local.poison_outputs();
  cp_fwd();
  cp_bwd();
  RT_CUDA_CHECK(cudaDeviceSynchronize(), "CP attention");
  res.dispatches = attention::dispatch_counts();

  if (opt.check) {
    whole.poison_outputs();
    single_fwd();
    single_bwd();
    RT_CUDA_CHECK(cudaDeviceSynchronize(), "single-GPU attention");
    const AttnBuffers ref(p, l.local_len(), dev);
    cp::shard(whole.o, 1, l, ref.o);
    cp::shard(whole.lse, 2, l, ref.lse);
    cp::shard(whole.dq, 1, l, ref.dq);
    cp::shard(whole.dk, 1, l, ref.dk);
    cp::shard(whole.dv, 1, l, ref.dv);
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
    const auto barrier = [&] { comm.barrier(); };
    const TimedRuns cp_runs = time_runs(
        dev, nullptr, opt.warmup, opt.iters,
        [&](int, DeviceClock& clock) {
          cp_fwd();
          clock.mark();
          cp_bwd();
        },
        barrier);
    std::vector<double> t = {cp_runs.median_to(0), cp_runs.median_to(1)};
    if (opt.time_single) {
      const TimedRuns single_runs = time_runs(
          dev, nullptr, opt.warmup, opt.iters,
          [&](int, DeviceClock& clock) {
            single_fwd();
            clock.mark();
            single_bwd();
          },
          barrier);
      t.push_back(single_runs.median_to(0));
      t.push_back(single_runs.median_to(1));
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

}  // namespace ringtrain::check::cuda
