// cuBLASLt, loaded at its first use (dlopen), not at start: the library is over 500 MB, and mapping it costs a
// process ~0.75 s, which a CPU-only run or a GPU test that skips should not pay. Functions keep their cuBLASLt names
// less the prefix: cublaslt().Matmul(...) is cublasLtMatmul(...).
#pragma once

#include <cublasLt.h>

namespace ringtrain::cuda {

struct CublasLt {
  decltype(&::cublasLtCreate) Create;
  decltype(&::cublasLtDestroy) Destroy;
  decltype(&::cublasLtGetStatusString) GetStatusString;
  decltype(&::cublasLtMatmul) Matmul;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
  decltype(&::cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute;
};

// The library's functions, loaded once (thread-safe): first by its soname (LD_LIBRARY_PATH, the system's paths), then
// from the CUDA toolkit this build was configured with. Throws an Error naming both tries when neither loads.
const CublasLt& cublaslt();

}  // namespace ringtrain::cuda
