// Bulk conversions over spans: float32, bfloat16 and float16 to and from every FP8 format, optionally scaled
// (q = cast(x * scale); x = q * scale_inv). Runtime-dispatched SIMD kernels and threads; always bit-identical
// to looping the scalar codec (codec.hpp) over the elements.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "fp8kit/codec.hpp"
#include "fp8kit/format.hpp"
#include "fp8kit/half.hpp"

namespace fp8kit {

struct CastOptions {
  Format format;
  Overflow overflow;
  Rounding rounding = Rounding::kNearestEven;
  // Quantization scale: each element is multiplied by it in float32 before the cast (Transformer Engine's order).
  float scale = 1.0f;
  // Stochastic rounding only: element i uses stochastic_bits(seed, stream_offset + i).
  std::uint64_t seed = 0;
  std::uint64_t stream_offset = 0;
};

// out[i] = encode(in[i] * scale). out.size() must equal in.size().
void cast_to_fp8(std::span<const float> in, std::span<std::uint8_t> out, const CastOptions& options);
void cast_to_fp8(std::span<const bfloat16> in, std::span<std::uint8_t> out, const CastOptions& options);
void cast_to_fp8(std::span<const float16> in, std::span<std::uint8_t> out, const CastOptions& options);

// out[i] = decode(in[i]) * scale_inv, computed in float32 and rounded to nearest even into the output type.
// With scale_inv == 1 the result is exact (for float16: except e8m0fnu outside float16's range).
void cast_from_fp8(std::span<const std::uint8_t> in, Format format, std::span<float> out, float scale_inv = 1.0f);
void cast_from_fp8(std::span<const std::uint8_t> in, Format format, std::span<bfloat16> out, float scale_inv = 1.0f);
void cast_from_fp8(std::span<const std::uint8_t> in, Format format, std::span<float16> out, float scale_inv = 1.0f);

// The ISA level of the conversion kernels in force ("avx512", "avx2", "scalar", ...; see cpu.hpp), and the
// kernels' name ("avx512-vbmi": AVX-512 with VBMI table lookups).
std::string_view conversion_isa();
std::string_view conversion_kernel();

}  // namespace fp8kit
