// The bodies of the scale formulas (scale.hpp's compute_scale, quantize.hpp's mx_scale_code) as inline functions
// that host code and CUDA device code share (FP8KIT_HD), as codec_inline.hpp is for the codec: the CPU's scales and
// the device's are one definition. Prefer compute_scale() and mx_scale_code() everywhere else.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "fp8kit/common/host_device.hpp"
#include "fp8kit/scaling/scale.hpp"

namespace fp8kit::scale_detail {

// 2^e for -127 <= e <= 127, exactly, without a libm call (2^-127 is a float subnormal).
FP8KIT_HD inline float pow2f(int e) {
  return e >= -126 ? std::bit_cast<float>(static_cast<std::uint32_t>(e + 127) << 23)
                   : std::bit_cast<float>(0x00400000u);
}

// compute_scale(amax, format, options, previous) with `fp8_max` the format's largest finite value as a float.
FP8KIT_HD inline float scale_from_amax(float amax, float fp8_max, const ScaleOptions& options, float previous) {
  const std::uint32_t magnitude = std::bit_cast<std::uint32_t>(amax) & 0x7FFFFFFFu;
  if (magnitude >= 0x7F800000u) return previous;  // NaN or +-Inf: keep the last good scale
  float a = std::bit_cast<float>(magnitude);
  if (a < options.epsilon) a = options.epsilon;
  if (a == 0.0f) return previous;
  // One correctly rounded float division (the same result as dividing in double and rounding once: 53 >= 2*24+2);
  // the margin's power of two is exact unless the scale leaves float's normal range.
  float scale = fp8_max / a;
  // fp8_max / a lies within 2^-121 .. 2^166, so any margin beyond +-512 ends at FLT_MIN or FLT_MAX as +-512 does;
  // the bound keeps -margin defined (INT_MIN).
  const int margin = options.margin < -512 ? -512 : (options.margin > 512 ? 512 : options.margin);
  if (margin != 0) scale = ldexpf(scale, -margin);
  if ((std::bit_cast<std::uint32_t>(scale) & 0x7FFFFFFFu) == 0x7F800000u) scale = 3.40282347e38f;  // FLT_MAX
  // A large margin can take it below float's normal range, where 1 / scale would be Inf (and dequantizing NaN): the
  // smallest normal float instead, whose inverse 2^126 is finite.
  if (scale < 1.17549435e-38f) scale = 1.17549435e-38f;  // FLT_MIN
  if (options.rounding == ScaleRounding::kPowerOfTwoDown) {
    int exponent = 0;
    frexpf(scale, &exponent);  // scale = m * 2^exponent, 0.5 <= m < 1
    scale = ldexpf(1.0f, exponent - 1);
  }
  return scale;
}

// What an MX element format's scale codes are computed from: the exponent of its largest normal (OCP's emax_elem) and
// 1 / its largest finite value as a float (Transformer Engine's reciprocal).
struct MxConstants {
  int emax_elem;
  float max_reciprocal;
};
constexpr MxConstants mx_constants(Format f) {
  int e = 0;  // floor(log2(max_finite)), max_finite >= 1 in every format
  for (double x = max_finite(f); x >= 2.0; x /= 2.0) ++e;
  return {e, 1.0f / static_cast<float>(max_finite(f))};
}

// mx_scale_code(amax, element format, mode) with the element format's `emax_elem` (the exponent of its largest
// normal) and `max_reciprocal` (1 / its largest finite value, as a float).
FP8KIT_HD inline std::uint8_t mx_code(float amax, int emax_elem, float max_reciprocal, bool rceil) {
  const std::uint32_t magnitude = std::bit_cast<std::uint32_t>(amax) & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return 0xFF;   // NaN
  if (magnitude == 0x7F800000u) return 0xFE;  // Inf
  if (magnitude == 0) return 0x00;
  int code = 0;
  if (!rceil) {
    // X = 2^(floor(log2(amax)) - emax_elem).
    const int field = static_cast<int>(magnitude >> 23);
    const int exponent = field != 0 ? field - 127 : hd::bit_width(magnitude) - 1 - 149;
    code = exponent - emax_elem + 127;
  } else {
    // amax * (1 / fp8_max) in float, as Transformer Engine computes it, rounded up to a power of two.
    const float s = std::bit_cast<float>(magnitude) * max_reciprocal;
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(s);
    const int field = static_cast<int>(bits >> 23);
    const std::uint32_t mant = bits & 0x7FFFFFu;
    if (s == 0.0f) {
      code = 0;
    } else if (field == 0) {  // subnormal float: 2^ceil(log2(mant * 2^-149))
      code = hd::bit_width(mant - 1) - 149 + 127;
    } else {
      code = field + (mant != 0 ? 1 : 0);
    }
  }
  return static_cast<std::uint8_t>(code < 0 ? 0 : code > 254 ? 254 : code);
}

// The dequantization scale an E8M0 code stands for (quantize.hpp's mx_scale_value).
FP8KIT_HD inline float mx_value(std::uint8_t code) {
  return code == 0xFF ? std::bit_cast<float>(0x7FC00000u) : pow2f(code - 127);
}

}  // namespace fp8kit::scale_detail
