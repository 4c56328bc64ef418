// The losses of losses.h as device kernels, behind an interface (as device_optimizer.h), for a train step whose
// batch lies on the policy's GPU (Trainer::step(TrainRows)): the per-token inputs, the logprobs and the gradients stay
// in device memory, and only the counts and the loss's sums come back. device_loss_kernels() is nullptr in a build
// without CUDA (train/device_kernels.cpp).
//
// A microbatch is held as the host losses take it: padded [batch, seq] row-major, entry p of row b the value at token
// p of the microbatch's sequence b, zero past its length. Every kernel is enqueued on the legacy default stream (where
// the GPU model runs) and accumulates in fp64 in an order fixed by the shapes alone (bitwise reproducible).
#pragma once

#include <cstdint>

#include "ringtrain/core/dtype.h"
#include "ringtrain/train/losses.h"

namespace ringtrain::train {

// One microbatch's loss inputs on the device ([batch * seq], sample_mask [batch]); absent inputs are null.
struct DeviceMicro {
  int64_t batch = 0, seq = 0;
  const uint8_t* token_mask = nullptr;  // 0/1
  const uint8_t* sample_mask = nullptr;
  const float* advantages = nullptr;
  const float* prev = nullptr;
  const float* ref = nullptr;
  const float* gen = nullptr;
};

// Values of a caller's [R, C] view (or [R]: one per row, col_stride 0) on the device, strides in elements.
struct DeviceSource {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int64_t row_stride = 0, col_stride = 0;
};

// What count() writes per microbatch, in this order.
enum CountSlot : int { kTokens, kSequences, kPairs, kChosenTokens, kBadPair, kCountSlots };

class DeviceLossKernels {
 public:
  virtual ~DeviceLossKernels() = default;

  // out[b * seq + p] = the source's value at (rows[b], p) for p < lengths[b] (device arrays of `batch`), 0 beyond:
  // as int32 (I32 out: token ids), as float (F32) or as 0/1 (U8: masks, where *first_bad, when not null, is lowered
  // to b * seq + p of the first value that is neither 0 nor 1; the caller sets it to -1 beforehand).
  virtual void gather_padded(const DeviceSource& src, const int64_t* rows, const int64_t* lengths, int64_t batch,
                             int64_t seq, DType out_dtype, void* out, int64_t* first_bad) const = 0;

  // counts[CountSlot] of the microbatch as count_valid and (with dpo) count_dpo_pairs give them, kBadPair the first
  // pair whose two sample masks differ (or -1); row_count[b] = row b's counted tokens.
  virtual void count(const DeviceMicro& m, bool dpo, double* row_count, double* counts) const = 0;

  // row_scale[b] = d(microbatch loss)/d(token loss) for row b's tokens (the NLL and the clipped PG: 1 / global
  // tokens, or for sequence means 1 / (row_count[b] · global sequences), 0 for a row without counted tokens).
  virtual void row_scales(const LossConfig& cfg, const DeviceMicro& m, const ValidCounts& global,
                          const double* row_count, double* row_scale) const = 0;
  // The token-local gradient (TokenLocalGradient's) of n listed tokens: token k is position seq_pos[2k + 1] of row
  // seq_pos[2k] (row < 0: nothing, gradient 0) with logprob logprobs[k]; d[k] = d(loss)/d(logprob).
  virtual void token_gradient(const LossConfig& cfg, const DeviceMicro& m, const double* row_scale,
                              const float* logprobs, const int32_t* seq_pos, int64_t n, float* d) const = 0;
  // The NLL's or the clipped PG's value and metric sums over the microbatch from its padded logprobs (and entropy,
  // or null): sums[0] = the loss, sums[1 + k] = metric k's sum in loss_metric_names' order.
  virtual void token_loss(const LossConfig& cfg, const DeviceMicro& m, const double* row_scale,
                          const float* logprobs, const float* entropy, double* sums) const = 0;
  // DPO on the microbatch (rows 2i, 2i + 1 the pairs): sums as token_loss's, and d_logprobs [batch * seq] the
  // gradient; `scratch` holds 3 * batch doubles.
  virtual void dpo(const DPOConfig& cfg, const DeviceMicro& m, const DPOCounts& global, const float* logprobs,
                   float* d_logprobs, double* sums, double* scratch) const = 0;
};

// The CUDA kernels, or nullptr where this build has none.
const DeviceLossKernels* device_loss_kernels();

}  // namespace ringtrain::train
