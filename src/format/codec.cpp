// The generic scalar converter (the specification of every FP8 conversion in fp8kit) and exact decoding.
// Written as numbered steps over an exactly unpacked input: sign, class, and value = significand *
// 2^exponent.
#include "fp8kit/format/codec.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <limits>

#include "fp8kit/format/codec_inline.hpp"

namespace fp8kit {

using codec_detail::encode_unpacked;
using codec_detail::unpack;

std::uint8_t encode(double x, const EncodeSpec& spec, std::uint32_t random_bits) {
  return encode_unpacked(descriptor(spec.format), unpack(x), spec, random_bits);
}
std::uint8_t encode(float x, const EncodeSpec& spec, std::uint32_t random_bits) {
  return encode_unpacked(descriptor(spec.format), unpack(x), spec, random_bits);
}
std::uint8_t encode(bfloat16 x, const EncodeSpec& spec, std::uint32_t random_bits) {
  return encode_unpacked(descriptor(spec.format), unpack(x), spec, random_bits);
}
std::uint8_t encode(float16 x, const EncodeSpec& spec, std::uint32_t random_bits) {
  return encode_unpacked(descriptor(spec.format), unpack(x), spec, random_bits);
}

double decode_to_double(Format f, std::uint8_t code) {
  const FormatDescriptor& d = descriptor(f);
  const bool negative = d.has_sign && (code & 0x80);
  if (d.is_nan(code)) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    return negative ? -nan : nan;
  }
  if (d.is_inf(code))
    return negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  return finite_value(d, code);
}

namespace {
// A double that a float holds exactly (an FP8 value: at most 12 significant bits), as that float. The float32
// subnormals (e8m0fnu's 2^-127) are built from their bits: a double -> float conversion is arithmetic, which a
// flush-to-zero mode in force on the first call would have made 0 in this process-wide table for good.
float exact_float(double v) {
  const double magnitude = std::fabs(v);
  if (magnitude == 0.0 || magnitude >= 0x1p-126 || std::isnan(v)) return static_cast<float>(v);
  const auto quanta = static_cast<std::uint32_t>(magnitude * 0x1p149);  // exact: v is a multiple of 2^-149
  return std::bit_cast<float>(quanta | (std::signbit(v) ? 0x80000000u : 0u));
}

// decode_to_double for every code of every format, as floats (exact).
using FloatTables = std::array<std::array<float, 256>, kAllFormats.size()>;
FloatTables make_float_tables() {
  FloatTables tables{};
  for (Format f : kAllFormats) {
    for (int c = 0; c < 256; ++c) {
      tables[static_cast<int>(f)][c] = exact_float(decode_to_double(f, static_cast<std::uint8_t>(c)));
    }
  }
  return tables;
}
}  // namespace

float decode_to_float(Format f, std::uint8_t code) {
  static const FloatTables tables = make_float_tables();
  return tables[static_cast<int>(f)][code];
}

bfloat16 decode_to_bfloat16(Format f, std::uint8_t code) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(decode_to_float(f, code));
  return bfloat16::from_bits(static_cast<std::uint16_t>(u >> 16));  // exact: FP8 values use at most 12 bits
}

float16 decode_to_float16(Format f, std::uint8_t code) {
  return float16::from_float(decode_to_float(f, code));
}

float overflow_threshold(Format format) {
  // Per format, once: the smallest positive float whose non-saturating code is the overflow code (encoding is
  // monotone in the magnitude, so a binary search over the float bits finds it).
  static const auto thresholds = [] {
    std::array<float, kAllFormats.size()> t{};
    for (Format f : kAllFormats) {
      const EncodeSpec nonsat{f, Overflow::kNonSaturating};
      const std::uint8_t overflow_code = encode(std::numeric_limits<float>::infinity(), nonsat);
      std::uint32_t lo = 0, hi = 0x7F800000u;  // encode(lo) is finite, encode(hi) overflows
      while (hi - lo > 1) {
        const std::uint32_t mid = lo + (hi - lo) / 2;
        (encode(std::bit_cast<float>(mid), nonsat) == overflow_code ? hi : lo) = mid;
      }
      t[static_cast<std::size_t>(f)] = std::bit_cast<float>(hi);
    }
    return t;
  }();
  return thresholds[static_cast<std::size_t>(format)];
}

}  // namespace fp8kit
