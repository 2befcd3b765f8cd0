// 16-bit storage types: bfloat16 and float16 (IEEE binary16), as bit containers with exact widening to float
// and round-to-nearest-even narrowing. No arithmetic and no implicit conversions: convert explicitly.
#pragma once

#include <bit>
#include <cstdint>

#include "fp8kit/common/host_device.hpp"

namespace fp8kit {

struct bfloat16 {
  std::uint16_t bits = 0;

  static constexpr bfloat16 from_bits(std::uint16_t b) { return bfloat16{b}; }
  // Round to nearest, ties to even; NaN stays NaN (quieted, sign kept); no flush of subnormals.
  static constexpr bfloat16 from_float(float x) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bfloat16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
    const std::uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
    return bfloat16{static_cast<std::uint16_t>(rounded >> 16)};
  }
  // Stochastic rounding with 16 uniform random bits: x rounds away from zero with probability (the 16 bits it
  // drops) / 2^16 and toward zero otherwise, so the result's expectation is x (unbiased; a finite x beyond the
  // largest bfloat16 may round to Inf). NaN stays NaN (quieted, sign kept).
  static constexpr bfloat16 from_float_stochastic(float x, std::uint16_t random) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bfloat16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
    if ((u & 0x7FFFFFFFu) == 0x7F800000u) return bfloat16{static_cast<std::uint16_t>(u >> 16)};
    return bfloat16{static_cast<std::uint16_t>((u + random) >> 16)};
  }
  // Exact: every bfloat16 is a float.
  constexpr float to_float() const { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }
  friend constexpr bool operator==(bfloat16, bfloat16) = default;
};

struct float16 {
  std::uint16_t bits = 0;

  static constexpr float16 from_bits(std::uint16_t b) { return float16{b}; }
  // Round to nearest, ties to even, with overflow to Inf as IEEE; NaN stays NaN (quieted, sign kept).
  static constexpr float16 from_float(float x) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
    const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    const std::uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return float16{static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu))};
    if (a >= 0x477FF000u) return float16{static_cast<std::uint16_t>(sign | 0x7C00u)};  // >= 65520: Inf
    const int e = static_cast<int>(a >> 23) - 127;
    if (e >= -14) {  // normal half: keep 10 of 23 mantissa bits
      const std::uint32_t r = a + 0xFFFu + ((a >> 13) & 1u) - (static_cast<std::uint32_t>(127 - 15) << 23);
      return float16{static_cast<std::uint16_t>(sign | (r >> 13))};
    }
    // subnormal half (or zero): quantum 2^-24
    if (e < -25) return float16{sign};  // below half the smallest subnormal (2^-25 itself rounds to even 0)
    const std::uint32_t sig = (a & 0x7FFFFFu) | 0x800000u;  // value = sig * 2^(e-23)
    const int shift = -e - 1;                               // (e - 23) - (-24) = e + 1 -> shift right by -(e+1)
    const std::uint32_t kept = sig >> shift;
    const std::uint32_t rem = sig & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    const std::uint32_t up = (rem > half || (rem == half && (kept & 1u))) ? 1u : 0u;
    return float16{static_cast<std::uint16_t>(sign | (kept + up))};
  }
  // Exact: every float16 is a float (a signaling NaN comes back quiet, as vcvtph2ps returns it).
  constexpr float to_float() const {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
    const std::uint32_t e = (bits >> 10) & 0x1Fu;
    const std::uint32_t m = bits & 0x3FFu;
    if (e == 0x1F) {  // Inf, or NaN quieted as the F16C instruction does
      return std::bit_cast<float>(sign | 0x7F800000u | (m << 13) | (m != 0 ? 0x00400000u : 0u));
    }
    if (e != 0) return std::bit_cast<float>(sign | ((e + 127 - 15) << 23) | (m << 13));
    if (m == 0) return std::bit_cast<float>(sign);
    // subnormal: m * 2^-24, exact in float
    const int lz = hd::countl_zero(m) - 22;  // leading zeros within 10 bits
    const std::uint32_t mm = (m << (lz + 1)) & 0x3FFu;
    const std::uint32_t ee = static_cast<std::uint32_t>(127 - 15 - lz);
    return std::bit_cast<float>(sign | (ee << 23) | (mm << 13));
  }
  friend constexpr bool operator==(float16, float16) = default;
};

}  // namespace fp8kit
