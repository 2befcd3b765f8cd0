// AtomicFile: an exclusive temporary file beside the destination, written with retried write(2), then
// fsync -> close -> rename(2) -> fsync of the directory; removed on any path that does not reach the rename.
// AtomicDirectory: a locked staging directory beside the destination, the old directory's other entries linked in,
// then renameat2(RENAME_EXCHANGE) and the old tree removed.
#include "fp8kit/io/atomic_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/fingerprint.hpp"
#include "fp8kit/common/error.hpp"

namespace fp8kit {
namespace {

std::atomic<unsigned> g_sequence{0};

std::filesystem::path directory_of(const std::filesystem::path& file) {
  const std::filesystem::path parent = file.parent_path();
  return parent.empty() ? std::filesystem::path(".") : parent;
}

// Fault injection for the crash tests (docs/testing.md): with FP8KIT_CRASH_AFTER_RENAMES=N in its environment, the
// process kills itself (SIGKILL: no handler, no cleanup) right after its N-th rename of a committed file or
// exchange of a directory, so that a test can stop a write at each of its commit points in turn.
void rename_done() {
  static const long limit = [] {
    const char* value = std::getenv("FP8KIT_CRASH_AFTER_RENAMES");
    return value == nullptr ? 0L : std::atol(value);
  }();
  static std::atomic<long> renames{0};
  if (limit > 0 && ++renames == limit) ::raise(SIGKILL);
}

[[noreturn]] void fail(const std::string& what, int err) {
  FP8KIT_THROW(ErrorKind::kIo, what, ": ", std::strerror(err));
}

// Whether `rest` (a name after its ".<name>.tmp-" prefix) is "<pid>-<n>", or "<pid>-<n>-probe" where allowed: the
// names AtomicFile and AtomicDirectory give, and nothing a user would name a file.
bool is_sequence_tail(std::string_view rest, bool probe) {
  if (probe && rest.ends_with("-probe")) rest.remove_suffix(6);
  const std::size_t dash = rest.find('-');
  const auto digits = [](std::string_view d) {
    return !d.empty() && d.find_first_not_of("0123456789") == std::string_view::npos;
  };
  return dash != std::string_view::npos && digits(rest.substr(0, dash)) && digits(rest.substr(dash + 1));
}

// Opens `path` without following a link and takes its flock without waiting: the descriptor (the caller closes
// it) when the lock was free, so that whoever made the entry is gone, else -1. `st` gets what was opened.
int lock_if_abandoned(const std::filesystem::path& path, struct stat& st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return -1;
  struct stat named {};
  // Only while locked and still the entry under that name (not one created since by another writer).
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &st) == 0 && ::lstat(path.c_str(), &named) == 0 &&
      st.st_ino == named.st_ino && st.st_dev == named.st_dev) {
    return fd;
  }
  ::close(fd);
  return -1;
}

// remove_all that also gets through folders without write or search permission (a read-only subfolder of an
// old tree). Best effort.
void remove_tree(const std::filesystem::path& path) noexcept {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (!ec) return;
  ::chmod(path.c_str(), 0700);
  for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->symlink_status(ec).type() == std::filesystem::file_type::directory) ::chmod(it->path().c_str(), 0700);
  }
  std::filesystem::remove_all(path, ec);
}

// Removes what earlier writers of the same destination left when they died before finishing (killed, out of
// power): in `directory`, the entries named `<prefix><pid>-<n>` whose writer's lock is gone — regular files
// (AtomicFile's temporary files) and, when `directories`, folders (AtomicDirectory's staging directories, an old tree
// an exchange left, `-probe` folders). A live writer holds its file's or directory's flock until it commits or
// discards (across hosts too, on NFS), so its entries are never touched. Best effort: whatever cannot be opened,
// locked or removed is left.
void remove_abandoned(const std::filesystem::path& directory, const std::string& prefix, bool directories) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(directory, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(prefix) || !is_sequence_tail(std::string_view(name).substr(prefix.size()), directories)) {
      continue;
    }
    struct stat st {};
    const int fd = lock_if_abandoned(e.path(), st);
    if (fd < 0) continue;
    if (S_ISREG(st.st_mode)) {
      ::unlink(e.path().c_str());
    } else if (S_ISDIR(st.st_mode) && directories) {
      remove_tree(e.path());  // (under its lock: a writer locks its staging directory before writing there)
    }
    ::close(fd);
  }
}

// The process's umask, read where reading it does not change it (/proc/self/status; 022 where that is missing).
mode_t process_umask() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  unsigned mask = 022;
  if (f != nullptr) {
    char line[256];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      if (std::sscanf(line, "Umask: %o", &mask) == 1) break;
    }
    std::fclose(f);
  }
  return static_cast<mode_t>(mask & 0777);
}

// ".<name>.tmp-": the temporary names are it and "<pid>-<n>" (and "-probe"). A name of over 200 bytes is cut to
// its first 180 (on a UTF-8 character's start) and a hash of the whole added, so that the temporary names of every
// name the file system takes stay within its 255 bytes (a 240-byte output name could not be written), and two long
// names that share their start do not share their temporaries.
std::string temporary_prefix(const std::filesystem::path& destination) {
  std::string name = destination.filename().string();
  constexpr std::size_t kKeptWhole = 200, kCutTo = 180;
  if (name.size() > kKeptWhole) {
    detail::Fingerprint hash;  // FNV-1a: the same in every process
    hash.add(name);
    std::size_t cut = kCutTo;
    while (cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) --cut;
    name.resize(cut);
    name += '~';
    name += hash.hex();
  }
  std::string prefix(1, '.');  // built piecewise: "." + std::string trips a false -Wrestrict in GCC 12
  prefix += name;
  prefix += ".tmp-";
  return prefix;
}

// Whether two directories beside the destination can be exchanged in one rename: false where its folder is not
// writable (a directory the user may write into, in a folder they may not) or the file system has no
// RENAME_EXCHANGE (ext4, xfs, btrfs and tmpfs have it; NFS does not). Tried on two empty directories made for it.
bool can_exchange(const std::filesystem::path& parent, const std::string& stem) {
  const std::filesystem::path a = parent / (stem + std::to_string(g_sequence.fetch_add(1)) + "-probe"),
                              b = parent / (stem + std::to_string(g_sequence.fetch_add(1)) + "-probe");
  bool ok = false;
  if (::mkdir(a.c_str(), 0700) == 0) {
    if (::mkdir(b.c_str(), 0700) == 0) {
      ok = ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0;
      ::rmdir(b.c_str());
    }
    ::rmdir(a.c_str());
  }
  return ok;
}

// Whether `path` is where a file system is mounted (a bind mount of the same file system included), where the kernel
// says (statx, Linux 5.8).
bool is_mount_root(const std::filesystem::path& path) {
  struct statx sx {};
  return ::statx(AT_FDCWD, path.c_str(), AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx) == 0 &&
         (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) && (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT);
}

// Whether an existing directory can be replaced by a new one without changing more than its content. Not where
// the new directory and its folders would belong to this process's user and group and lose ACLs, a mount cannot be
// renamed (or would be copied and emptied), and a process working inside would be left in the removed old tree.
bool only_content_would_change(const std::filesystem::path& destination, const struct stat& st) {
  if (st.st_uid != ::geteuid() || st.st_gid != ::getegid()) return false;  // another owner or group
  for (const char* acl : {"system.posix_acl_access", "system.posix_acl_default"}) {
    if (::lgetxattr(destination.c_str(), acl, nullptr, 0) >= 0) return false;  // an ACL
  }
  std::error_code ec;
  const std::filesystem::path cwd = std::filesystem::current_path(ec),
                              real = std::filesystem::canonical(destination, ec);
  if (!ec) {
    const auto [stop, rest] = std::mismatch(real.begin(), real.end(), cwd.begin(), cwd.end());
    if (stop == real.end()) return false;  // the working directory
  }
  if (is_mount_root(destination)) return false;  // a mount point
  for (auto it = std::filesystem::recursive_directory_iterator(destination, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    const std::filesystem::file_type type = it->symlink_status(ec).type();
    // (a link to a folder: the new content would put a folder of its own where the link was)
    std::error_code link_ec;  // (a link to nothing is carried as a link)
    if (type == std::filesystem::file_type::symlink && std::filesystem::is_directory(it->path(), link_ec)) {
      return false;  // a symbolic link to a folder inside
    }
    if (type != std::filesystem::file_type::directory) continue;
    struct stat sub {};
    if (::lstat(it->path().c_str(), &sub) != 0) continue;
    if (sub.st_dev != st.st_dev || is_mount_root(it->path())) return false;  // a mount point inside
    if (sub.st_uid != st.st_uid || sub.st_gid != st.st_gid) return false;  // a folder of another owner or group inside
  }
  return !ec;  // (a folder that cannot be listed: in place)
}

// Puts what `from` holds and `to` does not into `to`, each relative path of a file, link or special file asked of
// `carry` first: folders made anew with their permission bits (set once they are filled), files and special files
// hard-linked (a file copied and synced where a link is refused: another owner's file under protected_hardlinks, a
// file system without links), symbolic links made again, a temporary file whose writer lives linked too (its
// writer's commit renames it within the new tree) and an abandoned one left behind. An entry `to` already holds is
// the new content's and stays (a folder of both is merged); a folder where it has a file or a file where it has a
// folder is refused.
void carry_over(const std::filesystem::path& from, const std::filesystem::path& to, const std::filesystem::path& rel,
                const std::function<bool(const std::filesystem::path&)>& carry, const std::filesystem::path& shown) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(from / rel, ec);
  if (ec) fail("cannot list '" + (shown / rel).string() + "'", ec.value());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    const fs::path r = rel / it->path().filename();
    const fs::path source = from / r, target = to / r;
    struct stat src {
    }, dst{};
    if (::lstat(source.c_str(), &src) != 0) {
      if (errno == ENOENT) continue;  // gone since it was listed
      {
        const int err = errno;
        fail("cannot read '" + (shown / r).string() + "'", err);
      }
    }
    const bool directory = S_ISDIR(src.st_mode);
    if (::lstat(target.c_str(), &dst) == 0) {
      // A folder and a file (or link) of one name: what the user had there would be lost.
      if (directory != S_ISDIR(dst.st_mode)) {
        FP8KIT_THROW(ErrorKind::kIo, "cannot write '", (shown / r).string(),
                     "': ", directory ? "a directory" : "a file", " of that name is in the way (nothing was changed)");
      }
      if (directory) {
        carry_over(from, to, r, carry, shown);
        if (::chmod(target.c_str(), src.st_mode & 07777) != 0) {  // the user's folder keeps its bits
          const int err = errno;
          fail("cannot set the permissions of '" + r.string() + "' in the new '" + shown.string() + "'", err);
        }
      }
      continue;
    }
    if (!directory && carry && !carry(r)) continue;
    if (directory) {
      if (::mkdir(target.c_str(), 0700) != 0) {
        {
          const int err = errno;
          fail("cannot make the folder '" + r.string() + "' in the new '" + shown.string() + "'", err);
        }
      }
      carry_over(from, to, r, carry, shown);
      if (::chmod(target.c_str(), src.st_mode & 07777) != 0) {
        {
          const int err = errno;
          fail("cannot set the permissions of '" + r.string() + "' in the new '" + shown.string() + "'", err);
        }
      }
    } else if (S_ISLNK(src.st_mode)) {
      fs::create_symlink(fs::read_symlink(source, ec), target, ec);
      if (ec) fail("cannot make the link '" + r.string() + "' in the new '" + shown.string() + "'", ec.value());
    } else {
      if (S_ISREG(src.st_mode) && is_temporary_file_name(r.filename().string())) {
        struct stat locked {};
        const int fd = lock_if_abandoned(source, locked);
        if (fd >= 0) {  // an interrupted write's: left with the old tree
          ::close(fd);
          continue;
        }
      }
      if (::link(source.c_str(), target.c_str()) == 0) continue;
      const int err = errno;
      if (!S_ISREG(src.st_mode) ||
          (err != EXDEV && err != EPERM && err != EMLINK && err != ENOTSUP && err != EOPNOTSUPP)) {
        fail("cannot link '" + (shown / r).string() + "' into the new directory", err);
      }
      fs::copy_file(source, target, ec);
      const int fd = ec ? -1 : ::open(target.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || ::fsync(fd) != 0) {
        const int copy_err = ec ? ec.value() : errno;
        if (fd >= 0) ::close(fd);
        fail("cannot copy '" + (shown / r).string() + "' into the new directory", copy_err);
      }
      ::close(fd);
    }
  }
  if (ec) fail("cannot list '" + (shown / rel).string() + "'", ec.value());
}

// fsyncs every folder of a tree (the names in them; the files written into it were synced by their writers).
void sync_tree(const std::filesystem::path& root) {
  std::error_code ec;
  sync_directory(root);
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->symlink_status(ec).type() == std::filesystem::file_type::directory) sync_directory(it->path());
  }
  if (ec) fail("cannot list '" + root.string() + "' to sync it", ec.value());
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
  return is_sequence_tail(filename.substr(tmp + 5), false);  // "<pid>-<n>" after it
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
  const std::string prefix = temporary_prefix(destination_);
  remove_abandoned(directory, prefix, false);
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
  rename_done();
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

AtomicDirectory::AtomicDirectory(std::filesystem::path destination) : destination_(std::move(destination)) {
  if (!destination_.has_filename() && destination_.has_parent_path()) destination_ = destination_.parent_path();
  const std::string name = destination_.filename().string();
  struct stat st {};
  const bool exists = ::lstat(destination_.c_str(), &st) == 0;
  if (const int err = errno; !exists && err != ENOENT) {
    fail("cannot write the directory '" + destination_.string() + "'", err);
  }
  if (exists && S_ISLNK(st.st_mode)) {
    // Replacing the link with a directory would change what it is: written through, in place.
    struct stat target {};
    if (::stat(destination_.c_str(), &target) != 0 || !S_ISDIR(target.st_mode)) {
      FP8KIT_THROW(ErrorKind::kIo, "cannot write the directory '", destination_.string(),
                   "': it is a symbolic link to nothing or to a file; remove it or give another directory");
    }
    in_place_ = true;
    return;
  }
  if (exists && !S_ISDIR(st.st_mode)) {
    FP8KIT_THROW(ErrorKind::kIo, "cannot write the directory '", destination_.string(),
                 "': a file of that name is in the way; remove it or give another directory");
  }
  if (name.empty() || name == "." || name == "..") {  // (a folder that cannot be renamed: written in place)
    in_place_ = true;
    return;
  }
  const std::filesystem::path parent = directory_of(destination_);
  struct stat above {};
  if (::stat(parent.c_str(), &above) != 0 || !S_ISDIR(above.st_mode)) {
    FP8KIT_THROW(ErrorKind::kIo, "cannot write the directory '", destination_.string(), "': its folder '",
                 parent.string(), "' does not exist; create it first");
  }
  const std::string prefix = temporary_prefix(destination_);
  remove_abandoned(parent, prefix, true);
  const std::string stem = prefix + std::to_string(::getpid()) + "-";
  if (exists &&
      (st.st_dev != above.st_dev || !only_content_would_change(destination_, st) || !can_exchange(parent, stem))) {
    in_place_ = true;
    return;
  }
  for (int attempt = 0;; ++attempt) {
    if (attempt == 100) fail("cannot create a staging directory in '" + parent.string() + "'", EEXIST);
    staging_ = parent / (stem + std::to_string(g_sequence.fetch_add(1)));
    // Private while it is written; the commit gives it the old directory's permission bits (the umask's for one
    // made anew).
    if (::mkdir(staging_.c_str(), 0700) != 0) {
      if (errno == EEXIST) continue;
      const int err = errno;
      staging_.clear();
      fail("cannot create a staging directory in '" + parent.string() + "' to write '" + destination_.string() + "'",
           err);
    }
    // Locked before anything is written there (what tells a later writer that it is not abandoned), and still the
    // directory made here: another writer's cleanup may have taken it between the two steps. A file system
    // without flock on directories (NFS emulates it with write locks) leaves it unlocked, as AtomicFile does.
    lock_fd_ = ::open(staging_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat opened {
    }, named{};
    const bool locked_by_another = lock_fd_ >= 0 && ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    if (lock_fd_ >= 0 && !locked_by_another && ::fstat(lock_fd_, &opened) == 0 &&
        ::lstat(staging_.c_str(), &named) == 0 && opened.st_ino == named.st_ino && opened.st_dev == named.st_dev) {
      break;
    }
    if (lock_fd_ >= 0) ::close(lock_fd_);
    lock_fd_ = -1;
  }
}

AtomicDirectory::~AtomicDirectory() {
  discard();
}

void AtomicDirectory::discard() noexcept {
  if (!staging_.empty()) {
    remove_tree(staging_);  // before the commit: the new content; after it: the old tree
    staging_.clear();
  }
  if (lock_fd_ >= 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
  }
}

void AtomicDirectory::commit(const std::function<bool(const std::filesystem::path& relative)>& carry) {
  FP8KIT_CHECK(!committed_, "AtomicDirectory::commit called twice ('", destination_.string(), "')");
  if (in_place_) {
    committed_ = true;
    return;
  }
  struct stat st {};
  const bool exists = ::lstat(destination_.c_str(), &st) == 0;
  if (exists) {
    FP8KIT_CHECK_KIND(S_ISDIR(st.st_mode), ErrorKind::kIo, "cannot write the directory '", destination_.string(),
                      "': something other than a directory took its place while it was written");
    // Owner access for the carrying over, and nothing for others that the old directory did not give them.
    if (::chmod(staging_.c_str(), (st.st_mode & 07777) | S_IRWXU) != 0) {
      const int err = errno;
      fail("cannot give the new '" + destination_.string() + "' the old one's permissions", err);
    }
    carry_over(destination_, staging_, {}, carry, destination_);
    if (::chmod(staging_.c_str(), st.st_mode & 07777) != 0) {
      {
        const int err = errno;
        fail("cannot give the new '" + destination_.string() + "' the old one's permissions", err);
      }
    }
  }
  if (!exists && ::chmod(staging_.c_str(), 0777 & ~process_umask()) != 0) {
    const int err = errno;
    fail("cannot give the new '" + destination_.string() + "' its permissions", err);
  }
  sync_tree(staging_);
  if (exists) {
    if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, destination_.c_str(), RENAME_EXCHANGE) != 0) {
      {
        const int err = errno;
        fail("cannot swap the new '" + destination_.string() + "' in (the old one was not touched)", err);
      }
    }
  } else if (::rename(staging_.c_str(), destination_.c_str()) != 0) {
    {
      const int err = errno;
      fail("cannot rename '" + staging_.string() + "' to '" + destination_.string() + "'", err);
    }
  }
  committed_ = true;
  rename_done();
  if (!exists) staging_.clear();  // renamed: nothing is left under the staging name
  discard();                      // the old tree, now under the staging name
  sync_directory(directory_of(destination_));
}

}  // namespace fp8kit
