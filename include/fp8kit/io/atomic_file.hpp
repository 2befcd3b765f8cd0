// AtomicFile: writes a file so that its destination holds either the old content or the complete new content,
// never a mix, whatever fails or crashes: temporary file in the same directory -> fsync -> rename -> fsync(dir).
#pragma once

#include <cstddef>
#include <filesystem>
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
