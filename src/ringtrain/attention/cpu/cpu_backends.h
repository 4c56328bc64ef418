// CPU attention backends: `math` (materialised scores; the reference) and `flash` (tiled online softmax,
// the algorithm of the GPU kernel). Both accept every float dtype, any strides, GQA and packed sequences.
#pragma once

#include <memory>

#include "ringtrain/attention/backend.h"

namespace ringtrain::attention::cpu {

std::unique_ptr<Backend> make_math_backend();
std::unique_ptr<Backend> make_flash_backend();

// The math backend's arithmetic: fp64 (the reference; default) or fp32 accumulation.
// Process-wide, for the reference runs of tests and the attention check.
void set_math_fp64(bool fp64);
bool math_fp64();

}  // namespace ringtrain::attention::cpu
