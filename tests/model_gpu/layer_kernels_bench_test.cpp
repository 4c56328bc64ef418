// Throughput of the GPU model's memory-bound kernels and GEMMs at the Llama-3.2-1B shape with 8192 tokens (what one
// training step of `ringtrain bench model --seq 8192` runs per layer), to see where a step's time goes. Runs only
// when RINGTRAIN_MODEL_KERNEL_BENCH=1 (it measures, it does not check). Time: CUDA events, 3 warm-ups, median of
// 10. Bytes: what each kernel must read and write at least (bf16 activations, fp32 statistics and gradients);
// GB/s against the H200's ~4.3 TB/s copy rate. GEMM TFLOP/s: 2·m·n·k per product.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "test_util.h"
#ifdef RINGTRAIN_WITH_CUDA
#include "kernel_test_util.h"
#include "ringtrain/core/cuda/gemm.h"
#include "ringtrain/model/cuda/layer_kernels.h"
#endif

namespace ringtrain {
namespace {

#ifdef RINGTRAIN_WITH_CUDA
using namespace model::cuda;
using ringtrain::cuda::Gemm;
using testing::kernels::DeviceArray;

double median_ms(cudaStream_t s, const std::function<void()>& run) {
  for (int i = 0; i < 3; ++i) run();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> ms;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(a, s);
    run();
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return (ms[4] + ms[5]) / 2;
}

template <typename T>
void fill_random(DeviceArray<T>& a, std::mt19937_64& rng) {
  const std::vector<float> v = testing::kernels::random_bf16_values(a.size(), rng, 0.5, 0.1);
  std::vector<T> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = static_cast<T>(v[i]);
  testing::kernels::cuda_ok(cudaMemcpy(a.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
}

void report(const char* what, double ms, double bytes, int calls_per_step) {
  std::printf("%-34s %8.3f ms %7.0f GB/s  x%-2d per step = %7.2f ms\n", what, ms, bytes / ms / 1e6, calls_per_step,
              ms * calls_per_step);
}

void report_gemm(const char* what, double ms, double m, double n, double k, int calls_per_step) {
  std::printf("%-34s %8.3f ms %7.0f TF/s  x%-2d per step = %7.2f ms\n", what, ms, 2 * m * n * k / ms / 1e9,
              calls_per_step, ms * calls_per_step);
}
#endif

TEST(GpuModelKernelBench, Llama1BShapeAt8192Tokens) {
  RT_REQUIRE_GPU();
  if (!std::getenv("RINGTRAIN_MODEL_KERNEL_BENCH"))
    GTEST_SKIP() << "set RINGTRAIN_MODEL_KERNEL_BENCH=1 to time the model's kernels";
#ifdef RINGTRAIN_WITH_CUDA
  constexpr int64_t N = 8192, H = 2048, F = 8192, HQ = 32, HKV = 8, D = 64, V = 128256, L = 16, CHUNK = 1792;
  constexpr int64_t QKV = (HQ + 2 * HKV) * D;
  std::mt19937_64 rng(testing::fresh_seed());
  cudaStream_t s = nullptr;
  Gemm gemm(s);
  DeviceArray<bf16> x(N * H), y(N * H), dy(N * H), dx(N * H), w(H), qkv(N * QKV), dqkv(N * QKV), q(N * HQ * D),
      k(N * HKV * D), v(N * HKV * D), gu(N * 2 * F), dgu(N * 2 * F), act(N * F), wq(QKV * H), wgu(2 * F * H),
      wd(H * F), lm(V * H);
  DeviceArray<float> rstd(N), dw(H), inv_freq(D / 2), logits(CHUNK * V), lp(CHUNK), lse(CHUNK), dlp(CHUNK),
      dwq(QKV * H), dwd(H * F), dlm(V * H);
  DeviceArray<int32_t> pos(N), tgt(CHUNK);
  for (auto* a : {&x, &dy, &w, &qkv, &q, &k, &v, &gu, &act, &wq, &wgu, &wd, &lm}) fill_random(*a, rng);
  std::vector<int32_t> hp(N), ht(CHUNK);
  for (int64_t i = 0; i < N; ++i) hp[i] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < CHUNK; ++i) ht[i] = static_cast<int32_t>(rng() % V);
  std::vector<float> hf(D / 2), hd(CHUNK, 1.f / N);
  for (int64_t i = 0; i < D / 2; ++i) hf[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / D));
  cudaMemcpy(pos.get(), hp.data(), N * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(tgt.get(), ht.data(), CHUNK * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(inv_freq.get(), hf.data(), hf.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dlp.get(), hd.data(), CHUNK * 4, cudaMemcpyHostToDevice);
  cudaMemset(dw.get(), 0, H * 4);
  const QkvShape sh{N, HQ, HKV, D, 1e-5f};

  std::printf("GPU model kernels, Llama-3.2-1B shape, %lld tokens (per-step counts: %lld layers)\n",
              static_cast<long long>(N), static_cast<long long>(L));
  const double act_bytes = 2.0 * N * H;
  report("rmsnorm forward", median_ms(s, [&] { rmsnorm_forward(s, y.get(), rstd.get(), x.get(), w.get(), N, H, 1e-5f); }),
         2 * act_bytes, 2 * L + 1);
  report("rmsnorm backward",
         median_ms(s, [&] {
           rmsnorm_backward(s, dx.get(), true, dw.get(), dy.get(), x.get(), w.get(), rstd.get(), N, H);
         }),
         4 * act_bytes, 2 * L + 1);
  report("qkv split + rope forward",
         median_ms(s, [&] {
           qkv_split_forward(s, sh, q.get(), k.get(), v.get(), nullptr, nullptr, qkv.get(), nullptr, nullptr,
                             pos.get(), inv_freq.get());
         }),
         2.0 * 2 * N * QKV, L);
  report("qkv split + rope backward",
         median_ms(s, [&] {
           qkv_split_backward(s, sh, dqkv.get(), nullptr, nullptr, q.get(), k.get(), v.get(), qkv.get(), nullptr,
                              nullptr, nullptr, nullptr, pos.get(), inv_freq.get());
         }),
         2.0 * 2 * N * QKV, L);
  report("swiglu forward", median_ms(s, [&] { swiglu_forward(s, act.get(), gu.get(), N, F); }), 2.0 * 3 * N * F, L);
  report("swiglu backward", median_ms(s, [&] { swiglu_backward(s, dgu.get(), act.get(), gu.get(), N, F); }),
         2.0 * 5 * N * F, L);
  // The chunk of the default budget at this vocabulary (default_logprob_chunk), 5 per step. The backward runs in
  // place, so its repeats read the previous repeat's output as logits: the same traffic, other values.
  report("logprob rows (1792 x vocab)",
         median_ms(s, [&] { logprob_rows(s, lp.get(), lse.get(), logits.get(), tgt.get(), CHUNK, V); }),
         4.0 * CHUNK * V, 5);
  const bf16* dlogits = reinterpret_cast<const bf16*>(logits.get());
  report("logprob rows backward (in place)",
         median_ms(s, [&] {
           logprob_rows_backward_in_place(s, logits.get(), lse.get(), tgt.get(), dlp.get(), CHUNK, V);
         }),
         6.0 * CHUNK * V, 5);
  report_gemm("gemm qkv forward", median_ms(s, [&] { gemm.linear_forward(qkv.get(), x.get(), wq.get(), nullptr, N, H, QKV); }),
              N, QKV, H, L);
  report_gemm("gemm gate_up forward",
              median_ms(s, [&] { gemm.linear_forward(gu.get(), x.get(), wgu.get(), nullptr, N, H, 2 * F); }), N,
              2 * F, H, L);
  report_gemm("gemm down backward (dx + dw)",
              median_ms(s,
                        [&] {
                          gemm.linear_backward(act.get(), false, dwd.get(), true, nullptr, dy.get(), act.get(),
                                               wd.get(), N, F, H);
                        }),
              2.0 * N, H, F, L);
  report_gemm("gemm lm head chunk forward (fp32)",
              median_ms(s, [&] { gemm.linear_forward_f32(logits.get(), x.get(), lm.get(), CHUNK, H, V); }), CHUNK, V,
              H, 5);
  report_gemm("gemm lm head chunk backward",
              median_ms(s,
                        [&] {
                          gemm.linear_backward(dx.get(), false, dlm.get(), true, nullptr, dlogits, x.get(), lm.get(),
                                               CHUNK, H, V, 2 * V);
                        }),
              2.0 * CHUNK, V, H, 5);
  testing::kernels::cuda_ok(cudaDeviceSynchronize(), "the benchmark's kernels");
#endif
}

}  // namespace
}  // namespace ringtrain
