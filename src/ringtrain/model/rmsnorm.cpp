// RMSNorm: y = w ∘ x · r with r = (mean(x²) + eps)^(-1/2).
// Backward: with g = w ∘ dy, dx = r·g - x · r³ · mean(g ∘ x); dw += dy ∘ x · r.
#include <cmath>

#include "ringtrain/model/layers.h"

namespace ringtrain::model {

template <typename T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* w, int64_t rows, int64_t dim, double eps) {
  parallel_items(rows, dim, [&](int64_t r) {
    const T* xr = x + r * dim;
    T ss = 0;
    for (int64_t j = 0; j < dim; ++j) ss += xr[j] * xr[j];
    const T rs = T(1) / std::sqrt(ss / T(dim) + T(eps));
    rstd[r] = rs;
    T* yr = y + r * dim;
    for (int64_t j = 0; j < dim; ++j) yr[j] = w[j] * (xr[j] * rs);
  });
}

template <typename T>
void rmsnorm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, int64_t rows, int64_t dim) {
  parallel_items(rows, dim, [&](int64_t r) {
    const T *xr = x + r * dim, *dyr = dy + r * dim;
    const T rs = rstd[r];
    T gx = 0;
    for (int64_t j = 0; j < dim; ++j) gx += w[j] * dyr[j] * xr[j];
    const T c = rs * rs * rs * gx / T(dim);
    T* dxr = dx + r * dim;
    for (int64_t j = 0; j < dim; ++j) dxr[j] += rs * w[j] * dyr[j] - c * xr[j];
  });
  // The weight gradient sums over rows; one pass keeps it free of races.
  for (int64_t r = 0; r < rows; ++r) {
    const T *xr = x + r * dim, *dyr = dy + r * dim;
    for (int64_t j = 0; j < dim; ++j) dw[j] += dyr[j] * xr[j] * rstd[r];
  }
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int64_t, int64_t, double);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int64_t, int64_t, double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*, const float*, int64_t,
                                      int64_t);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*, const double*, const double*,
                                       int64_t, int64_t);

}  // namespace ringtrain::model
