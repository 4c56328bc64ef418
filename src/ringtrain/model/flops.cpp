#include "ringtrain/model/flops.h"

namespace ringtrain::model {

double matmul_weights(const ModelConfig& c) {
  const double qd = static_cast<double>(c.heads) * c.head_dim, kvd = static_cast<double>(c.kv_heads) * c.head_dim;
  const double per_layer = c.hidden * (qd + 2 * kvd) + qd * c.hidden + 3.0 * c.hidden * c.ffn;
  return c.layers * per_layer + static_cast<double>(c.vocab) * c.hidden;
}

double train_step_flops(const ModelConfig& c, int64_t seq) {
  const double S = static_cast<double>(seq);
  return 6 * matmul_weights(c) * S + 6.0 * c.layers * S * S * (c.heads * c.head_dim);
}

}  // namespace ringtrain::model
