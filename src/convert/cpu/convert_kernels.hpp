// Internal: the conversion kernel tables (one per ISA level, src/convert/cpu/convert_<isa>.cpp) and the parameters
// they take. Kernels know nothing of dispatch or threads; convert.cpp picks a table and splits the work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

#include "common/dispatch.hpp"
#include "fp8kit/common/kernel_contract.hpp"
#include "fp8kit/convert/convert.hpp"

namespace fp8kit::convert_detail {

// Outputs at least this large are written with non-temporal stores (the bulk casts, and the segment kernels under
// quantize and dequantize): they would not stay in the caches anyway, and skipping the read-for-ownership of the
// destination saves memory bandwidth.
inline constexpr std::size_t kStreamingBytes = std::size_t{16} << 20;

// Everything an encoding kernel needs, precomputed from the format descriptor by make_encode_params().
struct EncodeParams {
  CastOptions options;
  // For the SIMD paths (the four sign-magnitude formats; e8m0fnu has its own constants):
  std::uint32_t mantissa_bits;
  std::uint32_t min_normal_bits;       // float bits of the smallest normal of the format
  std::uint32_t overflow_bits;         // float bits of the smallest magnitude that overflows (from the scalar codec)
  std::uint32_t rebias;                // (127 - bias) << mantissa_bits: float exponent to FP8 exponent
  std::uint32_t subnormal_magic_bits;  // float bits of 2^(24 - bias - mantissa_bits), whose ulp is the FP8 quantum
  std::uint8_t overflow_code;          // positive code for overflow under the policy
  std::uint8_t nan_code;               // positive canonical NaN code
  bool sign_on_zero;                   // the format has -0
  bool streaming_stores = false;       // write the output with non-temporal stores (large outputs; set by the entry)
  // Segment kernels: when nonzero, prefetch this many bytes past each input position instead of the default
  // short distance (quantize points it at the next block row, so that row's amax pass reads from cache while
  // this one encodes).
  std::size_t prefetch_ahead_bytes = 0;
};
EncodeParams make_encode_params(const CastOptions& options);

struct DecodeParams {
  Format format;
  float scale_inv;
  bool streaming_stores = false;  // write the output with non-temporal stores (large outputs; set by the entry)
};

template <typename In>
using EncodeFn = void (*)(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p);
template <typename Out>
using DecodeFn = void (*)(const std::uint8_t* in, Out* out, std::size_t n, const DecodeParams& p);

// Encodes x[k * segment, ...) with scale scales[k] for every segment (round to nearest even; p.options.scale
// is ignored). One call per row of a block-scaled matrix instead of one per block.
using EncodeSegmentsFn = void (*)(const float* in, std::uint8_t* out, std::size_t n, std::size_t segment,
                                  const float* scales, const EncodeParams& p);

// Decodes in[k * segment, ...) to float32 times scale_invs[k] for every segment (p.scale_inv is ignored).
using DecodeSegmentsFn = void (*)(const std::uint8_t* in, float* out, std::size_t n, std::size_t segment,
                                  const float* scale_invs, const DecodeParams& p);

// A level's conversion kernels. Their contract is always kBitIdentical: the scalar table's results (the codec's) on
// every input, stochastic rounding included; the tests compare every table with the scalar one bit for bit.
struct KernelTable {
  std::string_view name;    // "scalar", "avx2", "avx512-vbmi", ...
  Isa isa;                  // the level it needs
  KernelContract contract;  // what the tests check it against
  EncodeFn<float> encode_f32;
  EncodeSegmentsFn encode_f32_segments;
  EncodeFn<bfloat16> encode_bf16;
  EncodeFn<float16> encode_f16;
  DecodeFn<float> decode_f32;
  DecodeSegmentsFn decode_f32_segments;
  DecodeFn<bfloat16> decode_bf16;
  DecodeFn<float16> decode_f16;
};

// The reference: the scalar codec in a loop. Handles every option, stochastic rounding included.
const KernelTable& scalar_kernels();
// AVX2 + F16C + FMA kernels for round-to-nearest-even (stochastic rounding is delegated to the scalar loop).
const KernelTable& avx2_kernels();
// AVX-512 kernels (round to nearest even and stochastic rounding), in two variants: decoders with 64-byte VBMI
// table lookups, and with a shift/mask decode; avx512_kernels() is the one for this CPU (convert.cpp chooses, so
// that no code of the AVX-512 file runs before the avx512 level is dispatched).
const KernelTable& avx512_kernels_with_vbmi();
const KernelTable& avx512_kernels_without_vbmi();
const KernelTable& avx512_kernels();
// The tables by level; only call a table whose level is <= cpu_max_isa().
const detail::IsaTables<KernelTable>& kernel_tables();
// The table for the level in force.
inline const KernelTable& active_kernels() {
  return kernel_tables().active();
}

// The constants of the shift/mask decode of FP8 codes to 16-bit floats (the AVX2 decoders, and the AVX-512 ones
// without VBMI), every one taken from the descriptor and the scalar codec: normal codes are (mag << shift) +
// rebias; magnitudes below 8 come from small_table; magnitudes >= special_min are Inf (== inf_magnitude, giving
// inf_bits) or NaN (nan_bits); the fnuz NaN 0x80 (nan_at_0x80) gives nan_0x80_bits. 0x100 never matches a magnitude.
struct ShiftDecodeRule {
  int shift;
  std::uint16_t rebias;
  std::uint16_t small_table[8];
  std::uint16_t special_min, inf_magnitude, inf_bits, nan_bits;
  bool nan_at_0x80;
  std::uint16_t nan_0x80_bits;
};
ShiftDecodeRule shift_decode_rule(Format format, bool to_f16);

// FP8 -> bfloat16 or float16 one byte of the result at a time, 32 codes per AVX2 vector (no widening to 16-bit lanes
// until the bytes are interleaved at the end). For a code c of magnitude m = c & 0x7F:
//   ordinary codes       high byte | (c & 0x80), low byte ((c << lo_shift) & lo_mask) ^ lo_flip, where the high
//                        byte is hi_table[(c >> 3) & 15] (bfloat16: its 8-bit exponent makes the high byte a function
//                        of the code's exponent) or ((m >> hi_shift) & hi_mask) + hi_add (float16: the code's bits
//                        shifted into place and the exponent re-biased)
//   (c & small_mask) == 0   zero and subnormals: small_hi[c & 7] | (c & 0x80), small_lo[c & 7]
//   m > special_min - 1  NaN (nan_hi | sign, nan_lo), or Inf where m == inf_magnitude (0x80: never)
//   c == 0x80 with nan80 the fnuz NaN (nan80_hi, nan80_lo)
// Every entry comes from the scalar codec, and the rule is checked against it on all 256 codes when it is made:
// none is returned for a format and output whose codes it does not reproduce (e5m2fnuz to bfloat16: its odd
// exponent rebias makes the high byte depend on the exponent's lowest bit, which the 4-bit index does not see), and
// the caller keeps the 16-bit-lane decode there.
struct ByteDecodeRule {
  bool table_high;
  std::uint8_t hi_table[16], small_hi[16], small_lo[16];
  int hi_shift, lo_shift;
  std::uint8_t hi_mask, hi_add, lo_mask, lo_flip, small_mask, special_min, inf_magnitude;
  std::uint8_t inf_hi, inf_lo, nan_hi, nan_lo;
  bool nan80;
  std::uint8_t nan80_hi, nan80_lo;
};
std::optional<ByteDecodeRule> make_byte_decode_rule(Format format, bool to_f16);
// The rule of each format and output, made once per process (nullptr where there is none).
const ByteDecodeRule* byte_decode_rule(Format format, bool to_f16);

// Round to nearest even of unscaled bfloat16/float16 into e4m3fn, e5m2, e4m3fnuz or e5m2fnuz in 16-bit lanes, without
// widening to float32 (the AVX2 and AVX-512 encoders; convert_avx512.cpp derives the method). The input type's
// layout:
template <typename In>
struct Half16 {
  static constexpr bool kBf16 = std::is_same_v<In, bfloat16>;
  static constexpr int kMantissa = kBf16 ? 7 : 10;
  static constexpr int kBias = kBf16 ? 127 : 15;
  static constexpr std::uint32_t kInfBits = kBf16 ? 0x7F80u : 0x7C00u;
  // 16-bit bits of a power of two 2^e (float16 subnormals included; e within the type's range)
  static std::uint32_t pow2_bits(int e) {
    if (e + kBias >= 1) return static_cast<std::uint32_t>(e + kBias) << kMantissa;
    return 1u << (kMantissa + e + kBias - 1);
  }
};

// How the subnormal path widens its lanes to float32:
//   kUnpack  bfloat16: the bits in the top half of a zeroed 32-bit lane
//   kShift   float16 -> e4m3fn/e4m3fnuz: the bits << 13 are the value times 2^-112 (float16 subnormals as float32
//            subnormals, which encode to 0 in both formats with or without denormals-are-zero), the adder's
//            constant scaled by 2^-112 too: cheaper than vcvtph2ps, which is slow on Zen 4
//   kCvt     float16 -> e5m2fnuz: vcvtph2ps (float16 subnormals encode to nonzero codes there)
//   kNone    float16 -> e5m2: none needed; e5m2 is float16 rounded at bit 8, subnormals included
enum class Widen { kUnpack, kShift, kCvt, kNone };
template <typename In, int kM, bool kSignOnZero>
constexpr Widen kWiden = std::is_same_v<In, bfloat16> ? Widen::kUnpack
                         : kM == 3                    ? Widen::kShift
                         : kSignOnZero                ? Widen::kNone
                                                      : Widen::kCvt;

// The encoder's constants, each a 16-bit lane value but magic_bits (a float32 lane's).
struct HalfEncodeRule {
  std::uint32_t magic_bits;       // the subnormal adder's constant C (scaled by 2^-112 for kShift)
  std::uint16_t round_base;       // 2^(s-1) - 1, s = the input's mantissa bits - m
  std::uint16_t rebias;           // (input bias - FP8 bias) << m, modulo 2^16 (negative for float16 -> e5m2fnuz)
  std::uint16_t subnormal_below;  // rounded magnitudes below this take the subnormal path
  std::uint16_t fold_code;        // what min() folds overflow to: the largest finite code, or the overflow code
  std::uint16_t max_code, overflow_code, nan_code;
};
// (defined in convert_scalar.cpp for bfloat16 and float16: no ISA-flagged file may hold a copy, see
// tests/package/check_isa_objects.sh)
template <typename In>
HalfEncodeRule half_encode_rule(const EncodeParams& p, Widen widen);

// Scalar element loops the SIMD kernels reuse for their tails.
void decode_segments_tail(const std::uint8_t* in, float* out, std::size_t n, std::size_t segment,
                          const float* scale_invs, const DecodeParams& p);
void encode_segments_tail(const float* in, std::uint8_t* out, std::size_t n, std::size_t segment, const float* scales,
                          const EncodeParams& p);
void encode_tail(const float* in, std::uint8_t* out, std::size_t n, const EncodeParams& p);
void encode_tail(const bfloat16* in, std::uint8_t* out, std::size_t n, const EncodeParams& p);
void encode_tail(const float16* in, std::uint8_t* out, std::size_t n, const EncodeParams& p);
void decode_tail(const std::uint8_t* in, float* out, std::size_t n, const DecodeParams& p);
void decode_tail(const std::uint8_t* in, bfloat16* out, std::size_t n, const DecodeParams& p);
void decode_tail(const std::uint8_t* in, float16* out, std::size_t n, const DecodeParams& p);

}  // namespace fp8kit::convert_detail
