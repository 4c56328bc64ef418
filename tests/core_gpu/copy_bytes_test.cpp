// copy_bytes between host and GPU memory: an odd count at odd offsets on both sides (what the Python module copies
// for a CUDA bool or int8 tensor), there and back, against the source bytes. Skips without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "ringtrain/core/tensor.h"
#include "test_util.h"

namespace ringtrain {
namespace {

TEST(CopyBytes, OddCountAtOddOffsetsThroughTheGpu) {
  RT_REQUIRE_GPU();
  std::vector<unsigned char> src(1001), back(1001, 0xAB);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(31 * i + 5);
  const Tensor dev = Tensor::empty({256}, DType::F32, Device::cuda(0));  // 1024 bytes
  fill(dev, -1.0);                                                      // poisoned: 0x00 0x00 0x80 0xBF
  unsigned char* d = static_cast<unsigned char*>(dev.data());
  copy_bytes(d + 3, Device::cuda(0), src.data() + 1, Device::cpu(), 999);
  copy_bytes(back.data() + 1, Device::cpu(), d + 3, Device::cuda(0), 999);
  EXPECT_EQ(back[0], 0xAB);
  for (size_t i = 1; i < 1000; ++i) ASSERT_EQ(back[i], src[i]) << i;
  EXPECT_EQ(back[1000], 0xAB);
  // The device bytes around the copied range kept the poison.
  std::vector<unsigned char> edges(1024);
  copy_bytes(edges.data(), Device::cpu(), d, Device::cuda(0), 1024);
  EXPECT_EQ(edges[2], 0x80);
  EXPECT_EQ(edges[1002], 0x80);
  EXPECT_EQ(edges[1003], 0xBF);
}

}  // namespace
}  // namespace ringtrain
