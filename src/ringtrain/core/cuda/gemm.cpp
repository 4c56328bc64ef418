// cuBLASLt is column-major. A row-major M[r, c] is, in the same memory, the column-major M^T[c, r] with leading
// dimension c, so each row-major product is computed on those transposed views:
//   y = x w^T      ->  y^T[out, n]   = op(w^T = [in, out] stored, transposed) · x^T[in, n]
//   dx = dy w      ->  dx^T[in, n]   = w^T[in, out] · dy^T[out, n]
//   dw (+)= dy^T x ->  dw^T[in, out] = x^T[in, n] · op(dy^T[out, n] stored, transposed)
// Operands are bf16, the accumulation fp32 (CUBLAS_COMPUTE_32F runs bf16 tensor cores with fp32 sums), results bf16
// or fp32. The bias of the forward is cuBLASLt's BIAS epilogue and a residual is its C operand (beta = 1): both are
// added in the epilogue, so neither costs a pass of its own over the activations.
#include "ringtrain/core/cuda/gemm.h"


#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ringtrain/core/cuda/bias_grad.cuh"
#include "ringtrain/core/cuda/check.h"
#include "ringtrain/core/cuda/cublaslt.h"
#include "ringtrain/core/error.h"

namespace ringtrain::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Autotuning: how many of the heuristic's algorithms are timed, and the largest scratch result it may allocate for a
// product that adds into its result.
constexpr int kTuneCandidates = 6;
constexpr size_t kTuneScratchBytes = size_t{256} << 20;

enum class Product { Forward, ForwardF32, DataGrad, WeightGrad };

// A matrix as cuBLASLt sees it: column-major rows x cols with leading dimension ld (elements).
struct ColMajor {
  uint64_t rows, cols;
  int64_t ld;
};

// A packed column-major matrix: the leading dimension is the row count.
ColMajor col_major(int64_t rows, int64_t cols) {
  return {static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), rows};
}

// One product: D = op(A) · op(B) with D's element type.
struct Spec {
  cublasOperation_t trans_a, trans_b;
  ColMajor a, b, d;
  cudaDataType_t d_type;
};

// What a plan depends on: the shape, dy's row pitch (the gradient products), the epilogue, whether the product adds
// into its result (beta = 1 selects other kernels, tuned apart) and the operands' alignments (which algorithms may
// run).
struct PlanKey {
  Product product;
  int64_t n, in, out, dy_ld;
  bool bias, adds;
  uint32_t align_a, align_b, align_d, align_c;
  auto operator<=>(const PlanKey&) const = default;
};

std::string describe(const PlanKey& k) {
  switch (k.product) {
    case Product::Forward:
      return cat("y[", k.n, ", ", k.out, "] bf16 = x[", k.n, ", ", k.in, "] · w[", k.out, ", ", k.in, "]^T",
                 k.bias ? " + bias" : "", k.align_c ? " + residual" : "");
    case Product::ForwardF32:
      return cat("y[", k.n, ", ", k.out, "] fp32 = x[", k.n, ", ", k.in, "] · w[", k.out, ", ", k.in, "]^T");
    case Product::DataGrad:
      return cat("dx[", k.n, ", ", k.in, "] bf16 ", k.adds ? "+" : "", "= dy[", k.n, ", ", k.out, "] · w[", k.out,
                 ", ", k.in, "]", k.dy_ld != k.out ? cat(" (dy row pitch ", k.dy_ld, ")") : "");
    case Product::WeightGrad:
      return cat("dw[", k.out, ", ", k.in, "] fp32 ", k.adds ? "+" : "", "= dy[", k.n, ", ", k.out, "]^T · x[", k.n,
                 ", ", k.in, "]", k.dy_ld != k.out ? cat(" (dy row pitch ", k.dy_ld, ")") : "");
  }
  return "an unknown product";
}

// The largest power of two up to 16 dividing both the address and the row pitch in bytes.
uint32_t alignment_of(const void* p, int64_t ld, size_t elem_bytes) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(p) | (static_cast<uint64_t>(ld) * elem_bytes);
  uint32_t a = 16;
  while (a > 1 && bits % a) a /= 2;
  return a;
}

// The descriptors and the chosen algorithm of one PlanKey; the heuristic's candidates until the first call has
// timed them.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::vector<cublasLtMatmulAlgo_t> candidates;
  size_t a_bytes = 0, b_bytes = 0, d_bytes = 0;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (d) cublaslt().MatrixLayoutDestroy(d);
    if (b) cublaslt().MatrixLayoutDestroy(b);
    if (a) cublaslt().MatrixLayoutDestroy(a);
    if (op) cublaslt().MatmulDescDestroy(op);
  }
};

// What a plan of batched_f32 depends on: the shape, the operands' transposes, row pitches, batch strides and
// alignments.
struct BatchedKey {
  int64_t m, n, k, batch;
  bool trans_a, trans_b;
  int64_t lda, ldb, ldc, stride_a, stride_b, stride_c;
  uint32_t align_a, align_b, align_c;
  auto operator<=>(const BatchedKey&) const = default;
};

std::string describe(const BatchedKey& k) {
  return cat("fp32 [", k.m, "x", k.k, "]x[", k.k, "x", k.n, "] batch ", k.batch);
}

struct Preference {
  cublasLtMatmulPreference_t pref = nullptr;
  ~Preference() {
    if (pref) cublaslt().MatmulPreferenceDestroy(pref);
  }
};

void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const auto& value,
              const PlanKey& key) {
  RT_CUBLAS_CHECK(cublaslt().MatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)), describe(key));
}

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  void* aligned_bias = nullptr;  // a 16-byte aligned copy of a bias the epilogue could not read in place
  bool autotune = true;          // RINGTRAIN_GEMM_AUTOTUNE=0 keeps the heuristic's first choice (reproducible bits)
  int64_t aligned_bias_capacity = 0;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
  std::map<BatchedKey, std::unique_ptr<Plan>> batched_plans;

  ~Impl() {
    plans.clear();
    batched_plans.clear();
    if (handle) cublaslt().Destroy(handle);
    if (workspace) cudaFree(workspace);
    if (aligned_bias) cudaFree(aligned_bias);
  }

  Plan& plan(const PlanKey& key, const Spec& s) {
    auto it = plans.find(key);
    if (it != plans.end()) return *it->second;
    auto p = std::make_unique<Plan>();
    RT_CUBLAS_CHECK(cublaslt().MatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), describe(key));
    RT_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &s.trans_a, sizeof(s.trans_a)),
                describe(key));
    RT_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &s.trans_b, sizeof(s.trans_b)),
                describe(key));
    if (key.bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      const cudaDataType_t bias_type = CUDA_R_16BF;
      RT_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
                  describe(key));
      RT_CUBLAS_CHECK(
          cublaslt().MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)),
          describe(key));
    }
    RT_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&p->a, CUDA_R_16BF, s.a.rows, s.a.cols, s.a.ld), describe(key));
    RT_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&p->b, CUDA_R_16BF, s.b.rows, s.b.cols, s.b.ld), describe(key));
    RT_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&p->d, s.d_type, s.d.rows, s.d.cols, s.d.ld), describe(key));

    Preference pr;
    RT_CUBLAS_CHECK(cublaslt().MatmulPreferenceCreate(&pr.pref), describe(key));
    set_pref(pr.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{kWorkspaceBytes}, key);
    set_pref(pr.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a, key);
    set_pref(pr.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b, key);
    set_pref(pr.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c ? key.align_c : key.align_d, key);
    set_pref(pr.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d, key);
    cublasLtMatmulHeuristicResult_t results[kTuneCandidates] = {};
    int found = 0;
    RT_CUBLAS_CHECK(cublaslt().MatmulAlgoGetHeuristic(handle, p->op, p->a, p->b, p->d, p->d, pr.pref,
                                               autotune ? kTuneCandidates : 1, results, &found),
                describe(key));
    RT_CHECK(found > 0, "cuBLASLt has no algorithm for ", describe(key), " (alignments A ", key.align_a, " B ",
             key.align_b, " D ", key.align_d, " bytes)");
    p->algo = results[0].algo;
    for (int i = 1; i < found; ++i) p->candidates.push_back(results[i].algo);
    if (!p->candidates.empty()) p->candidates.insert(p->candidates.begin(), results[0].algo);
    p->a_bytes = static_cast<size_t>(s.a.ld) * s.a.cols * sizeof(bf16);
    p->b_bytes = static_cast<size_t>(s.b.ld) * s.b.cols * sizeof(bf16);
    p->d_bytes = static_cast<size_t>(s.d.ld) * s.d.cols * (s.d_type == CUDA_R_32F ? 4 : 2);
    return *plans.emplace(key, std::move(p)).first->second;
  }

  // cuBLASLt is column-major: a row-major C[m, n] is the column-major C^T[n, m] = op(B)^T op(A)^T, so the operands
  // swap places and each keeps its own transpose flag. fp32 operands with CUBLAS_COMPUTE_32F: true fp32, no TF32.
  Plan& batched_plan(const BatchedKey& key) {
    auto it = batched_plans.find(key);
    if (it != batched_plans.end()) return *it->second;
    auto p = std::make_unique<Plan>();
    RT_CUBLAS_CHECK(cublaslt().MatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), describe(key));
    const cublasOperation_t op_first = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_second = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    RT_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)),
                    describe(key));
    RT_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)),
                    describe(key));
    const auto layout = [&](cublasLtMatrixLayout_t* l, int64_t rows, int64_t cols, int64_t ld, int64_t stride) {
      RT_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(l, CUDA_R_32F, static_cast<uint64_t>(rows),
                                                 static_cast<uint64_t>(cols), ld),
                      describe(key));
      const int32_t count = static_cast<int32_t>(key.batch);
      RT_CUBLAS_CHECK(cublaslt().MatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
                      describe(key));
      RT_CUBLAS_CHECK(
          cublaslt().MatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
          describe(key));
    };
    // The first (column-major) operand: B stored row-major [k, n] (or [n, k] transposed) is column-major [n, k]
    // ([k, n]).
    layout(&p->a, key.trans_b ? key.k : key.n, key.trans_b ? key.n : key.k, key.ldb, key.stride_b);
    layout(&p->b, key.trans_a ? key.m : key.k, key.trans_a ? key.k : key.m, key.lda, key.stride_a);
    layout(&p->d, key.n, key.m, key.ldc, key.stride_c);
    Preference pr;
    RT_CUBLAS_CHECK(cublaslt().MatmulPreferenceCreate(&pr.pref), describe(key));
    const auto set = [&](cublasLtMatmulPreferenceAttributes_t attr, const auto& value) {
      RT_CUBLAS_CHECK(cublaslt().MatmulPreferenceSetAttribute(pr.pref, attr, &value, sizeof(value)), describe(key));
    };
    set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{kWorkspaceBytes});
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    RT_CUBLAS_CHECK(cublaslt().MatmulAlgoGetHeuristic(handle, p->op, p->a, p->b, p->d, p->d, pr.pref, 1, &result, &found),
                    describe(key));
    RT_CHECK(found > 0, "cuBLASLt has no algorithm for the ", describe(key));
    p->algo = result.algo;
    return *batched_plans.emplace(key, std::move(p)).first->second;
  }

  // Chooses among the plan's candidates by timing each on this call's operands (once to warm up, three times timed)
  // and keeps the fastest; a candidate that fails is skipped. A call that overwrites its result (beta = 0) lets them
  // write the real result, which the call itself then overwrites. An adding call gives them a scratch result of at
  // most kTuneScratchBytes; one whose result is larger (the LM head's fp32 dW, added per chunk) is timed on its own
  // result with its smaller operand replaced by zeros, which leaves the result as it is (D = 0 + 1 * D). Scratch
  // that cannot be had now defers the choice to a later call; it never costs more memory than kTuneScratchBytes.
  // The timing waits for the stream, once per plan.
  void tune(cudaStream_t stream, const PlanKey& key, Plan& p, const void* a, const void* b, void* d, float beta,
            const void* c) {
    const bool in_place = beta == 0.f;
    const bool zero_operand = !in_place && p.d_bytes > kTuneScratchBytes;
    if (zero_operand && (beta != 1.f || (c && c != d) || std::min(p.a_bytes, p.b_bytes) > kTuneScratchBytes)) return;
    void* target = d;
    void* scratch = nullptr;
    if (!in_place) {
      const size_t bytes = zero_operand ? std::min(p.a_bytes, p.b_bytes) : p.d_bytes;
      if (cudaMallocAsync(&scratch, bytes, stream) != cudaSuccess) {
        cudaGetLastError();  // no room now: try again on a later call
        return;
      }
      if (zero_operand) {
        RT_CUDA_CHECK(cudaMemsetAsync(scratch, 0, bytes, stream), "autotuning ", describe(key));
        (p.a_bytes <= p.b_bytes ? a : b) = scratch;
      } else {
        target = scratch;
      }
    }
    const std::vector<cublasLtMatmulAlgo_t> candidates = std::move(p.candidates);
    p.candidates.clear();
    cudaEvent_t start = nullptr, stop = nullptr;
    RT_CUDA_CHECK(cudaEventCreate(&start), "autotuning ", describe(key));
    RT_CUDA_CHECK(cudaEventCreate(&stop), "autotuning ", describe(key));
    const float alpha = 1.f;
    float best = 0.f;
    for (const cublasLtMatmulAlgo_t& algo : candidates) {
      const auto once = [&] {
        return cublaslt().Matmul(handle, p.op, &alpha, a, p.a, b, p.b, &beta, target, p.d, target, p.d, &algo, workspace,
                              kWorkspaceBytes, stream);
      };
      if (once() != CUBLAS_STATUS_SUCCESS) continue;
      RT_CUDA_CHECK(cudaEventRecord(start, stream), "autotuning ", describe(key));
      bool ok = true;
      for (int i = 0; i < 3 && ok; ++i) ok = once() == CUBLAS_STATUS_SUCCESS;
      RT_CUDA_CHECK(cudaEventRecord(stop, stream), "autotuning ", describe(key));
      RT_CUDA_CHECK(cudaEventSynchronize(stop), "autotuning ", describe(key));
      float ms = 0.f;
      RT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop), "autotuning ", describe(key));
      if (ok && (best == 0.f || ms < best)) best = ms, p.algo = algo;
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    if (scratch) RT_CUDA_CHECK(cudaFreeAsync(scratch, stream), "the autotuning scratch of ", describe(key));
  }

  // D = op(A) · op(B) + beta * C on the stream; C is D's layout and defaults to D.
  void run(cudaStream_t stream, const PlanKey& key, const Spec& s, const void* a, const void* b, void* d, float beta,
           const bf16* bias, const void* c = nullptr) {
    Plan& p = plan(key, s);
    if (bias)
      RT_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
                  describe(key));
    if (!p.candidates.empty()) tune(stream, key, p, a, b, d, beta, c);
    const float alpha = 1.f;
    RT_CUBLAS_CHECK(cublaslt().Matmul(handle, p.op, &alpha, a, p.a, b, p.b, &beta, c ? c : d, p.d, d, p.d, &p.algo, workspace,
                               kWorkspaceBytes, stream),
                describe(key));
  }

  // The epilogue reads the bias with vector loads: one not 16-byte aligned (e.g. an odd offset in a flat parameter
  // buffer) is first copied, on the stream, into an aligned buffer.
  const bf16* epilogue_bias(cudaStream_t stream, const bf16* bias, int64_t out) {
    if (!bias || reinterpret_cast<uintptr_t>(bias) % 16 == 0) return bias;
    if (aligned_bias_capacity < out) {
      // The old buffer may still be read by queued GEMMs.
      RT_CUDA_CHECK(cudaStreamSynchronize(stream), "growing the aligned bias buffer to ", out);
      if (aligned_bias) RT_CUDA_CHECK(cudaFree(aligned_bias), "growing the aligned bias buffer to ", out);
      aligned_bias = nullptr, aligned_bias_capacity = 0;
      RT_CUDA_CHECK(cudaMalloc(&aligned_bias, static_cast<size_t>(out) * sizeof(bf16)),
                         "the aligned bias buffer of ", out, " values");
      aligned_bias_capacity = out;
    }
    RT_CUDA_CHECK(
        cudaMemcpyAsync(aligned_bias, bias, static_cast<size_t>(out) * sizeof(bf16), cudaMemcpyDeviceToDevice, stream),
        "copying a bias of ", out, " values");
    return static_cast<const bf16*>(aligned_bias);
  }
};

Gemm::Gemm(cudaStream_t stream) : impl_(std::make_unique<Impl>()), stream_(stream) {
  const char* tune = std::getenv("RINGTRAIN_GEMM_AUTOTUNE");
  impl_->autotune = !(tune && std::string_view(tune) == "0");
  RT_CUBLAS_CHECK(cublaslt().Create(&impl_->handle), "a new Gemm");
  RT_CUDA_CHECK(cudaMalloc(&impl_->workspace, kWorkspaceBytes), "the ", kWorkspaceBytes, "-byte GEMM workspace");
}

Gemm::~Gemm() {
  cudaStreamSynchronize(stream_);  // queued GEMMs may still use the workspace
}

void Gemm::linear_forward(bf16* y, const bf16* x, const bf16* w, const bf16* bias, int64_t n, int64_t in, int64_t out,
                          const bf16* residual) {
  if (n == 0 || out == 0) return;
  RT_CHECK(in > 0, "linear_forward: empty inner dimension (n=", n, " in=", in, " out=", out, ")");
  const PlanKey key{Product::Forward,
                    n,
                    in,
                    out,
                    0,
                    bias != nullptr,
                    residual != nullptr,
                    alignment_of(w, in, 2),
                    alignment_of(x, in, 2),
                    alignment_of(y, out, 2),
                    residual ? alignment_of(residual, out, 2) : 0u};
  const Spec s{CUBLAS_OP_T, CUBLAS_OP_N, col_major(in, out), col_major(in, n), col_major(out, n), CUDA_R_16BF};
  impl_->run(stream_, key, s, w, x, y, residual ? 1.f : 0.f, impl_->epilogue_bias(stream_, bias, out), residual);
}

void Gemm::linear_forward_f32(float* y, const bf16* x, const bf16* w, int64_t n, int64_t in, int64_t out) {
  if (n == 0 || out == 0) return;
  RT_CHECK(in > 0, "linear_forward_f32: empty inner dimension (n=", n, " in=", in, " out=", out, ")");
  const PlanKey key{Product::ForwardF32, n, in, out, 0, false, false,
                    alignment_of(w, in, 2), alignment_of(x, in, 2), alignment_of(y, out, 4)};
  const Spec s{CUBLAS_OP_T, CUBLAS_OP_N, col_major(in, out), col_major(in, n), col_major(out, n), CUDA_R_32F};
  impl_->run(stream_, key, s, w, x, y, 0.f, nullptr);
}

void Gemm::linear_backward(bf16* dx, bool accumulate_dx, float* dw, bool accumulate_dw, float* db, const bf16* dy,
                           const bf16* x, const bf16* w, int64_t n, int64_t in, int64_t out, int64_t dy_ld) {
  RT_CHECK(dw != nullptr, "linear_backward: dw is required (n=", n, " in=", in, " out=", out, ")");
  if (dy_ld == 0) dy_ld = out;
  RT_CHECK(dy_ld >= out, "linear_backward: dy's row pitch ", dy_ld, " is shorter than its ", out, " columns");
  RT_CHECK(!db || dy_ld == out, "linear_backward: a bias gradient needs dy packed (row pitch ", dy_ld, ", ", out,
           " columns)");
  if (in == 0 || out == 0) return;
  if (n == 0) {  // no rows: nothing to add, and an overwritten dw is zero
    if (!accumulate_dw)
      RT_CUDA_CHECK(cudaMemsetAsync(dw, 0, static_cast<size_t>(in * out) * sizeof(float), stream_),
                         "clearing dw[", out, ", ", in, "]");
    return;
  }
  if (dx) {
    const PlanKey key{Product::DataGrad, n, in, out, dy_ld, false, accumulate_dx,
                      alignment_of(w, in, 2), alignment_of(dy, dy_ld, 2), alignment_of(dx, in, 2)};
    const Spec s{CUBLAS_OP_N, CUBLAS_OP_N, col_major(in, out), {uint64_t(out), uint64_t(n), dy_ld}, col_major(in, n),
                 CUDA_R_16BF};
    impl_->run(stream_, key, s, w, dy, dx, accumulate_dx ? 1.f : 0.f, nullptr);
  }
  const PlanKey key{Product::WeightGrad, n, in, out, dy_ld, false, accumulate_dw,
                    alignment_of(x, in, 2), alignment_of(dy, dy_ld, 2), alignment_of(dw, in, 4)};
  const Spec s{CUBLAS_OP_N, CUBLAS_OP_T, col_major(in, n), {uint64_t(out), uint64_t(n), dy_ld}, col_major(in, out),
               CUDA_R_32F};
  impl_->run(stream_, key, s, x, dy, dw, accumulate_dw ? 1.f : 0.f, nullptr);
  if (db) bias_grad_add(stream_, db, dy, n, out);
}

void Gemm::batched_f32(int64_t m, int64_t n, int64_t k, float alpha, RowMajorF32 a, RowMajorF32 b, float* c,
                       int64_t ldc, int64_t c_batch_stride, int64_t batch) {
  RT_CHECK(batch > 0 && batch < (int64_t{1} << 31), "batched_f32: bad batch count ", batch);
  if (m == 0 || n == 0) return;
  RT_CHECK(k > 0, "batched_f32: empty inner dimension");
  // The alignment cuBLASLt may assume: of the address, the row pitch and the batch stride.
  const auto align = [](const void* p, int64_t ld, int64_t stride) {
    return std::min(alignment_of(p, ld, sizeof(float)), alignment_of(p, stride, sizeof(float)));
  };
  const BatchedKey key{.m = m,
                       .n = n,
                       .k = k,
                       .batch = batch,
                       .trans_a = a.transposed,
                       .trans_b = b.transposed,
                       .lda = a.ld,
                       .ldb = b.ld,
                       .ldc = ldc,
                       .stride_a = a.batch_stride,
                       .stride_b = b.batch_stride,
                       .stride_c = c_batch_stride,
                       .align_a = align(a.data, a.ld, a.batch_stride),
                       .align_b = align(b.data, b.ld, b.batch_stride),
                       .align_c = align(c, ldc, c_batch_stride)};
  Plan& p = impl_->batched_plan(key);
  const float beta = 0.f;
  RT_CUBLAS_CHECK(cublaslt().Matmul(impl_->handle, p.op, &alpha, b.data, p.a, a.data, p.b, &beta, c, p.d, c, p.d, &p.algo,
                                 impl_->workspace, kWorkspaceBytes, stream_),
                  describe(key));
}

}  // namespace ringtrain::cuda
