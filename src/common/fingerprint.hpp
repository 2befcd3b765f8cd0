// Internal, for every layer: FNV-1a 64 over bytes, streamed, and its 16-hex-digit text (the fingerprints of
// training data in checkpoints and of replicas' weights under data parallelism).
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>

namespace fp8kit::detail {

class Fingerprint {
 public:
  void add(std::span<const std::byte> bytes) {
    for (std::byte b : bytes) {
      h_ ^= static_cast<std::uint8_t>(b);
      h_ *= 0x100000001b3ull;
    }
  }
  void add(std::string_view text) { add(std::as_bytes(std::span<const char>(text.data(), text.size()))); }
  std::uint64_t value() const { return h_; }
  std::string hex() const {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h_));
    return text;
  }

 private:
  std::uint64_t h_ = 0xcbf29ce484222325ull;
};

}  // namespace fp8kit::detail
