// SwiGLU activation of the MLP: h = silu(gate) ∘ up, silu(g) = g·σ(g); silu'(g) = σ(g)·(1 + g·(1 - σ(g))).
#include <algorithm>
#include <cmath>

#include "ringtrain/model/layers.h"

namespace ringtrain::model {
namespace {
constexpr int64_t kBlock = 4096;  // elements per work item
}

template <typename T>
void swiglu_forward(T* h, const T* gate, const T* up, int64_t n) {
  parallel_items((n + kBlock - 1) / kBlock, kBlock, [&](int64_t b) {
    for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
      const T sig = T(1) / (T(1) + std::exp(-gate[i]));
      h[i] = gate[i] * sig * up[i];
    }
  });
}

template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dh, const T* gate, const T* up, int64_t n) {
  parallel_items((n + kBlock - 1) / kBlock, kBlock, [&](int64_t b) {
    for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
      const T sig = T(1) / (T(1) + std::exp(-gate[i]));
      dup[i] = dh[i] * gate[i] * sig;
      dgate[i] = dh[i] * up[i] * sig * (T(1) + gate[i] * (T(1) - sig));
    }
  });
}

template void swiglu_forward<float>(float*, const float*, const float*, int64_t);
template void swiglu_forward<double>(double*, const double*, const double*, int64_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, const float*, int64_t);
template void swiglu_backward<double>(double*, double*, const double*, const double*, const double*, int64_t);

}  // namespace ringtrain::model
