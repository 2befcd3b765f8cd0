// MappedFile: open, fstat, mmap(PROT_READ, MAP_PRIVATE), close the descriptor; munmap on destruction.
// The descriptor is closed as soon as the mapping exists (the mapping keeps the file alive).
#include "io/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fp8kit/common/error.hpp"

namespace fp8kit::detail {

MappedFile::MappedFile(const std::filesystem::path& path) {
  // O_NONBLOCK: a FIFO (or a device) given as a checkpoint is refused below instead of waiting for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    FP8KIT_THROW(ErrorKind::kIo, "cannot open '", path.string(), "' for reading: ", std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    FP8KIT_THROW(ErrorKind::kIo, "cannot stat '", path.string(), "': ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    FP8KIT_THROW(ErrorKind::kInvalidArgument, "'", path.string(), "' is not a regular file",
                 S_ISDIR(st.st_mode)    ? " (it is a directory)"
                 : S_ISFIFO(st.st_mode) ? " (it is a pipe)"
                                        : " (a device or a socket)",
                 "; give a file");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      FP8KIT_THROW(ErrorKind::kIo, "cannot memory-map '", path.string(), "': ", std::strerror(err));
    }
    data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

}  // namespace fp8kit::detail
