// `fp8kit bench convert`: every conversion kernel against memcpy of the same wide array, in the same run.
// Throughput counts input plus output bytes (STREAM's convention); memcpy counts what it reads plus writes.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "harness.hpp"

namespace fp8kit::bench {

struct ConvertBenchOptions {
  std::size_t bytes = std::size_t{256} << 20;  // size of the wide (float32/bfloat16/float16) array
  std::vector<int> threads = {1, 2};
  int reps = 11;
  bool scalar_reference = true;  // also time the scalar reference loop (f32->e4m3fn, e4m3fn->f32)
  std::vector<std::string> ops;  // only these ops ("f32->e4m3fn", ...; every variant of each), none: all of them
};

// The op names run_convert_bench knows, in its order.
std::vector<std::string> convert_bench_ops();

struct ConvertResult {
  std::string op;        // "f32->e4m3fn", "e5m2->bf16", ...
  std::string isa;       // the ISA level of the kernels used: "avx512", "avx2", "scalar" ("-" for the probe)
  std::string kernel;    // their table's name: "avx512-vbmi", ...
  std::string overflow;  // "saturate" or "non-saturating" (encodes); "" for decodes
  float scale = 1.0f;    // the scale (encodes) or scale_inv (decodes) applied
  std::size_t elements = 0;
  Timing timing;  // bytes_moved: input plus output; baseline: memcpy of the wide array (2 * bytes / seconds)
};

// The memory run_convert_bench allocates for options.bytes: float32, bfloat16 and float16 arrays of bytes / 2
// elements, their codes and a wide output, and memcpy's source and destination.
constexpr std::size_t convert_bench_memory(std::size_t bytes) {
  return bytes / 2 * (4 + 2 + 2 + 1 + 4) + 2 * bytes;
}

// Runs the benchmark; `progress(done, total)` is called after each measurement.
std::vector<ConvertResult> run_convert_bench(const ConvertBenchOptions& options,
                                             const std::function<void(int, int)>& progress = {});

}  // namespace fp8kit::bench
