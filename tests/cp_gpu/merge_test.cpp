// The device merge of partial attention results (cp::merge_partial on GPU views) against the definition in fp64 on
// the host: O = (e^La O_a + e^Lb O_b) / (e^La + e^Lb), L = log(e^La + e^Lb), with rows where one side saw no key
// (LSE -inf). Every pair of O dtypes the ring uses, the four-element path (contiguous, D % 4 == 0) and the
// element-wise one (D = 30, and a view with a row pitch that breaks the four-element alignment).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ringtrain/cp/cp_common.h"
#include "test_util.h"

namespace ringtrain::cp {
namespace {

struct MergeCase {
  DType a, b;
  int64_t dim, pitch;  // pitch: elements between rows (>= dim)
};

// Host fp64 copy of a host view of any float dtype (the reference's inputs, as the kernel reads them).
std::vector<double> values(const TensorView& t) {
  std::vector<double> out;
  for_each_offset(t, t, [&](int64_t off, int64_t) { out.push_back(load_as_double(t.data, t.dtype, off)); });
  return out;
}

TEST(CpMergeGpu, MatchesTheDefinitionForEveryDtypePair) {
  RT_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  const int64_t B = 2, n = 37, H = 3;
  const MergeCase cases[] = {{DType::BF16, DType::BF16, 128, 128}, {DType::F32, DType::BF16, 64, 64},
                             {DType::F16, DType::F16, 64, 64},     {DType::BF16, DType::F32, 30, 30},
                             {DType::F32, DType::F32, 64, 66}};
  std::mt19937_64 rng(testing::fresh_seed());
  for (const MergeCase& c : cases) {
    const std::string what = cat(dtype_name(c.a), "/", dtype_name(c.b), " D=", c.dim, " pitch=", c.pitch);
    // Host inputs: O of both sides, LSEs with some rows at -inf on one side (never both).
    Tensor oa_host = Tensor::empty({B, n, H, c.pitch}, c.a), ob_host = Tensor::empty({B, n, H, c.dim}, c.b);
    Tensor la_host = Tensor::empty({B, H, n}, DType::F32), lb_host = Tensor::empty({B, H, n}, DType::F32);
    testing::fill_normal(oa_host, rng);
    testing::fill_normal(ob_host, rng);
    testing::fill_normal(la_host, rng, 3.0);
    testing::fill_normal(lb_host, rng, 3.0);
    float* la = la_host.ptr<float>();
    float* lb = lb_host.ptr<float>();
    for (int64_t i = 0; i < la_host.numel(); i += 7) (i % 2 ? la : lb)[i] = -INFINITY;
    const TensorView oa_rows = oa_host.view().slice(3, 0, c.dim);

    // Reference in fp64 from the rounded inputs.
    const std::vector<double> xa = values(oa_rows), xb = values(ob_host.view());
    std::vector<double> want_o(xa.size()), want_l(static_cast<size_t>(la_host.numel()));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t li = (b * H + h) * n + i, row = ((b * n + i) * H + h) * c.dim;
          const double m = std::max<double>(la[li], lb[li]);
          const double ea = std::exp(la[li] - m), eb = std::exp(lb[li] - m);
          want_l[li] = m + std::log(ea + eb);
          for (int64_t d = 0; d < c.dim; ++d)
            want_o[row + d] = (ea * xa[row + d] + eb * xb[row + d]) / (ea + eb);
        }

    Tensor oa = Tensor::empty({B, n, H, c.pitch}, c.a, dev), ob = Tensor::empty({B, n, H, c.dim}, c.b, dev);
    Tensor la_dev = Tensor::empty({B, H, n}, DType::F32, dev), lb_dev = Tensor::empty({B, H, n}, DType::F32, dev);
    copy(oa, oa_host);
    copy(ob, ob_host);
    copy(la_dev, la_host);
    copy(lb_dev, lb_host);
    merge_partial(oa.view().slice(3, 0, c.dim), la_dev, ob, lb_dev, nullptr);
    Tensor got_o = Tensor::empty({B, n, H, c.pitch}, c.a), got_l = Tensor::empty({B, H, n}, DType::F32);
    testing::poison(got_o);
    testing::poison(got_l);
    copy(got_o, oa);
    copy(got_l, la_dev);

    const TensorView ref_o = contiguous_view(want_o.data(), DType::F64, Device::cpu(), {B, n, H, c.dim});
    const TensorView ref_l = contiguous_view(want_l.data(), DType::F64, Device::cpu(), {B, H, n});
    // The result is rounded once to A's dtype (relative 2^-8 for bf16, 2^-11 for fp16, fp32 ~1e-7 after the fp32
    // arithmetic); the bounds leave a factor of about two.
    const double tol = c.a == DType::BF16 ? 4e-3 : c.a == DType::F16 ? 1e-3 : 2e-6;
    EXPECT_LE(testing::rel_error(got_o.view().slice(3, 0, c.dim), ref_o), tol) << what;
    EXPECT_LE(testing::rel_error(got_l, ref_l), 1e-6) << what;  // fp32 log-sum-exp of values of order 1-10
  }
}

}  // namespace
}  // namespace ringtrain::cp
