// FP8 format descriptors: the bit layout and special encodings of every 8-bit float fp8kit knows.
// One descriptor per format; every other constant (max, min normal, numeric_limits, ...) is derived from it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fp8kit {

// The formats, in the order `fp8kit formats` prints them.
enum class Format : std::uint8_t {
  e4m3fn,    // s eeee mmm, bias 7,  no Inf, NaN = S.1111.111,           max 448    (OCP E4M3,
             // torch.float8_e4m3fn)
  e5m2,      // s eeeee mm, bias 15, IEEE Inf and NaN,                   max 57344  (OCP E5M2, torch.float8_e5m2)
  e4m3fnuz,  // s eeee mmm, bias 8,  no Inf, NaN = 0x80 only, no -0,     max 240    (AMD MI300, Graphcore)
  e5m2fnuz,  // s eeeee mm, bias 16, no Inf, NaN = 0x80 only, no -0,     max 57344  (AMD MI300, Graphcore)
  e8m0fnu,   // eeeeeeee,   bias 127, unsigned powers of two, NaN = 0xFF, no zero  (OCP MX block scale)
};

inline constexpr std::array<Format, 5> kAllFormats = {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz,
                                                      Format::e8m0fnu};

// How a format spells NaN.
enum class NanEncoding : std::uint8_t {
  kIeee,          // exponent all ones, mantissa nonzero, either sign (e5m2: S.11111.{01,10,11})
  kAllOnes,       // only S.1111.111: the exponent-all-ones codes below it are finite (e4m3fn)
  kNegativeZero,  // only 0x80, the code that would be -0 (the fnuz formats)
  kUnsignedMax,   // only 0xFF in a format without a sign bit (e8m0fnu)
};

// Exactly what is needed to encode and decode a format; everything else is derived below.
struct FormatDescriptor {
  Format format;
  std::string_view name;        // fp8kit's name: "e4m3fn"
  std::string_view torch_name;  // "float8_e4m3fn" (also ml_dtypes' name)
  int exponent_bits;
  int mantissa_bits;
  int bias;
  bool has_sign;  // false only for e8m0fnu
  bool has_inf;   // IEEE Inf at exponent all ones, mantissa 0
  NanEncoding nan;
  bool has_subnormals;  // exponent field 0 means 0.mmm * 2^(1-bias); false for e8m0fnu, where it means 2^-bias

  constexpr std::uint8_t sign_mask() const { return has_sign ? 0x80 : 0x00; }
  constexpr std::uint8_t magnitude_mask() const { return has_sign ? 0x7F : 0xFF; }
  constexpr int max_exponent_field() const { return (1 << exponent_bits) - 1; }
  constexpr bool has_zero() const { return has_subnormals; }
  constexpr bool has_negative_zero() const { return has_sign && nan != NanEncoding::kNegativeZero; }

  // The largest finite code (positive).
  constexpr std::uint8_t max_code() const {
    const int mant_all = (1 << mantissa_bits) - 1;
    switch (nan) {
      case NanEncoding::kIeee:  // the top exponent is reserved for Inf/NaN
        return static_cast<std::uint8_t>(((max_exponent_field() - 1) << mantissa_bits) | mant_all);
      case NanEncoding::kAllOnes:  // only S.1...1 is NaN
        return static_cast<std::uint8_t>(((max_exponent_field()) << mantissa_bits) | (mant_all - 1));
      case NanEncoding::kNegativeZero:
        return static_cast<std::uint8_t>((max_exponent_field() << mantissa_bits) | mant_all);
      case NanEncoding::kUnsignedMax:
        return 0xFE;
    }
    return 0;
  }
  // The canonical quiet NaN (what conversions produce), with a sign where the format has one.
  constexpr std::uint8_t nan_code(bool negative) const {
    const std::uint8_t sign = negative ? sign_mask() : 0;
    switch (nan) {
      case NanEncoding::kIeee:  // quiet NaN: top mantissa bit set, as IEEE (and ml_dtypes) do
        return static_cast<std::uint8_t>((max_exponent_field() << mantissa_bits) | (1 << (mantissa_bits - 1)) | sign);
      case NanEncoding::kAllOnes:
        return static_cast<std::uint8_t>(0x7F | sign);
      case NanEncoding::kNegativeZero:
        return 0x80;
      case NanEncoding::kUnsignedMax:
        return 0xFF;
    }
    return 0;
  }
  constexpr std::uint8_t inf_code(bool negative) const {
    return static_cast<std::uint8_t>((max_exponent_field() << mantissa_bits) | (negative ? sign_mask() : 0));
  }
  constexpr bool is_nan(std::uint8_t code) const {
    const int mag = code & magnitude_mask();
    switch (nan) {
      case NanEncoding::kIeee:
        return (mag >> mantissa_bits) == max_exponent_field() && (mag & ((1 << mantissa_bits) - 1)) != 0;
      case NanEncoding::kAllOnes:
        return mag == 0x7F;
      case NanEncoding::kNegativeZero:
        return code == 0x80;
      case NanEncoding::kUnsignedMax:
        return code == 0xFF;
    }
    return false;
  }
  constexpr bool is_inf(std::uint8_t code) const { return has_inf && (code & magnitude_mask()) == inf_code(false); }
};

namespace detail {
constexpr double pow2(int e) {
  double r = 1.0;
  for (; e > 0; --e) r *= 2.0;
  for (; e < 0; ++e) r *= 0.5;
  return r;
}
}  // namespace detail

// The exact value of a finite code, as a double (every FP8 value is exactly representable in double).
// Not for NaN or Inf codes.
constexpr double finite_value(const FormatDescriptor& d, std::uint8_t code) {
  const int mag = code & d.magnitude_mask();
  const int field = mag >> d.mantissa_bits;
  const int mant = mag & ((1 << d.mantissa_bits) - 1);
  const double sign = (d.has_sign && (code & 0x80)) ? -1.0 : 1.0;
  if (field == 0 && d.has_subnormals) return sign * mant * detail::pow2(1 - d.bias - d.mantissa_bits);
  return sign * (1.0 + mant * detail::pow2(-d.mantissa_bits)) * detail::pow2(field - d.bias);
}

inline constexpr std::array<FormatDescriptor, 5> kFormatDescriptors = {{
    // e4m3fn: 0.1111.110 = 1.75 * 2^8 = 448; 0.0001.000 = 2^-6; 0.0000.001 = 2^-9; NaN 0.1111.111
    // / 1.1111.111
    {Format::e4m3fn, "e4m3fn", "float8_e4m3fn", 4, 3, 7, true, false, NanEncoding::kAllOnes, true},
    // e5m2: 0.11110.11 = 1.75 * 2^15 = 57344; 0.00001.00 = 2^-14; 0.00000.01 = 2^-16; Inf 0.11111.00
    {Format::e5m2, "e5m2", "float8_e5m2", 5, 2, 15, true, true, NanEncoding::kIeee, true},
    // e4m3fnuz: 0.1111.111 = 1.875 * 2^7 = 240; 0.0001.000 = 2^-7; 0.0000.001 = 2^-10; NaN 1.0000.000 only
    {Format::e4m3fnuz, "e4m3fnuz", "float8_e4m3fnuz", 4, 3, 8, true, false, NanEncoding::kNegativeZero, true},
    // e5m2fnuz: 0.11111.11 = 1.75 * 2^15 = 57344; 0.00001.00 = 2^-15; 0.00000.01 = 2^-17; NaN 1.00000.00 only
    {Format::e5m2fnuz, "e5m2fnuz", "float8_e5m2fnuz", 5, 2, 16, true, false, NanEncoding::kNegativeZero, true},
    // e8m0fnu: 11111110 = 2^127; 00000000 = 2^-127; NaN 11111111; no sign, no zero
    {Format::e8m0fnu, "e8m0fnu", "float8_e8m0fnu", 8, 0, 127, false, false, NanEncoding::kUnsignedMax, false},
}};

constexpr const FormatDescriptor& descriptor(Format f) {
  return kFormatDescriptors[static_cast<int>(f)];
}

// Derived constants (positive values).
constexpr double max_finite(Format f) {
  return finite_value(descriptor(f), descriptor(f).max_code());
}
constexpr double min_normal(Format f) {
  const auto& d = descriptor(f);
  return detail::pow2((d.has_subnormals ? 1 : 0) - d.bias);
}
// The smallest positive subnormal, or nothing for a format without subnormals.
constexpr std::optional<double> min_subnormal(Format f) {
  const auto& d = descriptor(f);
  if (!d.has_subnormals) return std::nullopt;
  return detail::pow2(1 - d.bias - d.mantissa_bits);
}
// The distance from 1.0 to the next larger value.
constexpr double epsilon(Format f) {
  return detail::pow2(-descriptor(f).mantissa_bits);
}

constexpr std::string_view name(Format f) {
  return descriptor(f).name;
}

// Accepts fp8kit's names ("e4m3fn") and PyTorch/ml_dtypes names ("float8_e4m3fn"), case-sensitive.
std::optional<Format> parse_format(std::string_view text);

// A code's bits as sign, exponent and mantissa fields joined by `separator` ("0 1000 110"; e8m0fnu: "01111111").
std::string code_bits(Format format, std::uint8_t code, char separator = ' ');
// How the format encodes Inf and NaN, as `fp8kit formats` prints them: "S.11111.00" (S: either sign), "none";
// "S.1111.111", "S.11111.{01,10,11}", "1.0000.000 (0x80) only", "11111111 (0xFF)".
std::string inf_encoding(Format format);
std::string nan_encoding(Format format);

}  // namespace fp8kit
