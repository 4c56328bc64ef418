// Token embedding: a row gather; the backward scatters rows back (serially: tokens may repeat).
#include <algorithm>

#include "ringtrain/core/error.h"
#include "ringtrain/model/layers.h"

namespace ringtrain::model {

template <typename T>
void embedding_forward(T* x, const int32_t* tokens, const T* table, int64_t n, int64_t dim, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i) {
    RT_CHECK(tokens[i] >= 0 && tokens[i] < vocab, "token id ", tokens[i], " at index ", i,
             " is outside the vocabulary [0, ", vocab, ")");
    std::copy(table + tokens[i] * dim, table + (tokens[i] + 1) * dim, x + i * dim);
  }
}

template <typename T>
void embedding_backward(T* dtable, const int32_t* tokens, const T* dx, int64_t n, int64_t dim) {
  for (int64_t i = 0; i < n; ++i) {
    T* row = dtable + static_cast<int64_t>(tokens[i]) * dim;
    for (int64_t j = 0; j < dim; ++j) row[j] += dx[i * dim + j];
  }
}

template void embedding_forward<float>(float*, const int32_t*, const float*, int64_t, int64_t, int64_t);
template void embedding_forward<double>(double*, const int32_t*, const double*, int64_t, int64_t, int64_t);
template void embedding_backward<float>(float*, const int32_t*, const float*, int64_t, int64_t);
template void embedding_backward<double>(double*, const int32_t*, const double*, int64_t, int64_t);

}  // namespace ringtrain::model
