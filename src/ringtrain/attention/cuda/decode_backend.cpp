// The `decode` backend on CUDA: attention of a few new query rows per sequence against a padded KV cache with
// per-sequence used lengths (AttnParams::kv_cache), the sampler's decoding steps. The training kernels (flash,
// efficient, cudnn) tile queries by 64-128 rows and take one length per call (or packed offsets): a step of one row
// per sequence would waste almost all of a tile, and the cache's ragged lengths are not theirs to read. This
// backend serves only those calls and rejects every other one; its kernels are decode_kernels.cu. Forward only.
#include <cuda_runtime_api.h>

#include "ringtrain/attention/cuda/cuda_backends.h"
#include "ringtrain/attention/cuda/cuda_util.h"
#include "ringtrain/attention/cuda/decode_kernels.h"
#include "ringtrain/attention/cuda/flash_call.h"
#include "ringtrain/core/device_info.h"

namespace ringtrain::attention {
namespace {

constexpr int64_t kMaxGridYZ = 65535;  // kv heads go to grid.y, sequences to grid.z

class DecodeBackend final : public Backend {
 public:
  BackendId id() const override { return BackendId::Decode; }
  DeviceKind device_kind() const override { return DeviceKind::CUDA; }
  bool cp_capable() const override { return false; }  // generation runs on one GPU

  std::vector<std::string> unsupported_reasons(const AttnParams& p) const override {
    std::vector<std::string> r;
    if (std::string why = hopper_unavailable_reason(p.device); !why.empty()) r.push_back(std::move(why));
    if (!p.kv_cache)
      r.push_back("not a KV-cache call (decode serves only new rows against a padded cache with per-sequence used "
                  "lengths: AttnParams::kv_cache)");
    if (p.dtype != DType::BF16 && p.dtype != DType::F16)
      r.push_back(cat("dtype ", dtype_name(p.dtype), " (needs bf16 or fp16)"));
    if (!cuda::decode_head_dim_supported(p.head_dim))
      r.push_back(cat("head dim ", p.head_dim, " (needs 16, 32, 64 or 128)"));
    if (p.heads_kv > 0 && p.heads_q % p.heads_kv == 0 &&
        p.heads_q / p.heads_kv * p.seqlen_q > cuda::kDecodeMaxRows)
      r.push_back(cat(p.heads_q / p.heads_kv, " query heads per kv head x Sq = ", p.seqlen_q, " rows (at most ",
                      cuda::kDecodeMaxRows, " rows per kv head)"));
    if (p.packed) r.push_back("packed (THD) sequences");
    if (p.has_bias) r.push_back("additive bias");
    if (p.mask == MaskType::CausalTopLeft)
      r.push_back("causal top-left mask (a cache call aligns its rows to the used length: bottom-right or none)");
    if (p.seqlen_kv >= (int64_t(1) << 31)) r.push_back(cat("cache capacity ", p.seqlen_kv, " (needs < 2^31)"));
    if (p.heads_kv > kMaxGridYZ) r.push_back(cat(p.heads_kv, " kv heads (at most ", kMaxGridYZ, ": grid.y)"));
    if (p.batch > kMaxGridYZ) r.push_back(cat("batch ", p.batch, " (at most ", kMaxGridYZ, " sequences: grid.z)"));
    // Checked per call: unit stride in D (validate), 16-byte aligned k/v rows, o's dtype.
    return r;
  }

  void forward(const AttnParams& p, const AttnForwardArgs& a) const override {
    require_supported(*this, p);
    validate(p, a);
    RT_CHECK(cuda::rows_aligned(p, a.k, 16) && cuda::rows_aligned(p, a.v, 16), "decode (cuda): 'k' ",
             a.k.shape_str(), " and 'v' ", a.v.shape_str(), " need 16-byte aligned rows");
    RT_CHECK(a.o.dtype == p.dtype || a.o.dtype == DType::F32, "decode (cuda): 'o' is ", a.o.shape_str(),
             "; expected ", dtype_name(p.dtype), " or fp32");
    cuda::DeviceGuard guard(p.device.index);
    cuda::DecodeCall c;
    c.batch = static_cast<int>(p.batch), c.heads_q = static_cast<int>(p.heads_q);
    c.heads_kv = static_cast<int>(p.heads_kv), c.head_dim = static_cast<int>(p.head_dim);
    c.seqlen_q = static_cast<int>(p.seqlen_q), c.capacity = static_cast<int>(p.seqlen_kv);
    c.mask = p.mask == MaskType::None ? cuda::kMaskNone : cuda::kMaskCausalBottomRight;
    // A window of at least the capacity hides no key (row i's start is at most kv_used[b] - window <= 0): passed as
    // none, which also keeps the kernel's start arithmetic within int.
    c.window = p.window < p.seqlen_kv ? static_cast<int>(p.window) : 0;
    c.scale = p.scale();
    c.bf16 = p.dtype == DType::BF16;
    c.q = cuda::flash_rows(p, a.q, "decode", "q");
    c.k = cuda::flash_rows(p, a.k, "decode", "k");
    c.v = cuda::flash_rows(p, a.v, "decode", "v");
    c.o = cuda::flash_rows(p, a.o, "decode", "o");
    c.lse = cuda::flash_stats(p, a.lse);
    c.kv_used = static_cast<const int32_t*>(a.kv_used.data);
    cuda::decode_forward(c, static_cast<cudaStream_t>(a.stream));
  }

  void backward(const AttnParams& p, const AttnBackwardArgs&) const override {
    throw Error(cat("decode (cuda) has no backward (", p.describe(), "): it serves generation only"));
  }
};

}  // namespace

std::unique_ptr<Backend> make_cuda_decode_backend() { return std::make_unique<DecodeBackend>(); }

}  // namespace ringtrain::attention
