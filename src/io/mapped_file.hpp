// A read-only memory mapping of a whole file, released on destruction (RAII). Private to src/io: the readers
// hold one behind a shared_ptr so that spans into it stay valid while any reader copy lives.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>

namespace fp8kit::detail {

class MappedFile {
 public:
  // Maps `path` read-only (MAP_PRIVATE). An empty file maps to an empty span. Throws Error(kIo) when the file
  // cannot be opened, is not a regular file, or cannot be mapped, naming the path and the OS's reason.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }

 private:
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace fp8kit::detail
