// Zigzag (head-tail) sharding of a sequence over cp ranks, so that causal attention costs every rank the same.
//
// The sequence of global_len tokens is padded at the end to 2*cp*c tokens (c = chunk length = the smallest with
// 2*cp*c >= global_len) and split into 2*cp chunks; rank r holds chunk r then chunk 2*cp-1-r (local length 2c).
// Padding is masked by truncation: on every rank the valid (non-padding) tokens form a prefix of the local
// sequence (chunk r padded at all => chunk 2*cp-1-r is only padding), so attention just uses shorter views.
#pragma once

#include <cstdint>
#include <vector>

#include "ringtrain/core/tensor.h"

namespace ringtrain::cp {

struct ZigzagLayout {
  int cp = 1;
  int rank = 0;
  int64_t global_len = 0;

  ZigzagLayout(int cp_size, int rank_index, int64_t sequence_len);

  int64_t chunk_len() const;   // c
  int64_t padded_len() const;  // 2 * cp * c
  int64_t local_len() const;   // 2 * c
  // Global token index of local position i (may be >= global_len: padding).
  int64_t global_index(int64_t local_pos) const;
  // Valid tokens of chunk j (0..2cp-1): how many of its positions are < global_len.
  int64_t chunk_valid(int64_t chunk) const;
  // Length of the valid prefix of rank r's local sequence (this rank's by default).
  int64_t valid_len(int r) const;
  int64_t valid_len() const { return valid_len(rank); }
};

// Packed documents: each document is zigzag-sharded on its own; a rank's local packed (THD) tensor holds its
// shard of every document (2 * c_d rows for document d), in document order.
struct PackedZigzag {
  int cp = 1;
  int rank = 0;
  std::vector<int64_t> doc_lens;  // global lengths

  PackedZigzag(int cp_size, int rank_index, std::vector<int64_t> lengths);
  ZigzagLayout doc(size_t d) const { return ZigzagLayout(cp, rank, doc_lens[d]); }
  int64_t local_start(size_t d) const;  // first local row of document d
  int64_t local_total() const;          // rows of the local packed tensor
  int64_t global_start(size_t d) const; // first row of document d in the global packed tensor
};

// Rows [start, start + len) of a packed [T, H, D] tensor as the one-sequence view [1, len, H, D], and columns
// [start, start + len) of a packed LSE [H, T] as [1, H, len]: a document as a dense call sees it.
TensorView packed_rows(const TensorView& thd, int64_t start, int64_t len);
TensorView packed_lse(const TensorView& lse, int64_t start, int64_t len);

// Copies this rank's tokens out of a full-sequence tensor (global_len along seq_dim) into `local`
// (local_len along seq_dim; other dimensions equal). Padding positions of `local` are set to zero.
void shard(const TensorView& global, int seq_dim, const ZigzagLayout& layout, const TensorView& local);
// The inverse: writes this rank's valid tokens of `local` to their places in `global`; padding is dropped.
void unshard(const TensorView& local, int seq_dim, const ZigzagLayout& layout, const TensorView& global);

// An uninitialised / zeroed tensor of the shape of `like`, on `device` (a helper for buffers of CP code).
Tensor empty_like(const TensorView& like, DType dtype, Device device);
Tensor zeros_like(const TensorView& like, DType dtype, Device device);

}  // namespace ringtrain::cp
