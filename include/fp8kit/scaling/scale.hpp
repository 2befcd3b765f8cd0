// The scale formula, in one place: the quantization scale (q = cast(x * scale)) from an amax, with Transformer
// Engine's guards; and its inverse, the dequantization scale (x ~= q * scale_inv) that GEMMs and checkpoints take.
#pragma once

#include <string_view>

#include "fp8kit/format/format.hpp"

namespace fp8kit {

enum class ScaleRounding : std::uint8_t {
  kExact,           // fp8_max / amax / 2^margin, rounded once to float (Transformer Engine, torchao tensorwise)
  kPowerOfTwoDown,  // then rounded down to a power of two (torchao row-wise, MS-AMP, TE block scaling)
};

struct ScaleOptions {
  int margin = 0;        // scale = (fp8_max / amax) / 2^margin
  float epsilon = 0.0f;  // amax = max(amax, epsilon) first (torchao uses 1e-12; 0 = off)
  ScaleRounding rounding = ScaleRounding::kExact;
};

// The quantization scale for a tensor (or block) with this amax, for `format`'s largest finite value:
//   amax NaN or +-Inf -> previous_scale (Transformer Engine keeps the last good scale)
//   amax = max(amax, epsilon); amax == 0 -> previous_scale (nothing to scale)
//   scale = fp8_max / amax / 2^margin, rounded once to float; if that overflows float -> FLT_MAX, below FLT_MIN
//   (a large margin) -> FLT_MIN (so that 1 / scale stays finite)
//   kPowerOfTwoDown: the largest power of two <= scale
float compute_scale(float amax, Format format, const ScaleOptions& options = {}, float previous_scale = 1.0f);

// Error(kInvalidArgument) naming `op` for options no scale can come from (an epsilon that is NaN, Inf or negative):
// compute_scale and quantize check them first.
void check_scale_options(const ScaleOptions& options, std::string_view op);

// The dequantization scale: 1 / scale, in float.
inline float dequantization_scale(float scale) {
  return 1.0f / scale;
}

}  // namespace fp8kit
