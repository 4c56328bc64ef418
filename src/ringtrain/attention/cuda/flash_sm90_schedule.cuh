// The order in which the Hopper flash kernels' CTAs take their tiles. Under a causal mask CTAs differ in work (the
// last query tiles of the forward and the first key tiles of the backward see the most); walked head by head, the
// longest CTAs of the last heads would start last and run alone at the end of the kernel (at 8K with GQA 32/8 the
// backward's longest CTA, 512 query tiles, would start after 87 % of the work). So the rows (head, sequence) are cut
// into groups, each walked tile by tile with its rows inside, longest tiles first: a group's long CTAs start
// together, and the next group's long ones fill in beside its short ones. Groups are as small as that allows,
// because the CTAs running at once read only their group's rows, which then stay in L2 (all heads in one group is
// 5 % slower at D = 128, 16K). Without a mask every CTA has the same work: one row per group, head by head.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "ringtrain/core/error.h"

namespace ringtrain::attention::cuda {

struct TileOfCta {
  int tile, head, batch;
};

class HeaviestFirst {
 public:
  // tiles per row, rows = heads x batch, on a GPU of `sms` multiprocessors. last_tile_heaviest: the forward (query
  // tile i sees keys up to i); the backward's key tile j is seen from j on.
  HeaviestFirst(int tiles, int heads, int batch, bool causal, bool last_tile_heaviest, int sms)
      : tiles_(tiles), heads_(heads), last_heaviest_(last_tile_heaviest) {
    RT_CHECK(int64_t(tiles) * heads * batch < (int64_t(1) << 31), "flash: ", tiles, " tiles x ", heads, " heads x ",
             batch, " sequences exceed one grid's 2^31 - 1 CTAs");
    const int rows = heads * batch;
    // A causal row of T tiles holds about T / 2 times its longest CTA's work. With G rows a group, the last group's
    // longest CTAs start while at least 2 SMs' worth of longest CTAs per SM remain: G T / 2 >= 2 SMs.
    const int per_group = causal ? std::max(1, (4 * sms + tiles - 1) / std::max(1, tiles)) : 1;
    groups_ = std::max(1, rows / per_group);
    // rows = big (size + 1) + (groups - big) size: the larger groups first, so that the last is never the smaller.
    size_ = rows / groups_, big_ = rows % groups_;
    big_ctas_ = tiles * (size_ + 1) * big_;
  }
  dim3 grid() const { return dim3(static_cast<unsigned>(big_ctas_ + tiles_ * size_ * (groups_ - big_))); }
  int groups() const { return groups_; }

  // In 32-bit arithmetic: it runs at the start of every CTA, before the first copy.
  __host__ __device__ TileOfCta at(unsigned block) const {
    const int id = int(block), large = id < big_ctas_;
    const int size = size_ + large, ids_per_group = tiles_ * size, base = large ? 0 : big_ctas_;
    const int g = (id - base) / ids_per_group, local = id - base - g * ids_per_group;
    const int row = (large ? 0 : big_ * (size_ + 1)) + g * size + local % size, rank = local / size;
    return {last_heaviest_ ? tiles_ - 1 - rank : rank, row % heads_, row / heads_};
  }

 private:
  int tiles_, heads_, groups_ = 1, size_ = 1, big_ = 0, big_ctas_ = 0;
  bool last_heaviest_;
};

}  // namespace ringtrain::attention::cuda
