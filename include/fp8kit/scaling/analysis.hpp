// Does FP8 hold a tensor, and at which granularity? Quantizes it per format x granularity and measures what each
// loses (QuantDiagnostics), against one set of criteria: `fp8kit analyze` prints it per file, `fp8kit inspect` per
// high-precision tensor, and the Python package's fp8kit.analyze() returns it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "fp8kit/scaling/quantize.hpp"

namespace fp8kit {

// A signal-to-noise ratio FP8's 3-4 significant bits can reach on well-scaled data, almost nothing flushed to
// zero, and nothing clipped.
inline constexpr double kGoodSqnrDb = 25.0;
inline constexpr double kMaxUnderflowFraction = 0.001;

// Whether a quantization meets the criteria: SQNR >= kGoodSqnrDb (or exact), nothing saturated, at most
// kMaxUnderflowFraction of the nonzero inputs flushed to zero.
bool holds(const QuantDiagnostics& d);

// How granularities of the same scale count are ordered (fewer scales comes first; best_holding): 0 tensor,
// 1 row/column, 2 block, 3 MX.
int coarseness_rank(const Granularity& g);

// Error(kInvalidArgument) for a format that holds no values (e8m0fnu, MX's scale format), naming the ones that do;
// analyze() checks its formats with it.
void check_analysis_format(Format format);

// The granularities analyze tries when none are named: tensor, row, block:1x128, mx32.
std::vector<Granularity> default_analysis_granularities();

// One quantization's result.
struct AnalysisRow {
  Format format;
  Granularity granularity;
  Overflow overflow;
  QuantDiagnostics d;
  // How many scales the granularity takes for this tensor's shape (the grid of blocks, 1 per tensor; an empty tensor
  // stores none), as analyze() fills it: best_holding orders by it.
  std::int64_t scales = 0;
  bool holds() const { return fp8kit::holds(d); }
};

// x quantized (scales computed as quantize() computes them, with ScaleOptions' defaults) for each format, then each
// granularity, in that order; the codes are dropped, the diagnostics kept. x is float32, bfloat16, float16 or
// float64; float64 is rounded to float32 first (as .float() does): values past float32's range read as Inf (counted
// in nonfinite_count, not measured), and nonzero values below half its smallest subnormal (2^-150) read as 0 and are
// counted as underflow in every row: no float32 or E8M0 scale lifts them to an FP8 subnormal, so every format and
// granularity loses them.
std::vector<AnalysisRow> analyze(MatrixRef x, std::span<const Format> formats,
                                 std::span<const Granularity> granularities, Overflow overflow = Overflow::kSaturate);

// The row that holds with the coarsest granularity, or null when none holds: the fewest scales for this shape (a
// 128x128 block grid of a 256x4096 tensor, 64 scales, is coarser than its 256 rows or 4096 columns), then the
// lowest coarseness_rank (a 1-scale block is per tensor), then the best SQNR.
const AnalysisRow* best_holding(std::span<const AnalysisRow> rows);

}  // namespace fp8kit
