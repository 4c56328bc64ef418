// Throughput of the CUDA `flash` backend at the shapes of bench/compare_torch.py: bf16, B=1,
// H=32, D=128, causal, S = 16384 and 32768. Runs only when RINGTRAIN_FLASH_BENCH=1 (it measures, it does not
// check). FLOPs: 4 B H S^2 D forward, halved for causal; forward+backward counts 3.5x the forward.
// Timing: 3 warm-up calls, then the median of 10 calls, each bracketed by a device synchronize and a host clock.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "ringtrain/attention/backend.h"
#include "ringtrain/core/device_info.h"
#include "test_util.h"

namespace ringtrain {
namespace {

using attention::MaskType;

double median_ms(const std::function<void()>& run) {
  for (int i = 0; i < 3; ++i) run();
  synchronize(Device::cuda(0));
  std::vector<double> ms;
  for (int i = 0; i < 10; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    synchronize(Device::cuda(0));
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return (ms[4] + ms[5]) / 2;
}

TEST(FlashCudaBench, CausalBf16Heads32Dim128) {
  RT_REQUIRE_GPU();
  if (!std::getenv("RINGTRAIN_FLASH_BENCH")) GTEST_SKIP() << "set RINGTRAIN_FLASH_BENCH=1 to time the kernels";
  const attention::Backend* be = attention::find_backend(attention::BackendId::Flash, DeviceKind::CUDA);
  ASSERT_NE(be, nullptr);
  constexpr int64_t H = 32, D = 128, kMaxS = 32768;
  std::mt19937_64 rng(testing::fresh_seed());
  // Random (never zero) inputs, made once at the longest length; shorter runs use the leading rows (B = 1).
  Tensor host = Tensor::empty({1, kMaxS, H, D}, DType::BF16);
  std::vector<Tensor> dev;
  for (int i = 0; i < 4; ++i) {  // q, k, v, dO
    testing::fill_normal(host, rng);
    dev.push_back(Tensor::empty({1, kMaxS, H, D}, DType::BF16, Device::cuda()));
    copy(dev.back(), host);
  }
  Tensor o = Tensor::empty({1, kMaxS, H, D}, DType::BF16, Device::cuda());
  Tensor lse = Tensor::empty({1, H, kMaxS}, DType::F32, Device::cuda());
  Tensor dq = Tensor::empty({1, kMaxS, H, D}, DType::BF16, Device::cuda());
  Tensor dk = Tensor::empty({1, kMaxS, H, D}, DType::BF16, Device::cuda());
  Tensor dv = Tensor::empty({1, kMaxS, H, D}, DType::BF16, Device::cuda());

  std::printf("flash (cuda) bf16 B=1 H=32 D=128 causal, median of 10\n");
  std::printf("%7s %9s %9s %9s %9s %11s %11s\n", "S", "fwd ms", "fwd TF/s", "bwd ms", "det bwd", "f+b TF/s",
              "f+b det");
  for (int64_t S : {int64_t(16384), kMaxS}) {
    auto rows = [&](const Tensor& t) { return t.view().slice(1, 0, S); };
    const TensorView q = rows(dev[0]), k = rows(dev[1]), v = rows(dev[2]), dout = rows(dev[3]);
    attention::AttnParams p = attention::params_for(q, k, MaskType::CausalTopLeft);
    const TensorView lse_s = lse.view().slice(2, 0, S);
    const attention::AttnForwardArgs f{q, k, v, rows(o), lse_s};
    const attention::AttnBackwardArgs b{q, k, v, rows(o), dout, lse_s, rows(dq), rows(dk), rows(dv)};
    const double fwd = median_ms([&] { be->forward(p, f); });
    const double bwd = median_ms([&] { be->backward(p, b); });
    p.deterministic = true;
    const double det = median_ms([&] { be->backward(p, b); });
    const double flops = 4.0 * H * S * S * D / 2;
    std::printf("%7lld %9.2f %9.1f %9.2f %9.2f %11.1f %11.1f\n", static_cast<long long>(S), fwd,
                flops / fwd * 1e-9, bwd, det, 3.5 * flops / (fwd + bwd) * 1e-9, 3.5 * flops / (fwd + det) * 1e-9);
  }
}

}  // namespace
}  // namespace ringtrain
