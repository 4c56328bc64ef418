// The attention backend interface and the registry of implementations.
//
// A backend is a name (cudnn, flash, efficient, decode, math) implemented on a device kind. It declares what it can
// serve through one predicate, unsupported_reasons(), which returns every reason it cannot serve the params
// (empty = can). Whether it may run under context parallelism is a separate declaration, cp_capable(): set
// only for implementations whose results under CP are verified by tests.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ringtrain/attention/params.h"

namespace ringtrain::attention {

// Decode serves only KV-cache calls (AttnParams::kv_cache: a few query rows per sequence against a padded cache with
// per-sequence used lengths, the sampler's decoding steps); every other backend rejects those.
enum class BackendId : uint8_t { Cudnn, Flash, Efficient, Math, Decode };
constexpr int kNumBackends = 5;
// In BackendId order (DispatchCounts index by it).
constexpr BackendId kAllBackends[kNumBackends] = {BackendId::Cudnn, BackendId::Flash, BackendId::Efficient,
                                                   BackendId::Math, BackendId::Decode};

std::string_view backend_name(BackendId id);
BackendId parse_backend(std::string_view name);  // throws naming the unknown name and the known ones
// "cudnn,flash" -> {Cudnn, Flash}; order kept, duplicates rejected.
std::vector<BackendId> parse_backend_list(std::string_view list);
std::string format_backend_list(const std::vector<BackendId>& ids);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendId id() const = 0;
  virtual DeviceKind device_kind() const = 0;
  virtual bool cp_capable() const = 0;
  virtual std::vector<std::string> unsupported_reasons(const AttnParams& p) const = 0;
  // Why the backward cannot serve params the forward can (none by default). Selection adds these to the reasons
  // unless a forward-only scope says no backward follows, and backward() refuses such params
  // (require_backward_supported).
  virtual std::vector<std::string> backward_unsupported_reasons(const AttnParams&) const { return {}; }
  virtual void forward(const AttnParams& p, const AttnForwardArgs& a) const = 0;
  virtual void backward(const AttnParams& p, const AttnBackwardArgs& a) const = 0;
};

// For direct calls that bypass selection (tests, benchmarks), so that a kernel's geometry is never entered unchecked:
// an error naming the backend, the params and every reason it cannot serve them.
void require_supported(const Backend& backend, const AttnParams& p);
// The same for the reasons a backend's backward adds (backward_unsupported_reasons), called by its backward().
void require_backward_supported(const Backend& backend, const AttnParams& p);

// The implementation of `id` on `kind`, or nullptr when this build has none.
const Backend* find_backend(BackendId id, DeviceKind kind);

// Called once from the registry to add every implementation this build has (register_backends.cpp, the one file of
// attention that depends on the build's options).
void register_backends(std::vector<std::unique_ptr<Backend>>& out);

}  // namespace ringtrain::attention
