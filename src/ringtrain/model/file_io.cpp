#include "ringtrain/model/file_io.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <thread>
#include <utility>

#include "ringtrain/core/error.h"
#include "ringtrain/core/log.h"
#include "ringtrain/core/sys_error.h"

namespace ringtrain::model {
namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

void write_all(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      throw Error(sys_message("cannot write", path, err));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

InputFile::InputFile(const std::filesystem::path& path) : path_(path.string()) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) throw_sys_error("cannot open", path_);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw Error(sys_message("cannot stat", path_, err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw Error(cat("cannot read ", path_, ": it is ", file_kind(st.st_mode), ", expected a regular file"));
  }
  identity_ = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
               int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec,
               int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec};
}

InputFile::~InputFile() { ::close(fd_); }

void InputFile::read_at(uint64_t offset, void* dst, size_t n) const {
  char* out = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd_, out, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw_sys_error("cannot read", path_);
    RT_CHECK(got > 0, "cannot read ", path_, ": the file ends at byte ", offset, ", ", n,
             " more bytes expected (it was truncated while being read)");
    out += got, offset += static_cast<uint64_t>(got), n -= static_cast<size_t>(got);
  }
}

std::string read_file(const std::filesystem::path& path, FileSource source) {
  const std::string name = path.string();
  // O_NONBLOCK where only a regular file will do: opening a FIFO must not wait for a writer; it is refused below.
  const int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC | (source == FileSource::RegularFile ? O_NONBLOCK : 0));
  if (fd < 0) throw_sys_error("cannot open", name);
  std::string bytes;
  try {
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw_sys_error("cannot stat", name);
    RT_CHECK(!S_ISDIR(st.st_mode), "cannot read ", name, ": it is a directory, expected a file");
    // A stream is a pipe, a socket or a terminal: a device such as /dev/zero would be read until memory ran out.
    const bool stream = S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) || (S_ISCHR(st.st_mode) && ::isatty(fd) == 1);
    RT_CHECK(S_ISREG(st.st_mode) || (source == FileSource::Stream && stream), "cannot read ", name, ": it is ",
             file_kind(st.st_mode),
             source == FileSource::Stream ? ", expected a regular file, a pipe or a terminal" : ", expected a regular file");
    // Sequential reads, so that pipes (--data /dev/stdin) work too.
    if (S_ISREG(st.st_mode)) bytes.reserve(static_cast<size_t>(st.st_size));
    char buf[1 << 16];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_sys_error("cannot read", name);
      if (n == 0) break;
      bytes.append(buf, static_cast<size_t>(n));
    }
  } catch (const std::bad_alloc&) {
    ::close(fd);
    throw Error(cat("cannot read ", name, ": out of memory after ", bytes.size(), " bytes"));
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return bytes;
}

void check_replaceable(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw_sys_error("cannot inspect", path.string());
  }
  RT_CHECK(S_ISREG(st.st_mode), "refusing to replace ", path.string(), ": it is ", file_kind(st.st_mode),
           ", not a regular file");
}

void sync_path(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_sys_error("cannot open", path.string());
  const int rc = ::fsync(fd), err = errno;
  ::close(fd);
  // Some file systems cannot sync a folder (EINVAL); the data itself was synced before the rename.
  if (rc != 0 && err != EINVAL) throw Error(sys_message("cannot sync", path.string(), err));
}

bool exists_no_follow(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::symlink_status(path, ec).type() != std::filesystem::file_type::not_found && !ec;
}

std::filesystem::path temporary_sibling(const std::filesystem::path& path) {
  constexpr size_t kMaxName = 255;  // bytes of one name (NAME_MAX) on Linux's file systems
  constexpr size_t kKeptBytes = 200;  // of a long name: with its hash and the suffix, well within kMaxName
  const std::string name = path.filename().string();
  RT_CHECK(name.size() <= kMaxName, path.string(), ": its name is ", name.size(), " bytes long; a file system allows ",
           kMaxName);
  const std::string suffix = cat(".tmp.", ::getpid());
  std::string stem = "." + name;
  if (stem.size() + suffix.size() > kMaxName) {
    char hash[24];
    std::snprintf(hash, sizeof hash, "~%016zx", std::hash<std::string>{}(name));
    stem = stem.substr(0, kKeptBytes) + hash;
  }
  return path.parent_path() / (stem + suffix);
}

void write_file_atomic(const std::filesystem::path& path, std::string_view bytes) {
  write_file_atomic(path, [&](const ByteSink& sink) { sink(bytes); });
}

void write_file_atomic(const std::filesystem::path& path, const std::function<void(const ByteSink& sink)>& produce) {
  const std::string tmp = temporary_sibling(path).string();
  check_replaceable(path);
  const std::string target = path.string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw_sys_error("cannot create", tmp);
  bool open = true;
  try {
    produce([&](std::string_view bytes) { write_all(fd, bytes, tmp); });
    if (::fsync(fd) != 0) throw_sys_error("cannot sync", tmp);
    open = false;
    if (::close(fd) != 0) throw_sys_error("cannot close", tmp);
  } catch (...) {
    if (open) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(sys_message(cat("cannot rename ", tmp, " to"), target, err));
  }
}

namespace {

// The folder locks this process holds: (device, inode) of the lock file -> its descriptor and how often it is held
// (flock would refuse a second descriptor of the same process).
struct HeldLocks {
  std::mutex mutex;
  std::map<std::pair<uint64_t, uint64_t>, std::pair<int, int>> held;
};
HeldLocks& held_locks() {
  static HeldLocks locks;
  return locks;
}

}  // namespace

FolderLock::FolderLock(const std::filesystem::path& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  RT_CHECK(std::filesystem::is_directory(dir), what, " = ", dir.string(), ": not a directory",
           ec ? cat(" (", ec.message(), ")") : std::string());
  const std::filesystem::path file = dir / ".ringtrain.lock";
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0) throw_sys_error(cat(what, ": cannot open the run lock"), file.string());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(sys_message(cat(what, ": cannot inspect the run lock"), file.string(), err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(cat(what, ": the run lock ", file.string(), " is ", file_kind(st.st_mode), ", not a regular file"));
  }
  device_ = static_cast<uint64_t>(st.st_dev);
  inode_ = static_cast<uint64_t>(st.st_ino);
  HeldLocks& locks = held_locks();
  const std::lock_guard<std::mutex> guard(locks.mutex);
  if (auto it = locks.held.find({device_, inode_}); it != locks.held.end()) {
    ::close(fd);
    ++it->second.second;
    return;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char owner[32] = {};
    const ssize_t n = ::pread(fd, owner, sizeof owner - 1, 0);
    ::close(fd);
    std::string pid = n > 0 ? std::string(owner, static_cast<size_t>(n)) : std::string();
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == '\r')) pid.pop_back();
    if (err == EWOULDBLOCK)
      throw Error(cat(what, " = ", dir.string(), ": another run is writing there",
                      pid.empty() ? std::string() : cat(" (process ", printable(pid, false), ")"),
                      "; wait for it to end, or choose another folder"));
    throw Error(sys_message(cat(what, ": cannot lock"), file.string(), err));
  }
  const std::string pid = cat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int err = errno;
    ::close(fd);
    throw Error(sys_message(cat(what, ": cannot write the run lock"), file.string(), err));
  }
  locks.held.emplace(std::make_pair(device_, inode_), std::make_pair(fd, 1));
}

FolderLock::~FolderLock() {
  HeldLocks& locks = held_locks();
  const std::lock_guard<std::mutex> guard(locks.mutex);
  auto it = locks.held.find({device_, inode_});
  if (it == locks.held.end() || --it->second.second > 0) return;
  ::close(it->second.first);  // drops the lock
  locks.held.erase(it);
}

namespace {

// flock's answers on a file system that has no locks: writers there are not excluded.
bool no_locks(int err) { return err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL; }

// The parent folder of staging folders, locked for the short preparation and publication sections of their writers;
// a writer waits for another's section, up to kWait.
class ParentLock {
 public:
  ParentLock(const std::filesystem::path& dir, const std::string& what) {
    constexpr std::chrono::seconds kWait{600};
    fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) throw_sys_error(cat(what, ": cannot open the folder"), dir.string());
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EWOULDBLOCK && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      if (no_locks(err)) return;
      ::close(fd_);
      if (err == EWOULDBLOCK)
        throw Error(cat(what, ": another writer has held the folder ", dir.string(), " for more than ", kWait.count(),
                        " s; is a save there stuck?"));
      throw Error(sys_message(cat(what, ": cannot lock the folder"), dir.string(), err));
    }
  }
  ~ParentLock() { ::close(fd_); }
  ParentLock(const ParentLock&) = delete;
  ParentLock& operator=(const ParentLock&) = delete;

 private:
  int fd_ = -1;
};

std::filesystem::path parent_of(const std::filesystem::path& p) {
  return p.parent_path().empty() ? std::filesystem::path(".") : p.parent_path();
}

}  // namespace

void check_removable(const std::filesystem::path& dir, const std::string& what) {
  const uid_t me = ::geteuid();
  const auto refuse = [&](const std::filesystem::path& at, const std::string& why) {
    throw Error(cat(what, ": ", dir.string(), " cannot be replaced, since this process cannot remove ", at.string(),
                    " (", why, "); make it removable, or write elsewhere"));
  };
  const auto stat_of = [&](const std::filesystem::path& p) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) refuse(p, std::strerror(errno));
    return st;
  };
  // An entry of a sticky folder goes only by its owner, the folder's, or root.
  const auto check_entry = [&](const std::filesystem::path& entry, const struct stat& folder) {
    if (me == 0 || !(folder.st_mode & S_ISVTX) || folder.st_uid == me) return;
    if (stat_of(entry).st_uid != me) refuse(entry, "its folder is sticky and neither is this user's");
  };
  const auto check_folder = [&](const std::filesystem::path& folder) {
    if (::access(folder.c_str(), R_OK | W_OK | X_OK) != 0) refuse(folder, cat("its folder: ", std::strerror(errno)));
    const struct stat st = stat_of(folder);
    std::error_code ec;
    for (const std::filesystem::directory_entry& e : std::filesystem::directory_iterator(folder, ec))
      check_entry(e.path(), st);
    if (ec) refuse(folder, ec.message());
  };
  check_entry(dir, stat_of(parent_of(dir)));
  check_folder(dir);
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec); !ec && it != decltype(it)(); it.increment(ec))
    if (it->symlink_status().type() == std::filesystem::file_type::directory) check_folder(it->path());
  if (ec) refuse(dir, ec.message());
}

void create_marker(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) throw_sys_error("cannot create", path.string());
  const int rc = ::fsync(fd), err = errno;
  ::close(fd);
  if (rc != 0) throw Error(sys_message("cannot sync", path.string(), err));
}

namespace {

void move_in_moving_aside(const std::filesystem::path& staged, const std::filesystem::path& dest,
                          const std::filesystem::path& aside, const std::string& what) {
  std::filesystem::rename(dest, aside);
  std::error_code moved;
  std::filesystem::rename(staged, dest, moved);
  if (!moved) return;
  std::error_code ignored;
  std::filesystem::rename(aside, dest, ignored);
  throw Error(cat(what, ": cannot rename ", staged.string(), " to ", dest.string(), ": ", moved.message()));
}

// The folder `staged` put in place of the folder `dest`: exchanged atomically, or with `dest` first moved to `aside`
// (a leftover there given to remove_leftover first). Returns where the replaced folder now is.
std::filesystem::path replace_folder(const std::filesystem::path& staged, const std::filesystem::path& dest,
                                     const std::filesystem::path& aside,
                                     const std::function<void(const std::filesystem::path&)>& remove_leftover,
                                     const std::string& what) {
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, dest.c_str(), RENAME_EXCHANGE) == 0) return staged;
  if (exists_no_follow(aside)) remove_leftover(aside);
  move_in_moving_aside(staged, dest, aside, what);
  return aside;
}

// remove_unless_held with the parent folder's lock already taken.
bool remove_unless_held_locked(const std::filesystem::path& path, const StagingFolder::Remove& remove) {
  // A folder that its writer still holds is being written; one that nobody holds is a leftover.
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    ::close(fd);
    return false;
  }
  try {
    remove(path);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    throw;
  }
  if (fd >= 0) ::close(fd);
  return true;
}

}  // namespace

bool remove_unless_held(const std::filesystem::path& path, const std::string& what,
                        const StagingFolder::Remove& remove) {
  const ParentLock section(parent_of(path), what);
  return remove_unless_held_locked(path, remove);
}

StagingFolder::StagingFolder(std::filesystem::path folder, std::string marker, std::string what, Remove remove)
    : path_(std::move(folder)), marker_(std::move(marker)), what_(std::move(what)), remove_(std::move(remove)) {
  const std::filesystem::path parent = parent_of(path_);
  std::error_code made;
  std::filesystem::create_directories(parent, made);
  if (made) throw Error(cat(what_, ": cannot make the folder ", parent.string(), ": ", made.message()));
  const ParentLock section(parent, what_);
  if (exists_no_follow(path_) && !remove_unless_held_locked(path_, remove_))
    throw Error(cat(what_, ": another save or export to the same folder is writing ", path_.string(),
                    " (in this process or another); wait for it to end, or choose another folder"));
  if (::mkdir(path_.c_str(), 0755) != 0) throw_sys_error(cat(what_, ": cannot make"), path_.string());
  fd_ = ::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd_ < 0) throw_sys_error(cat(what_, ": cannot open"), path_.string());
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0 && !no_locks(errno)) {
    const int err = errno;
    ::close(fd_);
    throw Error(sys_message(cat(what_, ": cannot lock"), path_.string(), err));
  }
  try {
    create_marker(path_ / marker_);
  } catch (...) {
    ::close(fd_);
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
    throw;
  }
}

StagingFolder::~StagingFolder() {
  if (!published_) {  // still ours (held): a failed write leaves nothing behind, or a leftover the next one clears
    try {
      remove_(path_);
    } catch (const std::exception&) {
    }
  }
  ::close(fd_);
}

void StagingFolder::publish(const std::filesystem::path& dest, const std::filesystem::path& aside,
                            const std::function<void(const std::filesystem::path&)>& check_replaceable) {
  const ParentLock section(parent_of(path_), what_);
  if (!exists_no_follow(dest)) {
    std::filesystem::rename(path_, dest);
    published_ = true;
    std::filesystem::remove(dest / marker_);
    return;
  }
  check_replaceable(dest);
  check_removable(dest, what_);
  create_marker(dest / marker_);
  const std::filesystem::path replaced = replace_folder(path_, dest, aside, remove_, what_);
  published_ = true;
  std::filesystem::remove(dest / marker_);
  try {
    remove_(replaced);
  } catch (const std::exception& e) {
    RT_LOG(Warn, what_, ": done, but what it replaced, now ", replaced.string(), ", could not be removed: ", e.what());
  }
}

}  // namespace ringtrain::model
