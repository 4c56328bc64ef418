// GPU `math` backend: the GPU reference. Per sequence and per chunk of query heads it gathers Q, K, V into
// dense fp32 scratch (GQA: each query head gets its kv head), materialises the scores S = scale Q K^T with
// cuBLASLt in true fp32, adds the bias (if any), takes an exact row softmax (fp32, masked entries 0) and
// O = P V. The backward recomputes P from the given (final) LSE and follows the textbook formulas; dK/dV of a
// kv head are summed over its query heads in fp32 before they are written. Slow and memory-hungry by design: it
// exists to check the fast backends on the GPU, at lengths where the CPU reference is too slow.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>

#include "ringtrain/attention/cuda/cuda_backends.h"
#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/attention/cuda/math_kernels.h"
#include "ringtrain/attention/layout.h"
#include "ringtrain/core/cuda/gemm.h"
#include "ringtrain/core/device_info.h"

namespace ringtrain::attention {
namespace {

using cuda::LseRef;
using RowMajor = ringtrain::cuda::RowMajorF32;

// One head's scores; the backward keeps P and dP in fp32, 8 bytes per score (32768 x 32768 -> 8 GiB).
constexpr int64_t kMaxScoresPerHead = int64_t{1} << 30;
// Scratch per call: heads are processed in chunks that fit (at least one head).
constexpr int64_t kScratchBudgetBytes = int64_t{12} << 30;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The products' Gemm of (device, stream, calling thread), made on the first call there and kept for the process: it
// owns a cuBLASLt handle, a workspace and the plans of the shapes seen, and is not shared between threads (its plan
// cache is not synchronised). Never destroyed: a Gemm waits for its stream when it dies, and at exit the stream may
// be gone.
ringtrain::cuda::Gemm& gemm_for(int device, cudaStream_t stream) {
  using Key = std::tuple<int, cudaStream_t, std::thread::id>;
  static std::mutex mu;
  static auto* gemms = new std::map<Key, std::unique_ptr<ringtrain::cuda::Gemm>>;
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<ringtrain::cuda::Gemm>& g = (*gemms)[Key{device, stream, std::this_thread::get_id()}];
  if (!g) g = std::make_unique<ringtrain::cuda::Gemm>(stream);
  return *g;
}

// Carves 256-byte aligned fp32 arrays out of one scratch allocation.
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  float* take(int64_t floats) {
    float* p = reinterpret_cast<float*>(base_ + used_);
    used_ += round_up(floats * 4, 256);
    return p;
  }
  static int64_t bytes(std::initializer_list<int64_t> floats) {
    int64_t b = 0;
    for (int64_t f : floats) b += round_up(f * 4, 256);
    return b;
  }

 private:
  char* base_;
  int64_t used_ = 0;
};

LseRef lse_ref(const AttnParams& p, const TensorView& lse, int64_t batch) {
  const TensorView v = lse_view(p, lse, batch);
  return {static_cast<float*>(v.data), v.stride[0], v.stride[1]};
}

int64_t heads_per_chunk(const AttnParams& p, int64_t per_head_bytes, int64_t fixed_bytes) {
  const int64_t fit = (kScratchBudgetBytes - fixed_bytes) / std::max<int64_t>(per_head_bytes, 1);
  return std::clamp<int64_t>(fit, 1, p.heads_q);
}

void forward_segment(const AttnParams& p, const AttnForwardArgs& a, const Segment& seg, cudaStream_t st) {
  const int64_t d = p.head_dim, group = p.heads_q / p.heads_kv, sq = seg.sq, skv = seg.skv;
  if (sq == 0) return;
  const int64_t ld = round_up(std::max<int64_t>(skv, 1), 4);
  const int64_t hc = heads_per_chunk(p, Carver::bytes({sq * ld, sq * d, skv * d, skv * d, sq * d}), 0);
  cuda::StreamScratch scratch(Carver::bytes({hc * sq * ld, hc * sq * d, hc * skv * d, hc * skv * d, hc * sq * d}), st,
                              "the GPU math forward");
  Carver carve(scratch.bytes());
  float* s = carve.take(hc * sq * ld);
  float* q = carve.take(hc * sq * d);
  float* k = carve.take(hc * skv * d);
  float* v = carve.take(hc * skv * d);
  float* o = carve.take(hc * sq * d);
  ringtrain::cuda::Gemm& gemm = gemm_for(p.device.index, st);

  const cuda::Strided qs = cuda::strided(rows_view(p, a.q, seg.batch));
  const cuda::Strided ks = cuda::strided(rows_view(p, a.k, seg.batch));
  const cuda::Strided vs = cuda::strided(rows_view(p, a.v, seg.batch));
  const cuda::Strided os = cuda::strided(rows_view(p, a.o, seg.batch));
  const LseRef lse = lse_ref(p, a.lse, seg.batch);
  const TensorView bias = p.has_bias ? bias_broadcast_view(a.bias) : TensorView{};
  for (int64_t h0 = 0; h0 < p.heads_q; h0 += hc) {
    const int64_t n = std::min(hc, p.heads_q - h0);
    cuda::gather_fp32(st, qs, seg.q_start, sq, h0, n, 1, d, q);
    cuda::gather_fp32(st, ks, seg.k_start, skv, h0, n, group, d, k);
    cuda::gather_fp32(st, vs, seg.k_start, skv, h0, n, group, d, v);
    if (skv > 0)
      gemm.batched_f32(sq, skv, d, p.scale(), RowMajor{q, d, sq * d, false}, RowMajor{k, d, skv * d, true}, s, ld,
                       sq * ld, n);
    if (p.has_bias) cuda::add_bias(st, s, n, sq, skv, ld, bias, seg.batch, h0);
    cuda::softmax_rows(st, s, n, sq, skv, ld, p.mask, p.window, lse, h0, seg.q_start);
    if (skv > 0)
      gemm.batched_f32(sq, d, skv, 1.f, RowMajor{s, ld, sq * ld, false}, RowMajor{v, d, skv * d, false}, o, d, sq * d,
                       n);
    else
      RT_CUDA_CHECK(cudaMemsetAsync(o, 0, n * sq * d * 4, st), "clearing O");
    cuda::scatter_fp32(st, o, seg.q_start, sq, h0, n, d, os, false);
  }
}

void backward_segment(const AttnParams& p, const AttnBackwardArgs& a, const Segment& seg, cudaStream_t st) {
  const int64_t d = p.head_dim, group = p.heads_q / p.heads_kv, sq = seg.sq, skv = seg.skv;
  const int64_t ld = round_up(std::max<int64_t>(skv, 1), 4);
  const int64_t fixed = Carver::bytes({p.heads_kv * skv * d, p.heads_kv * skv * d});
  const int64_t hc = heads_per_chunk(
      p, Carver::bytes({sq * ld, sq * ld, sq * d, sq * d, sq * d, sq * d, skv * d, skv * d, skv * d, skv * d}), fixed);
  cuda::StreamScratch scratch(
      Carver::bytes({hc * sq * ld, hc * sq * ld, hc * sq * d, hc * sq * d, hc * sq * d, hc * sq * d, hc * skv * d,
                     hc * skv * d, hc * skv * d, hc * skv * d}) +
          fixed,
      st, "the GPU math backward");
  Carver carve(scratch.bytes());
  float* s = carve.take(hc * sq * ld);
  float* dp = carve.take(hc * sq * ld);
  float* q = carve.take(hc * sq * d);
  float* o = carve.take(hc * sq * d);
  float* dout = carve.take(hc * sq * d);
  float* dq = carve.take(hc * sq * d);
  float* k = carve.take(hc * skv * d);
  float* v = carve.take(hc * skv * d);
  float* dk = carve.take(hc * skv * d);
  float* dv = carve.take(hc * skv * d);
  float* dk_acc = carve.take(p.heads_kv * skv * d);
  float* dv_acc = carve.take(p.heads_kv * skv * d);
  ringtrain::cuda::Gemm& gemm = gemm_for(p.device.index, st);
  RT_CUDA_CHECK(cudaMemsetAsync(dk_acc, 0, p.heads_kv * skv * d * 4, st), "clearing dK");
  RT_CUDA_CHECK(cudaMemsetAsync(dv_acc, 0, p.heads_kv * skv * d * 4, st), "clearing dV");

  const cuda::Strided qs = cuda::strided(rows_view(p, a.q, seg.batch));
  const cuda::Strided ks = cuda::strided(rows_view(p, a.k, seg.batch));
  const cuda::Strided vs = cuda::strided(rows_view(p, a.v, seg.batch));
  const cuda::Strided os = cuda::strided(rows_view(p, a.o, seg.batch));
  const cuda::Strided dos = cuda::strided(rows_view(p, a.dout, seg.batch));
  const LseRef lse = lse_ref(p, a.lse, seg.batch);
  const TensorView bias = p.has_bias ? bias_broadcast_view(a.bias) : TensorView{};
  const float scale = p.scale();
  for (int64_t h0 = 0; h0 < p.heads_q; h0 += hc) {
    const int64_t n = std::min(hc, p.heads_q - h0);
    cuda::gather_fp32(st, qs, seg.q_start, sq, h0, n, 1, d, q);
    cuda::gather_fp32(st, os, seg.q_start, sq, h0, n, 1, d, o);
    cuda::gather_fp32(st, dos, seg.q_start, sq, h0, n, 1, d, dout);
    cuda::gather_fp32(st, ks, seg.k_start, skv, h0, n, group, d, k);
    cuda::gather_fp32(st, vs, seg.k_start, skv, h0, n, group, d, v);
    if (sq > 0 && skv > 0) {
      gemm.batched_f32(sq, skv, d, scale, RowMajor{q, d, sq * d, false}, RowMajor{k, d, skv * d, true}, s, ld,
                       sq * ld, n);
      gemm.batched_f32(sq, skv, d, 1.f, RowMajor{dout, d, sq * d, false}, RowMajor{v, d, skv * d, true}, dp, ld,
                       sq * ld, n);
      if (p.has_bias) cuda::add_bias(st, s, n, sq, skv, ld, bias, seg.batch, h0);
      cuda::backward_rows(st, s, dp, o, dout, n, sq, skv, ld, d, p.mask, p.window, lse, h0, seg.q_start);
      // dV = P^T dO, dQ = scale dS K, dK = scale dS^T Q (dS is in dp now, P in s).
      gemm.batched_f32(skv, d, sq, 1.f, RowMajor{s, ld, sq * ld, true}, RowMajor{dout, d, sq * d, false}, dv, d,
                       skv * d, n);
      gemm.batched_f32(sq, d, skv, scale, RowMajor{dp, ld, sq * ld, false}, RowMajor{k, d, skv * d, false}, dq, d,
                       sq * d, n);
      gemm.batched_f32(skv, d, sq, scale, RowMajor{dp, ld, sq * ld, true}, RowMajor{q, d, sq * d, false}, dk, d,
                       skv * d, n);
      cuda::add_group_sums(st, dk, h0, n, group, skv, d, dk_acc);
      cuda::add_group_sums(st, dv, h0, n, group, skv, d, dv_acc);
    } else {
      RT_CUDA_CHECK(cudaMemsetAsync(dq, 0, n * sq * d * 4, st), "clearing dQ");
    }
    cuda::scatter_fp32(st, dq, seg.q_start, sq, h0, n, d, cuda::strided(rows_view(p, a.dq, seg.batch)),
                       a.accumulate);
  }
  cuda::scatter_fp32(st, dk_acc, seg.k_start, skv, 0, p.heads_kv, d, cuda::strided(rows_view(p, a.dk, seg.batch)),
                     a.accumulate);
  cuda::scatter_fp32(st, dv_acc, seg.k_start, skv, 0, p.heads_kv, d, cuda::strided(rows_view(p, a.dv, seg.batch)),
                     a.accumulate);
}

class CudaMathBackend final : public Backend {
 public:
  BackendId id() const override { return BackendId::Math; }
  DeviceKind device_kind() const override { return DeviceKind::CUDA; }
  bool cp_capable() const override { return true; }  // verified by tests/check_gpu/cp_nccl_test.cpp (two H200s)

  std::vector<std::string> unsupported_reasons(const AttnParams& p) const override {
    std::vector<std::string> r;
    if (p.kv_cache) r.push_back(kv_cache_reason());
    if (std::string why = hopper_unavailable_reason(p.device); !why.empty()) r.push_back(std::move(why));
    if (p.dtype != DType::F32 && p.dtype != DType::BF16 && p.dtype != DType::F16)
      r.push_back(cat("dtype ", dtype_name(p.dtype), " (the GPU math backend reads fp32, bf16 and fp16)"));
    if (p.seqlen_q * p.seqlen_kv > kMaxScoresPerHead)
      r.push_back(cat("Sq x Skv = ", p.seqlen_q, " x ", p.seqlen_kv, " exceeds the GPU math backend's limit of 2^30 ",
                      "fp32 scores per head and sequence (e.g. 32768 x 32768)"));
    return r;
  }

  void forward(const AttnParams& p, const AttnForwardArgs& a) const override {
    cuda::DeviceGuard guard(p.device.index);
    cudaStream_t st = static_cast<cudaStream_t>(a.stream);
    for (const Segment& seg : cuda::device_segments(p, a.cu_seqlens_q, a.cu_seqlens_kv, st))
      forward_segment(p, a, seg, st);
  }

  void backward(const AttnParams& p, const AttnBackwardArgs& a) const override {
    cuda::DeviceGuard guard(p.device.index);
    cudaStream_t st = static_cast<cudaStream_t>(a.stream);
    for (const Segment& seg : cuda::device_segments(p, a.cu_seqlens_q, a.cu_seqlens_kv, st))
      backward_segment(p, a, seg, st);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cuda_math_backend() { return std::make_unique<CudaMathBackend>(); }

}  // namespace ringtrain::attention
