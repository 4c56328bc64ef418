// Zigzag layout arithmetic and shard/unshard round trips along any sequence dimension, padding included.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "ringtrain/core/error.h"
#include "ringtrain/cp/zigzag.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using cp::ZigzagLayout;

const std::vector<std::pair<int, int64_t>> kShapes = {{1, 1},  {1, 7},  {2, 8},   {2, 9},  {3, 1000},
                                                      {4, 64}, {8, 37}, {8, 10},  {8, 3},  {5, 11}};

TEST(Zigzag, LayoutCoversThePaddedSequenceWithAValidPrefixPerRank) {
  for (auto [cp_size, len] : kShapes) {
    std::set<int64_t> seen;
    int64_t valid_total = 0;
    for (int r = 0; r < cp_size; ++r) {
      const ZigzagLayout l(cp_size, r, len);
      EXPECT_EQ(l.padded_len() % (2 * cp_size), 0);
      EXPECT_GE(l.padded_len(), len);
      EXPECT_LT(l.padded_len() - len, 2 * cp_size) << "padding must be less than one token per chunk";
      EXPECT_EQ(l.local_len(), 2 * l.chunk_len());
      for (int64_t i = 0; i < l.local_len(); ++i) {
        const int64_t g = l.global_index(i);
        EXPECT_TRUE(seen.insert(g).second) << "global index " << g << " held twice";
        // Valid tokens form a prefix of the local sequence.
        EXPECT_EQ(g < len, i < l.valid_len()) << "cp=" << cp_size << " S=" << len << " rank " << r << " pos " << i;
      }
      // Chunk r comes first and chunk 2cp-1-r second.
      EXPECT_EQ(l.global_index(0), r * l.chunk_len());
      EXPECT_EQ(l.global_index(l.chunk_len()), (2 * cp_size - 1 - r) * l.chunk_len());
      valid_total += l.valid_len();
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), ZigzagLayout(cp_size, 0, len).padded_len());
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(valid_total, len);
  }
}

// Shards `global` over all ranks, checks padding is zero, unshards into a poisoned tensor: must equal `global`.
void round_trip(const TensorView& global, int seq_dim, int cp_size) {
  Tensor back = cp::empty_like(global, global.dtype, Device::cpu());
  if (is_float(global.dtype)) testing::poison(back);
  else fill(back, -12345);
  for (int r = 0; r < cp_size; ++r) {
    const ZigzagLayout l(cp_size, r, global.shape[seq_dim]);
    TensorView local_shape = global;
    local_shape.shape[seq_dim] = l.local_len();
    Tensor local = cp::empty_like(local_shape, global.dtype, Device::cpu());
    fill(local, 999);  // shard must overwrite everything, padding with zeros
    cp::shard(global, seq_dim, l, local);
    const int64_t valid = l.valid_len();
    if (valid < l.local_len()) {
      const TensorView pad = local.view().slice(seq_dim, valid, l.local_len() - valid);
      for_each_offset(pad, pad, [&](int64_t o, int64_t) {
        ASSERT_EQ(load_as_double(pad.data, pad.dtype, o), 0.0) << "padding not zero";
      });
    }
    cp::unshard(local, seq_dim, l, back);
  }
  EXPECT_EQ(testing::max_abs_error(back, global), 0.0) << global.shape_str() << " dim " << seq_dim << " cp " << cp_size;
}

TEST(Zigzag, ShardUnshardRoundTripAnySequenceDimension) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (auto [cp_size, len] : kShapes) {
    Tensor tokens = Tensor::empty({2, len}, DType::I32);  // [B, S]
    std::uniform_int_distribution<int32_t> vocab(0, 50000);
    for (int64_t i = 0; i < tokens.numel(); ++i) tokens.ptr<int32_t>()[i] = vocab(rng);
    round_trip(tokens, 1, cp_size);
    Tensor positions = Tensor::empty({len}, DType::I64);  // [S]
    for (int64_t i = 0; i < len; ++i) positions.ptr<int64_t>()[i] = i;
    round_trip(positions, 0, cp_size);
    Tensor acts = Tensor::empty({2, len, 3, 4}, DType::BF16);  // [B, S, H, D]
    testing::fill_normal(acts, rng);
    round_trip(acts, 1, cp_size);
    Tensor lse = Tensor::empty({2, 3, len}, DType::F32);  // [B, H, S]
    testing::fill_normal(lse, rng);
    round_trip(lse, 2, cp_size);
  }
}

TEST(Zigzag, WrongShapesNameTheTensor) {
  Tensor global = Tensor::empty({1, 10, 2, 4}, DType::F32);
  Tensor local = Tensor::empty({1, 5, 2, 4}, DType::F32);
  try {
    cp::shard(global, 1, ZigzagLayout(2, 0, 10), local);  // local length should be 6 (chunks of 3)
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("local tensor"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected 6"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ZigzagLayout(2, 2, 10), Error);
  EXPECT_THROW(ZigzagLayout(0, 0, 10), Error);
}

}  // namespace
}  // namespace ringtrain
