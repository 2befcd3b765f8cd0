// Scalar FP8 types: float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, float8_e5m2fnuz, float8_e8m0fnu, each a byte
// plus its format, with explicit conversions only; std::numeric_limits derived from the format descriptor.
#pragma once

#include <cstdint>
#include <limits>

#include "fp8kit/format/codec.hpp"
#include "fp8kit/format/format.hpp"

namespace fp8kit {

template <Format F>
struct float8 {
  static constexpr Format format = F;
  std::uint8_t bits = 0;

  static constexpr float8 from_bits(std::uint8_t b) { return float8{b}; }
  // Round to nearest even. The overflow policy has no default: say which convention you want.
  static float8 from_float(float x, Overflow overflow) { return float8{encode(x, EncodeSpec{F, overflow})}; }
  static float8 from_double(double x, Overflow overflow) { return float8{encode(x, EncodeSpec{F, overflow})}; }
  float to_float() const { return decode_to_float(F, bits); }
  double to_double() const { return decode_to_double(F, bits); }
  constexpr bool is_nan() const { return descriptor(F).is_nan(bits); }
  constexpr bool is_inf() const { return descriptor(F).is_inf(bits); }
  // Bitwise equality (NaN == NaN here); compare values through to_float().
  friend constexpr bool operator==(float8, float8) = default;
};

using float8_e4m3fn = float8<Format::e4m3fn>;
using float8_e5m2 = float8<Format::e5m2>;
using float8_e4m3fnuz = float8<Format::e4m3fnuz>;
using float8_e5m2fnuz = float8<Format::e5m2fnuz>;
using float8_e8m0fnu = float8<Format::e8m0fnu>;

}  // namespace fp8kit

// numeric_limits for every float8<F>, derived from descriptor(F): nothing here is written per format.
template <fp8kit::Format F>
class std::numeric_limits<fp8kit::float8<F>> {
  using T = fp8kit::float8<F>;
  static constexpr const fp8kit::FormatDescriptor& d() { return fp8kit::descriptor(F); }
  static constexpr std::uint8_t min_normal_code() {
    return static_cast<std::uint8_t>(d().has_subnormals ? (1 << d().mantissa_bits) : 0);
  }

 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = fp8kit::descriptor(F).has_sign;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = fp8kit::descriptor(F).has_inf;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = false;
  static constexpr std::float_denorm_style has_denorm =
      fp8kit::descriptor(F).has_subnormals ? std::denorm_present : std::denorm_absent;
  static constexpr bool has_denorm_loss = false;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  static constexpr bool is_iec559 = false;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = fp8kit::descriptor(F).mantissa_bits + 1;
  static constexpr int digits10 = 0;
  static constexpr int max_digits10 = fp8kit::descriptor(F).mantissa_bits == 0 ? 2 : 3;
  static constexpr int radix = 2;
  // As in <limits>: min_exponent is one more than the exponent of min(), max_exponent one more than max()'s.
  static constexpr int min_exponent = (fp8kit::descriptor(F).has_subnormals ? 1 : 0) - fp8kit::descriptor(F).bias + 1;
  static constexpr int max_exponent =
      (fp8kit::descriptor(F).max_code() >> fp8kit::descriptor(F).mantissa_bits) - fp8kit::descriptor(F).bias + 1;
  static constexpr int min_exponent10 = 0;
  static constexpr int max_exponent10 = 0;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  static constexpr T min() noexcept { return T::from_bits(min_normal_code()); }
  static constexpr T max() noexcept { return T::from_bits(d().max_code()); }
  static constexpr T lowest() noexcept {
    return T::from_bits(static_cast<std::uint8_t>(d().has_sign ? (d().max_code() | 0x80) : min_normal_code()));
  }
  // 1 + epsilon is the next value after 1.0: epsilon = 2^-mantissa_bits.
  static constexpr T epsilon() noexcept {
    return T::from_bits(static_cast<std::uint8_t>((d().bias - d().mantissa_bits) << d().mantissa_bits));
  }
  // Half an ulp of 1.0 (round to nearest).
  static constexpr T round_error() noexcept {
    return T::from_bits(static_cast<std::uint8_t>((d().bias - 1) << d().mantissa_bits));
  }
  static constexpr T infinity() noexcept {
    return T::from_bits(d().has_inf ? d().inf_code(false) : d().nan_code(false));
  }
  static constexpr T quiet_NaN() noexcept { return T::from_bits(d().nan_code(false)); }
  static constexpr T signaling_NaN() noexcept { return T::from_bits(d().nan_code(false)); }
  static constexpr T denorm_min() noexcept { return T::from_bits(d().has_subnormals ? 1 : 0); }
};
