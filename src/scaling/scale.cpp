// The scale formula (see scale.hpp): the only place fp8kit turns an amax into a scale.
#include "fp8kit/scaling/scale.hpp"

#include <array>

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

float compute_scale(float amax, Format format, const ScaleOptions& options, float previous_scale) {
  return scale_detail::scale_from_amax(amax, kMaxFinite[static_cast<std::size_t>(format)], options, previous_scale);
}

}  // namespace fp8kit
