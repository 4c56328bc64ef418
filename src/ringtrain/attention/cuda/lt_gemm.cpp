#include "ringtrain/attention/cuda/lt_gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "ringtrain/core/error.h"

namespace ringtrain::attention::cuda {
namespace {

#define RT_LT_CHECK(expr, what)                                                                        \
  do {                                                                                                 \
    cublasStatus_t rt_lt_st_ = (expr);                                                                 \
    if (rt_lt_st_ != CUBLAS_STATUS_SUCCESS)                                                            \
      throw Error(cat("cuBLASLt: ", what, " failed: ", cublasLtGetStatusString(rt_lt_st_), " (", #expr, ")")); \
  } while (0)

// One handle per device, created on first use and kept for the process.
cublasLtHandle_t handle_for_current_device() {
  static std::mutex mu;
  static std::map<int, cublasLtHandle_t> handles;
  int dev = 0;
  cudaGetDevice(&dev);
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(dev);
  if (it != handles.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  RT_LT_CHECK(cublasLtCreate(&h), "creating a handle");
  handles[dev] = h;
  return h;
}

// The largest power of two (<= 16) dividing a byte address/extent: the alignment cuBLASLt may assume.
uint32_t alignment_of(uint64_t value) {
  uint32_t a = 16;
  while (a > 1 && value % a) a /= 2;
  return a;
}

// Owns the descriptors of one call.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void make_layout(cublasLtMatrixLayout_t* l, uint64_t rows, uint64_t cols, int64_t ld, int64_t batch,
                 int64_t batch_stride) {
  RT_LT_CHECK(cublasLtMatrixLayoutCreate(l, CUDA_R_32F, rows, cols, ld), "creating a matrix layout");
  const int32_t count = static_cast<int32_t>(batch);
  RT_LT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
              "setting the batch count");
  RT_LT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                                               sizeof(batch_stride)),
              "setting the batch stride");
}

}  // namespace

void lt_gemm(cudaStream_t stream, int64_t m, int64_t n, int64_t k, float alpha, RowMajor a, RowMajor b, float* c,
             int64_t ldc, int64_t c_batch_stride, int64_t batch, void* workspace, size_t workspace_bytes) {
  RT_CHECK(batch > 0 && batch < (int64_t{1} << 31), "lt_gemm: bad batch count ", batch);
  if (m == 0 || n == 0) return;
  RT_CHECK(k > 0, "lt_gemm: empty inner dimension");
  cublasLtHandle_t h = handle_for_current_device();
  // cuBLASLt is column-major: a row-major C[m,n] is the column-major C^T[n,m] = op(B)^T op(A)^T, so the
  // operands swap places and each keeps its own transpose flag.
  Descs d;
  RT_LT_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "creating the matmul descriptor");
  const cublasOperation_t op_first = b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  RT_LT_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)),
              "setting transa");
  RT_LT_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)),
              "setting transb");
  // First (column-major) operand: B stored row-major [k,n] (or [n,k] transposed) is column-major [n,k] ([k,n]).
  make_layout(&d.a, b.transposed ? k : n, b.transposed ? n : k, b.ld, batch, b.batch_stride);
  make_layout(&d.b, a.transposed ? m : k, a.transposed ? k : m, a.ld, batch, a.batch_stride);
  make_layout(&d.c, n, m, ldc, batch, c_batch_stride);

  auto align = [](const float* p, int64_t ld, int64_t stride) {
    return std::min({alignment_of(reinterpret_cast<uint64_t>(p)), alignment_of(ld * 4), alignment_of(stride * 4)});
  };
  const uint32_t align_first = align(b.data, b.ld, b.batch_stride), align_second = align(a.data, a.ld, a.batch_stride);
  const uint32_t align_c = align(c, ldc, c_batch_stride);
  RT_LT_CHECK(cublasLtMatmulPreferenceCreate(&d.pref), "creating the preference");
  const uint64_t ws = workspace_bytes;
  RT_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
              "setting the workspace size");
  RT_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_first,
                                                   sizeof(align_first)),
              "setting A's alignment");
  RT_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_second,
                                                   sizeof(align_second)),
              "setting B's alignment");
  RT_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                   sizeof(align_c)),
              "setting C's alignment");
  RT_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                                   sizeof(align_c)),
              "setting D's alignment");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  RT_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(h, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result, &found),
              cat("finding an algorithm for [", m, "x", k, "]x[", k, "x", n, "] batch ", batch));
  RT_CHECK(found > 0, "cuBLASLt has no algorithm for the fp32 GEMM [", m, "x", k, "]x[", k, "x", n, "] batch ", batch);
  const float beta = 0.f;
  RT_LT_CHECK(cublasLtMatmul(h, d.op, &alpha, b.data, d.a, a.data, d.b, &beta, c, d.c, c, d.c, &result.algo, workspace,
                             workspace_bytes, stream),
              cat("GEMM [", m, "x", k, "]x[", k, "x", n, "] batch ", batch));
}

}  // namespace ringtrain::attention::cuda
