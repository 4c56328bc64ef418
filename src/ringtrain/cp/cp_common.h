// Pieces shared by the CP algorithms: argument checks, per-block params, packed KV buffers, the merge of
// partial results.
#pragma once

#include <cstdint>
#include <vector>

#include "ringtrain/attention/params.h"
#include "ringtrain/comm/communicator.h"
#include "ringtrain/cp/zigzag.h"

namespace ringtrain::cp {

// Checks a local CP call (not packed, no bias, mask none or causal, local shapes, device of the communicator) and
// returns this rank's layout. `what` names the entry point in errors. A sliding window (local.window, over the global
// sequence) passes: each algorithm serves it or refuses it.
ZigzagLayout check_cp_call(const char* what, const comm::Communicator& comm, const attention::AttnParams& local,
                           int64_t global_len);
bool is_causal(const attention::AttnParams& local);

// One sequence's rows in the local tensors of a CP call: its zigzag layout and the first of its 2c local rows
// (dimension 1 of [B, rows, H, D]). A dense call is one segment at 0; packed documents are one segment each, at
// their local starts, so that an algorithm moves the rows of every document together.
struct Segment {
  ZigzagLayout layout;
  int64_t start = 0;
  int64_t len() const { return layout.local_len(); }
};

// The sequences of a CP call in global order, one after another (all-gather's keys and values, all-to-all's head
// groups): segment i's whole (padded) sequence takes rows [at[i], at[i] + padded_len) of `total`.
struct GlobalOrder {
  std::vector<Segment> segments;
  int64_t local_rows = 0;  // rows of the local tensors
  std::vector<int64_t> at;
  int64_t total = 0;

  GlobalOrder(std::vector<Segment> segs, int64_t local_rows);
  // Rank s's local rows of every sequence (`block`, [B, local_rows, ...]) to their places in `global` ([B, total,
  // ...]), and back; enqueued on `stream`.
  void to_global(int s, const TensorView& block, const TensorView& global, void* stream) const;
  void to_block(int s, const TensorView& global, const TensorView& block, void* stream) const;
};

// A packed call as a dense one: every document a segment of the [1, T_local, H, D] views of the local THD tensors
// (LSE [1, H, T_local]), each checked by `check` as the dense call of that document would be, and the dense params
// of those views (batch 1, not packed), validated against them.
using CheckCall = ZigzagLayout (*)(const char* what, const comm::Communicator& comm,
                                   const attention::AttnParams& local, int64_t global_len);
struct DenseSegments {
  std::vector<Segment> segments;
  attention::AttnParams params;
  int64_t rows = 0;  // T_local
};
DenseSegments packed_segments(const char* what, const comm::Communicator& comm, const attention::AttnParams& p,
                              const PackedZigzag& l, CheckCall check, const attention::AttnForwardArgs& a);
DenseSegments packed_segments(const char* what, const comm::Communicator& comm, const attention::AttnParams& p,
                              const PackedZigzag& l, CheckCall check, const attention::AttnBackwardArgs& a);
attention::AttnForwardArgs packed_as_dense(const attention::AttnForwardArgs& a, int64_t rows);
attention::AttnBackwardArgs packed_as_dense(const attention::AttnBackwardArgs& a, int64_t rows);

// The params of one block call: sq queries against skv keys with mask m (the scale made explicit), keeping the
// local window (the keys must then end at the block's diagonal, as a bottom-right mask aligns them) unless it hides
// no key of the block.
attention::AttnParams block_params(const attention::AttnParams& local, int64_t sq, int64_t skv,
                                   attention::MaskType m);

// K and V of `len` positions packed in one contiguous buffer [K | V], each [B, len, Hkv, D]: what travels.
struct KvPack {
  Tensor buf;
  TensorView k, v;
  size_t count() const { return static_cast<size_t>(buf.numel()); }
};
KvPack make_kv_pack(const TensorView& k_like, int64_t len, DType dtype, Device device, bool zeroed);
// Views of a [K | V] block inside a larger buffer (e.g. block s of an all-gather result).
KvPack view_kv_pack(void* data, const TensorView& k_like, int64_t len, DType dtype, Device device);

// Rows [start, start + n) of a BSHD tensor / of a [B, H, S] LSE.
inline TensorView rows(const TensorView& t, int64_t start, int64_t n) { return t.slice(1, start, n); }
inline TensorView lse_rows(const TensorView& t, int64_t start, int64_t n) { return t.slice(2, start, n); }

// Copies between rank s's local layout [chunk s | chunk 2cp-1-s] (a [B, 2c, ...] view) and the global-order
// [B, padded_len, ...] view, both directions, enqueued on `stream` (core's copy_async).
void block_to_global(const ZigzagLayout& l, int s, const TensorView& block, const TensorView& global, void* stream);
void global_to_block(const ZigzagLayout& l, int s, const TensorView& global, const TensorView& block, void* stream);

// One block of a CP forward: local query rows [q_start, q_start + nq) of a against the first nk keys of (k, v) under
// `mask`, writing the block's O and LSE into o and lse (views of nq rows).
void block_forward(const attention::AttnParams& local, const attention::AttnForwardArgs& a, int64_t q_start,
                   int64_t nq, const TensorView& k, const TensorView& v, int64_t nk, attention::MaskType mask,
                   const TensorView& o, const TensorView& lse);

// One block of a CP backward: local query rows [q_start, q_start + nq) of a (with the final O and LSE) against the
// first nk keys of (k, v) under `mask`; the gradients are added into fp32 buffers (accumulate) or written to buffers
// of any float dtype: dq (local rows), dk and dv (the block's rows).
void block_backward(const attention::AttnParams& local, const attention::AttnBackwardArgs& a, int64_t q_start,
                    int64_t nq, const TensorView& k, const TensorView& v, int64_t nk, attention::MaskType mask,
                    const TensorView& dq, const TensorView& dk, const TensorView& dv, bool accumulate = true);

// Merges a partial result (o_b, lse_b) of the same query rows into the running (o_a, lse_a), in fp32:
// O = O_a - sigmoid(L_b - L_a) (O_a - O_b), L = L_a - logsigmoid(L_a - L_b); a -inf side contributes nothing.
// O of either side may be of any float dtype (rounded once, on writing o_a); LSEs are fp32. Enqueued on `stream`
// for device views.
void merge_partial(const TensorView& o_a, const TensorView& lse_a, const TensorView& o_b, const TensorView& lse_b,
                   void* stream);
// The device form of merge_partial for views on `kind`, or nullptr when this build has none; filled in by
// register_devices.cpp, the one file of cp that depends on the build's options.
using MergePartialFn = void (*)(const TensorView& o_a, const TensorView& lse_a, const TensorView& o_b,
                                const TensorView& lse_b, void* stream);
MergePartialFn find_device_merge_partial(DeviceKind kind);
// Sets every element of an fp32 view to -inf (the LSE of rows that have seen no key yet).
void fill_neg_inf(const TensorView& t, void* stream);

}  // namespace ringtrain::cp
