// The matrix products of the GPU code through cuBLASLt (CUDA builds only). One Gemm per stream: it owns the cuBLASLt
// handle, a workspace and a cache of matmul descriptors per shape.
//  - The model's linear layers: bf16 operands, fp32 accumulation (CUBLAS_COMPUTE_32F), in the row-major Hugging Face
//    conventions of model/layers.h (weights [out, in]), with the algorithm chosen by timing the heuristic's first six
//    on the shape's first call (RINGTRAIN_GEMM_AUTOTUNE=0: the heuristic's first).
//  - Row-major fp32 strided-batched products in true fp32 (CUBLAS_COMPUTE_32F on fp32 operands: no TF32), with the
//    heuristic's first algorithm: the GPU math attention backend, the GPU reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

namespace ringtrain::cuda {

// An fp32 operand of batched_f32: a row-major matrix with rows `ld` elements apart and batch entries
// `batch_stride` elements apart, used transposed when asked.
struct RowMajorF32 {
  const float* data;
  int64_t ld;
  int64_t batch_stride;
  bool transposed;
};

class Gemm {
 public:
  explicit Gemm(cudaStream_t stream);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y[n, out] = x[n, in] · w[out, in]^T (+ bias[out]) (+ residual[n, out]), each term added when non-null, by the
  // GEMM's epilogue (no pass of its own). residual may be y itself.
  void linear_forward(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                      int64_t n, int64_t in, int64_t out, const __nv_bfloat16* residual = nullptr);
  // The same product with an fp32 result (the LM head's logits).
  void linear_forward_f32(float* y, const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t n, int64_t in,
                          int64_t out);
  // dx[n, in] = (accumulate_dx ? dx : 0) + dy · w   (skipped when dx is null);
  // dw[out, in] = (accumulate_dw ? dw : 0) + dy^T · x in fp32;  db[out] += sum over rows of dy in fp32 (skipped when
  // db is null). dy's rows are dy_ld elements apart (0: out; the LM head's gradient lies in its logits' buffer).
  void linear_backward(__nv_bfloat16* dx, bool accumulate_dx, float* dw, bool accumulate_dw, float* db,
                       const __nv_bfloat16* dy, const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t n, int64_t in,
                       int64_t out, int64_t dy_ld = 0);

  // c[b] = alpha * op(a[b]) · op(b[b]) for b < batch: c[b] is [m, n] with rows ldc elements apart, op(a[b]) is
  // [m, k], op(b[b]) is [k, n]. True fp32 (no TF32).
  void batched_f32(int64_t m, int64_t n, int64_t k, float alpha, RowMajorF32 a, RowMajorF32 b, float* c, int64_t ldc,
                   int64_t c_batch_stride, int64_t batch);

  cudaStream_t stream() const { return stream_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  cudaStream_t stream_;
};

}  // namespace ringtrain::cuda
