// AtomicFile: writes a file so that its destination holds either the old content or the complete new content,
// never a mix, whatever fails or crashes: temporary file in the same directory -> fsync -> rename -> fsync(dir).
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <span>
#include <string_view>

namespace fp8kit {

// Creates `.<name>.tmp-<pid>-<n>` next to the destination (exclusively, mode 0666 less the umask, or the
// destination's permission bits when it exists). write() appends to it; commit() fsyncs it, renames it over the
// destination and fsyncs the directory, so that the new file survives a power loss once commit() returns.
// Destroyed without commit() (an exception, an early return), it closes and removes the temporary file: the
// destination is never opened for writing, so an existing file there is untouched and readers that mapped it
// keep their bytes. A process killed before commit() leaves only its temporary file behind; the next AtomicFile for
// the same destination removes it (a temporary file is locked with flock(2) while its writer lives, so only those
// of dead writers go).
// A destination that exists and is not a regular file (a directory, a pipe, a device such as /dev/null) is refused:
// the rename would replace it. Every failure throws Error(kIo) naming the path and the OS's reason. Not copyable or
// movable.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path destination);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends all of `bytes` (retrying short writes and EINTR).
  void write(std::span<const std::byte> bytes);
  // Flushes the written bytes to the disk now; commit() does it when it has not been done.
  void sync();
  // sync(), rename over the destination, fsync the directory. Once it returns the temporary file is gone.
  void commit();

  const std::filesystem::path& destination() const noexcept { return destination_; }
  const std::filesystem::path& temporary_path() const noexcept { return temporary_; }
  bool committed() const noexcept { return committed_; }

 private:
  void discard() noexcept;

  std::filesystem::path destination_;
  std::filesystem::path temporary_;
  int fd_ = -1;
  bool synced_ = false;
  bool committed_ = false;
};

// AtomicDirectory: replaces (or creates) a whole directory so that its path names either the old directory or the
// complete new one, whatever fails or crashes. The new content is written into a staging directory beside it,
// `.<name>.tmp-<pid>-<n>` (path() names it; locked with flock(2) while its writer lives). commit() carries over what
// the old directory holds and the new content does not: files and special files as hard links of the same inodes
// (a file copied where a link is refused), symbolic links made again, folders made again with their permission bits
// and merged with the new content's, each file or link first asked of `carry`; an AtomicFile temporary file whose
// writer lives goes on (its commit then lands in the new directory), an abandoned one does not. A folder where the
// new content has a file, or a file where it has a folder, is refused (Error(kIo)), the old directory untouched.
// Then the staging tree is fsynced, the two directories exchanged in one renameat2(RENAME_EXCHANGE) (a rename where
// there was none), the old tree removed and the parent fsynced. The staging directory is private while written and
// gets the old directory's permission bits (the umask's for a new one); folders of both keep the old one's bits.
// What another writer puts into the old directory during commit() itself (between carrying over and the exchange)
// goes with the old tree. A process killed before the exchange leaves the old
// directory; killed after it, the new one, complete; either way only a `.<name>.tmp-*` directory is left, which the
// next AtomicDirectory of that name removes (only those whose writer's lock is gone). Destroyed without commit(), it
// removes its staging directory.
// In place (path() is the destination itself, the files' own AtomicFile renames are the commit, and commit() does
// nothing more) where a new directory would be more than new content: the destination is a symbolic link (a swap
// would replace the link), "." or "/", a mount point or holds one, belongs to another user or group or holds a
// folder that does, has an ACL, holds a symbolic link to a folder, or holds the working directory; and where two
// directories cannot be exchanged there (a folder not writable, a file system without RENAME_EXCHANGE such as NFS). The
// destination's folder must exist; an existing destination that is not a directory is refused (Error(kIo)).
class AtomicDirectory {
 public:
  explicit AtomicDirectory(std::filesystem::path destination);
  ~AtomicDirectory();
  AtomicDirectory(const AtomicDirectory&) = delete;
  AtomicDirectory& operator=(const AtomicDirectory&) = delete;

  // Where to write the new content: the staging directory, or the destination when in place.
  const std::filesystem::path& path() const noexcept { return in_place_ ? destination_ : staging_; }
  const std::filesystem::path& destination() const noexcept { return destination_; }
  bool in_place() const noexcept { return in_place_; }
  // `carry(relative)` says whether a file or link of the old directory that the new content does not hold goes on to
  // the new one (all do when it is empty). Files written into path() must be complete (AtomicFile's commit done).
  void commit(const std::function<bool(const std::filesystem::path& relative)>& carry = {});

 private:
  void discard() noexcept;

  std::filesystem::path destination_;
  std::filesystem::path staging_;
  int lock_fd_ = -1;
  bool in_place_ = false;
  bool committed_ = false;
};

// Checks, before a long computation, that its result could be written there: a file `destination` (written with
// AtomicFile) is not a directory, a pipe or a device, and its directory exists and is writable; a `directory`
// destination (created with its parents, then written into) is not a file, and the nearest folder of its path that
// exists is a writable directory. Throws Error(kIo) naming the path and the fix. A check, not a promise: a disk
// that fills up or permissions that change before the write still fail there.
void check_writable_destination(const std::filesystem::path& destination, bool directory = false);

// Whether `filename` (no directory) is one AtomicFile gives its temporary files (".<name>.tmp-<pid>-<n>"): what an
// interrupted write leaves behind, and the next write of <name> removes.
bool is_temporary_file_name(std::string_view filename);

// fsyncs a directory so that renames and removals in it are durable. Filesystems that cannot sync a directory
// (EINVAL) are accepted silently; other failures throw Error(kIo).
void sync_directory(const std::filesystem::path& directory);

}  // namespace fp8kit
