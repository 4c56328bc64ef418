// Tile sizes and warp roles of the Hopper flash forward (flash_fwd_sm90.cu), per head dimension.
//
// One CTA: a producer warpgroup (one warp issues the copies) and kConsumers consumer warpgroups of 64 query rows each
// (BM = 64 kConsumers). 1 CTA per SM: Q + kStages x (K + V) must fit in the 227 KB of shared memory, and the
// registers the warpgroups set (setmaxnreg) must fit in the SM's 64K: 128 (kProducerRegs + kConsumers kConsumerRegs).
#pragma once

namespace ringtrain::attention::cuda {

template <int D>
struct FwdSm90Tiles;

template <>
struct FwdSm90Tiles<64> {
  static constexpr int kConsumers = 3, BN = 128, kStages = 3;
  static constexpr int kProducerRegs = 24, kConsumerRegs = 160;
};
template <>
struct FwdSm90Tiles<128> {
  static constexpr int kConsumers = 2, BN = 128, kStages = 2;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
};
// Above D = 128, 64-key tiles: at 192 O takes 96 registers per thread and K + V of 128 keys would leave room for
// only one stage beside Q (48 KB); with 64 keys three stages fit.
template <>
struct FwdSm90Tiles<192> {
  static constexpr int kConsumers = 2, BN = 64, kStages = 3;
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
};
// O takes 128 registers per thread: 64-key tiles keep the scores and P at 48, and Q (64 KB) + 2 x (K + V) (128 KB)
// fit; a third stage does not.
template <>
struct FwdSm90Tiles<256> {
  static constexpr int kConsumers = 2, BN = 64, kStages = 2;
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
};

// What follows from a head dimension's tiles.
template <int D>
struct FwdSm90Shape : FwdSm90Tiles<D> {
  using Tiles = FwdSm90Tiles<D>;
  static constexpr int BM = 64 * Tiles::kConsumers, kThreads = 128 * (1 + Tiles::kConsumers);
  static_assert(128 * (Tiles::kProducerRegs + Tiles::kConsumers * Tiles::kConsumerRegs) <= 65536,
                "the warpgroups' registers must fit in the SM");
  static_assert(BM * D * 2 + 4 * Tiles::kStages * Tiles::BN * D + 2048 <= 227 * 1024,
                "Q and the K/V ring must fit in the SM's shared memory");
};

}  // namespace ringtrain::attention::cuda
