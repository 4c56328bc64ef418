#include "ringtrain/attention/cuda/tma_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "ringtrain/core/error.h"

namespace ringtrain::attention::cuda {
namespace {

// The driver's encoder, found through the runtime so that nothing links libcuda directly.
PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
    RT_CHECK(e == cudaSuccess && found == cudaDriverEntryPointSuccess && p != nullptr,
             "flash (cuda): the driver offers no cuTensorMapEncodeTiled (", cudaGetErrorString(e),
             "); the Hopper kernels need a CUDA 12+ driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

CUtensorMap panel_map(const FlashRows& t, int64_t rows, int heads, int batches, int head_dim, int box_rows,
                      const char* what) {
  RT_CHECK(t.elem != FlashElem::F32, "flash (cuda): '", what, "' must be 16-bit for a tensor map");
  RT_CHECK(rows < (int64_t(1) << 31), "flash (cuda): '", what, "' has ", rows,
           " rows; the kernels' tensor-map coordinates are 32-bit (needs < 2^31)");
  constexpr uint64_t kElem = 2;
  // A size-1 dimension's stride is never stepped; any valid stride (a multiple of 16 bytes) describes it.
  const int64_t batch_stride = batches > 1 ? t.batch_stride : t.head_stride;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(rows > 0 ? rows : 1),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batches)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(t.row_stride) * kElem,
                                 static_cast<cuuint64_t>(t.head_stride) * kElem,
                                 static_cast<cuuint64_t>(batch_stride) * kElem};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult r = encoder()(&map, t.elem == FlashElem::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                               : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                               4, t.ptr, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  RT_CHECK(r == CUDA_SUCCESS, "flash (cuda): the driver refused a tensor map for '", what, "' (CUresult ",
           static_cast<int>(r), ") of D=", head_dim, " rows=", rows, " heads=", heads, " batches=", batches,
           " strides (row, head, batch) = (", t.row_stride, ", ", t.head_stride, ", ", t.batch_stride,
           ") elements at ", t.ptr);
  return map;
}

}  // namespace ringtrain::attention::cuda
