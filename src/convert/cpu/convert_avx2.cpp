// AVX2 + F16C conversion kernels (round to nearest even), bit-identical to the scalar codec. They assume MXCSR's
// default round-to-nearest mode, as all compiled float code does; DAZ/FTZ do not change their results (a float
// subnormal input rounds to 0 in every FP8 format either way).
//
// float32 -> FP8, per element, on a = |x| as bits (m = FP8 mantissa bits):
//   normal FP8     ((a + 2^(22-m) - 1 + lsb) >> (23-m)) - ((127-bias) << m)   carry into the exponent is correct
//   subnormal FP8  bits(|x| + C) - bits(C), C = 2^(24-bias-m): the float adder rounds once onto the FP8 quantum
//   overflow       a >= overflow_bits (found from the scalar codec) -> the policy's overflow code
//   NaN            a > 0x7F800000 -> the canonical NaN; then the sign bit (never on the fnuz zero)
// FP8 -> float32: normal (mag << (23-m)) + rebias, subnormal int->float * 2^(1-bias-m) (exact), then specials.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../kernels.hpp"
#include "fp8kit/cpu.hpp"

namespace fp8kit::convert_detail {
namespace {

// Software prefetch distance for the input stream (helps one thread keep enough reads in flight).
constexpr int kPrefetchBytes = 1024;

__m256i splat(std::uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
__m256i select(__m256i mask, __m256i if_true, __m256i if_false) { return _mm256_blendv_epi8(if_false, if_true, mask); }

struct EncodeConsts {
  explicit EncodeConsts(const EncodeParams& p)
      : scale(_mm256_set1_ps(p.options.scale)),
        shift(_mm_cvtsi32_si128(static_cast<int>(23 - p.mantissa_bits))),
        round_base(splat((1u << (22 - p.mantissa_bits)) - 1u)),
        rebias(splat(p.rebias)),
        min_normal(splat(p.min_normal_bits)),
        overflow_minus_1(splat(p.overflow_bits - 1u)),
        overflow_code(splat(p.overflow_code)),
        nan_code(splat(p.nan_code)),
        subnormal_magic(_mm256_castsi256_ps(splat(p.subnormal_magic_bits))),
        saturate(p.options.overflow == Overflow::kSaturate) {}
  __m256 scale;
  __m128i shift;
  __m256i round_base, rebias, min_normal, overflow_minus_1, overflow_code, nan_code;
  __m256 subnormal_magic;
  bool saturate;
};

// 8 floats -> 8 codes in the low byte of each 32-bit lane: e4m3fn, e5m2, e4m3fnuz, e5m2fnuz.
template <bool kScaled, bool kSignOnZero>
inline __m256i encode8(__m256 x, const EncodeConsts& c) {
  if constexpr (kScaled) x = _mm256_mul_ps(x, c.scale);
  const __m256i one = splat(1);
  const __m256i u = _mm256_castps_si256(x);
  const __m256i a = _mm256_and_si256(u, splat(0x7FFFFFFFu));
  // Normal FP8 result: add the rounding bias (half - 1 + lsb) and shift the mantissa into place.
  const __m256i lsb = _mm256_and_si256(_mm256_srl_epi32(a, c.shift), one);
  const __m256i rounded = _mm256_add_epi32(a, _mm256_add_epi32(c.round_base, lsb));
  const __m256i normal = _mm256_sub_epi32(_mm256_srl_epi32(rounded, c.shift), c.rebias);
  // Subnormal FP8 result: adding C = 2^(24-bias-m), whose ulp is the FP8 quantum 2^(1-bias-m), makes the
  // float adder round |x| once, to nearest even, onto that quantum; the code is the difference of the bits.
  const __m256 rounded_sub = _mm256_add_ps(_mm256_castsi256_ps(a), c.subnormal_magic);
  const __m256i subnormal = _mm256_sub_epi32(_mm256_castps_si256(rounded_sub), _mm256_castps_si256(c.subnormal_magic));
  __m256i code = select(_mm256_cmpgt_epi32(c.min_normal, a), subnormal, normal);
  code = select(_mm256_cmpgt_epi32(a, c.overflow_minus_1), c.overflow_code, code);
  code = select(_mm256_cmpgt_epi32(a, splat(0x7F800000u)), c.nan_code, code);
  __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), splat(0x80));
  if constexpr (!kSignOnZero) sign = _mm256_andnot_si256(_mm256_cmpeq_epi32(code, _mm256_setzero_si256()), sign);
  return _mm256_or_si256(code, sign);
}

// 8 floats -> 8 e8m0fnu codes: the nearest power of two, ties up (as PyTorch and ml_dtypes), no sign, no zero.
template <bool kScaled, bool /*kSignOnZero*/>
inline __m256i encode8_e8m0(__m256 x, const EncodeConsts& c) {
  if constexpr (kScaled) x = _mm256_mul_ps(x, c.scale);
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

// Stores 32 bytes; streaming (non-temporal) stores need a 32-byte aligned address and skip the cache, which pays
// off for outputs much larger than the caches (no read-for-ownership of the destination).
template <bool kStream>
inline void store256(void* p, __m256i v) {
  if constexpr (kStream) {
    _mm256_stream_si256(static_cast<__m256i*>(p), v);
  } else {
    _mm256_storeu_si256(static_cast<__m256i*>(p), v);
  }
}

// Elements to convert one by one before `out` reaches a 32-byte boundary (for streaming stores).
template <typename T>
std::size_t head_until_aligned(const T* out, std::size_t n) {
  const auto misalignment = reinterpret_cast<std::uintptr_t>(out) & 31u;
  return std::min(n, ((32u - misalignment) & 31u) / sizeof(T));
}

// Four vectors of 8 codes -> 32 bytes in order.
template <bool kStream>
inline void store32(std::uint8_t* out, __m256i c0, __m256i c1, __m256i c2, __m256i c3) {
  const __m256i p01 = _mm256_packus_epi32(c0, c1);
  const __m256i p23 = _mm256_packus_epi32(c2, c3);
  const __m256i bytes = _mm256_packus_epi16(p01, p23);
  const __m256i ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  store256<kStream>(out, ordered);
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bfloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const float16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// The loop for one combination of format family, scaling and sign rule, so the vector body has no branches.
template <typename In, bool kE8M0, bool kScaled, bool kSignOnZero, bool kStream>
void encode_body(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  const EncodeConsts c(p);
  auto enc = [&c](__m256 x) {
    if constexpr (kE8M0) {
      return encode8_e8m0<kScaled, kSignOnZero>(x, c);
    } else {
      return encode8<kScaled, kSignOnZero>(x, c);
    }
  };
  std::size_t i = 0;
  if constexpr (kStream) {
    i = head_until_aligned(out, n);
    encode_tail(in, out, i, p);
  }
  for (; i + 32 <= n; i += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(in + i) + kPrefetchBytes, _MM_HINT_T0);
    store32<kStream>(out + i, enc(load8(in + i)), enc(load8(in + i + 8)), enc(load8(in + i + 16)),
                     enc(load8(in + i + 24)));
  }
  if constexpr (kStream) _mm_sfence();
  EncodeParams tail = p;
  tail.options.stream_offset += i;
  encode_tail(in + i, out + i, n - i, tail);
}

template <typename In, bool kE8M0, bool kScaled>
void encode_sign_rule(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  const int variant = (p.sign_on_zero ? 1 : 0) | (p.streaming_stores ? 2 : 0);
  switch (variant) {
    case 0: return encode_body<In, kE8M0, kScaled, false, false>(in, out, n, p);
    case 1: return encode_body<In, kE8M0, kScaled, true, false>(in, out, n, p);
    case 2: return encode_body<In, kE8M0, kScaled, false, true>(in, out, n, p);
    default: return encode_body<In, kE8M0, kScaled, true, true>(in, out, n, p);
  }
}

template <typename In, bool kE8M0>
void encode_scaling(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  if (p.options.scale != 1.0f) {
    encode_sign_rule<In, kE8M0, true>(in, out, n, p);
  } else {
    encode_sign_rule<In, kE8M0, false>(in, out, n, p);
  }
}

template <typename In>
void encode_avx2(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  if (p.options.rounding != Rounding::kNearestEven) {
    encode_tail(in, out, n, p);  // stochastic rounding: the scalar reference loop
  } else if (p.options.format == Format::e8m0fnu) {
    encode_scaling<In, true>(in, out, n, p);
  } else {
    encode_scaling<In, false>(in, out, n, p);
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

// 16 codes -> 16 outputs per step; Out selects the conversion of the float32 bit patterns.
template <typename Out, bool kE8M0, bool kStream>
void decode_body(const std::uint8_t* in, Out* out, std::size_t n, const DecodeConsts& c, const DecodeParams& p) {
  std::size_t i = 0;
  if constexpr (kStream) {
    i = head_until_aligned(out, n);
    decode_tail(in, out, i, p);
  }
  for (; i + 16 <= n; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(in + i) + kPrefetchBytes / 4, _MM_HINT_T0);
    const __m256i lo = decode_scaled<kE8M0>(in + i, c);
    const __m256i hi = decode_scaled<kE8M0>(in + i + 8, c);
    if constexpr (std::is_same_v<Out, float>) {
      store256<kStream>(out + i, lo);
      store256<kStream>(out + i + 8, hi);
    } else if constexpr (std::is_same_v<Out, bfloat16>) {
      store256<kStream>(out + i, _mm256_permute4x64_epi64(_mm256_packus_epi32(to_bf16_bits(lo), to_bf16_bits(hi)), 0xD8));
    } else {
      const __m128i lo16 = _mm256_cvtps_ph(_mm256_castsi256_ps(lo), _MM_FROUND_TO_NEAREST_INT);
      const __m128i hi16 = _mm256_cvtps_ph(_mm256_castsi256_ps(hi), _MM_FROUND_TO_NEAREST_INT);
      store256<kStream>(out + i, _mm256_set_m128i(hi16, lo16));
    }
  }
  if constexpr (kStream) _mm_sfence();
  decode_tail(in + i, out + i, n - i, p);
}

template <typename Out>
void decode_avx2(const std::uint8_t* in, Out* out, std::size_t n, const DecodeParams& p) {
  const DecodeConsts c(p);
  const int variant = (p.format == Format::e8m0fnu ? 1 : 0) | (p.streaming_stores ? 2 : 0);
  switch (variant) {
    case 0: return decode_body<Out, false, false>(in, out, n, c, p);
    case 1: return decode_body<Out, true, false>(in, out, n, c, p);
    case 2: return decode_body<Out, false, true>(in, out, n, c, p);
    default: return decode_body<Out, true, true>(in, out, n, c, p);
  }
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
