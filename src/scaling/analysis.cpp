// The holding criteria, the analysis loop and the choice of the best granularity.
#include "fp8kit/scaling/analysis.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "fp8kit/common/error.hpp"

namespace fp8kit {

bool holds(const QuantDiagnostics& d) {
  const bool sqnr_ok = d.exact || (d.sqnr_db && *d.sqnr_db >= kGoodSqnrDb);
  return sqnr_ok && d.saturated_count == 0 && d.underflow_fraction() <= kMaxUnderflowFraction;
}

int coarseness_rank(const Granularity& g) {
  switch (g.kind) {
    case Granularity::Kind::kTensor:
      return 0;
    case Granularity::Kind::kRow:
    case Granularity::Kind::kColumn:
      return 1;
    case Granularity::Kind::kBlock:
      return 2;
    case Granularity::Kind::kMx:
      return 3;
  }
  return 4;
}

void check_analysis_format(Format format) {
  FP8KIT_CHECK(format != Format::e8m0fnu,
               "e8m0fnu is MX's scale format and holds no values; analyze e4m3fn, e5m2, e4m3fnuz or e5m2fnuz (the "
               "mx32 granularity gives e8m0fnu scales)");
}

std::vector<Granularity> default_analysis_granularities() {
  return {Granularity::tensor(), Granularity::row(), Granularity::block(1, 128), Granularity::mx()};
}

std::vector<AnalysisRow> analyze(MatrixRef x, std::span<const Format> formats,
                                 std::span<const Granularity> granularities, Overflow overflow) {
  for (Format f : formats) check_analysis_format(f);
  if (x.dtype == DType::float64) {
    // Rounded to float32 as .float() does: values past its range become Inf (counted as non-finite), nonzero ones
    // below half its smallest subnormal become 0 and are counted as underflow in every row.
    x.check("analyze", DType::float64);
    std::vector<float> narrow(static_cast<std::size_t>(x.rows * x.cols));
    std::uint64_t flushed = 0;
    double largest_flushed = 0.0;
    for (std::int64_t r = 0; r < x.rows; ++r) {
      const double* in = x.row<double>(r);
      float* out = narrow.data() + r * x.cols;
      for (std::int64_t c = 0; c < x.cols; ++c) {
        out[c] = static_cast<float>(in[c]);
        if (in[c] != 0.0 && out[c] == 0.0f) {
          ++flushed;
          largest_flushed = std::max(largest_flushed, std::fabs(in[c]));
        }
      }
    }
    std::vector<AnalysisRow> rows = analyze(MatrixRef{narrow.data(), x.rows, x.cols}, formats, granularities, overflow);
    for (AnalysisRow& row : rows) {
      if (flushed == 0) break;
      row.d.nonzero_finite += flushed;
      row.d.underflow_count += flushed;
      row.d.exact = false;
      row.d.max_abs_error = std::max(row.d.max_abs_error, largest_flushed);
      row.d.max_rel_error = std::max(row.d.max_rel_error, 1.0);  // a value that became 0
    }
    return rows;
  }
  std::vector<AnalysisRow> rows;
  rows.reserve(formats.size() * granularities.size());
  ScaledTensor codes;  // reused: one buffer for every quantization
  for (Format f : formats) {
    for (const Granularity& g : granularities) {
      AnalysisRow r{f, g, overflow, {}};
      quantize_into(x, QuantizeOptions{f, overflow, g, ScaleOptions{}}, codes, &r.d);
      r.scales = static_cast<std::int64_t>(codes.scale_inv.size());
      rows.push_back(r);
    }
  }
  return rows;
}

const AnalysisRow* best_holding(std::span<const AnalysisRow> rows) {
  const AnalysisRow* best = nullptr;
  for (const AnalysisRow& r : rows) {
    if (!r.holds()) continue;
    if (best == nullptr) {
      best = &r;
      continue;
    }
    const auto key = [](const AnalysisRow& a) {
      return std::make_tuple(a.scales, coarseness_rank(a.granularity), -a.d.sqnr_db.value_or(1e9));
    };
    if (key(r) < key(*best)) best = &r;
  }
  return best;
}

}  // namespace fp8kit
