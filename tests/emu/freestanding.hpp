// What a kernel file needs beside itself in an isa-emu blob (no libc): memcpy and memset, a table of the codec's
// bfloat16 results (decode_to_bfloat16, which the byte tables are built from) filled by the host, and a byte in
// .data so that the zero-initialized state is stored in the blob.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fp8kit/format/codec.hpp"

extern "C" {
void* memcpy(void* d, const void* s, std::size_t n) {
  auto* to = static_cast<unsigned char*>(d);
  const auto* from = static_cast<const unsigned char*>(s);
  for (std::size_t i = 0; i < n; ++i) to[i] = from[i];
  return d;
}
void* memset(void* d, int c, std::size_t n) {
  auto* to = static_cast<unsigned char*>(d);
  for (std::size_t i = 0; i < n; ++i) to[i] = static_cast<unsigned char>(c);
  return d;
}
}

namespace emu {
inline std::uint16_t bf16_of_code[5][256];
[[gnu::used]] inline unsigned char in_data = 1;

inline void set_bf16_table(const std::uint16_t* table) {
  for (int f = 0; f < 5; ++f)
    for (int c = 0; c < 256; ++c) bf16_of_code[f][c] = table[f * 256 + c];
}
}  // namespace emu

namespace fp8kit {
bfloat16 decode_to_bfloat16(Format f, std::uint8_t code) {
  bfloat16 b;
  b.bits = emu::bf16_of_code[static_cast<int>(f)][code];
  return b;
}
}  // namespace fp8kit
