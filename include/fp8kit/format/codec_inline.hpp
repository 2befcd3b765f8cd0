// The body of the generic scalar converter (codec.hpp's encode()), as inline functions, for element loops that
// want it inlined with the format a constant: the scalar conversion kernels and the CUDA kernels (FP8KIT_HD: the
// same definition compiles for the host and the device). Prefer encode() everywhere else; this header is the spec
// in code, and the two never differ.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "fp8kit/common/host_device.hpp"
#include "fp8kit/format/codec.hpp"

namespace fp8kit::codec_detail {

// An input value, unpacked without rounding.
struct Unpacked {
  enum class Kind : std::uint8_t { kZero, kFinite, kInf, kNan };
  Kind kind;
  bool negative;
  std::uint64_t significand;  // value = significand * 2^exponent, significand != 0 when finite
  int exponent;
};

// Unpacks an IEEE-style binary format with `E` exponent bits and `M` stored mantissa bits held in `bits`.
template <int E, int M, typename Bits>
FP8KIT_HD inline Unpacked unpack_ieee(Bits bits) {
  constexpr int kBias = (1 << (E - 1)) - 1;
  const bool negative = (bits >> (E + M)) & 1;
  const int field = static_cast<int>((bits >> M) & ((Bits{1} << E) - 1));
  const std::uint64_t mant = static_cast<std::uint64_t>(bits & ((Bits{1} << M) - 1));
  if (field == (1 << E) - 1) return {mant ? Unpacked::Kind::kNan : Unpacked::Kind::kInf, negative, 0, 0};
  if (field == 0) {
    if (mant == 0) return {Unpacked::Kind::kZero, negative, 0, 0};
    return {Unpacked::Kind::kFinite, negative, mant, 1 - kBias - M};
  }
  return {Unpacked::Kind::kFinite, negative, mant | (std::uint64_t{1} << M), field - kBias - M};
}

FP8KIT_HD inline std::uint8_t with_sign(const FormatDescriptor& d, std::uint8_t magnitude, bool negative) {
  if (!negative || !d.has_sign) return magnitude;
  if (magnitude == 0 && !d.has_negative_zero()) return 0;  // fnuz: -0 becomes +0
  return static_cast<std::uint8_t>(magnitude | 0x80);
}

FP8KIT_HD inline std::uint8_t overflow_code(const FormatDescriptor& d, Overflow overflow, bool negative) {
  if (overflow == Overflow::kSaturate) return with_sign(d, d.max_code(), negative);
  return d.has_inf ? d.inf_code(negative) : d.nan_code(negative);
}

// Should a value whose dropped part is `rem` out of 2^shift round away from zero?
FP8KIT_HD inline bool round_up(std::uint64_t kept, std::uint64_t sig, int shift, Rounding rounding,
                               std::uint32_t random_bits) {
  // rem = sig mod 2^shift (all of sig when shift >= 64)
  const std::uint64_t rem = shift >= 64 ? sig : (sig & ((std::uint64_t{1} << shift) - 1));
  if (rounding == Rounding::kNearestEven) {
    if (shift > 64) return false;  // rem < 2^64 <= half
    const std::uint64_t half = std::uint64_t{1} << (shift - 1);
    return rem > half || (rem == half && (kept & 1));
  }
  // Stochastic: the top 32 bits of the dropped fraction, compared with 32 random bits.
  std::uint64_t frac32;
  if (shift <= 32) {
    frac32 = rem << (32 - shift);
  } else {
    frac32 = (shift - 32) >= 64 ? 0 : (rem >> (shift - 32));
  }
  return random_bits < frac32;
}

// The converter. `d` is a parameter so that loops over one format can pass a constant and let it fold.
[[gnu::always_inline]] FP8KIT_HD inline std::uint8_t encode_unpacked(const FormatDescriptor& d, const Unpacked& u,
                                                                     const EncodeSpec& spec,
                                                                     std::uint32_t random_bits) {
  // 1. NaN stays NaN (the canonical quiet NaN, with the input's sign where the format has a signed NaN).
  if (u.kind == Unpacked::Kind::kNan) return d.nan_code(u.negative);
  // 2. A format without a sign bit (e8m0fnu) has no representation for negative values: NaN.
  if (!d.has_sign && u.negative && u.kind != Unpacked::Kind::kZero) return d.nan_code(false);
  // 3. Infinity is an overflow: Inf/NaN (non-saturating) or +-max (saturating).
  if (u.kind == Unpacked::Kind::kInf) return overflow_code(d, spec.overflow, u.negative);
  // 4. Zero keeps its sign where the format has -0. e8m0fnu has no zero: NaN, or its minimum when saturating.
  if (u.kind == Unpacked::Kind::kZero) {
    if (!d.has_zero()) return spec.overflow == Overflow::kSaturate ? 0x00 : d.nan_code(false);
    return with_sign(d, 0, u.negative);
  }
  // 5. Find the value's binary exponent E (value = 1.fff * 2^E) and the quantum of the target at that exponent.
  const int m = d.mantissa_bits;
  const int msb = 63 - hd::countl_zero(u.significand);
  const int e = u.exponent + msb;
  const int emin = (d.has_subnormals ? 1 : 0) - d.bias;  // exponent of the smallest normal
  const int emax = (d.max_code() >> m) - d.bias;         // exponent of the largest finite value
  if (e > emax + 1) return overflow_code(d, spec.overflow, u.negative);
  const int quantum_exp = (e < emin ? emin : e) - m;
  // 6. Round the significand to a multiple of the quantum: kept * 2^quantum_exp.
  const int shift = quantum_exp - u.exponent;
  std::uint64_t kept;
  if (shift <= 0) {
    kept = u.significand << -shift;  // exact: fewer significant bits than the target keeps
  } else {
    kept = shift >= 64 ? 0 : (u.significand >> shift);
    if (round_up(kept, u.significand, shift, spec.rounding, random_bits)) ++kept;
  }
  // 7. Assemble the code. kept has at most m+1 bits; a carry into bit m+1 moves to the next binade by itself.
  std::uint64_t code;
  if (e < emin) {
    // Below the smallest normal: subnormal codes are kept itself (kept == 2^m is the smallest normal).
    // A format without subnormals (e8m0fnu) has no zero either: what rounds below its minimum becomes the minimum.
    code = d.has_subnormals ? kept : 0;
  } else {
    code = (static_cast<std::uint64_t>(e + d.bias) << m) + (kept - (std::uint64_t{1} << m));
  }
  // 8. Past the largest finite code: overflow.
  if (code > d.max_code()) return overflow_code(d, spec.overflow, u.negative);
  // 9. Apply the sign.
  return with_sign(d, static_cast<std::uint8_t>(code), u.negative);
}

// A code's exact value as a float, decode_to_float's (codec.hpp) without its table, for device code: quiet NaN with
// the code's sign, +-Inf, or the finite value from ldexpf (exact: every FP8 value is a float, e8m0fnu's 2^-127 a
// subnormal one).
FP8KIT_HD inline float decode_code(const FormatDescriptor& d, std::uint8_t code) {
  const bool negative = d.has_sign && (code & 0x80);
  if (d.is_nan(code)) return std::bit_cast<float>(negative ? 0xFFC00000u : 0x7FC00000u);
  if (d.is_inf(code)) return std::bit_cast<float>(negative ? 0xFF800000u : 0x7F800000u);
  const int mag = code & d.magnitude_mask();
  const int field = mag >> d.mantissa_bits;
  const int mant = mag & ((1 << d.mantissa_bits) - 1);
  const float v = (field == 0 && d.has_subnormals)
                      ? ldexpf(static_cast<float>(mant), 1 - d.bias - d.mantissa_bits)
                      : ldexpf(static_cast<float>((1 << d.mantissa_bits) + mant), field - d.bias - d.mantissa_bits);
  return negative ? -v : v;
}

template <typename T>
FP8KIT_HD inline Unpacked unpack(T x) {
  if constexpr (std::is_same_v<T, double>) {
    return unpack_ieee<11, 52>(std::bit_cast<std::uint64_t>(x));
  } else if constexpr (std::is_same_v<T, float>) {
    return unpack_ieee<8, 23>(std::bit_cast<std::uint32_t>(x));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return unpack_ieee<8, 7>(x.bits);
  } else {
    static_assert(std::is_same_v<T, float16>);
    return unpack_ieee<5, 10>(x.bits);
  }
}

}  // namespace fp8kit::codec_detail
