// Helpers for the io tests: a temporary directory removed on destruction, whole-file reads and writes, directory
// listings, and safetensors images assembled from a header text and a data size (for crafted malformed files).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp8kit/common/error.hpp"

namespace fp8kit::test_files {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "fp8kit-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline std::vector<std::byte> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(raw.size());
  if (!raw.empty()) std::memcpy(out.data(), raw.data(), raw.size());
  return out;
}

inline void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  write_file(path, std::as_bytes(std::span<const char>(text)));
}

// The names in a directory, sorted.
inline std::vector<std::string> list_dir(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// 8-byte little-endian length (the header's own unless `length` overrides it), the header, then `data_bytes`
// bytes counting up from 0.
inline std::vector<std::byte> st_image(const std::string& header, std::size_t data_bytes,
                                       std::optional<std::uint64_t> length = std::nullopt) {
  const std::uint64_t n = length.value_or(header.size());
  std::vector<std::byte> out(8);
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::byte>(n >> (8 * i));
  for (char c : header) out.push_back(static_cast<std::byte>(c));
  for (std::size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<std::byte>(i));
  return out;
}

// Deterministic pseudo-random bytes.
inline std::vector<std::byte> pattern_bytes(std::size_t n, std::uint32_t seed) {
  std::vector<std::byte> out(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<std::byte>(x);
  }
  return out;
}

// Where FP8KIT_FUZZ_CORPUS_OUT names a directory (fuzz/make_corpus.py sets it), a crafted input is also written
// there as <harness>/crafted-<hash of its bytes>: the tests' malformed files become the fuzzers' seeds.
inline void save_for_fuzzing(const std::string& harness, std::span<const std::byte> bytes) {
  const char* out = std::getenv("FP8KIT_FUZZ_CORPUS_OUT");
  if (out == nullptr || *out == '\0') return;
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (const std::byte b : bytes) h = (h ^ static_cast<std::uint64_t>(b)) * 0x100000001b3ull;
  const std::filesystem::path dir = std::filesystem::path(out) / harness;
  std::filesystem::create_directories(dir);
  char name[32];
  std::snprintf(name, sizeof name, "crafted-%016llx", static_cast<unsigned long long>(h));
  write_file(dir / name, bytes);
}

// The fp8kit::Error f throws (a test failure, and an empty error, when it throws none).
template <typename F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no fp8kit::Error thrown";
  return Error(ErrorKind::kInternal, "", "", 0);
}

}  // namespace fp8kit::test_files
