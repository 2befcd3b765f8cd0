// What `fp8kit analyze` calls holding: the criteria (SQNR, underflow, saturation), the preference for coarse
// granularities, and the pick of the best one; `analyze` prints it per file, `inspect` per high-precision tensor.
#pragma once

#include <vector>

#include "fp8kit/scaling/quantize.hpp"

namespace fp8kit::cli {

// A signal-to-noise ratio FP8's 3-4 significant bits can reach on well-scaled data, almost nothing flushed to
// zero, and nothing clipped.
inline constexpr double kGoodSqnrDb = 25.0;
inline constexpr double kMaxUnderflowFraction = 0.001;

bool holds(const QuantDiagnostics& d);
// Coarser granularities need fewer scales: 0 tensor, 1 row/column, 2 block, 3 MX.
int coarseness_rank(const Granularity& g);

// One quantization's result.
struct VerdictRow {
  Format format;
  Granularity granularity;
  QuantDiagnostics d;
};
// The row that holds with the coarsest granularity (then the best SQNR), or null when none holds.
const VerdictRow* best_holding(const std::vector<VerdictRow>& rows);

}  // namespace fp8kit::cli
