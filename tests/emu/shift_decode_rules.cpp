// Native helper of the isa-emu checks: the bytes of shift_decode_rule(format, to_f16) for the five formats and both
// targets, in hex, one per line, as decode_avx512.cpp's set_up takes them.
#include <cstdio>

#include "convert/cpu/convert_kernels.hpp"

int main() {
  for (int f = 0; f < 5; ++f) {
    for (const bool to_f16 : {false, true}) {
      const auto rule = fp8kit::convert_detail::shift_decode_rule(static_cast<fp8kit::Format>(f), to_f16);
      const auto* bytes = reinterpret_cast<const unsigned char*>(&rule);
      for (std::size_t i = 0; i < sizeof rule; ++i) std::printf("%02x", bytes[i]);
      std::printf("\n");
    }
  }
}
