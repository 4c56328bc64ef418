// Tile sizes of the Hopper flash forward (flash_fwd_sm90.cu), per head dimension.
//
// One CTA: a producer warpgroup (one warp issues the copies) and two consumer warpgroups of 64 query rows each.
// 1 CTA per SM: Q + kStages x (K + V) must fit in the 227 KB of shared memory, and the registers the consumers
// claim (kConsumerRegs each) plus the producer's must fit in the 64K of the SM.
#pragma once

namespace ringtrain::attention::cuda {

template <int D>
struct FwdSm90Tiles;

template <>
struct FwdSm90Tiles<64> {
  static constexpr int BM = 128, BN = 128, kStages = 3;
};
template <>
struct FwdSm90Tiles<128> {
  static constexpr int BM = 128, BN = 128, kStages = 2;
};

struct FwdSm90Warps {
  static constexpr int kConsumerWarpgroups = 2, kThreads = 128 * (1 + kConsumerWarpgroups);
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128 x 40 + 256 x 232 <= 65536
};

}  // namespace ringtrain::attention::cuda
