// The kernel choice inside cuda::dequantize, for the tests and the benchmark: cuda::dequantize takes kBlocked for
// every matrix of several scales. dequantize_tiles (kTiles), written without a device and not yet run on one, is
// taken only when asked for, so that the device check runs it beside the default and measures both in one run
// (docs/cuda.md, "What comes next").
#pragma once

#include "fp8kit/scaling/cuda_quantize.hpp"

namespace fp8kit::cuda_detail {

enum class DequantizeKernel {
  kBlocked,  // one thread a quad of codes (or a code), its block's scale found with FastDiv (cuda::dequantize's)
  kTiles,    // a CUDA block per scaling block and a table of that block's 256 results
};

// cuda::dequantize(q, dtype) with the kernel named. kTiles needs blocks of at least 32 x 128 (columns of the matrix
// and of the block in fours, the pointers 4-byte aligned, sides below 2^30) and throws Error(kUnsupported) naming
// what the shape lacks otherwise; one scale for the whole matrix takes the decode kernel under either.
Tensor dequantize_with(const cuda::QuantizedTensor& q, DType dtype, DequantizeKernel kernel);

}  // namespace fp8kit::cuda_detail
