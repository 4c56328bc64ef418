#include "ringtrain/worker/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "ringtrain/core/error.h"
#include "ringtrain/worker/tensorboard_event.pb.h"

namespace ringtrain::worker {
namespace {

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

}  // namespace

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

MetricsWriter::MetricsWriter(const std::filesystem::path& dir, bool tensorboard) {
  ensure_directory(dir);
  jsonl_path_ = dir / "metrics.jsonl";
  jsonl_ = open_for_writing(jsonl_path_, O_APPEND);
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
  text += cat(" | loss ", loss);
  if (!s.note.empty()) text += " | " + s.note;
  if (s.total_steps > 0 && s.step > 0 && s.step <= s.total_steps) {
    text += " | ETA " + duration_text(s.elapsed_seconds / static_cast<double>(s.step) *
                                      static_cast<double>(s.total_steps - s.step));
  }
  return text;
}

ProgressLine::ProgressLine(int64_t total_steps, std::FILE* out)
    : out_(out),
      tty_(::isatty(::fileno(out)) == 1),
      total_(total_steps),
      start_(std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count()) {}

void ProgressLine::update(int64_t step, int64_t step_tokens, double loss, const std::string& note) {
  tokens_ += step_tokens;
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  ProgressState s;
  s.step = step;
  s.total_steps = total_;
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
