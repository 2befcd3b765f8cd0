// The exact scalar codecs: one generic converter from float, double, bfloat16 and float16 to any FP8 format,
// and exact decoding. This is the specification every SIMD kernel is tested against, bit for bit.
#pragma once

#include <cstdint>

#include "fp8kit/format/format.hpp"
#include "fp8kit/format/half.hpp"

namespace fp8kit {

// What happens to a finite value that rounds past the largest finite code, and to +-Inf.
enum class Overflow : std::uint8_t {
  // PyTorch eager .to() up to 2.11, ml_dtypes: +-Inf where the format has Inf (e5m2), NaN otherwise.
  kNonSaturating,
  // CUDA __NV_SATFINITE, Transformer Engine, torchao: +-max finite (Inf included). NaN stays NaN.
  kSaturate,
};

enum class Rounding : std::uint8_t {
  kNearestEven,  // round to nearest, ties to even, on the exact input value
  kStochastic,   // round up with probability (x - lo) / (hi - lo), from 32 caller-supplied random bits
};

// Everything a conversion to FP8 needs besides the value. `random_bits` is only read for kStochastic:
// the value rounds away from zero when random_bits < floor(2^32 * fraction dropped).
struct EncodeSpec {
  Format format;
  Overflow overflow;
  Rounding rounding = Rounding::kNearestEven;
};

// The generic converter. Each overload reads the exact input value (no intermediate rounding).
std::uint8_t encode(double x, const EncodeSpec& spec, std::uint32_t random_bits = 0);
std::uint8_t encode(float x, const EncodeSpec& spec, std::uint32_t random_bits = 0);
std::uint8_t encode(bfloat16 x, const EncodeSpec& spec, std::uint32_t random_bits = 0);
std::uint8_t encode(float16 x, const EncodeSpec& spec, std::uint32_t random_bits = 0);

// The smallest float magnitude that rounds past the format's largest finite value (464 for e4m3fn: 448 + half an
// ulp, the tie going to even 448, and the next float up; 61440 for e5m2, where the tie goes up), found from the
// codec itself. Non-saturating, such a value becomes Inf or NaN; saturating, it is clamped: "saturated" in every
// diagnostic fp8kit reports means |x * scale| >= this.
float overflow_threshold(Format format);

// Exact decoding. NaN codes give the quiet NaN with the code's sign bit (the fnuz NaN 0x80 decodes as -NaN,
// as in ml_dtypes); Inf gives Inf.
double decode_to_double(Format f, std::uint8_t code);
float decode_to_float(Format f, std::uint8_t code);
// Exact for every format: all FP8 values are bfloat16 values.
bfloat16 decode_to_bfloat16(Format f, std::uint8_t code);
// Exact except e8m0fnu outside float16's range (2^-25 and below become 0, 2^16 and above Inf: round to
// nearest even).
float16 decode_to_float16(Format f, std::uint8_t code);

// SplitMix64's finalizer (Steele, Lea and Flood, 2014): a bijective mix of the 64 bits of z. The one copy in
// fp8kit (the AVX-512 stochastic-rounding kernel has a vectorized one, tested against stochastic_bits).
constexpr std::uint64_t splitmix64_finalize(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The 32 random bits stochastic rounding uses for element `index` of a stream seeded with `seed`: a
// counter-based hash, so bulk conversions give the same result for any thread count and kernel.
constexpr std::uint32_t stochastic_bits(std::uint64_t seed, std::uint64_t index) {
  return static_cast<std::uint32_t>(splitmix64_finalize(seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull) >>
                                    32);
}

}  // namespace fp8kit
