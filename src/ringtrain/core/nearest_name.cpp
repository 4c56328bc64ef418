#include "ringtrain/core/nearest_name.h"

#include <algorithm>
#include <limits>

namespace ringtrain {
namespace {

// Whether `name` holds each dot-separated part of `typed` (each non-empty), in order and without overlap.
bool holds_parts_in_order(const std::string& name, const std::string& typed) {
  size_t at = 0;
  for (size_t start = 0;;) {
    const size_t dot = typed.find('.', start);
    const std::string part = typed.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) return false;
    const size_t found = name.find(part, at);
    if (found == std::string::npos) return false;
    at = found + part.size();
    if (dot == std::string::npos) return true;
    start = dot + 1;
  }
}

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::optional<std::string> nearest_name(const std::string& typed, const std::vector<std::string>& known) {
  std::optional<std::string> holding;
  for (const std::string& name : known)
    if (name != typed && holds_parts_in_order(name, typed) && (!holding || name.size() < holding->size()))
      holding = name;
  if (holding) return holding;
  std::optional<std::string> best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& name : known)
    if (const size_t d = edit_distance(typed, name); d < best_d) best_d = d, best = name;
  if (best_d > std::max<size_t>(2, typed.size() / 3)) return std::nullopt;
  return best;
}

}  // namespace ringtrain
