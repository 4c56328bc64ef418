// For the tests of the GPU model's kernels and GEMMs: device arrays filled from host values (bf16 rounding done on
// the host, so the reference sees exactly the values the GPU reads), NaN poisoning, and an element-wise comparison
// against a double reference with a bound per element (NaN never passes). CUDA builds only.
#pragma once
#ifdef RINGTRAIN_WITH_CUDA

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ringtrain/core/dtype.h"
#include "ringtrain/core/error.h"

namespace ringtrain::testing::kernels {

using bf16 = __nv_bfloat16;

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(cat(what, ": ", cudaGetErrorString(e)));
}

// An owned device array of n elements.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    cuda_ok(cudaMalloc(&ptr_, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return static_cast<T*>(ptr_); }
  size_t size() const { return n_; }
  // Every byte 0xff: a NaN in fp32 and in bf16 alike.
  void poison() { cuda_ok(cudaMemset(ptr_, 0xff, n_ * sizeof(T)), "poisoning a device array"); }

 private:
  void* ptr_ = nullptr;
  size_t n_;
};

// N(0, stddev) values rounded to bf16 (so that they are exactly what a bf16 array holds), as floats.
inline std::vector<float> random_bf16_values(size_t n, std::mt19937_64& rng, double stddev = 1.0, double mean = 0.0) {
  std::normal_distribution<float> dist(static_cast<float>(mean), static_cast<float>(stddev));
  std::vector<float> v(n);
  for (float& x : v) x = bf16_to_float(float_to_bf16(dist(rng)));
  return v;
}

inline std::vector<float> random_f32_values(size_t n, std::mt19937_64& rng, double stddev = 1.0) {
  std::normal_distribution<float> dist(0.f, static_cast<float>(stddev));
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline void upload_to(const DeviceArray<bf16>& d, const std::vector<float>& v, size_t offset = 0) {
  RT_CHECK(offset + v.size() <= d.size(), "upload of ", v.size(), " values at ", offset, " into ", d.size());
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = float_to_bf16(v[i]);
  cuda_ok(cudaMemcpy(d.get() + offset, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), "bf16 upload");
}

template <typename T>
void upload_to(const DeviceArray<T>& d, const std::vector<T>& v) {
  RT_CHECK(v.size() <= d.size(), "upload of ", v.size(), " values into ", d.size());
  cuda_ok(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
}

inline std::unique_ptr<DeviceArray<bf16>> upload_bf16(const std::vector<float>& v) {
  auto d = std::make_unique<DeviceArray<bf16>>(v.size());
  upload_to(*d, v);
  return d;
}

template <typename T>
std::unique_ptr<DeviceArray<T>> upload(const std::vector<T>& v) {
  auto d = std::make_unique<DeviceArray<T>>(v.size());
  upload_to(*d, v);
  return d;
}

// count values starting at `offset`, as floats.
inline std::vector<float> download(const DeviceArray<bf16>& d, size_t offset = 0, size_t count = SIZE_MAX) {
  if (count == SIZE_MAX) count = d.size() - offset;
  std::vector<uint16_t> bits(count);
  cuda_ok(cudaMemcpy(bits.data(), d.get() + offset, count * 2, cudaMemcpyDeviceToHost), "bf16 download");
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = bf16_to_float(bits[i]);
  return v;
}

inline std::vector<float> download(const DeviceArray<float>& d) {
  std::vector<float> v(d.size());
  cuda_ok(cudaMemcpy(v.data(), d.get(), v.size() * sizeof(float), cudaMemcpyDeviceToHost), "fp32 download");
  return v;
}

// A stream of the test's own (the kernels must work on any stream, not only the legacy default one).
class TestStream {
 public:
  TestStream() { cuda_ok(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~TestStream() { cudaStreamDestroy(s_); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  cudaStream_t get() const { return s_; }
  void sync() const { cuda_ok(cudaStreamSynchronize(s_), "waiting for the test stream"); }

 private:
  cudaStream_t s_ = nullptr;
};

// One bf16 rounding of an fp32 result: at most 2^-9 relative; 2^-8 leaves room for the fp32 arithmetic before it
// (which can move a value across a rounding boundary).
constexpr double kBf16Out = 1.0 / 256;

// Worst-case error of an fp32 sum along a chain of at most `chain` additions (each rounding adds at most 2^-24 of
// the running magnitude, bounded by the sum of magnitudes `magnitude`).
inline double fp32_sum_bound(double chain, double magnitude) { return (chain + 2) * std::ldexp(1.0, -24) * magnitude; }

// Checks |got[i] - ref[i]| <= bound(i) for every i (NaN or inf in got fails); prints the worst ratio error/bound.
template <typename Bound>
void expect_elementwise(const std::string& what, const std::vector<float>& got, const std::vector<double>& ref,
                        Bound&& bound) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t failures = 0, worst_at = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]), b = bound(i);
    const double ratio = !std::isfinite(got[i]) ? INFINITY : err == 0 ? 0.0 : err / b;
    if (!(ratio <= 1.0)) {
      if (failures < 5)
        ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", reference " << ref[i] << " (bound " << b
                      << ")";
      ++failures;
    }
    if (!(ratio <= worst)) worst = ratio, worst_at = i;
  }
  EXPECT_EQ(failures, 0u) << what << ": " << failures << " of " << got.size() << " elements out of bounds";
  std::printf("[%s] %zu elements, worst error/bound %.3g at %zu\n", what.c_str(), got.size(), worst, worst_at);
}

// The bound of a bf16 output: one rounding of |ref| plus an absolute floor for fp32 cancellation near zero.
inline auto bf16_bound(const std::vector<double>& ref, double floor) {
  return [&ref, floor](size_t i) { return kBf16Out * std::fabs(ref[i]) + floor; };
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

}  // namespace ringtrain::testing::kernels

#endif  // RINGTRAIN_WITH_CUDA

// Test bodies call the GPU checks through this: in a build without CUDA the call is left out and the test is skipped
// by RT_REQUIRE_GPU (test_util.h) with the reason.
#ifdef RINGTRAIN_WITH_CUDA
#define RT_GPU_ONLY(...) __VA_ARGS__
#else
#define RT_GPU_ONLY(...)
#endif
