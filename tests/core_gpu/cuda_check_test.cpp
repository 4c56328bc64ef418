// core/cuda/check.h: a failing CUDA or cuBLAS call becomes a ringtrain::Error naming the context, the expression, the
// library's message and the source line. Runs without a GPU too: the calls below fail on any machine.
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"
#ifdef RINGTRAIN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/cuda/cublaslt.h"
#endif

namespace ringtrain {
namespace {

#ifdef RINGTRAIN_WITH_CUDA
// The Error of f, or "" when it threw none.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudaCheck, NamesContextExpressionMessageFileAndLine) {
  int line = 0;
  const std::string msg = error_of([&] {
    line = __LINE__ + 1;
    RT_CUDA_CHECK(cudaSetDevice(-1), "selecting device ", -1);
  });
  cudaGetLastError();  // leave no error behind for the next test
  ASSERT_FALSE(msg.empty());
  EXPECT_EQ(msg.rfind("selecting device -1: cudaSetDevice(-1) failed: ", 0), 0u) << msg;
  EXPECT_NE(msg.find("core_gpu/cuda_check_test.cpp:" + std::to_string(line) + ")"), std::string::npos) << msg;
}

TEST(CudaCheck, WithoutContextStartsWithTheExpression) {
  const std::string msg = error_of([] { RT_CUDA_CHECK(cudaSetDevice(-1)); });
  cudaGetLastError();
  EXPECT_EQ(msg.rfind("cudaSetDevice(-1) failed: ", 0), 0u) << msg;
}

TEST(CudaCheck, PassesSuccessThrough) {
  EXPECT_EQ(error_of([] { RT_CUDA_CHECK(cudaSuccess, "never shown"); }), "");
  EXPECT_EQ(error_of([] { RT_CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS, "never shown"); }), "");
}

TEST(CudaCheck, CublasStatusIsNamed) {
  const std::string msg = error_of([] { RT_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE, "a GEMM [", 2, "x", 3, "]"); });
  EXPECT_EQ(msg.rfind("a GEMM [2x3]: CUBLAS_STATUS_INVALID_VALUE failed: ", 0), 0u) << msg;
  // then cuBLAS's own text for the status (from the library loaded at first use) and the source line
  const std::string status_text = cuda::cublaslt().GetStatusString(CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_FALSE(status_text.empty());
  EXPECT_NE(msg.find("failed: " + status_text + " ("), std::string::npos) << msg;
  EXPECT_NE(msg.find("core_gpu/cuda_check_test.cpp:"), std::string::npos) << msg;
}
#endif  // RINGTRAIN_WITH_CUDA

}  // namespace
}  // namespace ringtrain
