#include "ringtrain/attention/selection.h"

#include <algorithm>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>

#include "ringtrain/core/error.h"
#include "ringtrain/core/log.h"

namespace ringtrain::attention {
namespace {

struct ScopeEntry {
  std::string label;
  std::vector<BackendId> allowed;
  bool requires_cp = false;
  bool forward_only = false;
};

thread_local std::vector<ScopeEntry> t_scopes;

struct Root {
  std::vector<BackendId> ids;
  std::string source;
  bool is_default = false;  // neither RINGTRAIN_SDPA_BACKENDS nor set_root_backends() chose it
};

struct RootList {
  std::mutex mu;
  bool set = false;
  Root list;
};

RootList& root() {
  static RootList r;
  return r;
}

Root root_list() {
  RootList& r = root();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.set) {
    if (const char* env = std::getenv("RINGTRAIN_SDPA_BACKENDS"); env && *env) {
      try {
        r.list = {parse_backend_list(env), "RINGTRAIN_SDPA_BACKENDS", false};
      } catch (const Error& e) {
        throw Error(cat("environment variable RINGTRAIN_SDPA_BACKENDS: ", e.what()));
      }
    } else {
      r.list = {default_backends(), "default order", true};
    }
    r.set = true;
  }
  return r.list;
}

std::vector<BackendId> all_backends() { return {std::begin(kAllBackends), std::end(kAllBackends)}; }

// The root order for these params: the default order becomes the head dim's where that differs.
Root effective_root(const AttnParams& p) {
  Root r = root_list();
  if (!r.is_default) return r;
  if (std::vector<BackendId> ids = default_backends(p); ids != r.ids) {
    r.ids = std::move(ids);
    r.source = cat("default order for head dim ", p.head_dim);
  }
  return r;
}

bool contains(const std::vector<BackendId>& v, BackendId id) {
  for (BackendId x : v)
    if (x == id) return true;
  return false;
}

struct Cache {
  std::mutex mu;
  std::map<std::string, Selection> entries;
};
Cache& cache() {
  static Cache c;
  return c;
}

std::atomic<int64_t> g_forward[kNumBackends];
std::atomic<int64_t> g_backward[kNumBackends];

Selection decide(const AttnParams& p, const std::vector<BackendId>& root_ids, const std::string& root_source,
                 const std::vector<ScopeEntry>& scopes) {
  Selection s;
  s.params = p.describe();
  s.scopes = cat("root [", format_backend_list(root_ids), "] (", root_source, ")");
  for (const ScopeEntry& sc : scopes)
    s.scopes += cat(" > ", sc.label,
                    sc.requires_cp || sc.forward_only ? "" : cat(" [", format_backend_list(sc.allowed), "]"));

  const bool forward_only =
      std::any_of(scopes.begin(), scopes.end(), [](const ScopeEntry& sc) { return sc.forward_only; });
  auto judge = [&](BackendId id) {
    CandidateReport c;
    c.id = id;
    const Backend* impl = find_backend(id, p.device.kind);
    for (const ScopeEntry& sc : scopes) {
      if (!sc.requires_cp && !contains(sc.allowed, id)) {
        c.reasons.push_back(cat("excluded by scope '", sc.label, "' [", format_backend_list(sc.allowed), "]"));
        return c;
      }
      if (sc.requires_cp && impl && !impl->cp_capable()) {
        c.reasons.push_back(cat("not verified under context parallelism on ", device_name(p.device),
                                " (excluded by scope '", sc.label, "')"));
        return c;
      }
    }
    if (!impl) {
      c.reasons.push_back(cat("no ", p.device.is_cpu() ? "cpu" : "cuda", " implementation in this build"));
      return c;
    }
    c.reasons = impl->unsupported_reasons(p);
    if (!forward_only)
      for (std::string& why : impl->backward_unsupported_reasons(p)) c.reasons.push_back(std::move(why));
    if (c.reasons.empty()) {
      if (!s.backend) {
        s.backend = impl;
        c.selected = true;
      } else {
        c.available = true;
      }
    }
    return c;
  };
  for (BackendId id : root_ids) s.candidates.push_back(judge(id));
  for (BackendId id : kAllBackends) {
    if (contains(root_ids, id)) continue;
    CandidateReport c;
    c.id = id;
    c.reasons.push_back(cat("not in the allow-list (", root_source, ")"));
    s.candidates.push_back(std::move(c));
  }
  return s;
}

}  // namespace

std::string Selection::report() const {
  std::ostringstream os;
  os << "attention backend selection for " << params << "\n";
  os << "  scopes: " << scopes << "\n";
  for (const CandidateReport& c : candidates) {
    std::string name(backend_name(c.id));
    name.resize(11, ' ');
    os << "  " << name;
    if (c.selected) {
      os << "SELECTED";
    } else if (c.available) {
      os << "available (lower preference)";
    } else {
      os << "rejected: ";
      for (size_t i = 0; i < c.reasons.size(); ++i) os << (i ? "; " : "") << c.reasons[i];
    }
    os << "\n";
  }
  return os.str();
}

BackendScope::BackendScope(std::string label, std::vector<BackendId> allowed)
    : BackendScope(std::move(label), std::move(allowed), false, false) {}

BackendScope::BackendScope(std::string label, std::vector<BackendId> allowed, bool requires_cp, bool forward_only) {
  t_scopes.push_back({std::move(label), std::move(allowed), requires_cp, forward_only});
}

BackendScope BackendScope::context_parallel(int cp_size) {
  RT_CHECK(cp_size >= 1, "context-parallel size must be >= 1, got ", cp_size);
  // cp = 1 is plain attention: the scope is still pushed so that the stack is uniform, but it narrows nothing.
  return BackendScope(cat("context-parallel cp=", cp_size), all_backends(), cp_size > 1, false);
}

BackendScope BackendScope::forward_only(bool when) {
  if (!when) return BackendScope();
  return BackendScope("forward only", all_backends(), false, true);
}

BackendScope::BackendScope(BackendScope&& other) noexcept : active_(other.active_) { other.active_ = false; }

BackendScope::~BackendScope() {
  if (active_) t_scopes.pop_back();
}

std::vector<BackendId> default_backends() {
  return {BackendId::Cudnn, BackendId::Flash, BackendId::Efficient, BackendId::Decode, BackendId::Math};
}

namespace {
std::vector<BackendId> flash_first() {
  return {BackendId::Flash, BackendId::Cudnn, BackendId::Efficient, BackendId::Decode, BackendId::Math};
}
}  // namespace

std::vector<BackendId> default_backends(const AttnParams& p) {
  if (p.device.is_cuda() && (p.head_dim == 64 || p.head_dim > 128)) return flash_first();
  return default_backends();
}

void set_root_backends(std::vector<BackendId> ids, std::string source) {
  RT_CHECK(!ids.empty(), "the attention backend allow-list is empty (", source, ")");
  {
    RootList& r = root();
    std::lock_guard<std::mutex> lock(r.mu);
    r.list = {std::move(ids), std::move(source), false};
    r.set = true;
  }
  clear_selection_cache();
}

void reset_root_backends() {
  {
    RootList& r = root();
    std::lock_guard<std::mutex> lock(r.mu);
    r.set = false;
  }
  clear_selection_cache();
}

std::vector<BackendId> root_backends() { return root_list().ids; }

Selection explain(const AttnParams& p) {
  validate_params(p);
  const Root r = effective_root(p);
  std::string key = p.key() + "#" + format_backend_list(r.ids) + "#" + r.source;
  for (const ScopeEntry& sc : t_scopes)
    key += cat("#", sc.label, sc.requires_cp ? "*" : "", sc.forward_only ? "^" : "", format_backend_list(sc.allowed));
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.entries.find(key);
    if (it != c.entries.end()) return it->second;
  }
  Selection s = decide(p, r.ids, r.source, t_scopes);
  RT_LOG(Debug, s.report());
  std::lock_guard<std::mutex> lock(c.mu);
  return c.entries.emplace(key, std::move(s)).first->second;
}

const Backend& select(const AttnParams& p) {
  Selection s = explain(p);
  if (!s.backend) throw Error(cat("no attention backend can serve this call\n", s.report()));
  return *s.backend;
}

void forward(const AttnParams& p, const AttnForwardArgs& a) {
  validate(p, a);
  const Backend& b = select(p);
  g_forward[static_cast<int>(b.id())].fetch_add(1, std::memory_order_relaxed);
  b.forward(p, a);
}

void backward(const AttnParams& p, const AttnBackwardArgs& a) {
  validate(p, a);
  const Backend& b = select(p);
  g_backward[static_cast<int>(b.id())].fetch_add(1, std::memory_order_relaxed);
  b.backward(p, a);
}

int64_t DispatchCounts::total() const {
  int64_t t = 0;
  for (int i = 0; i < kNumBackends; ++i) t += forward[i] + backward[i];
  return t;
}

DispatchCounts dispatch_counts() {
  DispatchCounts c;
  for (int i = 0; i < kNumBackends; ++i) {
    c.forward[i] = g_forward[i].load();
    c.backward[i] = g_backward[i].load();
  }
  return c;
}

void reset_dispatch_counts() {
  for (int i = 0; i < kNumBackends; ++i) {
    g_forward[i] = 0;
    g_backward[i] = 0;
  }
}

std::string format_dispatch_counts(const DispatchCounts& c) {
  std::string s;
  for (int i = 0; i < kNumBackends; ++i) {
    if (!c.forward[i] && !c.backward[i]) continue;
    if (!s.empty()) s += "; ";
    s += cat(backend_name(kAllBackends[i]), ": fwd ", c.forward[i], " bwd ", c.backward[i]);
  }
  return s.empty() ? "no attention calls" : s;
}

void clear_selection_cache() {
  std::lock_guard<std::mutex> lock(cache().mu);
  cache().entries.clear();
}

}  // namespace ringtrain::attention
