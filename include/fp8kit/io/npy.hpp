// NumPy .npy files: a strict reader (format versions 1.0-3.0, little-endian float16/float32/float64, C or
// Fortran order) for `fp8kit analyze`. Every malformed or unsupported file is a specific fp8kit::Error of
// kind kParse.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace fp8kit {

enum class NpyDType : std::uint8_t { kFloat16, kFloat32, kFloat64 };

struct NpyArray {
  NpyDType dtype = NpyDType::kFloat32;
  std::string descr;                // as in the header, e.g. "<f4"
  std::vector<std::int64_t> shape;  // () for a scalar
  std::vector<std::byte> data;      // C order, little-endian, numel * itemsize bytes
  std::int64_t numel() const;
  // The values as float32 (float16 exactly, float64 rounded to nearest even, as .astype(np.float32)).
  std::vector<float> to_float32() const;
};

// Parses the bytes of a .npy file.
NpyArray parse_npy(std::span<const std::byte> bytes);
// Reads and parses a file; an unreadable file is an fp8kit::Error of kind kIo.
NpyArray load_npy(const std::filesystem::path& path);

}  // namespace fp8kit
