// amax on a CUDA device (device pointers, a build with the CUDA backend): amax() of amax.hpp with the same result bit
// for bit (the maximum does not depend on the order it is taken in), and Transformer Engine's fused pattern, the cast
// to FP8 that also produces its input's amax (the next step's delayed scale) in the same pass. Both wait for their
// result (one 24-byte copy back). A build without the CUDA backend throws Error(kUnsupported).
#pragma once

#include <cstdint>

#include "fp8kit/convert/convert.hpp"
#include "fp8kit/scaling/amax.hpp"

namespace fp8kit::cuda {

// max |x| over the finite elements of the n float32 at `x` on device `device`, NaN and Inf counted.
AmaxResult amax(const float* x, std::int64_t n, int device);

// cuda::cast_to_fp8(in, out, n, options, device) and amax(in, n, device) in one pass over `in` (the amax is of the
// input as given, before options.scale).
AmaxResult cast_to_fp8_with_amax(const float* in, std::uint8_t* out, std::int64_t n, const CastOptions& options,
                                 int device);

}  // namespace fp8kit::cuda
