// File reads and crash-safe writes (a temporary name in the same folder, then a rename). Errors name the path and
// the system's reason.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace ringtrain::model {

// An open regular file for positioned reads (a directory, FIFO or device is refused at open).
class InputFile {
 public:
  explicit InputFile(const std::filesystem::path& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Reads exactly n bytes at `offset`; an error when the file is shorter (it changed under us).
  void read_at(uint64_t offset, void* dst, size_t n) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// What read_file accepts besides a regular file: nothing (checkpoint and config files), or a pipe, terminal or
// other stream (an input that a user may pipe in, like `--data /dev/stdin`).
enum class FileSource : uint8_t { RegularFile, Stream };
// The whole file; anything else is an error naming it and what it is.
std::string read_file(const std::filesystem::path& path, FileSource source = FileSource::RegularFile);
// Writes `bytes` to a temporary file next to `path`, syncs it and renames it over `path`; a failed write leaves
// `path` untouched. Refuses a `path` that exists and is not a regular file (a symlink, FIFO or device).
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);
// The same with the bytes given piece by piece to `sink` by `produce` (no copy of the whole file in memory).
using ByteSink = std::function<void(std::string_view)>;
void write_file_atomic(const std::filesystem::path& path, const std::function<void(const ByteSink& sink)>& produce);
// The same check on its own: an error unless `path` is absent or a regular file (symlinks are not followed).
void check_replaceable(const std::filesystem::path& path);
// fsync of a file or folder (after a rename, the folder's entry); errors name the path.
void sync_path(const std::filesystem::path& path);

}  // namespace ringtrain::model
