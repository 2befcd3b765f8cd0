// AtomicFile: an exclusive temporary file beside the destination, written with retried write(2), then
// fsync -> close -> rename(2) -> fsync of the directory; removed on any path that does not reach the rename.
#include "fp8kit/io/atomic_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "fp8kit/common/error.hpp"

namespace fp8kit {
namespace {

std::atomic<unsigned> g_sequence{0};

std::filesystem::path directory_of(const std::filesystem::path& file) {
  const std::filesystem::path parent = file.parent_path();
  return parent.empty() ? std::filesystem::path(".") : parent;
}

[[noreturn]] void fail(const std::string& what, int err) {
  FP8KIT_THROW(ErrorKind::kIo, what, ": ", std::strerror(err));
}

// Removes the temporary files of earlier writers of the same destination that died before commit() (killed, out
// of power): `.<name>.tmp-*` in the directory whose writer's lock is gone. A live writer holds its temporary
// file's flock until it commits or discards (across hosts too, on NFS), so its file is never touched. Best effort:
// whatever cannot be opened, locked or removed is left.
void remove_abandoned(const std::filesystem::path& directory, const std::string& stem) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(directory, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(stem)) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat opened {
    }, named{};
    // Unlinked only while locked and still the file under that name (not one created since by another writer).
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &opened) == 0 && S_ISREG(opened.st_mode) &&
        ::lstat(e.path().c_str(), &named) == 0 && opened.st_ino == named.st_ino && opened.st_dev == named.st_dev) {
      ::unlink(e.path().c_str());
    }
    ::close(fd);
  }
}

}  // namespace

void check_writable_destination(const std::filesystem::path& destination, bool directory) {
  std::error_code ec;
  FP8KIT_CHECK(directory || !destination.filename().empty(), "cannot write '", destination.string(),
               "': not a file name");
  const auto status = std::filesystem::status(destination, ec);
  if (std::filesystem::exists(status)) {
    if (directory) {
      if (!std::filesystem::is_directory(status)) {
        FP8KIT_THROW(ErrorKind::kIo, "cannot write into '", destination.string(),
                     "': it is a file, not a directory; give a directory or a .safetensors file name");
      }
    } else if (!std::filesystem::is_regular_file(status)) {
      FP8KIT_THROW(ErrorKind::kIo, "cannot write '", destination.string(), "': it is ",
                   std::filesystem::is_directory(status) ? "a directory" : "not a regular file", "; give a file name");
    }
  }
  // Where the first file is created: the file's directory, or the nearest folder of the directory that exists.
  std::filesystem::path where = directory ? destination : directory_of(destination);
  if (directory) {
    while (!where.empty() && !std::filesystem::exists(where, ec)) where = where.parent_path();
    if (where.empty()) where = ".";
  }
  if (!std::filesystem::is_directory(where, ec)) {
    FP8KIT_THROW(ErrorKind::kIo, "cannot write '", destination.string(), "': ",
                 std::filesystem::exists(where, ec)
                     ? "'" + where.string() + "' is a file, not a directory"
                     : "the directory '" + where.string() + "' does not exist; create it first");
  }
  // A file created and removed at once says it (access(2) would not: root passes it on a read-only mount or /proc).
  const std::filesystem::path probe =
      where / (".fp8kit-write-probe-" + std::to_string(::getpid()) + "-" + std::to_string(g_sequence.fetch_add(1)));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    FP8KIT_THROW(ErrorKind::kIo, "cannot write '", destination.string(), "': cannot write into '", where.string(),
                 "' (", std::strerror(err), "); choose a writable directory");
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

bool is_temporary_file_name(std::string_view filename) {
  const std::size_t tmp = filename.rfind(".tmp-");
  if (filename.size() < 2 || filename[0] != '.' || tmp == std::string_view::npos || tmp < 2) return false;
  // "<pid>-<n>" after it
  const std::string_view rest = filename.substr(tmp + 5);
  const std::size_t dash = rest.find('-');
  const auto digits = [](std::string_view d) {
    return !d.empty() && d.find_first_not_of("0123456789") == std::string_view::npos;
  };
  return dash != std::string_view::npos && digits(rest.substr(0, dash)) && digits(rest.substr(dash + 1));
}

AtomicFile::AtomicFile(std::filesystem::path destination) : destination_(std::move(destination)) {
  FP8KIT_CHECK(!destination_.filename().empty(), "cannot write '", destination_.string(), "': not a file name");
  // The rename would replace whatever is there: a device (/dev/null) or a pipe would become a regular file. Only a
  // regular file (or a link to one, which stat follows) is written over.
  if (struct stat existing{}; ::stat(destination_.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode)) {
    FP8KIT_THROW(ErrorKind::kIo, "cannot write '", destination_.string(), "': it is ",
                 S_ISDIR(existing.st_mode)    ? "a directory"
                 : S_ISFIFO(existing.st_mode) ? "a pipe"
                                              : "a device or a socket",
                 ", not a regular file (the destination was not touched); give a file name");
  }
  const std::filesystem::path directory = directory_of(destination_);
  std::string prefix(1, '.');  // built piecewise: "." + std::string trips a false -Wrestrict in GCC 12
  prefix += destination_.filename().string();
  prefix += ".tmp-";
  remove_abandoned(directory, prefix);
  const std::string stem = prefix + std::to_string(::getpid()) + "-";
  for (int attempt = 0; fd_ < 0; ++attempt) {
    temporary_ = directory / (stem + std::to_string(g_sequence.fetch_add(1)));
    fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && (errno != EEXIST || attempt == 100)) {
      const int err = errno;
      fail("cannot create a temporary file in '" + directory.string() + "' to write '" + destination_.string() + "'",
           err);
    }
  }
  // Held until the file is committed or discarded (closing drops it): what tells a later writer that this
  // temporary file is not abandoned. A file system without locks leaves it unlocked, and so cleanable.
  (void)::flock(fd_, LOCK_EX | LOCK_NB);
  // A file written over keeps its permission bits (a read-only checkpoint stays read-only).
  struct stat st {};
  if (::stat(destination_.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::fchmod(fd_, st.st_mode & 07777) != 0) {
    const int err = errno;
    discard();
    fail("cannot give the temporary file for '" + destination_.string() + "' the existing file's permissions", err);
  }
}

AtomicFile::~AtomicFile() {
  discard();
}

void AtomicFile::discard() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!committed_ && !temporary_.empty()) {
    ::unlink(temporary_.c_str());
    temporary_.clear();
  }
}

void AtomicFile::write(std::span<const std::byte> bytes) {
  FP8KIT_CHECK(fd_ >= 0 && !committed_, "AtomicFile::write after commit() or a failure ('", destination_.string(),
               "')");
  synced_ = false;
  const std::byte* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, std::min<std::size_t>(left, std::size_t{1} << 30));
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      fail("writing '" + destination_.string() + "' failed (the destination was not touched)", err);
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

void AtomicFile::sync() {
  FP8KIT_CHECK(fd_ >= 0 && !committed_, "AtomicFile::sync after commit() or a failure ('", destination_.string(), "')");
  if (synced_) return;
  if (::fsync(fd_) != 0) {
    const int err = errno;
    fail("fsync of '" + destination_.string() + "' failed (the destination was not touched)", err);
  }
  synced_ = true;
}

void AtomicFile::commit() {
  sync();
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    fail("closing '" + destination_.string() + "' failed (the destination was not touched)", err);
  }
  if (::rename(temporary_.c_str(), destination_.c_str()) != 0) {
    const int err = errno;
    fail("cannot rename '" + temporary_.string() + "' to '" + destination_.string() +
             "' (the destination was not touched)",
         err);
  }
  committed_ = true;
  temporary_.clear();
  sync_directory(directory_of(destination_));
}

void sync_directory(const std::filesystem::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    fail("cannot open the directory '" + directory.string() + "' to sync it", err);
  }
  if (::fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP) {
    const int err = errno;
    ::close(fd);
    fail("fsync of the directory '" + directory.string() + "' failed", err);
  }
  ::close(fd);
}

}  // namespace fp8kit
