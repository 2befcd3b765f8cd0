// AVX2 + F16C conversion kernels (round to nearest even). Integer-only rounding, so the result does not depend on
// MXCSR's rounding mode or DAZ/FTZ (only the optional scale multiply is a float operation, as in the reference).
//
// float32 -> FP8, per element, on a = |x| as bits (E = float exponent field, m = FP8 mantissa bits):
//   normal FP8     ((a + 2^(22-m) - 1 + lsb) >> (23-m)) - ((127-bias) << m)   carry into the exponent is correct
//   subnormal FP8  sig = 1.mant as an integer, RNE of sig >> (151 - bias - m - E) with variable shifts
//   overflow       a >= overflow_bits (found from the scalar codec) -> the policy's overflow code
//   NaN            a > 0x7F800000 -> the canonical NaN; then the sign bit (never on the fnuz zero)
// FP8 -> float32: normal (mag << (23-m)) + rebias, subnormal int->float * 2^(1-bias-m) (exact), then specials.
#include <immintrin.h>

#include "../kernels.hpp"
#include "fp8kit/cpu.hpp"

namespace fp8kit::convert_detail {
namespace {

__m256i splat(std::uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
__m256i select(__m256i mask, __m256i if_true, __m256i if_false) { return _mm256_blendv_epi8(if_false, if_true, mask); }

struct EncodeConsts {
  explicit EncodeConsts(const EncodeParams& p)
      : scale(_mm256_set1_ps(p.options.scale)),
        scaled(p.options.scale != 1.0f),
        shift(_mm_cvtsi32_si128(static_cast<int>(23 - p.mantissa_bits))),
        round_base(splat((1u << (22 - p.mantissa_bits)) - 1u)),
        rebias(splat(p.rebias)),
        min_normal(splat(p.min_normal_bits)),
        overflow_minus_1(splat(p.overflow_bits - 1u)),
        overflow_code(splat(p.overflow_code)),
        nan_code(splat(p.nan_code)),
        subnormal_shift_base(splat(p.subnormal_shift_base)),
        sign_on_zero(p.sign_on_zero),
        saturate(p.options.overflow == Overflow::kSaturate) {}
  __m256 scale;
  bool scaled;
  __m128i shift;
  __m256i round_base, rebias, min_normal, overflow_minus_1, overflow_code, nan_code, subnormal_shift_base;
  bool sign_on_zero;
  bool saturate;
};

// 8 floats -> 8 codes in the low byte of each 32-bit lane: e4m3fn, e5m2, e4m3fnuz, e5m2fnuz.
inline __m256i encode8(__m256 x, const EncodeConsts& c) {
  if (c.scaled) x = _mm256_mul_ps(x, c.scale);
  const __m256i one = splat(1);
  const __m256i u = _mm256_castps_si256(x);
  const __m256i a = _mm256_and_si256(u, splat(0x7FFFFFFFu));
  // Normal FP8 result: add the rounding bias (half - 1 + lsb) and shift the mantissa into place.
  const __m256i lsb = _mm256_and_si256(_mm256_srl_epi32(a, c.shift), one);
  const __m256i rounded = _mm256_add_epi32(a, _mm256_add_epi32(c.round_base, lsb));
  const __m256i normal = _mm256_sub_epi32(_mm256_srl_epi32(rounded, c.shift), c.rebias);
  // Subnormal FP8 result: round the 24-bit significand right by a per-element shift (capped: >= 25 gives 0).
  const __m256i sig = _mm256_or_si256(_mm256_and_si256(a, splat(0x7FFFFFu)), splat(0x800000u));
  const __m256i shift = _mm256_min_epu32(_mm256_sub_epi32(c.subnormal_shift_base, _mm256_srli_epi32(a, 23)), splat(31));
  const __m256i kept = _mm256_srlv_epi32(sig, shift);
  const __m256i rem = _mm256_sub_epi32(sig, _mm256_sllv_epi32(kept, shift));
  const __m256i half = _mm256_sllv_epi32(one, _mm256_sub_epi32(shift, one));
  const __m256i odd = _mm256_cmpeq_epi32(_mm256_and_si256(kept, one), one);
  const __m256i up = _mm256_or_si256(_mm256_cmpgt_epi32(rem, half), _mm256_and_si256(_mm256_cmpeq_epi32(rem, half), odd));
  const __m256i subnormal = _mm256_sub_epi32(kept, up);  // up is 0 or -1
  __m256i code = select(_mm256_cmpgt_epi32(c.min_normal, a), subnormal, normal);
  code = select(_mm256_cmpgt_epi32(a, c.overflow_minus_1), c.overflow_code, code);
  code = select(_mm256_cmpgt_epi32(a, splat(0x7F800000u)), c.nan_code, code);
  __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), splat(0x80));
  if (!c.sign_on_zero) sign = _mm256_andnot_si256(_mm256_cmpeq_epi32(code, _mm256_setzero_si256()), sign);
  return _mm256_or_si256(code, sign);
}

// 8 floats -> 8 e8m0fnu codes: the nearest power of two, ties up (as PyTorch and ml_dtypes), no sign, no zero.
inline __m256i encode8_e8m0(__m256 x, const EncodeConsts& c) {
  if (c.scaled) x = _mm256_mul_ps(x, c.scale);
  const __m256i u = _mm256_castps_si256(x);
  const __m256i a = _mm256_and_si256(u, splat(0x7FFFFFFFu));
  const __m256i zero = _mm256_setzero_si256();
  const __m256i field = _mm256_srli_epi32(a, 23);
  // normal float: exponent field, plus one when the mantissa is >= 1.5
  const __m256i normal = _mm256_sub_epi32(field, _mm256_cmpgt_epi32(_mm256_and_si256(a, splat(0x7FFFFFu)), splat(0x3FFFFFu)));
  // subnormal float (< 2^-126): 2^-127 (code 0) or, from 1.5 * 2^-127 up, 2^-126 (code 1)
  const __m256i denormal = _mm256_and_si256(_mm256_cmpgt_epi32(a, splat(0x5FFFFFu)), splat(1));
  __m256i code = select(_mm256_cmpeq_epi32(field, zero), denormal, normal);
  code = select(_mm256_cmpgt_epi32(a, c.overflow_minus_1), c.overflow_code, code);
  const __m256i is_zero = _mm256_cmpeq_epi32(a, zero);
  code = select(is_zero, splat(c.saturate ? 0x00 : 0xFF), code);
  const __m256i negative = _mm256_andnot_si256(is_zero, _mm256_cmpgt_epi32(zero, u));
  const __m256i nan = _mm256_or_si256(negative, _mm256_cmpgt_epi32(a, splat(0x7F800000u)));
  return select(nan, splat(0xFF), code);
}

// Four vectors of 8 codes -> 32 bytes in order.
inline void store32(std::uint8_t* out, __m256i c0, __m256i c1, __m256i c2, __m256i c3) {
  const __m256i p01 = _mm256_packus_epi32(c0, c1);
  const __m256i p23 = _mm256_packus_epi32(c2, c3);
  const __m256i bytes = _mm256_packus_epi16(p01, p23);
  const __m256i ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), ordered);
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bfloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const float16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

template <typename In, bool kE8M0>
void encode_body(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  const EncodeConsts c(p);
  auto enc = [&c](__m256 x) { return kE8M0 ? encode8_e8m0(x, c) : encode8(x, c); };
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    store32(out + i, enc(load8(in + i)), enc(load8(in + i + 8)), enc(load8(in + i + 16)), enc(load8(in + i + 24)));
  }
  EncodeParams tail = p;
  tail.options.stream_offset += i;
  encode_tail(in + i, out + i, n - i, tail);
}

template <typename In>
void encode_avx2(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  if (p.options.rounding != Rounding::kNearestEven) {
    encode_tail(in, out, n, p);  // stochastic rounding: the scalar reference loop
    return;
  }
  if (p.options.format == Format::e8m0fnu) {
    encode_body<In, true>(in, out, n, p);
  } else {
    encode_body<In, false>(in, out, n, p);
  }
}

struct DecodeConsts {
  explicit DecodeConsts(const DecodeParams& p) : scale_inv(_mm256_set1_ps(p.scale_inv)), scaled(p.scale_inv != 1.0f) {
    const FormatDescriptor& d = descriptor(p.format);
    const int m = d.mantissa_bits;
    shift = _mm_cvtsi32_si128(23 - m);
    rebias = splat(static_cast<std::uint32_t>(127 - d.bias) << 23);
    subnormal_limit = splat(1u << m);
    subnormal_scale = _mm256_set1_ps(static_cast<float>(detail::pow2(1 - d.bias - m)));
    // Codes whose magnitude is >= special_min are Inf or NaN (none for the fnuz formats: 0x100 never matches).
    std::uint32_t special_min = 0x100, inf_mag = 0x100;
    if (d.nan == NanEncoding::kAllOnes) special_min = 0x7F;
    if (d.nan == NanEncoding::kIeee) {
      special_min = static_cast<std::uint32_t>(d.max_exponent_field()) << m;
      inf_mag = d.inf_code(false);
    }
    special_minus_1 = splat(special_min - 1);
    inf_magnitude = splat(inf_mag);
    nan_exact = splat(d.nan == NanEncoding::kNegativeZero ? 0x80u : 0x100u);
  }
  __m256 scale_inv;
  bool scaled;
  __m128i shift;
  __m256i rebias, subnormal_limit, special_minus_1, inf_magnitude, nan_exact;
  __m256 subnormal_scale;
};

// 8 codes -> 8 float32 bit patterns (exact).
inline __m256i decode8(const std::uint8_t* in, const DecodeConsts& c) {
  const __m256i code = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in)));
  const __m256i mag = _mm256_and_si256(code, splat(0x7F));
  const __m256i normal = _mm256_add_epi32(_mm256_sll_epi32(mag, c.shift), c.rebias);
  const __m256i subnormal = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(mag), c.subnormal_scale));
  __m256i bits = select(_mm256_cmpgt_epi32(c.subnormal_limit, mag), subnormal, normal);
  const __m256i special = _mm256_cmpgt_epi32(mag, c.special_minus_1);
  const __m256i special_bits = select(_mm256_cmpeq_epi32(mag, c.inf_magnitude), splat(0x7F800000u), splat(0x7FC00000u));
  bits = select(special, special_bits, bits);
  bits = _mm256_or_si256(bits, _mm256_slli_epi32(_mm256_and_si256(code, splat(0x80)), 24));
  return select(_mm256_cmpeq_epi32(code, c.nan_exact), splat(0xFFC00000u), bits);
}

// 8 e8m0fnu codes -> float32: 2^(code-127); 0x00 is the float subnormal 2^-127; 0xFF is NaN.
inline __m256i decode8_e8m0(const std::uint8_t* in, const DecodeConsts&) {
  const __m256i code = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in)));
  __m256i bits = _mm256_slli_epi32(code, 23);
  bits = select(_mm256_cmpeq_epi32(code, _mm256_setzero_si256()), splat(0x00400000u), bits);
  return select(_mm256_cmpeq_epi32(code, splat(0xFF)), splat(0x7FC00000u), bits);
}

// float32 bits -> bfloat16 bits in the low half of each lane (round to nearest even, NaN quieted).
inline __m256i to_bf16_bits(__m256i u) {
  const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(splat(0x7FFF), _mm256_and_si256(_mm256_srli_epi32(u, 16), splat(1))));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, splat(0x7FFFFFFFu)), splat(0x7F800000u));
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), splat(0x40));
  return select(is_nan, nan, _mm256_srli_epi32(rounded, 16));
}

template <bool kE8M0>
inline __m256i decode_scaled(const std::uint8_t* in, const DecodeConsts& c) {
  const __m256i bits = kE8M0 ? decode8_e8m0(in, c) : decode8(in, c);
  if (!c.scaled) return bits;
  return _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(bits), c.scale_inv));
}

template <bool kE8M0>
void decode_f32_body(const std::uint8_t* in, float* out, std::size_t n, const DecodeConsts& c) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), decode_scaled<kE8M0>(in + i, c));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 8), decode_scaled<kE8M0>(in + i + 8, c));
  }
  (void)i;
}

template <bool kE8M0>
void decode_bf16_body(const std::uint8_t* in, bfloat16* out, std::size_t n, const DecodeConsts& c) {
  for (std::size_t i = 0; i + 16 <= n; i += 16) {
    const __m256i lo = to_bf16_bits(decode_scaled<kE8M0>(in + i, c));
    const __m256i hi = to_bf16_bits(decode_scaled<kE8M0>(in + i + 8, c));
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
}

template <bool kE8M0>
void decode_f16_body(const std::uint8_t* in, float16* out, std::size_t n, const DecodeConsts& c) {
  for (std::size_t i = 0; i + 16 <= n; i += 16) {
    const __m128i lo = _mm256_cvtps_ph(_mm256_castsi256_ps(decode_scaled<kE8M0>(in + i, c)), _MM_FROUND_TO_NEAREST_INT);
    const __m128i hi = _mm256_cvtps_ph(_mm256_castsi256_ps(decode_scaled<kE8M0>(in + i + 8, c)), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), lo);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 8), hi);
  }
}

template <typename Out>
void decode_avx2(const std::uint8_t* in, Out* out, std::size_t n, const DecodeParams& p) {
  const DecodeConsts c(p);
  const bool e8m0 = p.format == Format::e8m0fnu;
  if constexpr (std::is_same_v<Out, float>) {
    e8m0 ? decode_f32_body<true>(in, out, n, c) : decode_f32_body<false>(in, out, n, c);
  } else if constexpr (std::is_same_v<Out, bfloat16>) {
    e8m0 ? decode_bf16_body<true>(in, out, n, c) : decode_bf16_body<false>(in, out, n, c);
  } else {
    e8m0 ? decode_f16_body<true>(in, out, n, c) : decode_f16_body<false>(in, out, n, c);
  }
  const std::size_t done = n - n % 16;
  decode_tail(in + done, out + done, n - done, p);
}

}  // namespace

const KernelTable* avx2_kernels() {
  static const KernelTable table{
      "avx2",
      &encode_avx2<float>,
      &encode_avx2<bfloat16>,
      &encode_avx2<float16>,
      &decode_avx2<float>,
      &decode_avx2<bfloat16>,
      &decode_avx2<float16>,
  };
  const CpuFeatures& f = cpu_features();
  return (f.avx2 && f.f16c && f.fma) ? &table : nullptr;
}

}  // namespace fp8kit::convert_detail
