// The checks of CUDA and cuBLAS(Lt) calls for the whole codebase (CUDA builds only). A failing call throws a
// ringtrain::Error naming the context, the failing expression, the library's message and the source line:
//   "GPU allocation of 512 bytes for [2, 64] bf16 cuda:0: cudaMallocAsync(&p, bytes, nullptr) failed: out of memory
//    (core/cuda/cuda_device_ops.cpp:41)"
// RT_CUDA_CHECK(expr, context...) for a cudaError_t, RT_CUDA_CHECK_LAUNCH(context...) for the last kernel launch,
// RT_CUBLAS_CHECK(expr, context...) for a cublasStatus_t (the caller includes core/cuda/cublaslt.h). The context
// parts are concatenated as by ringtrain::cat and may be left out.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "ringtrain/core/error.h"

namespace ringtrain::cuda {

// Throws the Error described above; `library_message` is the library's text for the status.
[[noreturn]] void throw_call_error(const std::string& context, const char* expr, const char* library_message,
                                   const char* file, int line);

// The context parts of a check, concatenated (none: "").
inline std::string check_context() { return {}; }
template <typename... Parts>
std::string check_context(const Parts&... parts) {
  return cat(parts...);
}

}  // namespace ringtrain::cuda

#define RT_CUDA_CHECK(expr, ...)                                                                         \
  do {                                                                                                   \
    const cudaError_t rt_cuda_err_ = (expr);                                                             \
    if (rt_cuda_err_ != cudaSuccess)                                                                     \
      ::ringtrain::cuda::throw_call_error(::ringtrain::cuda::check_context(__VA_ARGS__), #expr,          \
                                          cudaGetErrorString(rt_cuda_err_), __FILE__, __LINE__);         \
  } while (0)

#define RT_CUDA_CHECK_LAUNCH(...) RT_CUDA_CHECK(cudaGetLastError(), "launching ", __VA_ARGS__)

#define RT_CUBLAS_CHECK(expr, ...)                                                                       \
  do {                                                                                                   \
    const cublasStatus_t rt_cublas_status_ = (expr);                                                     \
    if (rt_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                                      \
      ::ringtrain::cuda::throw_call_error(::ringtrain::cuda::check_context(__VA_ARGS__), #expr,          \
                                          ::ringtrain::cuda::cublaslt().GetStatusString(rt_cublas_status_), \
                                          __FILE__, __LINE__);                                           \
  } while (0)
