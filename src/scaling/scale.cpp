// The scale formula (see scale.hpp): the only place fp8kit turns an amax into a scale.
#include "fp8kit/scaling/scale.hpp"

#include <array>
#include <cfloat>
#include <cmath>
#include <limits>

namespace fp8kit {

namespace {
// max_finite() of every format as a float, computed once (the descriptor arithmetic is not free per block).
constexpr auto kMaxFinite = [] {
  std::array<float, kAllFormats.size()> m{};
  for (Format f : kAllFormats) m[static_cast<std::size_t>(f)] = static_cast<float>(max_finite(f));
  return m;
}();
}  // namespace

float compute_scale(float amax, Format format, const ScaleOptions& options, float previous_scale) {
  if (!std::isfinite(amax)) return previous_scale;
  float a = std::fabs(amax);
  if (a < options.epsilon) a = options.epsilon;
  if (a == 0.0f) return previous_scale;
  // One correctly rounded float division (the same result as dividing in double and rounding once: 53 >= 2*24+2);
  // the margin's power of two is exact unless the scale leaves float's normal range.
  float scale = kMaxFinite[static_cast<std::size_t>(format)] / a;
  if (options.margin != 0) scale = std::ldexp(scale, -options.margin);
  if (std::isinf(scale)) scale = FLT_MAX;
  if (scale == 0.0f) scale = std::numeric_limits<float>::denorm_min();  // a huge amax: smallest positive scale
  if (options.rounding == ScaleRounding::kPowerOfTwoDown) {
    int exponent = 0;
    std::frexp(scale, &exponent);  // scale = m * 2^exponent, 0.5 <= m < 1
    scale = std::ldexp(1.0f, exponent - 1);
  }
  return scale;
}

}  // namespace fp8kit
