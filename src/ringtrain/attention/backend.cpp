#include "ringtrain/attention/backend.h"

#include <mutex>

#include "ringtrain/core/error.h"

namespace ringtrain::attention {

std::string_view backend_name(BackendId id) {
  switch (id) {
    case BackendId::Cudnn: return "cudnn";
    case BackendId::Flash: return "flash";
    case BackendId::Efficient: return "efficient";
    case BackendId::Math: return "math";
    case BackendId::Decode: return "decode";
  }
  return "?";
}

BackendId parse_backend(std::string_view name) {
  for (BackendId id : kAllBackends)
    if (backend_name(id) == name) return id;
  throw Error(cat("unknown attention backend '", name, "' (known: cudnn, flash, efficient, decode, math)"));
}

std::vector<BackendId> parse_backend_list(std::string_view list) {
  std::vector<BackendId> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string_view::npos) end = list.size();
    std::string_view item = list.substr(pos, end - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    RT_CHECK(!item.empty(), "empty entry in attention backend list '", list, "'");
    BackendId id = parse_backend(item);
    for (BackendId seen : out)
      RT_CHECK(seen != id, "attention backend '", item, "' listed twice in '", list, "'");
    out.push_back(id);
    pos = end + 1;
  }
  return out;
}

std::string format_backend_list(const std::vector<BackendId>& ids) {
  std::string s;
  for (BackendId id : ids) {
    if (!s.empty()) s += ',';
    s += backend_name(id);
  }
  return s;
}

const Backend* find_backend(BackendId id, DeviceKind kind) {
  static const std::vector<std::unique_ptr<Backend>> registry = [] {
    std::vector<std::unique_ptr<Backend>> r;
    register_backends(r);
    return r;
  }();
  for (const auto& b : registry)
    if (b->id() == id && b->device_kind() == kind) return b.get();
  return nullptr;
}

namespace {

void throw_if_any(const Backend& backend, const AttnParams& p, const std::vector<std::string>& reasons,
                  const char* what) {
  if (reasons.empty()) return;
  std::string all;
  for (const std::string& why : reasons) all += (all.empty() ? "" : "; ") + why;
  throw Error(cat(backend_name(backend.id()), " (", backend.device_kind() == DeviceKind::CUDA ? "cuda" : "cpu",
                  ") cannot serve ", what, p.describe(), ": ", all));
}

}  // namespace

void require_supported(const Backend& backend, const AttnParams& p) {
  throw_if_any(backend, p, backend.unsupported_reasons(p), "");
}

void require_backward_supported(const Backend& backend, const AttnParams& p) {
  throw_if_any(backend, p, backend.backward_unsupported_reasons(p), "the backward of ");
}

}  // namespace ringtrain::attention
