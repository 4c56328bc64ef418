#include "test_util.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sys/wait.h>
#include <unistd.h>

namespace ringtrain::testing {

uint64_t fresh_seed() {
  static uint64_t counter = 0;
  uint64_t seed;
  if (const char* s = std::getenv("RINGTRAIN_TEST_SEED")) {
    seed = std::strtoull(s, nullptr, 10) + counter++;
  } else {
    seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }
  std::printf("[seed %llu]\n", static_cast<unsigned long long>(seed));
  return seed;
}

TempDir::TempDir(const std::string& prefix) {
  static std::atomic<int> made{0};
  path = std::filesystem::temp_directory_path() /
         (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(made++));
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

namespace {
// Visits matching elements of two same-shaped views as doubles; false when the shapes differ.
template <typename F>
bool for_pairs(const TensorView& a, const TensorView& b, F&& f) {
  if (a.ndim != b.ndim) return false;
  for (int d = 0; d < a.ndim; ++d)
    if (a.shape[d] != b.shape[d]) return false;
  for_each_offset(a, b, [&](int64_t oa, int64_t ob) {
    f(load_as_double(a.data, a.dtype, oa), load_as_double(b.data, b.dtype, ob));
  });
  return true;
}
}  // namespace

void fill_normal(const TensorView& t, std::mt19937_64& rng, double stddev) {
  std::normal_distribution<double> dist(0.0, stddev);
  for_each_offset(t, t, [&](int64_t off, int64_t) { store_from_double(t.data, t.dtype, off, dist(rng)); });
}

void poison(const TensorView& t) { fill(t, std::numeric_limits<double>::quiet_NaN()); }

double rel_error(const TensorView& a, const TensorView& b) {
  double num = 0, den = 0;
  bool bad = false;
  const bool ok = for_pairs(a, b, [&](double x, double y) {
    if (std::isinf(y) && x == y) return;  // matching infinities (e.g. LSE of a fully masked row)
    if (!std::isfinite(x) || !std::isfinite(y)) {
      bad = true;
      return;
    }
    num += (x - y) * (x - y);
    den += y * y;
  });
  if (!ok || bad) return std::numeric_limits<double>::infinity();
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double max_abs_error(const TensorView& a, const TensorView& b) {
  double m = 0;
  bool bad = false;
  const bool ok = for_pairs(a, b, [&](double x, double y) {
    if (std::isinf(y) && x == y) return;
    if (!std::isfinite(x) || !std::isfinite(y)) bad = true;
    else m = std::max(m, std::fabs(x - y));
  });
  return (!ok || bad) ? std::numeric_limits<double>::infinity() : m;
}

double max_ragged_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return std::numeric_limits<double>::infinity();
    for (size_t p = 0; p < a[i].size(); ++p) {
      const double d = std::abs(static_cast<double>(a[i][p]) - b[i][p]);
      if (!(d <= m)) m = std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
    }
  }
  return m;
}

std::string cli_program() {
  const char* given = std::getenv("RINGTRAIN_CLI");
  return given && *given ? given : RINGTRAIN_CLI;
}

CliResult run_cli(const std::string& args, const std::string& pipe_in) {
  CliResult r;
  const std::string feed = pipe_in.empty() ? "" : "cat '" + pipe_in + "' | ";
  FILE* pipe = popen((feed + cli_program() + " " + args + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) r.output.append(buf, n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace ringtrain::testing
