// Linear layer: the model's GEMMs. Rows of x and of w are contiguous along `in`, so every output is a dot
// product of two contiguous rows; blocks of 4 rows share each loaded weight row.
#include <algorithm>

#include "ringtrain/model/layers.h"

namespace ringtrain::model {
namespace {
constexpr int64_t kRowBlock = 4;    // rows of x per work item (reuse of each weight row)
constexpr int64_t kColBlock = 64;   // outputs per work item
}  // namespace

template <typename T>
void linear_forward(T* y, const T* x, const T* w, const T* b, int64_t n, int64_t in, int64_t out) {
  const int64_t row_blocks = (n + kRowBlock - 1) / kRowBlock, col_blocks = (out + kColBlock - 1) / kColBlock;
  parallel_items(row_blocks * col_blocks, kRowBlock * kColBlock * in, [&](int64_t item) {
    const int64_t r0 = (item / col_blocks) * kRowBlock, r1 = std::min(n, r0 + kRowBlock);
    const int64_t c0 = (item % col_blocks) * kColBlock, c1 = std::min(out, c0 + kColBlock);
    for (int64_t o = c0; o < c1; ++o) {
      const T* wo = w + o * in;
      const T bias = b ? b[o] : T(0);
      if (r1 - r0 == kRowBlock) {
        const T *x0 = x + r0 * in, *x1 = x0 + in, *x2 = x1 + in, *x3 = x2 + in;
        T a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
        for (int64_t k = 0; k < in; ++k) {
          a0 += x0[k] * wo[k];
          a1 += x1[k] * wo[k];
          a2 += x2[k] * wo[k];
          a3 += x3[k] * wo[k];
        }
        y[r0 * out + o] = a0 + bias;
        y[(r0 + 1) * out + o] = a1 + bias;
        y[(r0 + 2) * out + o] = a2 + bias;
        y[(r0 + 3) * out + o] = a3 + bias;
      } else {
        for (int64_t r = r0; r < r1; ++r) {
          const T* xr = x + r * in;
          T a = 0;
#pragma omp simd reduction(+ : a)
          for (int64_t k = 0; k < in; ++k) a += xr[k] * wo[k];
          y[r * out + o] = a + bias;
        }
      }
    }
  });
}

template <typename T>
void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, int64_t n, int64_t in, int64_t out) {
  if (dx) {  // dx[r, :] += Σ_o dy[r, o] · w[o, :]; items own disjoint rows of dx
    parallel_items((n + kRowBlock - 1) / kRowBlock, kRowBlock * out * in, [&](int64_t item) {
      const int64_t r0 = item * kRowBlock, r1 = std::min(n, r0 + kRowBlock);
      for (int64_t o = 0; o < out; ++o) {
        const T* wo = w + o * in;
        for (int64_t r = r0; r < r1; ++r) {
          const T g = dy[r * out + o];
          if (g == T(0)) continue;
          T* dxr = dx + r * in;
#pragma omp simd
          for (int64_t k = 0; k < in; ++k) dxr[k] += g * wo[k];
        }
      }
    });
  }
  // dw[o, :] += Σ_r dy[r, o] · x[r, :]; items own disjoint rows of dw
  parallel_items((out + kRowBlock - 1) / kRowBlock, kRowBlock * n * in, [&](int64_t item) {
    const int64_t o0 = item * kRowBlock, o1 = std::min(out, o0 + kRowBlock);
    for (int64_t r = 0; r < n; ++r) {
      const T* xr = x + r * in;
      for (int64_t o = o0; o < o1; ++o) {
        const T g = dy[r * out + o];
        if (g == T(0)) continue;
        T* dwo = dw + o * in;
#pragma omp simd
        for (int64_t k = 0; k < in; ++k) dwo[k] += g * xr[k];
      }
    }
    if (db)
      for (int64_t o = o0; o < o1; ++o)
        for (int64_t r = 0; r < n; ++r) db[o] += dy[r * out + o];
  });
}

template void linear_forward<float>(float*, const float*, const float*, const float*, int64_t, int64_t, int64_t);
template void linear_forward<double>(double*, const double*, const double*, const double*, int64_t, int64_t, int64_t);
template void linear_backward<float>(float*, float*, float*, const float*, const float*, const float*, int64_t,
                                     int64_t, int64_t);
template void linear_backward<double>(double*, double*, double*, const double*, const double*, const double*, int64_t,
                                      int64_t, int64_t);

}  // namespace ringtrain::model
