// amax over spans and blocks: the dispatch to the kernel tables, threads for large inputs, and the
// block grid (per row, per column, per block, per tensor are all block shapes).
#include "fp8kit/scaling/amax.hpp"
#include "fp8kit/scaling/cuda_amax.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/no_cuda.hpp"
#include "common/parallel.hpp"
#include "cpu/amax_kernels.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"

namespace fp8kit {
namespace scaling_detail {

const detail::IsaTables<AmaxTable>& amax_tables() {
  static const detail::IsaTables<AmaxTable> tables(
      {&scalar_amax_kernels(), &avx2_amax_kernels(), &avx512_amax_kernels(), nullptr, nullptr});
  return tables;
}

}  // namespace scaling_detail

std::string_view amax_kernel() {
  return scaling_detail::active_amax_kernels().name;
}

namespace {

constexpr auto kParallelThreshold = static_cast<std::size_t>(detail::kParallelStreamElements);

}  // namespace

AmaxResult amax(std::span<const float> x) {
  const auto kernel = scaling_detail::active_amax_kernels().amax;
  AmaxResult total;
  const int threads = num_threads();
  if (x.size() < kParallelThreshold || threads <= 1) {
    kernel(x.data(), x.size(), total);
    return total;
  }
  std::vector<AmaxResult> parts(static_cast<std::size_t>(threads));
  const std::size_t per = (x.size() + static_cast<std::size_t>(threads) - 1) / static_cast<std::size_t>(threads);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const std::size_t begin = std::min(x.size(), per * static_cast<std::size_t>(t));
    const std::size_t end = std::min(x.size(), begin + per);
    kernel(x.data() + begin, end - begin, parts[static_cast<std::size_t>(t)]);
  }
  for (const AmaxResult& part : parts) total.merge(part);
  return total;
}

void amax_blocks(MatrixRef x, std::int64_t block_rows, std::int64_t block_cols, std::span<float> out,
                 AmaxResult* total) {
  x.element<float>("amax_blocks");
  FP8KIT_CHECK(block_rows >= 1 && block_cols >= 1, "amax_blocks: block shape must be positive, got ", block_rows, "x",
               block_cols);
  const std::int64_t grid_rows = ceil_div(x.rows, block_rows);
  const std::int64_t grid_cols = ceil_div(x.cols, block_cols);
  FP8KIT_CHECK(static_cast<std::int64_t>(out.size()) == grid_rows * grid_cols, "amax_blocks: output has ", out.size(),
               " entries, the ", grid_rows, "x", grid_cols, " block grid needs ", grid_rows * grid_cols);
  const auto kernel = scaling_detail::active_amax_kernels().amax;
  std::vector<AmaxResult> parts(static_cast<std::size_t>(grid_rows));
  const bool parallel = x.rows * x.cols >= static_cast<std::int64_t>(kParallelThreshold) && grid_rows > 1;
  // One block row per iteration: its blocks are reduced row by row, each row segment by the span kernel (or,
  // for narrow blocks such as single columns, elementwise).
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(dynamic, 1) if (parallel)
  for (std::int64_t gr = 0; gr < grid_rows; ++gr) {
    AmaxResult& part = parts[static_cast<std::size_t>(gr)];
    float* block_amax = out.data() + gr * grid_cols;
    std::fill(block_amax, block_amax + grid_cols, 0.0f);
    const std::int64_t row_end = std::min(x.rows, (gr + 1) * block_rows);
    for (std::int64_t r = gr * block_rows; r < row_end; ++r) {
      const float* row = x.row<float>(r);
      for (std::int64_t gc = 0; gc < grid_cols; ++gc) {
        const std::int64_t c0 = gc * block_cols;
        const std::int64_t c1 = std::min(x.cols, c0 + block_cols);
        AmaxResult seg;
        if (block_cols >= 16) {
          kernel(row + c0, static_cast<std::size_t>(c1 - c0), seg);
        } else {
          scaling_detail::amax_scalar(row + c0, static_cast<std::size_t>(c1 - c0), seg);
        }
        block_amax[gc] = std::max(block_amax[gc], seg.amax);
        part.merge(seg);
      }
    }
  }
  if (total != nullptr) {
    *total = AmaxResult{};
    for (const AmaxResult& part : parts) total->merge(part);
  }
}

}  // namespace fp8kit

#ifndef FP8KIT_HAVE_CUDA
// The CPU-only build's device amax (cuda_amax.hpp): there is no device to run it on.
namespace fp8kit::cuda {
AmaxResult amax(const float*, std::int64_t, int) {
  detail::throw_no_cuda_backend("amax");
}
AmaxResult cast_to_fp8_with_amax(const float*, std::uint8_t*, std::int64_t, const CastOptions&, int) {
  detail::throw_no_cuda_backend("cast_to_fp8_with_amax");
}
}  // namespace fp8kit::cuda
#endif
