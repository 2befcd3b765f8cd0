// The holding criteria and the choice of the best granularity shared by `analyze` and `inspect`.
#include "fp8_verdict.hpp"

namespace fp8kit::cli {

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

const VerdictRow* best_holding(const std::vector<VerdictRow>& rows) {
  const VerdictRow* best = nullptr;
  for (const VerdictRow& r : rows) {
    if (!holds(r.d)) continue;
    if (best == nullptr || coarseness_rank(r.granularity) < coarseness_rank(best->granularity) ||
        (coarseness_rank(r.granularity) == coarseness_rank(best->granularity) &&
         r.d.sqnr_db.value_or(1e9) > best->d.sqnr_db.value_or(1e9))) {
      best = &r;
    }
  }
  return best;
}

}  // namespace fp8kit::cli
