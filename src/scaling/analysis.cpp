// The holding criteria, the analysis loop and the choice of the best granularity.
#include "fp8kit/scaling/analysis.hpp"

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

std::vector<Granularity> default_analysis_granularities() {
  return {Granularity::tensor(), Granularity::row(), Granularity::block(1, 128), Granularity::mx()};
}

std::vector<AnalysisRow> analyze(MatrixRef x, std::span<const Format> formats,
                                 std::span<const Granularity> granularities, Overflow overflow) {
  std::vector<AnalysisRow> rows;
  rows.reserve(formats.size() * granularities.size());
  ScaledTensor codes;  // reused: one buffer for every quantization
  for (Format f : formats) {
    for (const Granularity& g : granularities) {
      AnalysisRow r{f, g, overflow, {}};
      quantize_into(x, QuantizeOptions{f, overflow, g, ScaleOptions{}}, codes, &r.d);
      rows.push_back(r);
    }
  }
  return rows;
}

const AnalysisRow* best_holding(std::span<const AnalysisRow> rows) {
  const AnalysisRow* best = nullptr;
  for (const AnalysisRow& r : rows) {
    if (!r.holds()) continue;
    if (best == nullptr || coarseness_rank(r.granularity) < coarseness_rank(best->granularity) ||
        (coarseness_rank(r.granularity) == coarseness_rank(best->granularity) &&
         r.d.sqnr_db.value_or(1e9) > best->d.sqnr_db.value_or(1e9))) {
      best = &r;
    }
  }
  return best;
}

}  // namespace fp8kit
