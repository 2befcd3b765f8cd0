// The bulk casts on a CUDA device (device pointers, a build with the CUDA backend): cast_to_fp8 and cast_from_fp8
// of convert.hpp with the same CastOptions and the same results bit for bit, each element through the scalar codec
// the CPU uses (format/codec_inline.hpp compiled for the device). Queued on the device's legacy default stream (a
// later copy or kernel there sees the result). A build without the CUDA backend throws Error(kUnsupported).
#pragma once

#include <cstdint>

#include "fp8kit/convert/convert.hpp"

namespace fp8kit::cuda {

// out[i] = encode(in[i] * options.scale), n elements on device `device` (stochastic rounding: stochastic_bits(seed,
// stream_offset + i), as on the CPU).
void cast_to_fp8(const float* in, std::uint8_t* out, std::int64_t n, const CastOptions& options, int device);
void cast_to_fp8(const bfloat16* in, std::uint8_t* out, std::int64_t n, const CastOptions& options, int device);
void cast_to_fp8(const float16* in, std::uint8_t* out, std::int64_t n, const CastOptions& options, int device);

// out[i] = decode(in[i]) * scale_inv in float32, rounded to nearest even into the output type.
void cast_from_fp8(const std::uint8_t* in, Format format, float* out, std::int64_t n, float scale_inv, int device);
void cast_from_fp8(const std::uint8_t* in, Format format, bfloat16* out, std::int64_t n, float scale_inv, int device);
void cast_from_fp8(const std::uint8_t* in, Format format, float16* out, std::int64_t n, float scale_inv, int device);

}  // namespace fp8kit::cuda
