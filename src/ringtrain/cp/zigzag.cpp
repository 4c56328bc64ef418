#include "ringtrain/cp/zigzag.h"

#include <algorithm>
#include <utility>

#include "ringtrain/core/error.h"

namespace ringtrain::cp {

ZigzagLayout::ZigzagLayout(int cp_size, int rank_index, int64_t sequence_len)
    : cp(cp_size), rank(rank_index), global_len(sequence_len) {
  RT_CHECK(cp >= 1, "zigzag layout: cp must be >= 1, got ", cp);
  RT_CHECK(rank >= 0 && rank < cp, "zigzag layout: rank ", rank, " out of range for cp=", cp);
  RT_CHECK(global_len >= 1, "zigzag layout: sequence length must be >= 1, got ", global_len);
}

int64_t ZigzagLayout::chunk_len() const { return (global_len + 2 * cp - 1) / (2 * cp); }
int64_t ZigzagLayout::padded_len() const { return 2 * cp * chunk_len(); }
int64_t ZigzagLayout::local_len() const { return 2 * chunk_len(); }

int64_t ZigzagLayout::global_index(int64_t i) const {
  const int64_t c = chunk_len();
  return i < c ? rank * c + i : (2 * cp - 1 - rank) * c + (i - c);
}

int64_t ZigzagLayout::chunk_valid(int64_t chunk) const {
  const int64_t c = chunk_len();
  return std::clamp<int64_t>(global_len - chunk * c, 0, c);
}

int64_t ZigzagLayout::valid_len(int r) const {
  const int64_t head = chunk_valid(r);
  return head < chunk_len() ? head : head + chunk_valid(2 * cp - 1 - r);
}

PackedZigzag::PackedZigzag(int cp_size, int rank_index, std::vector<int64_t> lengths)
    : cp(cp_size), rank(rank_index), doc_lens(std::move(lengths)) {
  RT_CHECK(!doc_lens.empty(), "packed zigzag layout: no documents");
  for (size_t d = 0; d < doc_lens.size(); ++d) (void)doc(d);  // checks every length
}

int64_t PackedZigzag::local_start(size_t d) const {
  int64_t start = 0;
  for (size_t i = 0; i < d; ++i) start += doc(i).local_len();
  return start;
}

int64_t PackedZigzag::local_total() const { return local_start(doc_lens.size()); }

int64_t PackedZigzag::global_start(size_t d) const {
  int64_t start = 0;
  for (size_t i = 0; i < d; ++i) start += doc_lens[i];
  return start;
}

TensorView packed_rows(const TensorView& thd, int64_t start, int64_t len) {
  TensorView v = thd.slice(0, start, len);
  v.ndim = 4;
  v.shape = {1, len, thd.shape[1], thd.shape[2]};
  v.stride = {len * thd.stride[0], thd.stride[0], thd.stride[1], thd.stride[2]};
  return v;
}

TensorView packed_lse(const TensorView& lse, int64_t start, int64_t len) {
  TensorView v = lse.slice(1, start, len);
  v.ndim = 3;
  v.shape = {1, lse.shape[0], len};
  v.stride = {lse.shape[0] * lse.stride[0], lse.stride[0], lse.stride[1]};
  return v;
}

namespace {

void check_seq_dim(const TensorView& t, int seq_dim, int64_t want, const char* what, const ZigzagLayout& l) {
  RT_CHECK(seq_dim >= 0 && seq_dim < t.ndim, "zigzag ", what, ": sequence dimension ", seq_dim, " out of range for ",
           t.shape_str());
  RT_CHECK(t.shape[seq_dim] == want, "zigzag ", what, ": ", t.shape_str(), " has ", t.shape[seq_dim],
           " positions in dimension ", seq_dim, ", expected ", want, " (cp=", l.cp, ", sequence length ",
           l.global_len, ")");
}

// Calls f(local_start, global_start, len) for the valid part of each of the rank's two chunks.
template <typename F>
void for_each_valid_run(const ZigzagLayout& l, F&& f) {
  const int64_t c = l.chunk_len();
  const int64_t chunks[2] = {l.rank, 2 * l.cp - 1 - l.rank};
  for (int h = 0; h < 2; ++h) {
    const int64_t n = l.chunk_valid(chunks[h]);
    if (n > 0) f(h * c, chunks[h] * c, n);
  }
}

}  // namespace

void shard(const TensorView& global, int seq_dim, const ZigzagLayout& l, const TensorView& local) {
  check_seq_dim(global, seq_dim, l.global_len, "shard (full tensor)", l);
  check_seq_dim(local, seq_dim, l.local_len(), "shard (local tensor)", l);
  for_each_valid_run(l, [&](int64_t ls, int64_t gs, int64_t n) {
    copy(local.slice(seq_dim, ls, n), global.slice(seq_dim, gs, n));
  });
  const int64_t valid = l.valid_len();
  if (valid < l.local_len()) {
    const TensorView pad = local.slice(seq_dim, valid, l.local_len() - valid);
    copy(pad, zeros_like(pad, pad.dtype, pad.device));
  }
}

void unshard(const TensorView& local, int seq_dim, const ZigzagLayout& l, const TensorView& global) {
  check_seq_dim(local, seq_dim, l.local_len(), "unshard (local tensor)", l);
  check_seq_dim(global, seq_dim, l.global_len, "unshard (full tensor)", l);
  for_each_valid_run(l, [&](int64_t ls, int64_t gs, int64_t n) {
    copy(global.slice(seq_dim, gs, n), local.slice(seq_dim, ls, n));
  });
}

Tensor empty_like(const TensorView& like, DType dtype, Device device) {
  const auto& s = like.shape;
  switch (like.ndim) {
    case 1: return Tensor::empty({s[0]}, dtype, device);
    case 2: return Tensor::empty({s[0], s[1]}, dtype, device);
    case 3: return Tensor::empty({s[0], s[1], s[2]}, dtype, device);
    case 4: return Tensor::empty({s[0], s[1], s[2], s[3]}, dtype, device);
  }
  throw Error(cat("empty_like: unsupported rank ", like.ndim, " of ", like.shape_str()));
}

Tensor zeros_like(const TensorView& like, DType dtype, Device device) {
  const auto& s = like.shape;
  switch (like.ndim) {
    case 1: return Tensor::zeros({s[0]}, dtype, device);
    case 2: return Tensor::zeros({s[0], s[1]}, dtype, device);
    case 3: return Tensor::zeros({s[0], s[1], s[2]}, dtype, device);
    case 4: return Tensor::zeros({s[0], s[1], s[2], s[3]}, dtype, device);
  }
  throw Error(cat("zeros_like: unsupported rank ", like.ndim, " of ", like.shape_str()));
}

}  // namespace ringtrain::cp
