// Bulk conversions over spans: float32, bfloat16 and float16 to and from every FP8 format, optionally scaled
// (q = cast(x * scale); x = q * scale_inv). Runtime-dispatched SIMD kernels and threads; always bit-identical
// to looping the scalar codec (codec.hpp) over the elements. Outputs never share memory with their inputs: an
// overlap (in place included) is Error(kInvalidArgument), since the kernels read ahead of what they write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "fp8kit/format/codec.hpp"
#include "fp8kit/format/format.hpp"
#include "fp8kit/format/half.hpp"

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

// ---------------------------------------------------------------- kernel-level entries
// For a caller that splits the work over threads itself and runs the conversion kernels inside its own loop (the
// fused block quantize and dequantize of the scaling layer): each call runs on the calling thread with the kernels
// of the level in force, makes no choice by size, and is bit-identical to the scalar codec like everything here.

// Where an output goes: through the caches, or around them with non-temporal stores (an output that would not stay
// in the caches anyway; skipping the read-for-ownership of the destination saves memory bandwidth).
enum class Stores : std::uint8_t { kCached, kStreaming };
// What the bulk casts above use for an output of this many bytes: streaming from 16 MiB.
Stores stores_for(std::size_t output_bytes);

// Encodes float32 into one format under one overflow policy, rounding to nearest even, with a quantization scale
// per call or per segment. Construct once per format and policy (it precomputes the kernels' constants).
class SegmentEncoder {
 public:
  SegmentEncoder(Format format, Overflow overflow);
  ~SegmentEncoder();
  SegmentEncoder(SegmentEncoder&&) noexcept;
  SegmentEncoder& operator=(SegmentEncoder&&) noexcept;

  // out[i] = encode(in[i] * scale). out.size() must equal in.size().
  void encode(std::span<const float> in, std::span<std::uint8_t> out, float scale) const;
  // out[i] = encode(in[i] * scales[i / segment]): one scale per segment of `segment` elements (the last may be
  // shorter; scales.size() must be their count). With prefetch_ahead_bytes > 0 the kernel prefetches that far past
  // each input position instead of its own short distance: a caller that reads there next (quantize's amax pass over
  // the next block row) finds the data in cache. kStreaming writes the output with non-temporal stores where it is
  // aligned for them (64 bytes for the AVX-512 kernels, 16 for the AVX2 ones; elsewhere plain stores).
  void encode_segments(std::span<const float> in, std::span<std::uint8_t> out, std::size_t segment,
                       std::span<const float> scales, std::size_t prefetch_ahead_bytes = 0,
                       Stores stores = Stores::kCached) const;

 private:
  struct Params;
  std::unique_ptr<const Params> params_;
};

// out[i] = decode(in[i]) * scale_invs[i / segment] in float32, one dequantization scale per segment (as above).
void decode_segments(std::span<const std::uint8_t> in, Format format, std::span<float> out, std::size_t segment,
                     std::span<const float> scale_invs, Stores stores = Stores::kCached);

}  // namespace fp8kit
