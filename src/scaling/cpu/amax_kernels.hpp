// Internal: the scaling layer's kernels (amax over a contiguous span, and per segment), one table per ISA level
// (src/scaling/cpu/amax_<isa>.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/dispatch.hpp"
#include "fp8kit/common/kernel_contract.hpp"
#include "fp8kit/scaling/amax.hpp"

namespace fp8kit::scaling_detail {

// Adds the amax and non-finite counts of x[0..n) into `acc` (acc.amax = max(acc.amax, ...)).
using AmaxFn = void (*)(const float* x, std::size_t n, AmaxResult& acc);

// out[k] = amax of x[k * segment, min(n, (k + 1) * segment)) for every segment; counts and the overall max go
// into `acc` as for AmaxFn.
using AmaxSegmentsFn = void (*)(const float* x, std::size_t n, std::size_t segment, float* out, AmaxResult& acc);

// A level's amax kernels; their contract is always kBitIdentical (a maximum and counts are exact): the scalar
// table's results, which the tests compare every table with.
struct AmaxTable {
  std::string_view name;
  Isa isa;
  KernelContract contract;
  AmaxFn amax;
  AmaxSegmentsFn amax_segments;
};

const AmaxTable& scalar_amax_kernels();
const AmaxTable& avx2_amax_kernels();
const AmaxTable& avx512_amax_kernels();
const detail::IsaTables<AmaxTable>& amax_tables();
inline const AmaxTable& active_amax_kernels() {
  return amax_tables().active();
}

// The scalar loops (also the SIMD kernels' tails).
void amax_scalar(const float* x, std::size_t n, AmaxResult& acc);
void amax_segments_scalar(const float* x, std::size_t n, std::size_t segment, float* out, AmaxResult& acc);
// For the SIMD kernels, which count non-finite elements without telling NaN from Inf: only when there are any,
// splits `nonfinite` (the count over x[0..n)) into acc's NaN and Inf counts with a second, scalar look at the data.
void split_nonfinite(const float* x, std::size_t n, std::uint64_t nonfinite, AmaxResult& acc);

}  // namespace fp8kit::scaling_detail
