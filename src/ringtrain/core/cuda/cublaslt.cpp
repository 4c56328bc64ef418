#include "ringtrain/core/cuda/cublaslt.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>

#include "ringtrain/core/error.h"

namespace ringtrain::cuda {
namespace {

// Set by CMake from the toolkit it found: the soname (libcublasLt.so.<major>) and the folder holding it.
constexpr const char* kSoname = RINGTRAIN_CUBLASLT_SONAME;
constexpr const char* kToolkitLibDir = RINGTRAIN_CUDA_LIBRARY_DIR;

std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown error";
}

CublasLt load() {
  void* lib = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  std::string tried;
  if (!lib) {
    tried = cat("dlopen(", kSoname, "): ", dl_error());
    const std::string path = cat(kToolkitLibDir, "/", kSoname);
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) tried += cat("; dlopen(", path, "): ", dl_error());
  }
  RT_CHECK(lib, "cuBLASLt could not be loaded (", tried, "); put the CUDA toolkit's lib folder on LD_LIBRARY_PATH");
  // The handle stays open for the process's life: every Gemm holds functions from it.
  const auto symbol = [&](auto& fn, const char* name) {
    dlerror();
    void* p = dlsym(lib, name);
    RT_CHECK(p, "cuBLASLt (", kSoname, ") has no ", name, ": ", dl_error());
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  CublasLt api{};
  symbol(api.Create, "cublasLtCreate");
  symbol(api.Destroy, "cublasLtDestroy");
  symbol(api.GetStatusString, "cublasLtGetStatusString");
  symbol(api.Matmul, "cublasLtMatmul");
  symbol(api.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  symbol(api.MatmulDescCreate, "cublasLtMatmulDescCreate");
  symbol(api.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
  symbol(api.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  symbol(api.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  symbol(api.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  symbol(api.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  symbol(api.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  symbol(api.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
  symbol(api.MatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute");
  return api;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt api = load();  // a throw leaves it unset: the next call tries again
  return api;
}

}  // namespace ringtrain::cuda
