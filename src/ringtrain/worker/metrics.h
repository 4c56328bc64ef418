// Per-step metrics: one JSON object per step in DIR/metrics.jsonl and the same scalars in a TensorBoard event file
// DIR/events.out.tfevents.<seconds>.<host>, both flushed after every step; and a progress line for the terminal.
//
// Event files are records of: uint64 length (little endian), its masked CRC32C, the payload (an Event message,
// tensorboard_event.proto), the payload's masked CRC32C. The first record carries file_version "brain.Event:2".
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ringtrain::worker {

// CRC32C (Castagnoli, reflected polynomial 0x82f63b78), table-driven one byte at a time, and TensorBoard's mask:
// ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

using Scalars = std::vector<std::pair<std::string, double>>;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;  // name -> value, in the order they are written

// Appends framed records to a new event file (never replacing an existing one).
class EventFileWriter {
 public:
  // Creates DIR/events.out.tfevents.<seconds>.<host> (a suffix is added when that name exists).
  explicit EventFileWriter(const std::filesystem::path& dir);

  // One Event with a Summary of simple_value scalars (float32; a non-finite value is written as it is).
  void write_scalars(int64_t step, double wall_time, const Scalars& values);
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& payload);
  std::filesystem::path path_;
  FilePtr file_;
};

// What a run does with the metrics an earlier run left in its folder (metrics.jsonl, event files): a fresh run
// refuses them (two runs' steps in one file cannot be told apart), an explicit overwrite removes them, and a resumed
// run keeps the steps up to its checkpoint's and drops the later ones, which it is about to write again.
struct MetricsStart {
  enum class Mode : uint8_t { Fresh, Overwrite, Continue };
  Mode mode = Mode::Fresh;
  int64_t after_step = 0;  // Continue: records of steps > after_step are dropped

  static MetricsStart fresh() { return {}; }
  static MetricsStart overwrite() { return {Mode::Overwrite, 0}; }
  static MetricsStart continue_after(int64_t step) { return {Mode::Continue, step}; }
};

// Which files of an earlier run count: its records (a non-empty metrics.jsonl), or also an event file (one of a run
// that took no step holds only its header).
enum class EarlierMetrics : uint8_t { Records, RecordsOrEventFiles };
// An error naming the file when DIR holds metrics of an earlier run, for a fresh run to refuse before it loads any
// weight. `hint` ends the message (which options avoid the refusal).
void check_no_earlier_metrics(const std::filesystem::path& dir, EarlierMetrics what, const std::string& hint);

// DIR/metrics.jsonl, the records' file of a metrics folder.
std::filesystem::path metrics_jsonl(const std::filesystem::path& dir);

// metrics.jsonl (appended to what `start` keeps of an earlier run's) and, unless disabled, a new event file.
class MetricsWriter {
 public:
  explicit MetricsWriter(const std::filesystem::path& dir, bool tensorboard = true,
                         MetricsStart start = MetricsStart::fresh());

  // {"step": step, "wall_time": seconds since the epoch, name: value, ...}; a non-finite value is written as null
  // (JSON has no NaN) and in the event file as the float it is.
  void write(int64_t step, const Scalars& values);
  const EventFileWriter* events() const { return events_.get(); }

 private:
  std::filesystem::path jsonl_path_;
  FilePtr jsonl_;
  std::unique_ptr<EventFileWriter> events_;
};

// What the progress line shows.
struct ProgressState {
  int64_t step = 0, total_steps = 0;  // total 0 = unknown (no ETA)
  int64_t first_step = 0;             // steps done before this run (a resumed run's checkpoint): not in elapsed
  double tokens_per_second = 0;
  double loss = 0;
  double elapsed_seconds = 0;
  std::string note;  // appended after the loss when not empty (e.g. "reward 0.71")
};
// "step 12/100 | 2,345 tok/s | loss 1.2345 | NOTE | ETA 3m05s"
std::string progress_text(const ProgressState& s);

// Writes progress_text to a stream: rewritten in place (\r) when the stream is a terminal, one line per update
// otherwise (logs stay readable).
class ProgressLine {
 public:
  // `first_step`: the steps done before this run (a resumed run's), which the ETA's pace leaves out.
  explicit ProgressLine(int64_t total_steps, int64_t first_step = 0, std::FILE* out = stderr);
  // After each step: its tokens (all ranks) and loss; time is measured from construction.
  void update(int64_t step, int64_t step_tokens, double loss, const std::string& note = "");
  void finish();  // ends a terminal line with a newline

 private:
  std::FILE* out_;
  bool tty_;
  int64_t total_, first_, tokens_ = 0;
  double start_;
  bool open_ = false;
};

}  // namespace ringtrain::worker
