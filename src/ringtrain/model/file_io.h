// File reads and crash-safe writes (a temporary name in the same folder, then a rename). Errors name the path and
// the system's reason.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace ringtrain::model {

// Which file a path named when it was opened, and its version: a file renamed over it or rewritten in place since
// differs in one of them (the change time as well as the modification time: a tool can restore the latter).
struct FileIdentity {
  uint64_t device = 0, inode = 0, size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

// An open regular file for positioned reads (a directory, FIFO or device is refused at open).
class InputFile {
 public:
  explicit InputFile(const std::filesystem::path& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  uint64_t size() const { return identity_.size; }
  const FileIdentity& identity() const { return identity_; }
  const std::string& path() const { return path_; }
  // Reads exactly n bytes at `offset`; an error when the file is shorter (it changed under us).
  void read_at(uint64_t offset, void* dst, size_t n) const;

 private:
  std::string path_;
  int fd_ = -1;
  FileIdentity identity_;
};

// What read_file accepts besides a regular file: nothing (checkpoint and config files), or a pipe, socket or terminal
// (an input that a user may pipe in, like `--data /dev/stdin`; never another device, which may not end).
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
// Whether anything is at `path`, a link (even a dangling one) counted as itself, not followed.
bool exists_no_follow(const std::filesystem::path& path);
// fsync of a file or folder (after a rename, the folder's entry); errors name the path.
void sync_path(const std::filesystem::path& path);
// The name beside `path` that it is written under before the rename that puts it in place: hidden, marked with this
// process's id, and within the file system's 255 bytes whatever the length of path's name (a long name is cut and
// its hash added). An error naming `path` when its own name is longer than 255 bytes.
std::filesystem::path temporary_sibling(const std::filesystem::path& path);

// An exclusive lock on a folder that a run writes (checkpoints, metrics): flock on `dir`/.ringtrain.lock, made with the
// folder if need be and holding the owner's pid, so that a second run on the folder is refused (naming `what`, the
// folder and that pid) instead of interleaving its files with the first's. The system drops the lock when the process
// ends, however it ends, so nothing stale is left. Locks of one process on one folder nest.
class FolderLock {
 public:
  FolderLock(const std::filesystem::path& dir, const std::string& what);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  uint64_t device_ = 0, inode_ = 0;
};

// An error naming `what` and the folder at fault unless this process may remove the folder `dir` and everything in
// it, and rename `dir` in its parent: every folder in it (links not followed) readable, writable and searchable, and
// where a folder is sticky (mode +t, as /tmp), its entries or the folder this process's own. Checked before a save
// replaces `dir`, so that the new version is never published beside an old one that cannot go.
void check_removable(const std::filesystem::path& dir, const std::string& what);
// An empty file made under its own name, or left as it is when there: a marker, which must be whole or absent (a
// temporary name and a rename could leave a third state behind a kill).
void create_marker(const std::filesystem::path& path);
// A folder written beside its destination and renamed into place (DIR.saving, DIR.exporting), held by its writer
// with flock on the folder itself: a second writer of the same destination, in this process or another, is refused
// (naming `what` and the folder) instead of removing the first one's files as a leftover. The preparation (leftover
// removed, folder made) and the publication run with the parent folder locked, so that neither sees the other half
// done. The folder carries the empty file `marker` from its start, and a folder it replaces gets one before it moves,
// so that such a folder is known as ours wherever a kill leaves it. `remove` removes a folder of ours, or refuses to:
// a leftover that no writer holds (its writer was killed), the folder a publication replaced, and this folder when
// it is given up unpublished (the write failed; best effort). The parent is made if missing. On a file system
// without flock there is no exclusion.
class StagingFolder {
 public:
  using Remove = std::function<void(const std::filesystem::path&)>;
  StagingFolder(std::filesystem::path folder, std::string marker, std::string what, Remove remove);
  ~StagingFolder();
  StagingFolder(const StagingFolder&) = delete;
  StagingFolder& operator=(const StagingFolder&) = delete;
  const std::filesystem::path& path() const { return path_; }
  // Puts the folder in place of `dest`, with the parent folder locked: renamed to `dest` when nothing is there;
  // otherwise `dest`, accepted by check_replaceable (which throws to refuse) and check_removable, is marked,
  // exchanged with the folder atomically (renameat2 RENAME_EXCHANGE; where the file system cannot, moved to `aside`
  // first, and back if the folder cannot take its name) and removed; a failure of that last removal is a warning,
  // the new version being in place. The published folder loses its marker.
  void publish(const std::filesystem::path& dest, const std::filesystem::path& aside,
               const std::function<void(const std::filesystem::path&)>& check_replaceable);

 private:
  std::filesystem::path path_;
  std::string marker_, what_;
  Remove remove_;
  int fd_ = -1;  // the folder, locked
  bool published_ = false;
};

// Removes `path` (a staging folder left by a save or export that died) with `remove`, unless a StagingFolder in this
// process or another still holds it; returns whether it did. Under the parent folder's lock, as StagingFolder's own
// steps are. `what` names the operation in errors.
bool remove_unless_held(const std::filesystem::path& path, const std::string& what,
                        const StagingFolder::Remove& remove);

}  // namespace ringtrain::model
