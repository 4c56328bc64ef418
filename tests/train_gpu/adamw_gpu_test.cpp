// The CUDA AdamW kernel against the host fp32 update (bitwise), and the device sum of squares against an fp64 host
// sum; aligned and misaligned shards (the vectorised and the element-wise paths). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ringtrain/core/device_info.h"
#include "ringtrain/core/tensor.h"
#include "ringtrain/train/device_optimizer.h"
#include "test_util.h"

namespace ringtrain::train {
namespace {

const DeviceOptimizerKernels* kernels_or_skip_reason(std::string& why) {
  if (why = cuda_unavailable_reason(); !why.empty()) return nullptr;
  if (const DeviceOptimizerKernels* k = device_optimizer_kernels()) return k;
  why = "this build has no CUDA optimizer kernels (CPU-only build)";
  return nullptr;
}

#define RT_REQUIRE_OPTIMIZER_KERNELS(k)                                   \
  std::string why_;                                                       \
  const DeviceOptimizerKernels* k = kernels_or_skip_reason(why_);         \
  if (!k) GTEST_SKIP() << "GPU test skipped: " << why_

// A device buffer of n + offset elements whose view starts `offset` elements in (offset 1: not 16-byte aligned).
struct DeviceBuffer {
  Tensor storage;
  TensorView view;
  DeviceBuffer(int64_t n, int64_t offset, DType dtype)
      : storage(Tensor::empty({n + offset}, dtype, Device::cuda(0))), view(storage.view().slice(0, offset, n)) {}
  template <typename T>
  T* ptr() const { return view.ptr<T>(); }
};

template <typename T>
void upload(const DeviceBuffer& dst, std::vector<T>& host, DType dtype) {
  copy(dst.view, contiguous_view(host.data(), dtype, Device::cpu(), {static_cast<int64_t>(host.size())}));
}
template <typename T>
std::vector<T> download(const DeviceBuffer& src, DType dtype) {
  std::vector<T> host(static_cast<size_t>(src.view.numel()));
  synchronize(Device::cuda(0));
  copy(contiguous_view(host.data(), dtype, Device::cpu(), {src.view.numel()}), src.view);
  return host;
}

template <typename T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Bitwise, not within an ulp: the kernel performs adamw_update<float>'s operations in the same order, each an IEEE
// fp32 operation rounded to nearest (the _rn intrinsics, no FMA contraction; the host build has no FMA contraction
// in ISO C++ mode; denormals are kept on both), on the same fp32 scalars (adamw_scalars<float>).
TEST(AdamWGpu, DeviceUpdateEqualsTheHostFp32UpdateBitwise) {
  RT_REQUIRE_OPTIMIZER_KERNELS(kernels);
  std::mt19937_64 rng(testing::fresh_seed());
  std::normal_distribution<float> nd(0, 1);
  for (int64_t offset : {0, 1}) {
    const int64_t n = (1 << 20) + 3;  // a tail of 3 after the groups of 4
    std::vector<float> master(n), m(n), v(n), grad(n);
    for (int64_t i = 0; i < n; ++i) {
      master[i] = nd(rng);
      m[i] = 0.01f * nd(rng);
      v[i] = 1e-4f * std::abs(nd(rng));
      grad[i] = 0.1f * nd(rng);
    }
    double sq = 0;
    for (float g : grad) sq += static_cast<double>(g) * g;
    AdamWConfig cfg;
    const AdamWStep step = plan_adamw_step(cfg, 4, 3e-4, sq);
    ASSERT_LT(step.clip_coef, 1);  // norm ≈ 0.1·1024 > max_norm 1: the fused clip is exercised

    DeviceBuffer d_master(n, offset, DType::F32), d_m(n, offset, DType::F32), d_v(n, offset, DType::F32),
        d_grad(n, offset, DType::F32), d_out(n, offset, DType::BF16);
    upload(d_master, master, DType::F32);
    upload(d_m, m, DType::F32);
    upload(d_v, v, DType::F32);
    upload(d_grad, grad, DType::F32);
    fill(d_out.view, std::numeric_limits<double>::quiet_NaN());
    kernels->adamw_update(step, {d_master.ptr<float>(), d_m.ptr<float>(), d_v.ptr<float>(), d_grad.ptr<float>(),
                                 d_out.ptr<uint16_t>(), n},
                          nullptr);

    std::vector<uint16_t> out(n);
    adamw_update<float>(step, master.data(), m.data(), v.data(), grad.data(), n, {out.data(), DType::BF16});
    EXPECT_TRUE(bitwise_equal(download<float>(d_master, DType::F32), master)) << "offset " << offset;
    EXPECT_TRUE(bitwise_equal(download<float>(d_m, DType::F32), m)) << "offset " << offset;
    EXPECT_TRUE(bitwise_equal(download<float>(d_v, DType::F32), v)) << "offset " << offset;
    // bf16 through the core copy (bf16 -> fp32 -> bf16 is exact for the finite values the update produces).
    std::vector<uint16_t> d_bits = download<uint16_t>(d_out, DType::BF16);
    EXPECT_EQ(d_bits, out) << "offset " << offset;
  }
}

TEST(AdamWGpu, SkippedStepLeavesTheDeviceStateAlone) {
  RT_REQUIRE_OPTIMIZER_KERNELS(kernels);
  const int64_t n = 1000;
  std::vector<float> master(n, 0.5f), grad(n, std::numeric_limits<float>::quiet_NaN());
  DeviceBuffer d_master(n, 0, DType::F32), d_m(n, 0, DType::F32), d_v(n, 0, DType::F32), d_grad(n, 0, DType::F32);
  upload(d_master, master, DType::F32);
  upload(d_grad, grad, DType::F32);
  fill(d_m.view, 0.25);
  fill(d_v.view, 0.125);
  DeviceBuffer sq_buf(1, 0, DType::F64);
  kernels->sum_of_squares(d_grad.ptr<float>(), n, sq_buf.ptr<double>(), nullptr);
  const double sq = download<double>(sq_buf, DType::F64)[0];
  EXPECT_TRUE(std::isnan(sq));  // a NaN gradient reaches the norm, never dropped
  const AdamWStep step = plan_adamw_step({}, 3, 1e-3, sq);
  ASSERT_TRUE(step.skipped);
  kernels->adamw_update(step, {d_master.ptr<float>(), d_m.ptr<float>(), d_v.ptr<float>(), d_grad.ptr<float>(),
                               nullptr, n},
                        nullptr);
  EXPECT_TRUE(bitwise_equal(download<float>(d_master, DType::F32), master));
  EXPECT_EQ(download<float>(d_m, DType::F32), std::vector<float>(n, 0.25f));
  EXPECT_EQ(download<float>(d_v, DType::F32), std::vector<float>(n, 0.125f));
}

// Σ x² over n fp32 values, both sums in fp64 (exact products): each has rounding error ≤ (n-1)·2⁻⁵³·Σ, so they
// differ by less than 2n·2⁻⁵³ of the sum. The device order depends on n only: the aligned and misaligned copies of
// the same values, and a second run, are bitwise equal.
TEST(AdamWGpu, SumOfSquaresMatchesAnFp64HostSumAndIsReproducible) {
  RT_REQUIRE_OPTIMIZER_KERNELS(kernels);
  std::mt19937_64 rng(testing::fresh_seed());
  std::normal_distribution<float> nd(0, 1);
  DeviceBuffer result(1, 0, DType::F64);
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{3} * (1 << 20) + 1}) {
    std::vector<float> x(n);
    for (auto& e : x) e = nd(rng);
    double host = 0;
    for (float e : x) host += static_cast<double>(e) * e;
    std::vector<double> got;
    for (int64_t offset : {0, 1, 0}) {
      DeviceBuffer d_x(n, offset, DType::F32);
      upload(d_x, x, DType::F32);
      fill(result.view, std::numeric_limits<double>::quiet_NaN());
      kernels->sum_of_squares(d_x.ptr<float>(), n, result.ptr<double>(), nullptr);
      got.push_back(download<double>(result, DType::F64)[0]);
    }
    EXPECT_NEAR(got[0], host, 2.0 * static_cast<double>(n) * std::ldexp(1.0, -53) * host) << "n = " << n;
    EXPECT_TRUE(bitwise_equal(std::vector<double>{got[1], got[2]}, std::vector<double>{got[0], got[0]}))
        << "n = " << n << ": " << got[0] << " " << got[1] << " " << got[2];
  }
}

// Throughput at the Llama-3.2-1B size (1.24B parameters, one shard holding them all). Runs only when
// RINGTRAIN_TRAIN_BENCH=1 (it measures, it does not check). Update: 30 B/parameter (adamw.cu); sum of squares:
// 4 B/parameter. Timing: 2 warm-up calls, then the median of 9, each bracketed by a device synchronize.
TEST(AdamWGpuBench, UpdateAndNormAt1_24BParameters) {
  RT_REQUIRE_OPTIMIZER_KERNELS(kernels);
  if (!std::getenv("RINGTRAIN_TRAIN_BENCH")) GTEST_SKIP() << "set RINGTRAIN_TRAIN_BENCH=1 to time the kernels";
  const int64_t n = 1'240'000'000;
  DeviceBuffer master(n, 0, DType::F32), m(n, 0, DType::F32), v(n, 0, DType::F32), grad(n, 0, DType::F32),
      out(n, 0, DType::BF16), sq(1, 0, DType::F64);
  fill(master.view, 0.5);
  fill(m.view, 0.0);
  fill(v.view, 0.0);
  fill_normal_hashed(grad.view, 7, 1e-4);
  const AdamWStep step = plan_adamw_step({}, 0, 1e-5, 2.0);
  auto median_ms = [](auto&& run) {
    for (int i = 0; i < 2; ++i) run();
    synchronize(Device::cuda(0));
    std::vector<double> ms;
    for (int i = 0; i < 9; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      run();
      synchronize(Device::cuda(0));
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[4];
  };
  const DeviceAdamWShard shard{master.ptr<float>(), m.ptr<float>(), v.ptr<float>(), grad.ptr<float>(),
                               out.ptr<uint16_t>(), n};
  const double update_ms = median_ms([&] { kernels->adamw_update(step, shard, nullptr); });
  const double norm_ms = median_ms([&] { kernels->sum_of_squares(grad.ptr<float>(), n, sq.ptr<double>(), nullptr); });
  std::printf("AdamW update, %lld parameters: %.2f ms, %.0f GB/s (30 B/parameter)\n", static_cast<long long>(n),
              update_ms, 30.0 * n / update_ms / 1e6);
  std::printf("sum of squares: %.2f ms, %.0f GB/s (4 B/parameter)\n", norm_ms, 4.0 * n / norm_ms / 1e6);
}

}  // namespace
}  // namespace ringtrain::train
