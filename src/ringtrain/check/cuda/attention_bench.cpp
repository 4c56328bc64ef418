// bench_attention_backend: one backend's CUDA implementation timed on one GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "ringtrain/check/cuda/cuda_checks.h"
#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/error.h"

namespace ringtrain::check::cuda {

AttentionBenchRow bench_attention_backend(attention::BackendId id, const AttnProblem& prob, int warmup, int iters) {
  AttentionBenchRow row;
  row.backend = std::string(attention::backend_name(id));
  row.seq = prob.seq;
  const attention::Backend* be = attention::find_backend(id, DeviceKind::CUDA);
  if (!be) {
    row.status = "no cuda implementation in this build";
    return row;
  }
  const Device dev = Device::cuda(0);
  attention::AttnParams p;
  p.device = dev;
  p.dtype = prob.dtype;
  p.batch = prob.batch;
  p.heads_q = prob.heads_q;
  p.heads_kv = prob.heads_kv;
  p.head_dim = prob.head_dim;
  p.seqlen_q = p.seqlen_kv = prob.seq;
  p.mask = prob.mask();
  p.window = prob.window;
  const auto reasons = be->unsupported_reasons(p);
  if (!reasons.empty()) {
    row.status = reasons.front();
    return row;
  }
  // Rotate among input sets when one set would sit in L2 (else repeated calls would time the cache).
  int l2 = 0;
  RT_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev.index), "L2 size");
  const int64_t set_bytes = static_cast<int64_t>(dtype_size(prob.dtype)) * prob.batch * prob.seq * prob.head_dim *
                            (2 * prob.heads_q + 2 * prob.heads_kv);
  const int sets =
      set_bytes >= 4 * int64_t{l2} ? 1 : static_cast<int>(std::min<int64_t>(8, 4 * int64_t{l2} / set_bytes + 1));
  std::vector<AttnBuffers> bufs;
  for (int i = 0; i < sets; ++i) {
    bufs.emplace_back(prob, prob.seq, dev);
    bufs.back().fill_inputs(1234 + static_cast<uint64_t>(i));
  }
  attention::validate(p, bufs[0].forward_args());
  // The forward alone, then forward + backward, each in runs of its own: the way PyTorch's side is timed
  // (bench/compare_torch.py), so that the forward's figure does not depend on what ran before it.
  const TimedRuns forward_runs = time_runs(dev, nullptr, warmup, iters, [&](int i, DeviceClock&) {
    be->forward(p, bufs[static_cast<size_t>(i % sets)].forward_args());
  });
  const double flops = prob.forward_flops();
  row.fwd_ms = forward_runs.median_to(0);
  row.fwd_tflops = flops / (row.fwd_ms * 1e9);
  row.status = "ok";
  if (const auto why = be->backward_unsupported_reasons(p); !why.empty()) {
    row.no_backward = why.front();
    return row;
  }
  const TimedRuns runs = time_runs(dev, nullptr, warmup, iters, [&](int i, DeviceClock&) {
    const AttnBuffers& b = bufs[static_cast<size_t>(i % sets)];
    be->forward(p, b.forward_args());
    be->backward(p, b.backward_args());
  });
  row.fwdbwd_ms = runs.median_to(0);
  row.fwdbwd_tflops = 3.5 * flops / (row.fwdbwd_ms * 1e9);
  return row;
}

}  // namespace ringtrain::check::cuda
