// `fp8kit bench checkpoint`: quantize, dequantize and convert of a generated checkpoint against cp + fsync.
#pragma once

#include <string>

namespace fp8kit::cli {

struct CheckpointBenchArgs {
  bool json = false;
  std::string bytes = "1GiB";  // the bf16 checkpoint's size (the f32 one is twice that)
  int reps = 5;
  std::string dir;  // where the files go (default: the temporary directory)
};

void run_bench_checkpoint(const CheckpointBenchArgs& args);

}  // namespace fp8kit::cli
