// CPU `flash` backend: the FlashAttention-2 algorithm on host tiles, fp32 accumulation.
// Forward: per query tile, stream key tiles with an online softmax (running max m, running sum l), rescale
// once at the end; LSE = m + log l. Backward: recompute P = exp(S - LSE) per tile from the given LSE,
// D = rowsum(dO * O) once per row, dS = P * (dP - D). Tiles beyond a causal row's key limit, and tiles wholly before
// a sliding window's start, are skipped.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ringtrain/attention/cpu/cpu_backends.h"
#include "ringtrain/attention/cpu/head_io.h"
#include "ringtrain/core/error.h"
#include "ringtrain/core/parallel.h"

namespace ringtrain::attention::cpu {
namespace {

constexpr int64_t kTileQ = 32;
constexpr int64_t kTileK = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float dot(const float* a, const float* b, int64_t d) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < d; ++c) s += a[c] * b[c];
  return s;
}

inline void axpy(float alpha, const float* x, float* y, int64_t d) {
#pragma omp simd
  for (int64_t c = 0; c < d; ++c) y[c] += alpha * x[c];
}

struct HeadItem {
  Segment seg;
  int64_t head;  // query head (forward) or kv head (backward)
};

void forward_head(const AttnParams& p, const AttnForwardArgs& a, const HeadItem& it) {
  const Segment& s = it.seg;
  const int64_t d = p.head_dim, kvh = it.head / (p.heads_q / p.heads_kv);
  const float scale = p.scale();
  std::vector<float> q, k, v;
  load_head(rows_view(p, a.q, s.batch), s.q_start, s.sq, it.head, q);
  load_head(rows_view(p, a.k, s.batch), s.k_start, s.skv, kvh, k);
  load_head(rows_view(p, a.v, s.batch), s.k_start, s.skv, kvh, v);
  std::vector<float> o(static_cast<size_t>(s.sq * d), 0.f);
  const TensorView lse = lse_view(p, a.lse, s.batch);
  float sc[kTileQ][kTileK];
  for (int64_t i0 = 0; i0 < s.sq; i0 += kTileQ) {
    const int64_t br = std::min(kTileQ, s.sq - i0);
    float m[kTileQ], l[kTileQ];
    std::fill(m, m + br, kNegInf);
    std::fill(l, l + br, 0.f);
    // Limits and window starts grow with the row: the tile's first row has the earliest start.
    const int64_t kv_end = key_limit(p.mask, i0 + br - 1, s.sq, s.skv);
    const int64_t kv_begin = key_start(p.mask, p.window, i0, s.sq, s.skv) / kTileK * kTileK;
    for (int64_t j0 = kv_begin; j0 < kv_end; j0 += kTileK) {
      const int64_t bc = std::min(kTileK, kv_end - j0);
      for (int64_t r = 0; r < br; ++r) {
        const int64_t lim = key_limit(p.mask, i0 + r, s.sq, s.skv) - j0;
        const int64_t first = key_start(p.mask, p.window, i0 + r, s.sq, s.skv) - j0;
        float mx = m[r];
        for (int64_t c = 0; c < bc; ++c) {
          sc[r][c] = c >= first && c < lim ? dot(&q[(i0 + r) * d], &k[(j0 + c) * d], d) * scale : kNegInf;
          mx = std::max(mx, sc[r][c]);
        }
        if (mx == kNegInf) continue;  // nothing visible yet in this row
        const float alpha = std::exp(m[r] - mx);
        float* orow = &o[(i0 + r) * d];
        if (alpha != 1.f)
          for (int64_t c = 0; c < d; ++c) orow[c] *= alpha;
        l[r] *= alpha;
        for (int64_t c = 0; c < bc; ++c) {
          if (sc[r][c] == kNegInf) continue;
          const float pc = std::exp(sc[r][c] - mx);
          l[r] += pc;
          axpy(pc, &v[(j0 + c) * d], orow, d);
        }
        m[r] = mx;
      }
    }
    for (int64_t r = 0; r < br; ++r) {
      float* orow = &o[(i0 + r) * d];
      float* lse_r = static_cast<float*>(lse.data) + it.head * lse.stride[0] + (s.q_start + i0 + r) * lse.stride[1];
      if (l[r] == 0.f) {
        std::fill(orow, orow + d, 0.f);
        *lse_r = kNegInf;
        continue;
      }
      const float inv = 1.f / l[r];
      for (int64_t c = 0; c < d; ++c) orow[c] *= inv;
      *lse_r = m[r] + std::log(l[r]);
    }
  }
  store_head(rows_view(p, a.o, s.batch), s.q_start, s.sq, it.head, o, false);
}

void backward_kv_head(const AttnParams& p, const AttnBackwardArgs& a, const HeadItem& it) {
  const Segment& s = it.seg;
  const int64_t d = p.head_dim, group = p.heads_q / p.heads_kv;
  const float scale = p.scale();
  std::vector<float> q, k, v, o, dout;
  load_head(rows_view(p, a.k, s.batch), s.k_start, s.skv, it.head, k);
  load_head(rows_view(p, a.v, s.batch), s.k_start, s.skv, it.head, v);
  std::vector<float> dk(static_cast<size_t>(s.skv * d), 0.f), dv(static_cast<size_t>(s.skv * d), 0.f);
  std::vector<float> dq, lse_h(static_cast<size_t>(s.sq)), drow(static_cast<size_t>(s.sq));
  const TensorView lse = lse_view(p, a.lse, s.batch);
  float pt[kTileQ][kTileK], ds[kTileQ][kTileK];
  for (int64_t h = it.head * group; h < (it.head + 1) * group; ++h) {
    load_head(rows_view(p, a.q, s.batch), s.q_start, s.sq, h, q);
    load_head(rows_view(p, a.o, s.batch), s.q_start, s.sq, h, o);
    load_head(rows_view(p, a.dout, s.batch), s.q_start, s.sq, h, dout);
    dq.assign(static_cast<size_t>(s.sq * d), 0.f);
    for (int64_t i = 0; i < s.sq; ++i) {
      lse_h[i] = static_cast<const float*>(lse.data)[h * lse.stride[0] + (s.q_start + i) * lse.stride[1]];
      drow[i] = dot(&dout[i * d], &o[i * d], d);
    }
    for (int64_t j0 = 0; j0 < s.skv; j0 += kTileK) {
      const int64_t bc = std::min(kTileK, s.skv - j0);
      for (int64_t i0 = 0; i0 < s.sq; i0 += kTileQ) {
        const int64_t br = std::min(kTileQ, s.sq - i0);
        if (key_limit(p.mask, i0 + br - 1, s.sq, s.skv) <= j0) continue;  // whole tile after every row's limit
        // The window of this query tile, and of every later one, starts past the key tile.
        if (key_start(p.mask, p.window, i0, s.sq, s.skv) >= j0 + bc) break;
        for (int64_t r = 0; r < br; ++r) {
          const int64_t i = i0 + r, lim = key_limit(p.mask, i, s.sq, s.skv) - j0;
          const int64_t first = key_start(p.mask, p.window, i, s.sq, s.skv) - j0;
          const bool dead = lse_h[i] == kNegInf;
          for (int64_t c = 0; c < bc; ++c) {
            if (dead || c < first || c >= lim) {
              pt[r][c] = ds[r][c] = 0.f;
              continue;
            }
            pt[r][c] = std::exp(dot(&q[i * d], &k[(j0 + c) * d], d) * scale - lse_h[i]);
            const float dp = dot(&dout[i * d], &v[(j0 + c) * d], d);
            ds[r][c] = pt[r][c] * (dp - drow[i]) * scale;
          }
        }
        for (int64_t r = 0; r < br; ++r) {
          const int64_t i = i0 + r;
          for (int64_t c = 0; c < bc; ++c) {
            if (pt[r][c] == 0.f && ds[r][c] == 0.f) continue;
            axpy(pt[r][c], &dout[i * d], &dv[(j0 + c) * d], d);
            axpy(ds[r][c], &q[i * d], &dk[(j0 + c) * d], d);
            axpy(ds[r][c], &k[(j0 + c) * d], &dq[i * d], d);
          }
        }
      }
    }
    store_head(rows_view(p, a.dq, s.batch), s.q_start, s.sq, h, dq, a.accumulate);
  }
  store_head(rows_view(p, a.dk, s.batch), s.k_start, s.skv, it.head, dk, a.accumulate);
  store_head(rows_view(p, a.dv, s.batch), s.k_start, s.skv, it.head, dv, a.accumulate);
}

std::vector<HeadItem> head_items(const std::vector<Segment>& segs, int64_t heads) {
  std::vector<HeadItem> out;
  for (const Segment& s : segs)
    for (int64_t h = 0; h < heads; ++h) out.push_back({s, h});
  return out;
}

class FlashBackend final : public Backend {
 public:
  BackendId id() const override { return BackendId::Flash; }
  DeviceKind device_kind() const override { return DeviceKind::CPU; }
  bool cp_capable() const override { return true; }  // tests/cp: ring and all-gather parity on CPU ranks

  std::vector<std::string> unsupported_reasons(const AttnParams& p) const override {
    std::vector<std::string> r;
    if (p.kv_cache) r.push_back(kv_cache_reason());
    if (p.dtype == DType::F64) r.push_back("fp64 inputs: flash accumulates in fp32 (use math)");
    if (!is_float(p.dtype)) r.push_back(cat("dtype ", dtype_name(p.dtype), " is not a float type"));
    if (p.has_bias) r.push_back("additive bias (the CPU flash tiles take none; use math)");
    return r;
  }

  void forward(const AttnParams& p, const AttnForwardArgs& a) const override {
    const auto work = head_items(segments(p, a.cu_seqlens_q, a.cu_seqlens_kv), p.heads_q);
    parallel_for(static_cast<int64_t>(work.size()), [&](int64_t i) { forward_head(p, a, work[i]); });
  }

  void backward(const AttnParams& p, const AttnBackwardArgs& a) const override {
    const auto work = head_items(segments(p, a.cu_seqlens_q, a.cu_seqlens_kv), p.heads_kv);
    parallel_for(static_cast<int64_t>(work.size()), [&](int64_t i) { backward_kv_head(p, a, work[i]); });
  }
};

}  // namespace

std::unique_ptr<Backend> make_flash_backend() { return std::make_unique<FlashBackend>(); }

}  // namespace ringtrain::attention::cpu
