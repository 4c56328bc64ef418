// Backend selection: which backend runs an attention call is decided here and nowhere else.
//
// The candidates are an ordered allow-list. The root list comes from RINGTRAIN_SDPA_BACKENDS, or from
// set_root_backends() (CLI), or the default preference order. Scopes (BackendScope) nest per
// thread and can only narrow: a scope keeps the candidates of the enclosing ones that it also lists, in
// the enclosing order; listing a backend the enclosing scopes excluded does not bring it back. A context-
// parallel scope additionally keeps only implementations declared cp_capable(). A forward-only scope narrows
// nothing; it says no backward follows its calls, so that the default order (and only the default order) may put
// the backend with the faster forward first. The first candidate whose
// implementation supports the params wins. Decisions are cached per (params, scope stack) and every
// dispatch is counted per backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ringtrain/attention/backend.h"

namespace ringtrain::attention {

struct CandidateReport {
  BackendId id;
  bool selected = false;
  bool available = false;            // could have run, but a candidate before it was preferred
  std::vector<std::string> reasons;  // why it cannot run (empty when selected or available)
};

struct Selection {
  const Backend* backend = nullptr;  // null when nothing fits
  std::string params;                // AttnParams::describe()
  std::string scopes;                // the scope stack, outermost first
  std::vector<CandidateReport> candidates;  // all four backends, in preference order then the excluded ones
  std::string report() const;               // multi-line, one line per backend with its reason
};

// A scope that narrows the allow-list on this thread for its lifetime.
class BackendScope {
 public:
  BackendScope(std::string label, std::vector<BackendId> allowed);
  // Context parallelism of size cp (> 1): only implementations declared cp_capable() remain.
  static BackendScope context_parallel(int cp_size);
  // No backward follows the calls in this scope (scoring, generation): backends that have no backward for the params
  // may serve them. With `when` false the scope does nothing (for a caller that knows the direction only at run
  // time).
  static BackendScope forward_only(bool when = true);
  ~BackendScope();
  BackendScope(const BackendScope&) = delete;
  BackendScope& operator=(const BackendScope&) = delete;
  BackendScope(BackendScope&& other) noexcept;
  BackendScope& operator=(BackendScope&&) = delete;

 private:
  BackendScope(std::string label, std::vector<BackendId> allowed, bool requires_cp, bool forward_only);
  BackendScope() : active_(false) {}  // pushes nothing
  bool active_ = true;
};

// The default preference order: measured on H200 (docs/PERF.md); on CPU only flash and math exist. cuDNN leads
// because its forward+backward is the faster pair at head dim 128 (and its forward there at 16K).
std::vector<BackendId> default_backends();
// The default order for these params: flash first on CUDA at head dim 64 and above 128 (192, 256), where its forward
// and its forward+backward are the faster ones (docs/PERF.md, "Flash against cuDNN"); default_backends() otherwise.
std::vector<BackendId> default_backends(const AttnParams& p);
// Root allow-list for the process; RINGTRAIN_SDPA_BACKENDS (if set) is read at first use unless this is called.
// A list set here or by the variable is used as given, forward-only scopes included.
void set_root_backends(std::vector<BackendId> ids, std::string source);
// Back to the state before any set_root_backends(): the variable, else the default orders, read at next use.
void reset_root_backends();
std::vector<BackendId> root_backends();

// The decision for these params under the current thread's scopes (cached; never throws).
Selection explain(const AttnParams& p);
// The backend that runs these params; throws ringtrain::Error with the full report when nothing fits.
const Backend& select(const AttnParams& p);

// Validates, selects, dispatches and counts.
void forward(const AttnParams& p, const AttnForwardArgs& a);
void backward(const AttnParams& p, const AttnBackwardArgs& a);

// Dispatch counters (process-wide, all threads): how many forward / backward calls each backend ran.
struct DispatchCounts {
  int64_t forward[kNumBackends] = {};
  int64_t backward[kNumBackends] = {};
  int64_t total() const;
};
DispatchCounts dispatch_counts();
void reset_dispatch_counts();
// "flash: fwd 12 bwd 12; math: fwd 0 bwd 0" (backends with no calls omitted).
std::string format_dispatch_counts(const DispatchCounts& c);

// Drops cached decisions (tests that change the root list or the registry's view call this).
void clear_selection_cache();

}  // namespace ringtrain::attention
