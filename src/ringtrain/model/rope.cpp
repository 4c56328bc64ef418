// Rotary position embedding with the rotate-half pairing of transformers: element i (< dim/2) pairs with
// i + dim/2, both rotated by the angle position · inv_freq[i]. Angles are formed in fp32 as transformers does
// (so long positions round the same way); cos/sin are then taken in double.
#include <cmath>

#include "ringtrain/model/layers.h"

namespace ringtrain::model {
namespace {

template <typename T>
void rotate(T* x, const int32_t* positions, const std::vector<float>& inv_freq, int64_t tokens, int64_t heads,
            int64_t dim, double sign) {
  const int64_t half = dim / 2;
  parallel_items(tokens, heads * dim, [&](int64_t t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[t]) * inv_freq[i];
      const T c = static_cast<T>(std::cos(static_cast<double>(angle)));
      const T s = static_cast<T>(sign * std::sin(static_cast<double>(angle)));
      for (int64_t h = 0; h < heads; ++h) {
        T* row = x + (t * heads + h) * dim;
        const T a = row[i], b = row[i + half];
        row[i] = a * c - b * s;
        row[i + half] = b * c + a * s;
      }
    }
  });
}

}  // namespace

std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t head_dim) {
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  const double pi = 3.14159265358979323846;
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    double f = 1.0 / std::pow(rope.theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
    if (rope.llama3) {
      // Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
      const double old_len = static_cast<double>(rope.original_max_position);
      const double low_wavelen = old_len / rope.low_freq_factor, high_wavelen = old_len / rope.high_freq_factor;
      const double wavelen = 2 * pi / f;
      if (wavelen > low_wavelen) {
        f = f / rope.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
        f = (1 - smooth) * f / rope.factor + smooth * f;
      }
    }
    inv[i] = static_cast<float>(f);
  }
  return inv;
}

template <typename T>
void rope_forward(T* x, const int32_t* positions, const std::vector<float>& inv_freq, int64_t tokens, int64_t heads,
                  int64_t dim) {
  rotate(x, positions, inv_freq, tokens, heads, dim, 1.0);
}

template <typename T>
void rope_backward(T* dx, const int32_t* positions, const std::vector<float>& inv_freq, int64_t tokens,
                   int64_t heads, int64_t dim) {
  rotate(dx, positions, inv_freq, tokens, heads, dim, -1.0);
}

template void rope_forward<float>(float*, const int32_t*, const std::vector<float>&, int64_t, int64_t, int64_t);
template void rope_forward<double>(double*, const int32_t*, const std::vector<float>&, int64_t, int64_t, int64_t);
template void rope_backward<float>(float*, const int32_t*, const std::vector<float>&, int64_t, int64_t, int64_t);
template void rope_backward<double>(double*, const int32_t*, const std::vector<float>&, int64_t, int64_t, int64_t);

}  // namespace ringtrain::model
