// Bulk-tensor (TMA) descriptors of the flash kernels' 16-bit [rows, heads, D] tensors, read in 64-column panels
// with the 128-byte swizzle that wgmma's shared-memory descriptors expect (wgmma.cuh).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "ringtrain/attention/cuda/flash_kernels.h"

namespace ringtrain::attention::cuda {

// Coordinates (column, row, head, batch): a box is 64 columns x `box_rows` rows of one head of one batch entry,
// landing in shared memory as `box_rows` swizzled 128-byte rows. `rows` is the row extent of one batch entry (BSHD:
// the sequence length; packed: the total rows, with batches = 1). Reads past `rows` give zeros. Throws an Error
// naming `what` and the shape when the driver refuses the description (alignment, strides).
CUtensorMap panel_map(const FlashRows& t, int64_t rows, int heads, int batches, int head_dim, int box_rows,
                      const char* what);

}  // namespace ringtrain::attention::cuda
