// amax: the largest finite magnitude of a tensor, its rows, columns or blocks, the input of every scale formula.
// NaN and Inf are counted and reported, never silently dropped or allowed to poison the maximum.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "fp8kit/tensor/matrix_ref.hpp"

namespace fp8kit {

struct AmaxResult {
  float amax = 0.0f;  // max |x| over the finite elements (0 when there are none)
  std::uint64_t nan_count = 0;
  std::uint64_t inf_count = 0;
  bool has_nonfinite() const { return nan_count + inf_count != 0; }
  // This and another part of the same data: the larger amax, the counts summed.
  void merge(const AmaxResult& part) {
    amax = amax < part.amax ? part.amax : amax;
    nan_count += part.nan_count;
    inf_count += part.inf_count;
  }
};

// Over all elements (SIMD, and threads for large inputs).
AmaxResult amax(std::span<const float> x);

// Over every block of block_rows x block_cols (edge blocks are what remains), written row-major over the block grid
// into `out` (ceil(rows / block_rows) * ceil(cols / block_cols) entries). Per row: block 1 x cols; per column:
// rows x 1; per tensor: rows x cols. `total`, when given, receives the whole matrix's amax and non-finite counts.
// x: float32 on the CPU, any row stride (a tensor of any shape is Tensor::matrix(), its last dimension the row).
void amax_blocks(MatrixRef x, std::int64_t block_rows, std::int64_t block_cols, std::span<float> out,
                 AmaxResult* total = nullptr);

// The amax kernels in force (their ISA level's table name: "avx512", "avx2", "scalar").
std::string_view amax_kernel();

// ceil(a / b) for the block grid (b >= 1); for a >= 0 without the overflow of (a + b - 1) / b.
constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return a >= 0 ? a / b + (a % b != 0 ? 1 : 0) : (a + b - 1) / b;
}

}  // namespace fp8kit
