// Internal: the scaling layer's kernels (amax over a contiguous span) per instruction set, and the dispatch.
#pragma once

#include <cstddef>

#include "fp8kit/amax.hpp"

namespace fp8kit::scaling_detail {

// Adds the amax and non-finite counts of x[0..n) into `acc` (acc.amax = max(acc.amax, ...)).
using AmaxFn = void (*)(const float* x, std::size_t n, AmaxResult& acc);

// out[k] = amax of x[k * segment, min(n, (k + 1) * segment)) for every segment; counts and the overall max go
// into `acc` as for AmaxFn.
using AmaxSegmentsFn = void (*)(const float* x, std::size_t n, std::size_t segment, float* out, AmaxResult& acc);

void amax_scalar(const float* x, std::size_t n, AmaxResult& acc);
void amax_segments_scalar(const float* x, std::size_t n, std::size_t segment, float* out, AmaxResult& acc);
// nullptr when this CPU lacks AVX2.
AmaxFn amax_avx2_kernel();
AmaxSegmentsFn amax_segments_avx2_kernel();
AmaxFn best_amax_kernel();
AmaxSegmentsFn best_amax_segments_kernel();

}  // namespace fp8kit::scaling_detail
