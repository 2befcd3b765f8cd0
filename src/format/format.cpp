// Format names (parsing what users type: fp8kit and PyTorch/ml_dtypes spellings) and the bit-pattern texts of
// codes and of each format's special encodings.
#include "fp8kit/format/format.hpp"

#include <cstdio>

namespace fp8kit {

std::optional<Format> parse_format(std::string_view text) {
  for (const FormatDescriptor& d : kFormatDescriptors) {
    if (text == d.name || text == d.torch_name) return d.format;
  }
  return std::nullopt;
}

std::string code_bits(Format format, std::uint8_t code, char separator) {
  const FormatDescriptor& d = descriptor(format);
  std::string out;
  const auto append_field = [&](int value, int width) {
    if (width == 0) return;
    if (!out.empty()) out += separator;
    for (int bit = width - 1; bit >= 0; --bit) out += ((value >> bit) & 1) ? '1' : '0';
  };
  append_field(d.has_sign ? code >> 7 : 0, d.has_sign ? 1 : 0);
  append_field((code >> d.mantissa_bits) & ((1 << d.exponent_bits) - 1), d.exponent_bits);
  append_field(code & ((1 << d.mantissa_bits) - 1), d.mantissa_bits);
  return out;
}

namespace {

std::string repeat(char bit, int width) {
  return std::string(static_cast<std::size_t>(width), bit);
}

std::string hex_code(std::uint8_t code) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%02X", code);
  return text;
}

}  // namespace

std::string inf_encoding(Format format) {
  const FormatDescriptor& d = descriptor(format);
  if (!d.has_inf) return "none";
  return "S." + repeat('1', d.exponent_bits) + "." + repeat('0', d.mantissa_bits);
}

std::string nan_encoding(Format format) {
  const FormatDescriptor& d = descriptor(format);
  switch (d.nan) {
    case NanEncoding::kIeee: {
      std::string mantissas;
      for (int m = 1; m < (1 << d.mantissa_bits); ++m) {
        std::string bits;
        for (int bit = d.mantissa_bits - 1; bit >= 0; --bit) bits += ((m >> bit) & 1) ? '1' : '0';
        mantissas += (mantissas.empty() ? "" : ",") + bits;
      }
      return "S." + repeat('1', d.exponent_bits) + ".{" + mantissas + "}";
    }
    case NanEncoding::kAllOnes:
      return "S." + repeat('1', d.exponent_bits) + "." + repeat('1', d.mantissa_bits);
    case NanEncoding::kNegativeZero:
      return "1." + repeat('0', d.exponent_bits) + "." + repeat('0', d.mantissa_bits) + " (" +
             hex_code(d.nan_code(false)) + ") only";
    case NanEncoding::kUnsignedMax:
      return code_bits(format, d.nan_code(false), '.') + " (" + hex_code(d.nan_code(false)) + ")";
  }
  return "?";
}

}  // namespace fp8kit
