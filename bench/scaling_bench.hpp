// `fp8kit bench scaling`: amax against the read-bandwidth probe; quantize (amax + scaled encode, per tensor
// and fused per row/block/MX) and dequantize against memcpy of the float32 array, all in the same run.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "harness.hpp"

namespace fp8kit::bench {

struct ScalingBenchOptions {
  std::size_t bytes = std::size_t{256} << 20;  // the float32 matrix, viewed as rows x 4096
  std::vector<int> threads = {1, 2};
  int reps = 11;
};

struct ScalingResult {
  std::string op;           // "amax", "quantize", "dequantize", "read-bandwidth"
  std::string granularity;  // "tensor", "row", "block:1x128", ... ("" for amax and the probe)
  std::string baseline;     // "read-bandwidth" (amax) or "memcpy"
  std::string isa;          // the ISA level in force
  std::string kernel;       // "avx512 amax + avx512-vbmi encode" ("" for the probe)
  Timing timing;
};

// The float32 matrix run_scaling_bench measures for options.bytes: rows x 4096 (at least one row), its bytes.
inline constexpr std::int64_t kScalingBenchCols = 4096;
constexpr std::size_t scaling_bench_matrix_bytes(std::size_t bytes) {
  const std::size_t row = 4 * static_cast<std::size_t>(kScalingBenchCols);
  return (bytes / row > 0 ? bytes / row : 1) * row;
}

// The memory run_scaling_bench allocates for options.bytes: the matrix, memcpy's destination, the dequantized copy
// and the FP8 codes.
constexpr std::size_t scaling_bench_memory(std::size_t bytes) {
  const std::size_t matrix = scaling_bench_matrix_bytes(bytes);
  return 3 * matrix + matrix / 4;
}

std::vector<ScalingResult> run_scaling_bench(const ScalingBenchOptions& options,
                                             const std::function<void(int, int)>& progress = {});

}  // namespace fp8kit::bench
