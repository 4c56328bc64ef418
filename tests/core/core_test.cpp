// core: 16-bit float conversions against values worked out by hand from the formats' definitions, tensor views
// (slices, strided copies, error messages) and the device tables behind them.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "ringtrain/core/checked.h"
#include "ringtrain/core/device_info.h"
#include "ringtrain/core/device_ops.h"
#include "ringtrain/core/dtype.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/json.h"
#include "ringtrain/core/nearest_name.h"
#include "ringtrain/core/sys_error.h"
#include "ringtrain/core/tensor.h"
#include "test_util.h"

namespace ringtrain {
namespace {

TEST(Dtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f / 3.0f), 0x3eab);   // 0x3eaaaaab: the dropped half 0xaaab > 0x8000 rounds up
  EXPECT_EQ(float_to_bf16(-2.5f), 0xc020);
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);   // exactly halfway (0x3f808000): ties to even (down)
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3f82);   // 0x3f818000 halfway: ties to even (up)
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
}

TEST(Dtype, Fp16RoundTripsAndRounds) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(1.0f / 3.0f), 0x3555);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);       // largest finite
  EXPECT_EQ(float_to_fp16(1e6f), 0x7c00);           // overflow -> inf
  EXPECT_EQ(float_to_fp16(5.9604645e-8f), 0x0001);  // smallest subnormal 2^-24
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  for (uint32_t h = 0; h < 0x7c00; ++h)  // every finite positive fp16 survives a round trip
    ASSERT_EQ(float_to_fp16(fp16_to_float(static_cast<uint16_t>(h))), h) << h;
}

TEST(Dtype, ParseNamesAndRejectsUnknown) {
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BF16);
  EXPECT_EQ(parse_dtype("fp32"), DType::F32);
  try {
    parse_dtype("fp8");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown dtype 'fp8'"), std::string::npos);
  }
}

TEST(Tensor, SliceAndStridedCopy) {
  Tensor t = Tensor::empty({2, 5, 3, 4}, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = static_cast<float>(i);
  TensorView s = t.view().slice(1, 2, 3);
  EXPECT_EQ(s.shape[1], 3);
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(*static_cast<float*>(s.at({1, 0, 2, 3})), static_cast<float>(((1 * 5 + 2) * 3 + 2) * 4 + 3));
  Tensor c = Tensor::empty({2, 3, 3, 4}, DType::BF16);
  testing::poison(c);
  copy(c, s);
  EXPECT_EQ(testing::max_abs_error(c, s), 0.0);  // small integers are exact in bf16
  EXPECT_THROW(t.view().slice(1, 4, 2), Error);
  try {
    copy(c, t);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3, 3, 4] bf16 cpu <- [2, 5, 3, 4] fp32 cpu"), std::string::npos)
        << e.what();
  }
}

// Raw bytes at odd offsets and an odd count (bools, int8 masks): no element type, no alignment.
TEST(Tensor, CopyBytesTakesAnyCountAtAnyOffset) {
  std::vector<unsigned char> src(41), dst(41, 0xAB);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(7 * i + 3);
  copy_bytes(dst.data() + 1, Device::cpu(), src.data() + 3, Device::cpu(), 37);
  EXPECT_EQ(dst[0], 0xAB);
  for (size_t i = 0; i < 37; ++i) ASSERT_EQ(dst[i + 1], src[i + 3]) << i;
  EXPECT_EQ(dst[38], 0xAB);
  copy_bytes(dst.data(), Device::cpu(), src.data(), Device::cpu(), 0);  // nothing, and no read
  EXPECT_EQ(dst[0], 0xAB);
}

TEST(TestUtil, NanNeverPasses) {
  Tensor a = Tensor::zeros({4}, DType::F32), b = Tensor::zeros({4}, DType::F32);
  b.ptr<float>()[0] = 1.f;
  a.ptr<float>()[0] = 1.f;
  EXPECT_EQ(testing::rel_error(a, b), 0.0);
  a.ptr<float>()[2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isinf(testing::rel_error(a, b)));
  EXPECT_TRUE(std::isinf(testing::max_abs_error(a, b)));
}

}  // namespace
}  // namespace ringtrain

namespace ringtrain {
namespace {

// The hashed normal fill: deterministic per (seed, index), N(0,1) moments within 5 standard errors, and the same
// values on a GPU (up to the device's float rounding).
TEST(HashedNormal, DeterministicWithNormalMoments) {
  const uint64_t seed = testing::fresh_seed();
  Tensor a = Tensor::empty({64, 3, 2, 50}, DType::F64), b = Tensor::empty({64, 3, 2, 50}, DType::F64);
  fill_normal_hashed(a, seed);
  fill_normal_hashed(b, seed);
  EXPECT_EQ(testing::max_abs_error(a, b), 0.0);
  const int64_t n = a.numel();
  double mean = 0, m2 = 0;
  for (int64_t i = 0; i < n; ++i) mean += a.ptr<double>()[i];
  mean /= n;
  for (int64_t i = 0; i < n; ++i) m2 += (a.ptr<double>()[i] - mean) * (a.ptr<double>()[i] - mean);
  const double var = m2 / (n - 1);
  EXPECT_LT(std::fabs(mean), 5.0 / std::sqrt(static_cast<double>(n)));
  EXPECT_LT(std::fabs(var - 1.0), 5.0 * std::sqrt(2.0 / n));
  fill_normal_hashed(b, seed + 1);
  EXPECT_GT(testing::max_abs_error(a, b), 1.0);  // another seed, other values
}

TEST(HashedNormal, GpuDrawsTheHostValues) {
  RT_REQUIRE_GPU();
  const uint64_t seed = testing::fresh_seed();
  Tensor a = Tensor::empty({64, 3, 2, 50}, DType::F64);
  fill_normal_hashed(a, seed);
  Tensor d = Tensor::empty({64, 3, 2, 50}, DType::F32, Device::cuda(0));
  fill_normal_hashed(d, seed);
  Tensor back = Tensor::empty({64, 3, 2, 50}, DType::F32);
  copy(back, d);
  EXPECT_LE(testing::max_abs_error(back, a), 1e-5);  // fp32 storage of the same deviates
}

// The stream-ordered copy / add / fill against the blocking host ones, on the views the CP steps use: contiguous
// (the vectorised path; 546 elements leave a tail of 2 past the packs of 8), strided row slices, dtype changes.
// fp32 destinations are exact: the only rounding is bf16's, which both sides do the same way.
void check_async_ops(Device dev) {
  std::mt19937_64 rng(testing::fresh_seed());
  auto on = [&](const Tensor& host) {
    Tensor t = Tensor::empty({host.size(0), host.size(1), host.size(2), host.size(3)}, host.dtype(), dev);
    copy(t, host);
    return t;
  };
  auto back = [](const Tensor& t) {
    Tensor h = Tensor::empty({t.size(0), t.size(1), t.size(2), t.size(3)}, t.dtype());
    copy(h, t);
    return h;
  };
  const Tensor a = Tensor::empty({2, 13, 3, 7}, DType::F32), b = Tensor::empty({2, 13, 3, 7}, DType::BF16);
  testing::fill_normal(a, rng);
  testing::fill_normal(b, rng);
  // Reference on the host: expected = a + b over every element, then rows [4, 9) of it overwritten by b's.
  Tensor expected = Tensor::empty({2, 13, 3, 7}, DType::F32);
  copy(expected, a);
  for_each_offset(expected, b, [&](int64_t oe, int64_t ob) {
    expected.ptr<float>()[oe] += bf16_to_float(b.ptr<uint16_t>()[ob]);
  });
  copy(expected.view().slice(1, 4, 5), b.view().slice(1, 4, 5));

  const Tensor da = on(a), db = on(b);
  Tensor dst = Tensor::empty({2, 13, 3, 7}, DType::F32, dev);
  fill(dst, std::numeric_limits<double>::quiet_NaN());
  copy_async(dst, da, nullptr);                                                // same dtype, contiguous
  add_async(dst, db, nullptr);                                                 // bf16 into fp32, vectorised
  copy_async(dst.view().slice(1, 4, 5), db.view().slice(1, 4, 5), nullptr);    // strided rows, bf16 -> fp32
  EXPECT_EQ(testing::max_abs_error(back(dst), expected), 0.0);

  // fill_async: zero (memset path) and a value (kernel path) on a strided slice.
  fill_async(dst, 0.0, nullptr);
  fill_async(dst.view().slice(1, 2, 3), -2.5, nullptr);
  const Tensor got = back(dst);
  for_each_offset(got, got, [&](int64_t o, int64_t) {
    const int64_t row = (o / (3 * 7)) % 13;
    EXPECT_EQ(got.ptr<float>()[o], row >= 2 && row < 5 ? -2.5f : 0.f) << "element " << o;
  });
}

TEST(AsyncOps, HostViewsMatchTheBlockingOnes) { check_async_ops(Device::cpu()); }

TEST(AsyncOps, DeviceKernelsMatchTheHost) {
  RT_REQUIRE_GPU();
  check_async_ops(Device::cuda(0));
  synchronize(Device::cuda(0));
}

// first_outside over random int32 / int64 ids viewed transposed (row stride 1), with random lengths and a few planted
// ids outside [0, limit) both inside and past the rows' lengths, against a plain scan of the host values.
void check_first_outside(Device dev) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (const DType dtype : {DType::I32, DType::I64})
    for (int trial = 0; trial < 20; ++trial) {
      const int64_t R = 1 + static_cast<int64_t>(rng() % 9), C = 1 + static_cast<int64_t>(rng() % 300);
      const int64_t limit = 1000;
      std::vector<int64_t> values(static_cast<size_t>(R * C));  // [C, R] storage: element (r, c) at c * R + r
      for (int64_t& v : values) v = static_cast<int64_t>(rng() % limit);
      std::vector<int64_t> lengths(static_cast<size_t>(R));
      for (int64_t& l : lengths) l = static_cast<int64_t>(rng() % static_cast<uint64_t>(C + 1));
      for (int k = trial % 4; k > 0; --k) {
        const int64_t bad[] = {-1, limit, limit + 7, std::numeric_limits<int32_t>::min()};
        values[rng() % values.size()] = bad[rng() % 4];
      }
      int64_t want = -1;
      for (int64_t r = 0; r < R && want < 0; ++r)
        for (int64_t c = 0; c < lengths[static_cast<size_t>(r)]; ++c) {
          const int64_t v = values[static_cast<size_t>(c * R + r)];
          if (v < 0 || v >= limit) {
            want = r * C + c;
            break;
          }
        }
      Tensor host = Tensor::empty({C, R}, dtype);
      for (size_t i = 0; i < values.size(); ++i) {
        if (dtype == DType::I32)
          host.ptr<int32_t>()[i] = static_cast<int32_t>(values[i]);
        else
          host.ptr<int64_t>()[i] = values[i];
      }
      Tensor stored = Tensor::empty({C, R}, dtype, dev);
      copy(stored, host);
      TensorView ids = stored.view();
      ids.shape = {R, C, 0, 0};
      ids.stride = {1, R, 0, 0};
      EXPECT_EQ(device_ops(ids, "test").first_outside(ids, lengths, limit), want)
          << dtype_name(dtype) << " [" << R << ", " << C << "] trial " << trial;
    }
  Tensor ids = Tensor::zeros({2, 3}, DType::I32, dev);
  const DeviceOps& ops = device_ops(ids, "test");
  EXPECT_THROW(ops.first_outside(ids, {1}, 5), Error);
  EXPECT_THROW(ops.first_outside(ids, {1, 4}, 5), Error);
  EXPECT_THROW(ops.first_outside(ids, {1, -1}, 5), Error);
  Tensor floats = Tensor::zeros({2, 3}, DType::F32, dev);
  EXPECT_THROW(ops.first_outside(floats, {1, 1}, 5), Error);
}

TEST(DeviceOps, FirstOutsideOnTheHost) { check_first_outside(Device::cpu()); }

TEST(DeviceOps, FirstOutsideOnTheGpuMatchesAHostScan) {
  RT_REQUIRE_GPU();
  check_first_outside(Device::cuda(0));
}

TEST(DeviceOps, HostViewsUseTheHostTable) {
  const DeviceOps* host = find_device_ops(DeviceKind::CPU);
  ASSERT_NE(host, nullptr);
  EXPECT_EQ(host->kind(), DeviceKind::CPU);
  Tensor t = Tensor::empty({3, 5}, DType::BF16);
  EXPECT_EQ(&device_ops(t, "test"), host);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);  // the host table's allocations are 64-byte aligned
  // zeros through the table's fill: every element written, also after poisoning memory of the same size.
  testing::poison(t);
  Tensor z = Tensor::zeros({3, 5}, DType::BF16);
  for (int64_t i = 0; i < z.numel(); ++i) EXPECT_EQ(z.ptr<uint16_t>()[i], 0u) << i;
  fill(t, -0.0);  // -0 is not the all-zero bit pattern: the memset shortcut must not take it
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.ptr<uint16_t>()[i], 0x8000u) << i;
}

// Without CUDA support a CUDA view is an Error naming the operation and the view, never a host access.
TEST(DeviceOps, CudaViewsWithoutCudaSupportAreClearErrors) {
  if (find_device_ops(DeviceKind::CUDA)) GTEST_SKIP() << "this build has CUDA support";
  EXPECT_EQ(cuda_device_count(), 0);
  EXPECT_EQ(cuda_unavailable_reason(), "this build of ringtrain has no CUDA support");
  EXPECT_EQ(hopper_unavailable_reason(Device::cuda(0)), "this build of ringtrain has no CUDA support");
  EXPECT_EQ(hopper_unavailable_reason(Device::cpu()), "runs on CUDA devices, not cpu");
  EXPECT_EQ(cuda_arch(0), 0);
  synchronize(Device::cuda(0));  // nothing to wait for

  float host[6] = {};
  // A device address that must never be touched: any host access would crash the test.
  const TensorView gpu = contiguous_view(reinterpret_cast<void*>(uintptr_t{0x10}), DType::F32, Device::cuda(1), {2, 3});
  const TensorView cpu = contiguous_view(host, DType::F32, Device::cpu(), {2, 3});
  const auto expect_error = [](const std::function<void()>& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
      EXPECT_NE(msg.find("[2, 3] fp32 cuda:1"), std::string::npos) << msg;
      EXPECT_NE(msg.find("no CUDA support"), std::string::npos) << msg;
    }
  };
  expect_error([&] { copy(cpu, gpu); }, "copy");
  expect_error([&] { copy(gpu, cpu); }, "copy");
  expect_error([&] { copy_async(gpu, gpu, nullptr); }, "copy_async");
  expect_error([&] { add_async(gpu, gpu, nullptr); }, "add_async");
  expect_error([&] { fill(gpu, 1.0); }, "fill");
  expect_error([&] { fill_async(gpu, 1.0, nullptr); }, "fill_async");
  expect_error([&] { fill_normal_hashed(gpu, 1); }, "fill_normal_hashed");
  expect_error([&] { Tensor::empty({2, 3}, DType::F32, Device::cuda(1)); }, "allocating");
  EXPECT_THROW(copy_async(cpu, gpu, nullptr), Error);  // different devices
}

}  // namespace
}  // namespace ringtrain

namespace ringtrain {
namespace {

TEST(Checked, ProductsAndSumsThatOverflowAreErrorsNamingTheQuantity) {
  EXPECT_EQ(checked_mul(int64_t{1} << 31, int64_t{1} << 31, "x"), int64_t{1} << 62);
  EXPECT_EQ(checked_add(INT64_MAX - 1, 1, "x"), INT64_MAX);
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { checked_mul(int64_t{1} << 62, 4, "tensor 'w' numel"); }).find("tensor 'w' numel"),
            std::string::npos);
  EXPECT_NE(message([] { checked_add(INT64_MAX, 1, "count"); }).find("count"), std::string::npos);
  EXPECT_NE(message([] { checked_mul(-1, 4, "negative"); }).find("negative"), std::string::npos);
  const std::vector<int64_t> wraps{int64_t{1} << 62, 4};  // 2^64 wraps to 0 unchecked
  EXPECT_NE(message([&] { checked_numel(wraps, "shape"); }).find("overflows"), std::string::npos);
  TensorView v;
  v.ndim = 2, v.shape[0] = int64_t{1} << 62, v.shape[1] = 4;
  EXPECT_NE(message([&] { (void)v.numel(); }).find("overflows"), std::string::npos);
}

TEST(Json, AKeyGivenTwiceInOneObjectIsAnError) {
  try {
    parse_json(R"({"a": {"b": 1, "c": [{"b": 2}], "b": 3}})", "f.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(R"(f.json: key "b" given twice)"), std::string::npos) << e.what();
  }
  // The same key in different objects, nested or side by side, is fine.
  EXPECT_EQ(parse_json(R"({"b": {"b": 1}, "c": [{"b": 2}, {"b": 3}]})", "ok")["c"][1]["b"], 3);
}

// 300,000 small objects in one (a hostile safetensors header's shape): the checks and the parse take one pass (the
// DOM parser with a callback walked the parent at every closing object: hours at this size, past ctest's timeout),
// and a key repeated at the very end is still found.
TEST(Json, ManyObjectsParseInOnePassWithTheirChecks) {
  std::string text = "{";
  for (int i = 0; i < 300000; ++i) text += "\"t" + std::to_string(i) + "\": {\"x\": [" + std::to_string(i) + "]},";
  EXPECT_EQ(parse_json(text.substr(0, text.size() - 1) + "}", "many")["t299999"]["x"][0], 299999);
  try {
    parse_json(text + "\"t7\": {}}", "many.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(R"(many.json: key "t7" given twice)"), std::string::npos) << e.what();
  }
}

TEST(Json, NestingBeyondTheLimitIsAnErrorNamingTheSource) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  try {
    parse_json(deep, "f.json:3");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f.json:3: JSON nested deeper than"), std::string::npos) << e.what();
  }
  const std::string ok_depth = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_NO_THROW(parse_json(ok_depth, "ok"));
  const std::string too_deep = std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']');
  EXPECT_THROW(parse_json(too_deep, "x"), Error);
  EXPECT_THROW(parse_json("{\"a\": ", "x"), Error);
  const std::string long_value = json_excerpt(nlohmann::json(std::string(1000, 'a')), 50);
  EXPECT_EQ(long_value.size(), 53u);
  EXPECT_TRUE(long_value.ends_with("..."));
}

TEST(Json, ANulByteIsAnErrorNotTheEndOfTheText) {
  // nlohmann's parser stops at a NUL: without the check the text below would parse as {"a": 1}.
  const std::string text = std::string(R"({"a": 1})") + '\0' + "} not json {";
  try {
    parse_json(text, "f.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f.json: a NUL byte at byte 9"), std::string::npos) << e.what();
  }
}

TEST(Error, ControlBytesOfAMessageAreShownEscapedAndNothingIsCutOff) {
  const std::string key = std::string("a") + '\0' + "b\x1b[31m";
  const Error e(cat("unknown field '", key, "'\n\tsecond line\x7f"));
  // what() is a C string: a raw NUL would have ended the message after "a".
  EXPECT_EQ(std::string(e.what()), "unknown field 'a\\x00b\\x1b[31m'\n\tsecond line\\x7f");
  EXPECT_EQ(printable("plain text, UTF-8 \xc3\xa9"), "plain text, UTF-8 \xc3\xa9");
}

TEST(SysError, MessageNamesWhatPathAndReason) {
  EXPECT_EQ(sys_message("cannot open", "/x/y", ENOENT), "cannot open /x/y: No such file or directory");
}

// The hint for a mistyped name: the edit distance against a hand count, a name holding the typed parts in order
// before any slip, no guess for what is far from everything.
TEST(NearestName, PartsInOrderThenSlipsThenNothing) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("same", "same"), 0u);
  const std::vector<std::string> known = {"train", "grpo", "policy.train_micro_batch_size",
                                          "policy.logprob_batch_size", "policy.optimizer.kwargs.lr"};
  EXPECT_EQ(nearest_name("trian", known), "train");
  EXPECT_EQ(nearest_name("policy.micro_batch_size", known), "policy.train_micro_batch_size");
  EXPECT_EQ(nearest_name("policy.optimizer.lr", known), "policy.optimizer.kwargs.lr");
  EXPECT_EQ(nearest_name("lr.optimizer", known), std::nullopt);  // parts out of order, and far by edits
  EXPECT_EQ(nearest_name("zzzzzzzz", known), std::nullopt);
  EXPECT_EQ(nearest_name("policy..lr", known), std::nullopt);  // an empty part holds nothing
  EXPECT_EQ(nearest_name("x", {}), std::nullopt);
}

}  // namespace
}  // namespace ringtrain
