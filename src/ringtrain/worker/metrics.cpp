#include "ringtrain/worker/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "ringtrain/core/error.h"
#include "ringtrain/core/json.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/worker/tensorboard_event.pb.h"

namespace ringtrain::worker {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kEventPrefix = "events.out.tfevents.";

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void ensure_directory(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  RT_CHECK(std::filesystem::is_directory(dir), "metrics directory ", dir.string(), ": ",
           ec ? ec.message() : "exists and is not a directory");
}

// Opens for writing without following a symlink; the result must be a regular file.
FilePtr open_for_writing(const std::filesystem::path& path, int flags) {
  // O_NONBLOCK: opening a FIFO without a reader fails at once (ENXIO) instead of waiting for one.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | flags, 0644);
  if (fd < 0) {
    const int err = errno;
    RT_CHECK(err != ELOOP, path.string(), " is a symbolic link; refusing to write through it");
    RT_CHECK(err != ENXIO, path.string(), ": not a regular file (a FIFO)");
    throw Error(cat("cannot open ", path.string(), " for writing: ", std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(cat(path.string(), ": not a regular file"));
  }
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(cat("cannot open ", path.string(), " for writing: ", std::strerror(err)));
  }
  FilePtr f(::fdopen(fd, "ab"));
  if (!f) {
    ::close(fd);
    throw Error(cat("cannot open ", path.string(), ": ", std::strerror(errno)));
  }
  return f;
}

void write_all(std::FILE* f, const void* data, size_t size, const std::filesystem::path& path) {
  RT_CHECK(std::fwrite(data, 1, size, f) == size, "error writing ", path.string(), ": ", std::strerror(errno));
}

void flush(std::FILE* f, const std::filesystem::path& path) {
  RT_CHECK(std::fflush(f) == 0, "error writing ", path.string(), ": ", std::strerror(errno));
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  std::string h(buf);
  for (char& c : h)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.' && c != '_') c = '_';
  return h.empty() ? "localhost" : h;
}

// The event files of DIR (what TensorBoard would read from it), sorted by name; one that is not a regular file is
// an error (a link could make two runs' files one).
std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (!e.path().filename().string().starts_with(kEventPrefix)) continue;
    RT_CHECK(e.symlink_status().type() == fs::file_type::regular, e.path().string(),
             ": an event file that is not a regular file");
    out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

uint64_t load_le64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<size_t>(i)]);
  return v;
}
uint32_t load_le32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<size_t>(i)]);
  return v;
}

// Keeps the lines of metrics.jsonl whose step is at most after_step. A last line without its newline was cut off by
// a run that died while writing it, and goes too. Rewritten (atomically) only when something is dropped.
void keep_jsonl_steps(const fs::path& path, int64_t after_step) {
  std::error_code ec;
  if (fs::symlink_status(path, ec).type() != fs::file_type::regular) return;  // absent; other kinds: refused at open
  const std::string text = model::read_file(path);
  std::string kept;
  bool dropped = false;
  size_t pos = 0;
  for (int64_t lineno = 1; pos < text.size(); ++lineno) {
    const size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) {
      dropped = true;
      break;
    }
    const std::string where = cat(path.string(), ":", lineno);
    const nlohmann::json j = parse_json(std::string_view(text).substr(pos, eol - pos), where);
    // Our steps are non-negative int64 (parsed as unsigned); 2^64 - 1 or -1 would otherwise read as a kept step.
    RT_CHECK(j.is_object() && j.contains("step") && j["step"].is_number_unsigned() &&
                 j["step"].get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
             where, ": not a metrics record (an object with an integer \"step\" in [0, 2^63)); refusing to rewrite ",
             "the file");
    if (j["step"].get<int64_t>() <= after_step) kept.append(text, pos, eol + 1 - pos);
    else dropped = true;
    pos = eol + 1;
  }
  if (dropped) model::write_file_atomic(path, kept);
}

// The same for an event file: summary records of steps after after_step are dropped, a record cut off at the end
// too; a checksum that does not match is an error naming the file and the record's offset.
void keep_event_steps(const fs::path& path, int64_t after_step) {
  const std::string bytes = model::read_file(path);
  std::string kept;
  bool dropped = false;
  for (size_t at = 0; at < bytes.size();) {
    const size_t left = bytes.size() - at;
    if (left < 12) {
      dropped = true;
      break;
    }
    const std::string where = cat(path.string(), ": the record at byte ", at);
    RT_CHECK(load_le32(bytes, at + 8) == masked_crc32c(bytes.data() + at, 8), where,
             ": its length's checksum does not match (not an intact event file)");
    const uint64_t length = load_le64(bytes, at);
    if (length > left - 12 || left - 12 - length < 4) {
      dropped = true;
      break;
    }
    const size_t n = static_cast<size_t>(length);
    RT_CHECK(load_le32(bytes, at + 12 + n) == masked_crc32c(bytes.data() + at + 12, n), where,
             ": its payload's checksum does not match (not an intact event file)");
    // protobuf parses at most INT_MAX bytes; a scalar Event is a few hundred.
    RT_CHECK(n <= static_cast<size_t>(std::numeric_limits<int>::max()), where, ": a record of ", n,
             " bytes, not one of scalar metrics");
    tb::Event e;
    RT_CHECK(e.ParseFromArray(bytes.data() + at + 12, static_cast<int>(n)), where, ": not an Event message");
    if (e.what_case() == tb::Event::kSummary && e.step() > after_step) dropped = true;
    else kept.append(bytes, at, 12 + n + 4);
    at += 12 + n + 4;
  }
  if (dropped) model::write_file_atomic(path, kept);
}

}  // namespace

void check_no_earlier_metrics(const fs::path& dir, EarlierMetrics what, const std::string& hint) {
  const fs::path jsonl = metrics_jsonl(dir);
  std::error_code ec;
  if (fs::symlink_status(jsonl, ec).type() == fs::file_type::regular && fs::file_size(jsonl, ec) > 0 && !ec)
    throw Error(cat(jsonl.string(), " holds the metrics of an earlier run; ", hint));
  if (what == EarlierMetrics::Records) return;
  const std::vector<fs::path> events = event_files(dir);
  if (!events.empty())
    throw Error(cat(events.front().string(), " is the TensorBoard event file of an earlier run; ", hint));
}

uint32_t crc32c(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) c = kCrc32cTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventFileWriter::EventFileWriter(const std::filesystem::path& dir) {
  ensure_directory(dir);
  const double wall = now_seconds();
  const std::string base = cat("events.out.tfevents.", static_cast<int64_t>(wall), ".", host_name());
  // O_EXCL: a second writer in the same second (another run, another rank) gets its own file.
  for (int attempt = 0; !file_; ++attempt) {
    path_ = dir / (attempt == 0 ? base : cat(base, ".", attempt));
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
      RT_CHECK(errno == EEXIST && attempt < 100, "cannot create ", path_.string(), ": ", std::strerror(errno));
      continue;
    }
    file_.reset(::fdopen(fd, "wb"));
    if (!file_) {
      ::close(fd);
      throw Error(cat("cannot open ", path_.string(), ": ", std::strerror(errno)));
    }
  }
  tb::Event first;
  first.set_wall_time(wall);
  first.set_file_version("brain.Event:2");
  write_record(first.SerializeAsString());
}

void EventFileWriter::write_record(const std::string& payload) {
  unsigned char header[12];
  const uint64_t length = payload.size();
  for (int i = 0; i < 8; ++i) header[i] = static_cast<unsigned char>(length >> (8 * i));
  const uint32_t length_crc = masked_crc32c(header, 8);
  for (int i = 0; i < 4; ++i) header[8 + i] = static_cast<unsigned char>(length_crc >> (8 * i));
  const uint32_t payload_crc = masked_crc32c(payload.data(), payload.size());
  unsigned char footer[4];
  for (int i = 0; i < 4; ++i) footer[i] = static_cast<unsigned char>(payload_crc >> (8 * i));
  write_all(file_.get(), header, sizeof header, path_);
  write_all(file_.get(), payload.data(), payload.size(), path_);
  write_all(file_.get(), footer, sizeof footer, path_);
  flush(file_.get(), path_);
}

void EventFileWriter::write_scalars(int64_t step, double wall_time, const Scalars& values) {
  tb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  tb::Summary* summary = e.mutable_summary();
  for (const auto& [tag, value] : values) {
    tb::SummaryValue* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  write_record(e.SerializeAsString());
}

fs::path metrics_jsonl(const fs::path& dir) { return dir / "metrics.jsonl"; }

MetricsWriter::MetricsWriter(const std::filesystem::path& dir, bool tensorboard, MetricsStart start) {
  ensure_directory(dir);
  jsonl_path_ = metrics_jsonl(dir);
  int flags = O_APPEND;
  switch (start.mode) {
    case MetricsStart::Mode::Fresh:
      check_no_earlier_metrics(dir, EarlierMetrics::RecordsOrEventFiles, "continue that run (--resume), replace its metrics (--overwrite-metrics), or "
                                    "choose another train.metrics_dir");
      break;
    case MetricsStart::Mode::Overwrite:
      model::check_replaceable(jsonl_path_);  // O_TRUNC only on a regular file
      for (const fs::path& e : event_files(dir)) {
        std::error_code ec;
        RT_CHECK(fs::remove(e, ec) && !ec, "cannot remove ", e.string(), ": ", ec.message());
      }
      flags |= O_TRUNC;
      break;
    case MetricsStart::Mode::Continue:
      keep_jsonl_steps(jsonl_path_, start.after_step);
      for (const fs::path& e : event_files(dir)) keep_event_steps(e, start.after_step);
      break;
  }
  jsonl_ = open_for_writing(jsonl_path_, flags);
  if (tensorboard) events_ = std::make_unique<EventFileWriter>(dir);
}

void MetricsWriter::write(int64_t step, const Scalars& values) {
  const double wall = now_seconds();
  nlohmann::ordered_json j;
  j["step"] = step;
  j["wall_time"] = wall;
  for (const auto& [name, value] : values) {
    RT_CHECK(name != "step" && name != "wall_time", "metric name '", name, "' is reserved");
    if (std::isfinite(value)) j[name] = value;
    else j[name] = nullptr;
  }
  const std::string line = j.dump() + "\n";
  write_all(jsonl_.get(), line.data(), line.size(), jsonl_path_);
  flush(jsonl_.get(), jsonl_path_);
  if (events_) events_->write_scalars(step, wall, values);
}

namespace {

std::string with_thousands(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string duration_text(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  const auto ll = [](int64_t v) { return static_cast<long long>(v); };
  char buf[64];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", ll(s / 3600), ll(s % 3600 / 60));
  } else if (s >= 60) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", ll(s / 60), ll(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%llds", ll(s));
  }
  return buf;
}

}  // namespace

std::string progress_text(const ProgressState& s) {
  std::string text = s.total_steps > 0 ? cat("step ", s.step, "/", s.total_steps) : cat("step ", s.step);
  const double tps = std::isfinite(s.tokens_per_second) ? s.tokens_per_second : 0.0;
  text += cat(" | ", with_thousands(static_cast<int64_t>(std::llround(tps))), " tok/s");
  char loss[32];
  std::snprintf(loss, sizeof loss, "%.4g", s.loss);
  text += cat(" | loss ", std::isnan(s.loss) ? "-" : loss);  // a step with nothing to learn from has none
  if (!s.note.empty()) text += " | " + s.note;
  if (s.total_steps > 0 && s.step > s.first_step && s.step <= s.total_steps) {
    text += " | ETA " + duration_text(s.elapsed_seconds / static_cast<double>(s.step - s.first_step) *
                                      static_cast<double>(s.total_steps - s.step));
  }
  return text;
}

ProgressLine::ProgressLine(int64_t total_steps, int64_t first_step, std::FILE* out)
    : out_(out),
      tty_(::isatty(::fileno(out)) == 1),
      total_(total_steps),
      first_(first_step),
      start_(std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count()) {}

void ProgressLine::update(int64_t step, int64_t step_tokens, double loss, const std::string& note) {
  tokens_ += step_tokens;
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  ProgressState s;
  s.step = step;
  s.total_steps = total_;
  s.first_step = first_;
  s.elapsed_seconds = now - start_;
  s.tokens_per_second = s.elapsed_seconds > 0 ? static_cast<double>(tokens_) / s.elapsed_seconds : 0.0;
  s.loss = loss;
  s.note = note;
  const std::string text = progress_text(s);
  // "\033[K" clears what a longer previous line left on a terminal.
  if (tty_) std::fprintf(out_, "\r%s\033[K", text.c_str());
  else std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
  open_ = tty_;
}

void ProgressLine::finish() {
  if (open_) std::fputc('\n', out_);
  open_ = false;
  std::fflush(out_);
}

}  // namespace ringtrain::worker
