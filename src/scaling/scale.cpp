// The scale formula (see scale.hpp): the only place fp8kit turns an amax into a scale.
#include "fp8kit/scale.hpp"

#include <array>
#include <cfloat>
#include <cmath>

namespace fp8kit {

namespace {
// max_finite() of every format, computed once (the descriptor arithmetic is not free on a per-block path).
constexpr auto kMaxFinite = [] {
  std::array<double, kAllFormats.size()> m{};
  for (Format f : kAllFormats) m[static_cast<std::size_t>(f)] = max_finite(f);
  return m;
}();
}  // namespace

float compute_scale(float amax, Format format, const ScaleOptions& options, float previous_scale) {
  if (!std::isfinite(amax)) return previous_scale;
  double a = std::fabs(static_cast<double>(amax));
  if (a < options.epsilon) a = options.epsilon;
  if (a == 0.0) return previous_scale;
  // In double, then rounded once to float: the same as a correctly rounded float division (53 >= 2 * 24 + 2).
  double exact = kMaxFinite[static_cast<std::size_t>(format)] / a;
  if (options.margin != 0) exact = std::ldexp(exact, -options.margin);
  float scale = exact > FLT_MAX ? FLT_MAX : static_cast<float>(exact);
  if (scale == 0.0f) scale = FLT_MIN * FLT_EPSILON;  // a huge amax: the smallest positive scale, never zero
  if (options.rounding == ScaleRounding::kPowerOfTwoDown) {
    int exponent = 0;
    std::frexp(scale, &exponent);  // scale = m * 2^exponent, 0.5 <= m < 1
    scale = std::ldexp(1.0f, exponent - 1);
  }
  return scale;
}

}  // namespace fp8kit
