// The scalar amax loops: the reference the SIMD kernels are tested against, and their tails.
#include <algorithm>
#include <cmath>

#include "amax_kernels.hpp"

namespace fp8kit::scaling_detail {

void amax_scalar(const float* x, std::size_t n, AmaxResult& acc) {
  for (std::size_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (std::isnan(a)) {
      ++acc.nan_count;
    } else if (std::isinf(a)) {
      ++acc.inf_count;
    } else if (a > acc.amax) {
      acc.amax = a;
    }
  }
}

void amax_segments_scalar(const float* x, std::size_t n, std::size_t segment, float* out, AmaxResult& acc) {
  for (std::size_t k = 0; k * segment < n; ++k) {
    AmaxResult seg;
    amax_scalar(x + k * segment, std::min(segment, n - k * segment), seg);
    out[k] = seg.amax;
    acc.amax = std::max(acc.amax, seg.amax);
    acc.nan_count += seg.nan_count;
    acc.inf_count += seg.inf_count;
  }
}

void split_nonfinite(const float* x, std::size_t n, std::uint64_t nonfinite, AmaxResult& acc) {
  if (nonfinite == 0) return;
  std::uint64_t infs = 0;
  for (std::size_t i = 0; i < n; ++i) infs += std::isinf(x[i]) ? 1 : 0;
  acc.inf_count += infs;
  acc.nan_count += nonfinite - infs;
}

const AmaxTable& scalar_amax_kernels() {
  static const AmaxTable table{"scalar", Isa::kScalar, KernelContract::kBitIdentical, &amax_scalar,
                               &amax_segments_scalar};
  return table;
}

}  // namespace fp8kit::scaling_detail
