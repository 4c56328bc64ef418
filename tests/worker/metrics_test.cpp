// Metrics: the event file read back record by record (both CRCs checked with an independent bitwise CRC32C, the
// payloads decoded with the generated classes), metrics.jsonl read back, refusals to write through symlinks or
// into non-directories, and the progress line's text.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "ringtrain/core/error.h"
#include "ringtrain/model/file_io.h"
#include "ringtrain/worker/metrics.h"
#include "ringtrain/worker/tensorboard_event.pb.h"
#include "test_util.h"

namespace ringtrain::worker {
namespace {

namespace fs = std::filesystem;

// CRC32C bit by bit (no table), as the definition states it: the reference for the library's table-driven one.
uint32_t bitwise_crc32c(const std::string& bytes) {
  uint32_t c = 0xffffffffu;
  for (unsigned char byte : bytes) {
    c ^= byte;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
  }
  return ~c;
}
uint32_t mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

uint64_t le64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}
uint32_t le32(const std::string& s, size_t at) {
  return static_cast<uint32_t>(le64(s.substr(at, 4) + std::string(4, '\0'), 0));
}

// Splits an event file into its payloads, checking the framing and both CRCs of every record.
std::vector<std::string> read_records(const fs::path& file) {
  const std::string bytes = model::read_file(file);
  std::vector<std::string> out;
  size_t at = 0;
  while (at < bytes.size()) {
    EXPECT_LE(at + 12, bytes.size()) << "truncated record header";
    if (at + 12 > bytes.size()) break;
    const uint64_t len = le64(bytes, at);
    EXPECT_EQ(le32(bytes, at + 8), mask(bitwise_crc32c(bytes.substr(at, 8)))) << "length CRC of record " << out.size();
    EXPECT_LE(at + 12 + len + 4, bytes.size()) << "truncated record";
    if (at + 12 + len + 4 > bytes.size()) break;
    const std::string payload = bytes.substr(at + 12, len);
    EXPECT_EQ(le32(bytes, at + 12 + len), mask(bitwise_crc32c(payload))) << "payload CRC of record " << out.size();
    out.push_back(payload);
    at += 12 + len + 4;
  }
  return out;
}

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("rt_metrics_test_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  return d;
}

TEST(WorkerMetrics, Crc32cMatchesTheBitwiseDefinition) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);  // the CRC-32C check value
  std::mt19937_64 rng(testing::fresh_seed());
  for (int trial = 0; trial < 50; ++trial) {
    std::string bytes(rng() % 300, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    EXPECT_EQ(crc32c(bytes.data(), bytes.size()), bitwise_crc32c(bytes));
    EXPECT_EQ(masked_crc32c(bytes.data(), bytes.size()), mask(bitwise_crc32c(bytes)));
  }
}

TEST(WorkerMetrics, EventFileAndJsonlReadBack) {
  const fs::path dir = temp_dir("events");
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<Scalars> written;
  fs::path events_path;
  {
    MetricsWriter w(dir / "run");
    for (int64_t step = 1; step <= 5; ++step) {
      Scalars s = {{"loss", std::normal_distribution<double>(2.0, 0.5)(rng)},
                   {"grad_norm", std::exponential_distribution<double>()(rng)},
                   {"lr", 1e-5 * static_cast<double>(step)}, {"skipped", 0.0}};
      if (step == 3) s.push_back({"reward/mean", std::nan("")});
      if (step == 4) s.push_back({"clip_fraction", -0.0});
      w.write(step, s);
      written.push_back(s);
    }
    events_path = w.events()->path();
    // Flushed after every step: readable while the writer is still open.
    EXPECT_EQ(read_records(events_path).size(), 6u);
  }
  EXPECT_EQ(events_path.parent_path(), dir / "run");
  EXPECT_EQ(events_path.filename().string().rfind("events.out.tfevents.", 0), 0u) << events_path;

  const std::vector<std::string> records = read_records(events_path);
  ASSERT_EQ(records.size(), 6u);
  tb::Event first;
  ASSERT_TRUE(first.ParseFromString(records[0]));
  EXPECT_EQ(first.file_version(), "brain.Event:2");
  EXPECT_GT(first.wall_time(), 1.7e9);
  for (size_t i = 1; i < records.size(); ++i) {
    tb::Event e;
    ASSERT_TRUE(e.ParseFromString(records[i]));
    EXPECT_EQ(e.step(), static_cast<int64_t>(i));
    EXPECT_GE(e.wall_time(), first.wall_time());
    const Scalars& want = written[i - 1];
    ASSERT_EQ(e.summary().value_size(), static_cast<int>(want.size()));
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(e.summary().value(static_cast<int>(k)).tag(), want[k].first);
      const tb::SummaryValue& v = e.summary().value(static_cast<int>(k));
      // Every value on the wire, 0 included (field 2, fixed32: tag byte 0x15 and the 4 bytes of the float last).
      const std::string wire = v.SerializeAsString();
      ASSERT_GE(wire.size(), 5u);
      EXPECT_EQ(static_cast<unsigned char>(wire[wire.size() - 5]), 0x15) << want[k].first;
      const float got = v.simple_value();
      if (std::isnan(want[k].second)) EXPECT_TRUE(std::isnan(got));
      else EXPECT_EQ(got, static_cast<float>(want[k].second));  // float32 in the file: exact after rounding
    }
  }

  std::ifstream jsonl(dir / "run" / "metrics.jsonl");
  std::string line;
  for (size_t i = 0; i < written.size(); ++i) {
    ASSERT_TRUE(std::getline(jsonl, line));
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("step").get<int64_t>(), static_cast<int64_t>(i + 1));
    for (const auto& [name, value] : written[i]) {
      if (std::isnan(value)) EXPECT_TRUE(j.at(name).is_null());
      else EXPECT_EQ(j.at(name).get<double>(), value);  // JSON doubles round-trip exactly
    }
  }
  EXPECT_FALSE(std::getline(jsonl, line));

  fs::remove_all(dir);
}

// The steps of metrics.jsonl in file order.
std::vector<int64_t> jsonl_steps(const fs::path& file) {
  std::vector<int64_t> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  return out;
}

// The steps of the summary records of every event file in DIR, files in name order (as TensorBoard reads them).
std::vector<int64_t> event_steps(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<int64_t> out;
  for (const fs::path& f : files) {
    for (const std::string& r : read_records(f)) {
      tb::Event e;
      EXPECT_TRUE(e.ParseFromString(r));
      if (e.has_summary()) out.push_back(e.step());
    }
  }
  return out;
}

// A fresh writer refuses an earlier run's metrics (naming the file); overwrite replaces them; continuing after step N
// keeps steps 1..N of both the JSONL and the event file and drops the later ones (a killed run's cut-off last line
// and last record included), so a resumed run writes every step once.
TEST(WorkerMetrics, EarlierRunIsRefusedReplacedOrContinued) {
  const fs::path dir = temp_dir("earlier") / "run";
  const auto run = [&](MetricsStart start, int64_t first, int64_t last) {
    MetricsWriter w(dir, true, start);
    for (int64_t step = first; step <= last; ++step) w.write(step, {{"loss", static_cast<double>(step)}});
    return w.events()->path();
  };
  const fs::path first_events = run(MetricsStart::fresh(), 1, 6);
  try {
    MetricsWriter w(dir, true);
    ADD_FAILURE() << "a fresh writer took an earlier run's metrics";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "metrics.jsonl").string() + " holds the metrics of an earlier run"),
              std::string::npos) << e.what();
  }
  EXPECT_EQ(jsonl_steps(dir / "metrics.jsonl"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));

  // A run killed while writing: half a line, half a record.
  { std::ofstream(dir / "metrics.jsonl", std::ios::app) << "{\"step\": 7, \"lo"; }
  {
    std::ofstream(first_events, std::ios::app | std::ios::binary) << std::string("\x20\x00\x00", 3);
  }
  run(MetricsStart::continue_after(4), 5, 8);
  EXPECT_EQ(jsonl_steps(dir / "metrics.jsonl"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(event_steps(dir), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));

  // Resuming with nothing kept (no checkpoint yet) starts the records again.
  run(MetricsStart::continue_after(0), 1, 2);
  EXPECT_EQ(jsonl_steps(dir / "metrics.jsonl"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(event_steps(dir), (std::vector<int64_t>{1, 2}));

  // An event file alone is an earlier run too; overwrite removes both kinds.
  fs::remove(dir / "metrics.jsonl");
  EXPECT_THROW(MetricsWriter(dir, false), Error);
  run(MetricsStart::overwrite(), 1, 3);
  EXPECT_EQ(jsonl_steps(dir / "metrics.jsonl"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(event_steps(dir), (std::vector<int64_t>{1, 2, 3}));

  // A line that is not ours, or a damaged record, is named rather than rewritten away.
  { std::ofstream(dir / "metrics.jsonl", std::ios::app) << "not json\n"; }
  EXPECT_THROW(MetricsWriter(dir, true, MetricsStart::continue_after(1)), Error);
  // Steps outside int64's non-negative range are not ours either (2^64 - 1 would wrap to -1 and be kept).
  for (const char* step : {"18446744073709551615", "-1", "9223372036854775808"}) {
    SCOPED_TRACE(step);
    run(MetricsStart::overwrite(), 1, 2);
    { std::ofstream(dir / "metrics.jsonl", std::ios::app) << "{\"step\": " << step << "}\n"; }
    try {
      MetricsWriter w(dir, true, MetricsStart::continue_after(1));
      ADD_FAILURE() << "a record of step " << step << " was taken for ours";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("metrics.jsonl:3: not a metrics record"), std::string::npos) << e.what();
    }
  }
  fs::remove_all(dir.parent_path());
}

TEST(WorkerMetrics, RefusesSymlinksAndNonDirectories) {
  const fs::path dir = temp_dir("hostile");
  fs::create_directories(dir / "run");
  std::ofstream(dir / "target") << "keep";
  fs::create_symlink(dir / "target", dir / "run" / "metrics.jsonl");
  EXPECT_THROW(MetricsWriter(dir / "run", false), Error);
  EXPECT_EQ(model::read_file(dir / "target"), "keep");
  std::ofstream(dir / "file") << "x";
  EXPECT_THROW(MetricsWriter(dir / "file"), Error);
  fs::create_directories(dir / "run2" / "metrics.jsonl");
  EXPECT_THROW(MetricsWriter(dir / "run2", false), Error);
  MetricsWriter ok(dir / "run3", false);
  EXPECT_THROW(ok.write(1, {{"step", 1.0}}), Error);
  fs::remove_all(dir);
}

TEST(WorkerMetrics, ProgressText) {
  ProgressState s;
  s.step = 12;
  s.total_steps = 100;
  s.tokens_per_second = 2345.4;
  s.loss = 1.23456;
  s.elapsed_seconds = 24.0;  // 2 s per step, 88 steps left
  EXPECT_EQ(progress_text(s), "step 12/100 | 2,345 tok/s | loss 1.235 | ETA 2m56s");
  s.total_steps = 0;
  s.tokens_per_second = 1234567.0;
  EXPECT_EQ(progress_text(s), "step 12 | 1,234,567 tok/s | loss 1.235");
  s.total_steps = 10000;
  s.tokens_per_second = std::nan("");
  s.loss = std::nan("");
  EXPECT_EQ(progress_text(s), "step 12/10000 | 0 tok/s | loss - | ETA 5h32m");  // 9988 steps x 2 s
  // Resumed after 9 steps: the 24 s are this run's 3 steps, 8 s each.
  s.first_step = 9;
  s.total_steps = 100;
  EXPECT_EQ(progress_text(s), "step 12/100 | 0 tok/s | loss - | ETA 11m44s");
  s.step = 9;  // no step of this run yet: no pace to tell
  EXPECT_EQ(progress_text(s), "step 9/100 | 0 tok/s | loss -");
}

TEST(WorkerMetrics, ProgressLineOnAPipeIsPlainLines) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::FILE* w = ::fdopen(fds[1], "w");
  {
    ProgressLine line(3, 0, w);
    line.update(1, 100, 2.0);
    line.update(2, 100, 1.5);
    line.finish();
  }
  std::fclose(w);
  std::string text;
  char buf[256];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
  EXPECT_EQ(text.rfind("step 1/3 | ", 0), 0u) << text;
  EXPECT_NE(text.find("\nstep 2/3 | "), std::string::npos) << text;
  EXPECT_NE(text.find("loss 1.5"), std::string::npos) << text;
}

// On a terminal the line is rewritten in place: a carriage return before each update, the rest of a longer earlier
// line cleared, one newline at the end.
TEST(WorkerMetrics, ProgressLineOnATerminalIsRewrittenInPlace) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(::grantpt(master), 0);
  ASSERT_EQ(::unlockpt(master), 0);
  const int terminal = ::open(::ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(terminal, 0);
  struct termios raw {};
  ASSERT_EQ(::tcgetattr(terminal, &raw), 0);
  ::cfmakeraw(&raw);  // no newline translation: the bytes arrive as written
  ASSERT_EQ(::tcsetattr(terminal, TCSANOW, &raw), 0);
  std::FILE* w = ::fdopen(terminal, "w");
  {
    ProgressLine line(2, 0, w);
    line.update(1, 10, 0.5);
    line.update(2, 10, 0.25);
    line.finish();
  }
  std::fclose(w);
  std::string text;
  char buf[256];
  ssize_t n;
  while ((n = ::read(master, buf, sizeof buf)) > 0) {
    text.append(buf, static_cast<size_t>(n));
    if (text.find('\n') != std::string::npos) break;
  }
  ::close(master);
  EXPECT_EQ(text.rfind("\rstep 1/2 | ", 0), 0u) << text;
  EXPECT_NE(text.find("\033[K\rstep 2/2 | "), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  EXPECT_EQ(text.back(), '\n') << text;
}

}  // namespace
}  // namespace ringtrain::worker
