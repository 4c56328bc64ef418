// From an attention call's tensors to the flash kernels' plain description (flash_kernels.h): shared by the flash
// and efficient backends, whose tensor-core kernels read the same FlashShape / FlashRows / FlashStats.
#pragma once

#include "ringtrain/attention/cuda/flash_kernels.h"
#include "ringtrain/attention/params.h"

namespace ringtrain::attention::cuda {

// `backend` and `name` only name the backend and tensor in errors.
FlashElem flash_elem(const TensorView& t, const char* backend, const char* name);
// Every row start (any batch, row, head) of a BSHD / THD tensor aligned to `bytes`.
bool rows_aligned(const AttnParams& p, const TensorView& t, int64_t bytes);
FlashRows flash_rows(const AttnParams& p, const TensorView& t, const char* backend, const char* name);
FlashStats flash_stats(const AttnParams& p, const TensorView& lse);
FlashShape flash_shape(const AttnParams& p, const TensorView& q, const TensorView& k, const TensorView& cu_q,
                       const TensorView& cu_kv);

}  // namespace ringtrain::attention::cuda
