// The scale formula (see scale.hpp): the only place fp8kit turns an amax into a scale.
#include "fp8kit/scaling/scale.hpp"

#include <array>
#include <cmath>
#include <string_view>

#include "fp8kit/common/error.hpp"

#include "fp8kit/scaling/scale_inline.hpp"

namespace fp8kit {

namespace {
// max_finite() of every format as a float, computed once (the descriptor arithmetic is not free per block).
constexpr auto kMaxFinite = [] {
  std::array<float, kAllFormats.size()> m{};
  for (Format f : kAllFormats) m[static_cast<std::size_t>(f)] = static_cast<float>(max_finite(f));
  return m;
}();
}  // namespace

void check_scale_options(const ScaleOptions& options, std::string_view op) {
  // An Inf epsilon made every amax Inf's: scale 0 clamped to FLT_MIN, every code 0, with nothing said.
  FP8KIT_CHECK(std::isfinite(options.epsilon) && options.epsilon >= 0.0f, op,
               ": ScaleOptions::epsilon must be finite and >= 0, not ", options.epsilon);
}

float compute_scale(float amax, Format format, const ScaleOptions& options, float previous_scale) {
  check_scale_options(options, "compute_scale");
  return scale_detail::scale_from_amax(amax, kMaxFinite[static_cast<std::size_t>(format)], options, previous_scale);
}

}  // namespace fp8kit
