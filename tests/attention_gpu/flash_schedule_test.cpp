// The Hopper flash kernels' CTA order (attention/cuda/flash_sm90_schedule.cuh), on the host: every (tile, head,
// sequence) exactly once; each row's tiles longest first; without a mask the rows one after the other; and with a
// causal mask, groups of rows (uneven ones too) walked tile by tile. Plain arithmetic: needs a CUDA build, no GPU.
#include <gtest/gtest.h>

#include <vector>

#ifdef RINGTRAIN_WITH_CUDA
#include "ringtrain/attention/cuda/flash_sm90_schedule.cuh"
#endif

namespace ringtrain {
namespace {

TEST(FlashSchedule, EveryTileOnceLongestFirstGroupByGroup) {
#ifndef RINGTRAIN_WITH_CUDA
  GTEST_SKIP() << "the flash kernels' schedule is in the CUDA build only";
#else
  using attention::cuda::HeaviestFirst;
  int uneven = 0;
  for (int tiles : {1, 2, 7, 32, 64, 130})
    for (int heads : {1, 3, 8, 37})
      for (int batch : {1, 2, 5})
        for (bool causal : {false, true})
          for (bool last_heaviest : {false, true})
            for (int sms : {1, 132}) {
              const HeaviestFirst order(tiles, heads, batch, causal, last_heaviest, sms);
              const int rows = heads * batch, n = tiles * rows;
              ASSERT_EQ(int(order.grid().x), n);
              const std::string where = cat("tiles ", tiles, " heads ", heads, " batch ", batch, " causal ", causal,
                                            " last ", last_heaviest, " sms ", sms);
              std::vector<int> next_rank(rows, 0);  // each row's tiles must come longest first, one by one
              int restarts = 0, prev_rank = -1;
              for (int b = 0; b < n; ++b) {
                const attention::cuda::TileOfCta t = order.at(unsigned(b));
                ASSERT_TRUE(t.tile >= 0 && t.tile < tiles && t.head >= 0 && t.head < heads && t.batch >= 0 &&
                            t.batch < batch) << where << " block " << b;
                const int row = t.batch * heads + t.head, rank = last_heaviest ? tiles - 1 - t.tile : t.tile;
                ASSERT_EQ(rank, next_rank[row]) << where << " block " << b;  // also: no tile twice, none skipped
                ++next_rank[row];
                if (!causal) {
                  EXPECT_EQ(row, b / tiles) << where << " block " << b;
                }
                if (rank < prev_rank) ++restarts;
                prev_rank = rank;
              }
              for (int r = 0; r < rows; ++r) ASSERT_EQ(next_rank[r], tiles) << where << " row " << r;
              // A group's tiles in order: the ranks start again once per later group.
              if (tiles > 1) {
                EXPECT_EQ(restarts, order.groups() - 1) << where;
              }
              if (!causal) {
                EXPECT_EQ(order.groups(), rows) << where;
              }
              if (causal && order.groups() > 1 && rows % order.groups() != 0) ++uneven;
            }
  EXPECT_GT(uneven, 0) << "no case had groups of different sizes";
#endif
}

}  // namespace
}  // namespace ringtrain
