// AVX2 + F16C conversion kernels (round to nearest even), bit-identical to the scalar codec. They assume
// MXCSR's default round-to-nearest mode, as all compiled float code does; DAZ/FTZ do not change their results
// (a float subnormal input rounds to 0 in every FP8 format either way).
//
// float32 -> FP8, per element, on a = |x| as bits (m = FP8 mantissa bits):
//   normal FP8     ((a + 2^(22-m) - 1 + lsb) >> (23-m)) - ((127-bias) << m)   carry into the exponent is
//   correct subnormal FP8  bits(|x| + C) - bits(C), C = 2^(24-bias-m): the float adder rounds once onto the
//   FP8 quantum overflow       a >= overflow_bits (found from the scalar codec) -> the policy's overflow code
//   NaN            a > 0x7F800000 -> the canonical NaN; then the sign bit (never on the fnuz zero)
// FP8 -> float32: normal (mag << (23-m)) + rebias, subnormal int->float * 2^(1-bias-m) (exact), then specials.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "convert_kernels.hpp"

namespace fp8kit::convert_detail {
namespace {

// Software prefetch distance for the input stream (helps one thread keep enough reads in flight).
constexpr int kPrefetchBytes = 2048;

// A step of 32 float32 inputs reads two cache lines: prefetch both (prefetching one per step left every other
// line to the hardware and halved the encode's speed for most input alignments: 42 ms vs 20 ms for 64 Mi floats).
template <typename In>
[[gnu::always_inline]] inline void prefetch_two_lines(const In* p, std::size_t ahead = kPrefetchBytes) {
  const char* c = reinterpret_cast<const char*>(p) + ahead;
  _mm_prefetch(c, _MM_HINT_T0);
  _mm_prefetch(c + 64, _MM_HINT_T0);
}

[[gnu::always_inline]] inline __m256i splat(std::uint32_t v) {
  return _mm256_set1_epi32(static_cast<int>(v));
}
[[gnu::always_inline]] inline __m256i select(__m256i mask, __m256i if_true, __m256i if_false) {
  return _mm256_blendv_epi8(if_false, if_true, mask);
}

// How a kernel applies the overflow policy and NaN (a template parameter, so each variant has no branches):
//   kFoldNone   compare-and-blend for overflow, a NaN mask for NaN (non-saturating e5m2, whose Inf and NaN differ)
//   kFoldMin    one min(code, overflow code), which is also the NaN code (non-saturating e4m3fn and fnuz)
//   kFoldClamp  clamp |x| to the largest finite value, then min(code, NaN code) (every saturating conversion)
constexpr int kFoldNone = 0, kFoldMin = 1, kFoldClamp = 2;

int fold_mode(const EncodeParams& p) {
  if (p.options.overflow == Overflow::kSaturate) return kFoldClamp;
  return p.nan_code == p.overflow_code ? kFoldMin : kFoldNone;
}

// Calls run.template operator()<kFold>() with the fold mode these parameters need.
template <typename Run>
void with_fold_mode(const EncodeParams& p, const Run& run) {
  switch (fold_mode(p)) {
    case kFoldClamp:
      return run.template operator()<kFoldClamp>();
    case kFoldMin:
      return run.template operator()<kFoldMin>();
    default:
      return run.template operator()<kFoldNone>();
  }
}

struct EncodeConsts {
  explicit EncodeConsts(const EncodeParams& p)
      : scale(_mm256_set1_ps(p.options.scale)),
        shift(_mm_cvtsi32_si128(static_cast<int>(23 - p.mantissa_bits))),
        round_base(splat((1u << (22 - p.mantissa_bits)) - 1u)),
        overflow_minus_1(splat(p.overflow_bits - 1u)),
        overflow_code(splat(p.overflow_code)),
        subnormal_magic(_mm256_castsi256_ps(splat(p.subnormal_magic_bits))),
        rebias16(_mm256_set1_epi16(static_cast<short>(p.rebias))),
        max_code16(_mm256_set1_epi16(descriptor(p.options.format).max_code())),
        min_normal16(_mm256_set1_epi16(static_cast<short>(p.min_normal_bits >> (23 - p.mantissa_bits)))),
        overflow_code16(_mm256_set1_epi16(p.overflow_code)),
        fold_code16(_mm256_set1_epi16(p.options.overflow == Overflow::kSaturate ? p.nan_code : p.overflow_code)),
        nan_code16(_mm256_set1_epi16(p.nan_code)),
        largest_finite(_mm256_set1_ps(static_cast<float>(fp8kit::max_finite(p.options.format)))),
        saturate(p.options.overflow == Overflow::kSaturate) {}
  __m256 scale;
  __m128i shift;
  __m256i round_base, overflow_minus_1, overflow_code;
  __m256 subnormal_magic;
  __m256i rebias16, max_code16, min_normal16, overflow_code16, fold_code16, nan_code16;  // 16-bit lanes
  __m256 largest_finite;
  bool saturate;
};

// The parts of 8 floats' codes computed in 32-bit lanes (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz):
//   rounded    (|x| + half - 1 + lsb) >> (23 - m): the normal code plus rebias, correctly rounded
//   subnormal  bits(|x| + C) - bits(C), C = 2^(24-bias-m): the float adder rounds |x| onto the FP8 quantum
//   nan, neg   all-ones masks
template <bool kScaled, int kFold>
[[gnu::always_inline]] inline void encode_parts8(__m256 x, const EncodeConsts& c, __m256i& rounded, __m256i& subnormal,
                                                 __m256i& nan, __m256i& neg) {
  if constexpr (kScaled) x = _mm256_mul_ps(x, c.scale);
  const __m256i u = _mm256_castps_si256(x);
  __m256i a = _mm256_and_si256(u, splat(0x7FFFFFFFu));
  if constexpr (kFold == kFoldClamp) {
    // Saturating: clamp |x| to the largest finite value first (vminps returns its second operand, |x|, when that
    // is NaN, so NaN survives and rounds far past max, where min(code, NaN code) catches it).
    a = _mm256_castps_si256(_mm256_min_ps(c.largest_finite, _mm256_castsi256_ps(a)));
  }
  const __m256i lsb = _mm256_and_si256(_mm256_srl_epi32(a, c.shift), splat(1));
  rounded = _mm256_srl_epi32(_mm256_add_epi32(a, _mm256_add_epi32(c.round_base, lsb)), c.shift);
  const __m256 sum = _mm256_add_ps(_mm256_castsi256_ps(a), c.subnormal_magic);
  subnormal = _mm256_sub_epi32(_mm256_castps_si256(sum), _mm256_castps_si256(c.subnormal_magic));
  if constexpr (kFold == kFoldNone) nan = _mm256_cmpgt_epi32(a, splat(0x7F800000u));
  neg = _mm256_srai_epi32(u, 31);
}

// 16 codes in 16-bit lanes from the packed parts. `rounded` < the rounded value of the smallest normal means
// the subnormal result applies (where a value just below it rounds up to it, both paths agree). The overflow
// code is max (saturating) or max + 1 (Inf or NaN), and every code the rounding can produce past the largest
// finite one is an overflow, so min() applies the policy. A NaN input's rounded code is far past max too:
// where the policy's overflow code is the NaN code (kFold), min() alone handles NaN as well.
template <bool kSignOnZero, int kFold>
[[gnu::always_inline]] inline __m256i finish16(__m256i rounded, __m256i subnormal, __m256i nan, __m256i neg,
                                               const EncodeConsts& c) {
  __m256i code = _mm256_sub_epi16(rounded, c.rebias16);
  code = select(_mm256_cmpgt_epi16(c.min_normal16, rounded), subnormal, code);
  if constexpr (kFold != kFoldNone) {
    code = _mm256_min_epi16(code, c.fold_code16);
  } else {
    // (measured: compare-and-blend is faster than min() here on Zen 3, where the NaN blend follows anyway)
    code = select(_mm256_cmpgt_epi16(code, c.max_code16), c.overflow_code16, code);
    code = select(nan, c.nan_code16, code);
  }
  __m256i sign = _mm256_and_si256(neg, _mm256_set1_epi16(0x80));
  if constexpr (!kSignOnZero) sign = _mm256_andnot_si256(_mm256_cmpeq_epi16(code, _mm256_setzero_si256()), sign);
  return _mm256_or_si256(code, sign);
}

// Restores element order after packing 32-bit lanes to 16 and then to 8 bits within 128-bit halves.
[[gnu::always_inline]] inline __m256i order_packed_bytes(__m256i bytes) {
  return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// 16 floats -> 16 codes in 16-bit lanes (in the lane order packing leaves; order_packed_bytes fixes it).
// Two vectors at a time keep the live values within AVX2's 16 registers.
template <bool kScaled, bool kSignOnZero, int kFold>
[[gnu::always_inline]] inline __m256i encode16(__m256 x0, __m256 x1, const EncodeConsts& c) {
  __m256i r0, s0, n0{}, g0, r1, s1, n1{}, g1;
  encode_parts8<kScaled, kFold>(x0, c, r0, s0, n0, g0);
  encode_parts8<kScaled, kFold>(x1, c, r1, s1, n1, g1);
  // rounded <= 2^11 and subnormal <= 2^m fit unsigned 16 bits; the masks stay masks under signed packing.
  const __m256i nan = kFold != kFoldNone ? n0 : _mm256_packs_epi32(n0, n1);
  return finish16<kSignOnZero, kFold>(_mm256_packus_epi32(r0, r1), _mm256_packus_epi32(s0, s1), nan,
                                      _mm256_packs_epi32(g0, g1), c);
}

// 32 floats -> 32 codes, in order.
template <bool kScaled, bool kSignOnZero, int kFold>
[[gnu::always_inline]] inline __m256i encode32(__m256 x0, __m256 x1, __m256 x2, __m256 x3, const EncodeConsts& c) {
  const __m256i lo = encode16<kScaled, kSignOnZero, kFold>(x0, x1, c);
  const __m256i hi = encode16<kScaled, kSignOnZero, kFold>(x2, x3, c);
  return order_packed_bytes(_mm256_packus_epi16(lo, hi));
}

// 8 floats -> 8 e8m0fnu codes: the nearest power of two, ties up (as PyTorch and ml_dtypes), no sign, no zero.
template <bool kScaled>
[[gnu::always_inline]] inline __m256i encode8_e8m0(__m256 x, const EncodeConsts& c) {
  if constexpr (kScaled) x = _mm256_mul_ps(x, c.scale);
  const __m256i u = _mm256_castps_si256(x);
  const __m256i a = _mm256_and_si256(u, splat(0x7FFFFFFFu));
  const __m256i zero = _mm256_setzero_si256();
  const __m256i field = _mm256_srli_epi32(a, 23);
  // normal float: exponent field, plus one when the mantissa is >= 1.5
  const __m256i normal =
      _mm256_sub_epi32(field, _mm256_cmpgt_epi32(_mm256_and_si256(a, splat(0x7FFFFFu)), splat(0x3FFFFFu)));
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

// Stores 32 bytes; streaming (non-temporal) stores need a 32-byte aligned address and skip the cache, which
// pays off for outputs much larger than the caches (no read-for-ownership of the destination).
template <bool kStream>
[[gnu::always_inline]] inline void store256(void* p, __m256i v) {
  if constexpr (kStream) {
    _mm256_stream_si256(static_cast<__m256i*>(p), v);
  } else {
    _mm256_storeu_si256(static_cast<__m256i*>(p), v);
  }
}

// Stores 32 bytes at a 16-byte aligned address, as two non-temporal 16-byte stores when kStream (segment kernels
// write rows of a larger array, which are 16- but not always 32-byte aligned).
template <bool kStream>
[[gnu::always_inline]] inline void store256_16aligned(void* p, __m256i v) {
  if constexpr (kStream) {
    _mm_stream_si128(static_cast<__m128i*>(p), _mm256_castsi256_si128(v));
    _mm_stream_si128(static_cast<__m128i*>(p) + 1, _mm256_extracti128_si256(v, 1));
  } else {
    _mm256_storeu_si256(static_cast<__m256i*>(p), v);
  }
}

// Whether a segment kernel may stream its stores: asked for, and every store address 16-byte aligned.
inline bool can_stream(bool requested, const void* out) {
  return requested && (reinterpret_cast<std::uintptr_t>(out) & 15u) == 0;
}

// Elements to convert one by one before `out` reaches a 32-byte boundary (for streaming stores).
template <typename T>
std::size_t head_until_aligned(const T* out, std::size_t n) {
  const auto misalignment = reinterpret_cast<std::uintptr_t>(out) & 31u;
  return std::min(n, ((32u - misalignment) & 31u) / sizeof(T));
}

// 32 floats -> 32 e8m0fnu codes, in order.
template <bool kScaled>
[[gnu::always_inline]] inline __m256i encode32_e8m0(__m256 x0, __m256 x1, __m256 x2, __m256 x3, const EncodeConsts& c) {
  const __m256i p01 = _mm256_packus_epi32(encode8_e8m0<kScaled>(x0, c), encode8_e8m0<kScaled>(x1, c));
  const __m256i p23 = _mm256_packus_epi32(encode8_e8m0<kScaled>(x2, c), encode8_e8m0<kScaled>(x3, c));
  return order_packed_bytes(_mm256_packus_epi16(p01, p23));
}

[[gnu::always_inline]] inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
[[gnu::always_inline]] inline __m256 load8(const bfloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
[[gnu::always_inline]] inline __m256 load8(const float16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// ---------------------------------------------------------------- bfloat16 and float16 in 16-bit lanes

// Unscaled round to nearest even of bfloat16/float16 into the four sign-magnitude formats, 16 lanes of 16 bits:
// convert_avx512.cpp's encode32_half (the method, and why each step is exact) with AVX2's signed compares, which
// hold because every magnitude, rounded value and code compared is below 2^15. Widening each input to float32
// first, as the other encoders do, made the bfloat16 and float16 encodes compute bound (Zen 3, 1 thread: 0.46-0.49x
// memcpy, where float32 reaches 0.62x).
template <typename In>
struct HalfEncodeConsts {
  HalfEncodeConsts(const EncodeParams& p, Widen widen) {
    const HalfEncodeRule r = half_encode_rule<In>(p, widen);
    magic_bits = splat(r.magic_bits);
    subnormal_magic = _mm256_castsi256_ps(magic_bits);
    round_base = splat16(r.round_base);
    rebias = splat16(r.rebias);
    subnormal_below = splat16(r.subnormal_below);
    fold_code = splat16(r.fold_code);
    max_code = splat16(r.max_code);
    overflow_code = splat16(r.overflow_code);
    nan_code = splat16(r.nan_code);
  }
  static __m256i splat16(std::uint16_t v) { return _mm256_set1_epi16(static_cast<short>(v)); }
  __m256 subnormal_magic;
  __m256i magic_bits, round_base, rebias, subnormal_below, fold_code, max_code, overflow_code, nan_code;
};

// The float adder's quantum counts of 16 magnitudes (16-bit bits), in 16-bit lanes in order (only those of lanes in
// the subnormal path are used).
template <typename In, Widen kHow>
[[gnu::always_inline]] inline __m256i quantum_counts(__m256i a, const HalfEncodeConsts<In>& c) {
  const auto count = [&c](__m256i x) {
    return _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(x), c.subnormal_magic)),
                            c.magic_bits);
  };
  if constexpr (kHow == Widen::kUnpack || kHow == Widen::kShift) {
    constexpr int kDown = kHow == Widen::kShift ? 3 : 0;
    const __m256i lo = _mm256_srli_epi32(_mm256_unpacklo_epi16(_mm256_setzero_si256(), a), kDown);
    const __m256i hi = _mm256_srli_epi32(_mm256_unpackhi_epi16(_mm256_setzero_si256(), a), kDown);
    return _mm256_packus_epi32(count(lo), count(hi));  // in-lane unpack and pack: the order is restored
  } else {
    const __m256i lo = _mm256_castps_si256(_mm256_cvtph_ps(_mm256_castsi256_si128(a)));
    const __m256i hi = _mm256_castps_si256(_mm256_cvtph_ps(_mm256_extracti128_si256(a, 1)));
    // the pack's qwords: counts 0-3, 8-11, 4-7, 12-15
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(count(lo), count(hi)), 0xD8);
  }
}

// 16 inputs (bits) -> 16 codes in 16-bit lanes.
template <typename In, int kM, bool kSignOnZero, int kFold>
[[gnu::always_inline]] inline __m256i encode16_half(__m256i u, const HalfEncodeConsts<In>& c) {
  constexpr int kShift = Half16<In>::kMantissa - kM;
  const __m256i a = _mm256_and_si256(u, _mm256_set1_epi16(0x7FFF));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi16(a, kShift), _mm256_set1_epi16(1));
  const __m256i rounded = _mm256_srli_epi16(_mm256_add_epi16(a, _mm256_add_epi16(c.round_base, lsb)), kShift);
  __m256i code = _mm256_sub_epi16(rounded, c.rebias);
  constexpr Widen kHow = kWiden<In, kM, kSignOnZero>;
  if constexpr (kHow != Widen::kNone) {
    __m256i below = _mm256_cmpgt_epi16(c.subnormal_below, rounded);
    if constexpr (kHow == Widen::kCvt) below = _mm256_or_si256(below, _mm256_cmpgt_epi16(_mm256_set1_epi16(0x0400), a));
    code = select(below, quantum_counts<In, kHow>(a, c), code);
  }
  const __m256i nan = _mm256_cmpgt_epi16(a, _mm256_set1_epi16(static_cast<short>(Half16<In>::kInfBits)));
  if constexpr (kFold == kFoldNone) {
    code = select(_mm256_cmpgt_epi16(code, c.max_code), c.overflow_code, code);
    code = select(nan, c.nan_code, code);
  } else {
    code = _mm256_min_epi16(code, c.fold_code);
    if constexpr (kFold == kFoldClamp) code = select(nan, c.nan_code, code);
  }
  __m256i sign = _mm256_and_si256(_mm256_srai_epi16(u, 15), _mm256_set1_epi16(0x80));
  if constexpr (!kSignOnZero) sign = _mm256_andnot_si256(_mm256_cmpeq_epi16(code, _mm256_setzero_si256()), sign);
  return _mm256_or_si256(code, sign);
}

template <typename In, int kM, bool kSignOnZero, int kFold, bool kStream>
void encode_half_body(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  const HalfEncodeConsts<In> c(p, kWiden<In, kM, kSignOnZero>);
  std::size_t i = 0;
  if constexpr (kStream) {
    i = head_until_aligned(out, n);
    encode_tail(in, out, i, p);
  }
  for (; i + 32 <= n; i += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(in + i) + kPrefetchBytes, _MM_HINT_T0);  // 32 inputs: one line
    const __m256i u0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    const __m256i u1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i + 16));
    const __m256i packed = _mm256_packus_epi16(encode16_half<In, kM, kSignOnZero, kFold>(u0, c),
                                               encode16_half<In, kM, kSignOnZero, kFold>(u1, c));
    // the pack's qwords: codes 0-7 of u0, of u1, 8-15 of u0, of u1
    store256<kStream>(out + i, _mm256_permute4x64_epi64(packed, 0xD8));
  }
  if constexpr (kStream) _mm_sfence();
  encode_tail(in + i, out + i, n - i, p);
}

// Calls encode_half_body for the format, the overflow policy's fold and the store kind.
template <typename In>
void encode_half(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  with_fold_mode(p, [&]<int kF>() {
    const auto run = [&]<int kM, bool kSign>() {
      if (p.streaming_stores) return encode_half_body<In, kM, kSign, kF, true>(in, out, n, p);
      encode_half_body<In, kM, kSign, kF, false>(in, out, n, p);
    };
    switch (p.options.format) {
      case Format::e4m3fn:
        return run.template operator()<3, true>();
      case Format::e5m2:
        return run.template operator()<2, true>();
      case Format::e4m3fnuz:
        return run.template operator()<3, false>();
      default:  // e5m2fnuz (e8m0fnu never comes here)
        return run.template operator()<2, false>();
    }
  });
}

// The loop for one combination of format family, scaling and sign rule, so the vector body has no branches.
template <typename In, bool kE8M0, bool kScaled, bool kSignOnZero, int kFold, bool kStream>
void encode_body(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  const EncodeConsts c(p);
  auto enc = [&c](__m256 x0, __m256 x1, __m256 x2, __m256 x3) {
    if constexpr (kE8M0) {
      return encode32_e8m0<kScaled>(x0, x1, x2, x3, c);
    } else {
      return encode32<kScaled, kSignOnZero, kFold>(x0, x1, x2, x3, c);
    }
  };
  std::size_t i = 0;
  if constexpr (kStream) {
    i = head_until_aligned(out, n);
    encode_tail(in, out, i, p);
  }
  for (; i + 32 <= n; i += 32) {
    prefetch_two_lines(in + i);
    store256<kStream>(out + i, enc(load8(in + i), load8(in + i + 8), load8(in + i + 16), load8(in + i + 24)));
  }
  if constexpr (kStream) _mm_sfence();
  EncodeParams tail = p;
  tail.options.stream_offset += i;
  encode_tail(in + i, out + i, n - i, tail);
}

template <typename In, bool kE8M0, bool kScaled>
void encode_sign_rule(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  const int variant = (p.sign_on_zero ? 1 : 0) | (p.streaming_stores ? 2 : 0);
  auto run = [&]<int kF>() {
    switch (variant) {
      case 0:
        return encode_body<In, kE8M0, kScaled, false, kF, false>(in, out, n, p);
      case 1:
        return encode_body<In, kE8M0, kScaled, true, kF, false>(in, out, n, p);
      case 2:
        return encode_body<In, kE8M0, kScaled, false, kF, true>(in, out, n, p);
      default:
        return encode_body<In, kE8M0, kScaled, true, kF, true>(in, out, n, p);
    }
  };
  with_fold_mode(p, run);
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
  } else if constexpr (!std::is_same_v<In, float>) {
    if (p.options.scale == 1.0f) return encode_half(in, out, n, p);  // (scaled: widened, as float32)
    encode_scaling<In, false>(in, out, n, p);
  } else {
    encode_scaling<In, false>(in, out, n, p);
  }
}

// FP8 -> 16-bit float bits (bfloat16 or float16), 16 codes per vector, in 16-bit lanes:
//   normal codes   (mag << (out_mantissa - m)) + ((out_bias - bias) << out_mantissa)
//   mag < 8        a pshufb table of the exact results (subnormals, and normals the formula cannot reach)
//   specials       Inf/NaN magnitudes, the fnuz NaN 0x80; then the sign bit. Every table entry and special
//                  pattern is taken from the scalar codec, so the kernel cannot disagree with it on a
//                  constant.
// float32 output zero-extends the bfloat16 bits (every FP8 value is exactly a bfloat16).
// Segments of a multiple of 32 elements, each with its own scale: the constants are built once per call and
// only the scale is re-broadcast per segment.
template <bool kE8M0, bool kSignOnZero, int kFold, bool kStream>
void encode_segments_body(const float* in, std::uint8_t* out, std::size_t n, std::size_t segment, const float* scales,
                          const EncodeParams& p) {
  EncodeConsts c(p);
  const std::size_t ahead = p.prefetch_ahead_bytes != 0 ? p.prefetch_ahead_bytes : kPrefetchBytes;
  std::size_t k = 0;
  for (; (k + 1) * segment <= n; ++k) {
    c.scale = _mm256_set1_ps(scales[k]);
    const float* x = in + k * segment;
    std::uint8_t* o = out + k * segment;
    for (std::size_t i = 0; i < segment; i += 32) {
      const char* next = reinterpret_cast<const char*>(x + i) + ahead;  // into L2: see convert_avx512.cpp
      _mm_prefetch(next, _MM_HINT_T1);
      _mm_prefetch(next + 64, _MM_HINT_T1);
      const __m256 x0 = load8(x + i), x1 = load8(x + i + 8), x2 = load8(x + i + 16), x3 = load8(x + i + 24);
      if constexpr (kE8M0) {
        store256_16aligned<kStream>(o + i, encode32_e8m0<true>(x0, x1, x2, x3, c));
      } else {
        store256_16aligned<kStream>(o + i, encode32<true, kSignOnZero, kFold>(x0, x1, x2, x3, c));
      }
    }
  }
  if constexpr (kStream) _mm_sfence();
  if (k * segment < n)
    encode_segments_tail(in + k * segment, out + k * segment, n - k * segment, segment, scales + k, p);
}

void encode_segments_avx2(const float* in, std::uint8_t* out, std::size_t n, std::size_t segment, const float* scales,
                          const EncodeParams& p) {
  if (segment == 0 || segment % 32 != 0 || p.options.rounding != Rounding::kNearestEven) {
    encode_segments_tail(in, out, n, segment, scales, p);
    return;
  }
  const bool stream = can_stream(p.streaming_stores, out);
  if (p.options.format == Format::e8m0fnu) {
    if (stream) return encode_segments_body<true, false, kFoldNone, true>(in, out, n, segment, scales, p);
    return encode_segments_body<true, false, kFoldNone, false>(in, out, n, segment, scales, p);
  }
  auto run = [&]<int kF>() {
    switch ((p.sign_on_zero ? 1 : 0) | (stream ? 2 : 0)) {
      case 0:
        return encode_segments_body<false, false, kF, false>(in, out, n, segment, scales, p);
      case 1:
        return encode_segments_body<false, true, kF, false>(in, out, n, segment, scales, p);
      case 2:
        return encode_segments_body<false, false, kF, true>(in, out, n, segment, scales, p);
      default:
        return encode_segments_body<false, true, kF, true>(in, out, n, segment, scales, p);
    }
  };
  with_fold_mode(p, run);
}

struct Decode16Consts {
  Decode16Consts(Format format, bool to_f16) {
    const ShiftDecodeRule r = shift_decode_rule(format, to_f16);
    shift = _mm_cvtsi32_si128(r.shift);
    rebias = _mm256_set1_epi16(static_cast<short>(r.rebias));
    small_table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r.small_table)));
    special_minus_1 = _mm256_set1_epi16(static_cast<short>(r.special_min - 1));
    inf_magnitude = _mm256_set1_epi16(static_cast<short>(r.inf_magnitude));
    inf_bits = _mm256_set1_epi16(static_cast<short>(r.inf_bits));
    nan_bits = _mm256_set1_epi16(static_cast<short>(r.nan_bits));
    nan_exact = _mm256_set1_epi16(static_cast<short>(r.nan_at_0x80 ? 0x80 : 0x100));
    nan_exact_bits = _mm256_set1_epi16(static_cast<short>(r.nan_0x80_bits));
  }
  __m128i shift;
  __m256i rebias, small_table, special_minus_1, inf_magnitude, inf_bits, nan_bits, nan_exact, nan_exact_bits;
};

[[gnu::always_inline]] inline __m256i load16_codes(const std::uint8_t* in) {
  return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in)));
}

// 16 codes of e4m3fn, e5m2, e4m3fnuz or e5m2fnuz -> 16 bfloat16 or float16 bit patterns (exact).
[[gnu::always_inline]] inline __m256i decode16(const std::uint8_t* in, const Decode16Consts& c) {
  const __m256i code = load16_codes(in);
  const __m256i mag = _mm256_and_si256(code, _mm256_set1_epi16(0x7F));
  const __m256i normal = _mm256_add_epi16(_mm256_sll_epi16(mag, c.shift), c.rebias);
  // pshufb index for 16-bit entry `mag`: bytes 2*mag and 2*mag+1 (only used where mag < 8).
  const __m256i index = _mm256_add_epi16(_mm256_mullo_epi16(mag, _mm256_set1_epi16(0x0202)), _mm256_set1_epi16(0x0100));
  const __m256i small = _mm256_shuffle_epi8(c.small_table, index);
  __m256i bits = select(_mm256_cmpgt_epi16(_mm256_set1_epi16(8), mag), small, normal);
  const __m256i special_bits = select(_mm256_cmpeq_epi16(mag, c.inf_magnitude), c.inf_bits, c.nan_bits);
  bits = select(_mm256_cmpgt_epi16(mag, c.special_minus_1), special_bits, bits);
  bits = _mm256_or_si256(bits, _mm256_slli_epi16(_mm256_and_si256(code, _mm256_set1_epi16(0x80)), 8));
  return select(_mm256_cmpeq_epi16(code, c.nan_exact), c.nan_exact_bits, bits);
}

// 16 e8m0fnu codes -> bfloat16 bits: 2^(code-127) is code << 7; 0x00 is the subnormal 2^-127 (0x0040); 0xFF NaN.
[[gnu::always_inline]] inline __m256i decode16_e8m0(const std::uint8_t* in, const Decode16Consts&) {
  const __m256i code = load16_codes(in);
  __m256i bits = _mm256_slli_epi16(code, 7);
  bits = select(_mm256_cmpeq_epi16(code, _mm256_setzero_si256()), _mm256_set1_epi16(0x0040), bits);
  return select(_mm256_cmpeq_epi16(code, _mm256_set1_epi16(0xFF)), _mm256_set1_epi16(0x7FC0), bits);
}

// FP8 -> bfloat16 or float16 a byte of the result at a time (ByteDecodeRule): 32 codes per step in byte lanes, where
// the 16-bit-lane decode16 takes 16; the two bytes of each result are interleaved at the end. About 27 operations per
// 32 codes against decode16's 19 per 16 (measured with bench convert: docs/conversions.md).
struct ByteDecodeConsts {
  explicit ByteDecodeConsts(const ByteDecodeRule& r)
      : hi_table(table(r.hi_table)),
        small_hi(table(r.small_hi)),
        small_lo(table(r.small_lo)),
        hi_shift(_mm_cvtsi32_si128(r.hi_shift)),
        lo_shift(_mm_cvtsi32_si128(r.lo_shift)),
        hi_mask(_mm256_set1_epi8(static_cast<char>(r.hi_mask))),
        hi_add(_mm256_set1_epi8(static_cast<char>(r.hi_add))),
        lo_mask(_mm256_set1_epi8(static_cast<char>(r.lo_mask))),
        lo_flip(_mm256_set1_epi8(static_cast<char>(r.lo_flip))),
        small_mask(_mm256_set1_epi8(static_cast<char>(r.small_mask))),
        special_min_minus_1(_mm256_set1_epi8(static_cast<char>(r.special_min - 1))),
        inf_magnitude(_mm256_set1_epi8(static_cast<char>(r.inf_magnitude))),
        inf_hi(_mm256_set1_epi8(static_cast<char>(r.inf_hi))),
        inf_lo(_mm256_set1_epi8(static_cast<char>(r.inf_lo))),
        nan_hi(_mm256_set1_epi8(static_cast<char>(r.nan_hi))),
        nan_lo(_mm256_set1_epi8(static_cast<char>(r.nan_lo))),
        nan80_enable(_mm256_set1_epi8(static_cast<char>(r.nan80 ? 0xFF : 0x00))),
        nan80_hi(_mm256_set1_epi8(static_cast<char>(r.nan80_hi))),
        nan80_lo(_mm256_set1_epi8(static_cast<char>(r.nan80_lo))) {}
  static __m256i table(const std::uint8_t (&t)[16]) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
  }
  __m256i hi_table, small_hi, small_lo;
  __m128i hi_shift, lo_shift;
  __m256i hi_mask, hi_add, lo_mask, lo_flip, small_mask, special_min_minus_1, inf_magnitude, inf_hi, inf_lo, nan_hi,
      nan_lo, nan80_enable, nan80_hi, nan80_lo;
};

// 32 codes -> 32 bfloat16 (kTableHigh) or float16 bit patterns (exact), codes 0-15 in `first`, 16-31 in `second`.
template <bool kTableHigh>
[[gnu::always_inline]] inline void decode32_bytes(const std::uint8_t* in, const ByteDecodeConsts& c, __m256i& first,
                                                  __m256i& second) {
  const __m256i code = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in));
  const __m256i sign = _mm256_and_si256(code, _mm256_set1_epi8(static_cast<char>(0x80)));
  const __m256i mag = _mm256_xor_si256(code, sign);
  // (In 16-bit lanes, shifts move bits across the byte boundary; the masks keep each byte's own.)
  __m256i hi;
  if constexpr (kTableHigh) {
    hi = _mm256_shuffle_epi8(c.hi_table, _mm256_and_si256(_mm256_srli_epi16(code, 3), _mm256_set1_epi8(0x0F)));
  } else {
    hi = _mm256_add_epi8(_mm256_and_si256(_mm256_srl_epi16(mag, c.hi_shift), c.hi_mask), c.hi_add);
  }
  __m256i lo = _mm256_xor_si256(_mm256_and_si256(_mm256_sll_epi16(code, c.lo_shift), c.lo_mask), c.lo_flip);
  const __m256i small = _mm256_cmpeq_epi8(_mm256_and_si256(code, c.small_mask), _mm256_setzero_si256());
  const __m256i small_index = _mm256_and_si256(code, _mm256_set1_epi8(7));
  hi = _mm256_blendv_epi8(hi, _mm256_shuffle_epi8(c.small_hi, small_index), small);
  lo = _mm256_blendv_epi8(lo, _mm256_shuffle_epi8(c.small_lo, small_index), small);
  const __m256i special = _mm256_cmpgt_epi8(mag, c.special_min_minus_1);  // magnitudes are 0..127: signed is fine
  const __m256i inf = _mm256_cmpeq_epi8(mag, c.inf_magnitude);
  hi = _mm256_blendv_epi8(hi, _mm256_blendv_epi8(c.nan_hi, c.inf_hi, inf), special);
  lo = _mm256_blendv_epi8(lo, _mm256_blendv_epi8(c.nan_lo, c.inf_lo, inf), special);
  hi = _mm256_or_si256(hi, sign);
  const __m256i nan80 =
      _mm256_and_si256(_mm256_cmpeq_epi8(code, _mm256_set1_epi8(static_cast<char>(0x80))), c.nan80_enable);
  hi = _mm256_blendv_epi8(hi, c.nan80_hi, nan80);
  lo = _mm256_blendv_epi8(lo, c.nan80_lo, nan80);
  const __m256i a = _mm256_unpacklo_epi8(lo, hi);  // codes 0-7 | 16-23
  const __m256i b = _mm256_unpackhi_epi8(lo, hi);  // codes 8-15 | 24-31
  first = _mm256_permute2x128_si256(a, b, 0x20);
  second = _mm256_permute2x128_si256(a, b, 0x31);
}

// float32 bits -> bfloat16 bits in the low half of each lane (round to nearest even, NaN quieted).
[[gnu::always_inline]] inline __m256i to_bf16_bits(__m256i u) {
  const __m256i rounded =
      _mm256_add_epi32(u, _mm256_add_epi32(splat(0x7FFF), _mm256_and_si256(_mm256_srli_epi32(u, 16), splat(1))));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, splat(0x7FFFFFFFu)), splat(0x7F800000u));
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), splat(0x40));
  return select(is_nan, nan, _mm256_srli_epi32(rounded, 16));
}

// 16 bfloat16 bit patterns -> two vectors of 8 float32 (elements 0-7 and 8-15), optionally times scale_inv.
template <bool kScaled>
[[gnu::always_inline]] inline void widen16(__m256i bf16, __m256 scale_inv, __m256& lo, __m256& hi) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i a = _mm256_unpacklo_epi16(zero, bf16);  // elements 0-3 | 8-11
  const __m256i b = _mm256_unpackhi_epi16(zero, bf16);  // elements 4-7 | 12-15
  lo = _mm256_castsi256_ps(_mm256_permute2x128_si256(a, b, 0x20));
  hi = _mm256_castsi256_ps(_mm256_permute2x128_si256(a, b, 0x31));
  if constexpr (kScaled) {
    lo = _mm256_mul_ps(lo, scale_inv);
    hi = _mm256_mul_ps(hi, scale_inv);
  }
}

// 16 codes -> 16 outputs per step.
template <typename Out, bool kE8M0, bool kScaled, bool kStream>
void decode_body(const std::uint8_t* in, Out* out, std::size_t n, const DecodeParams& p) {
  // float16 output without a scale is computed directly in float16 (not for e8m0fnu, whose range float16 lacks).
  constexpr bool kDirectF16 = std::is_same_v<Out, float16> && !kScaled && !kE8M0;
  const Decode16Consts c(p.format, kDirectF16);
  const __m256 scale_inv = _mm256_set1_ps(p.scale_inv);
  std::size_t i = 0;
  if constexpr (kStream) {
    i = head_until_aligned(out, n);
    decode_tail(in, out, i, p);
  }
  // The 16 results of bits16 (bfloat16 or float16 bit patterns) stored at out + at, in the output type.
  const auto emit = [&](std::size_t at, __m256i bits16) {
    if constexpr (kDirectF16 || (std::is_same_v<Out, bfloat16> && !kScaled)) {
      store256<kStream>(out + at, bits16);
    } else {
      __m256 lo, hi;
      widen16<kScaled>(bits16, scale_inv, lo, hi);
      if constexpr (std::is_same_v<Out, float>) {
        store256<kStream>(out + at, _mm256_castps_si256(lo));
        store256<kStream>(out + at + 8, _mm256_castps_si256(hi));
      } else if constexpr (std::is_same_v<Out, bfloat16>) {
        const __m256i packed =
            _mm256_packus_epi32(to_bf16_bits(_mm256_castps_si256(lo)), to_bf16_bits(_mm256_castps_si256(hi)));
        store256<kStream>(out + at, _mm256_permute4x64_epi64(packed, 0xD8));
      } else {
        const __m128i lo16 = _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT);
        const __m128i hi16 = _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT);
        store256<kStream>(out + at, _mm256_set_m128i(hi16, lo16));
      }
    }
  };
  // The byte decode where the format has a rule: float16 bits for unscaled float16, bfloat16 bits for the rest.
  if constexpr (!kE8M0) {
    if (const ByteDecodeRule* rule = byte_decode_rule(p.format, kDirectF16)) {
      const ByteDecodeConsts bc(*rule);
      for (; i + 32 <= n; i += 32) {
        _mm_prefetch(reinterpret_cast<const char*>(in + i) + kPrefetchBytes / 4, _MM_HINT_T0);
        __m256i first, second;
        decode32_bytes<!kDirectF16>(in + i, bc, first, second);
        emit(i, first);
        emit(i + 16, second);
      }
    }
  }
  for (; i + 16 <= n; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(in + i) + kPrefetchBytes / 4, _MM_HINT_T0);
    emit(i, kE8M0 ? decode16_e8m0(in + i, c) : decode16(in + i, c));
  }
  if constexpr (kStream) _mm_sfence();
  decode_tail(in + i, out + i, n - i, p);
}

// How a segment kernel stores: cached, or non-temporal at 16-byte aligned addresses (two 16-byte stores per 32
// bytes) or at 32-byte aligned ones. (Zen 3, 128x128-block dequantize of 256 MiB, one thread: 32-byte non-temporal
// stores where the rows allow them, and the unit-scale test out of the step, took a quarter fewer samples of the
// kernel than 16-byte stores; most of it from the stores.)
constexpr int kCached = 0, kStreaming16 = 1, kStreaming32 = 2;
template <int kStore>
[[gnu::always_inline]] inline void store_segment(void* p, __m256i v) {
  if constexpr (kStore == kStreaming32) {
    store256<true>(p, v);
  } else {
    store256_16aligned<kStore == kStreaming16>(p, v);
  }
}

// Segments of a multiple of 16 codes, each with its own dequantization scale; constants built once per call. A
// segment whose scale is 1 is widened without the multiply (exact, as the scalar loop does without a scale); the
// choice is made per segment, outside its loop.
template <bool kE8M0, int kStore>
void decode_segments_body(const std::uint8_t* in, float* out, std::size_t n, std::size_t segment,
                          const float* scale_invs, const DecodeParams& p) {
  const Decode16Consts c(p.format, false);
  // The byte decode (32 codes a step) where the format has a rule and segments hold whole steps.
  const ByteDecodeRule* rule = kE8M0 || segment % 32 != 0 ? nullptr : byte_decode_rule(p.format, false);
  const ByteDecodeConsts bc(rule != nullptr ? *rule : ByteDecodeRule{});
  // One segment's codes src[0, segment) to dst, times scale_inv where kScaled.
  const auto run = [&]<bool kScaled>(const std::uint8_t* src, float* dst, __m256 scale_inv) {
    const auto emit = [&](std::size_t at, __m256i bits16) {
      __m256 lo, hi;
      widen16<kScaled>(bits16, scale_inv, lo, hi);
      store_segment<kStore>(dst + at, _mm256_castps_si256(lo));
      store_segment<kStore>(dst + at + 8, _mm256_castps_si256(hi));
    };
    if (rule != nullptr) {
      for (std::size_t i = 0; i < segment; i += 32) {
        _mm_prefetch(reinterpret_cast<const char*>(src + i) + kPrefetchBytes / 4, _MM_HINT_T0);
        __m256i first, second;
        decode32_bytes<true>(src + i, bc, first, second);
        emit(i, first);
        emit(i + 16, second);
      }
      return;
    }
    for (std::size_t i = 0; i < segment; i += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(src + i) + kPrefetchBytes / 4, _MM_HINT_T0);
      emit(i, kE8M0 ? decode16_e8m0(src + i, c) : decode16(src + i, c));
    }
  };
  std::size_t k = 0;
  for (; (k + 1) * segment <= n; ++k) {
    const float s = scale_invs[k];
    if (s == 1.0f) {
      run.template operator()<false>(in + k * segment, out + k * segment, _mm256_setzero_ps());
    } else {
      run.template operator()<true>(in + k * segment, out + k * segment, _mm256_set1_ps(s));
    }
  }
  if constexpr (kStore != kCached) _mm_sfence();
  if (k * segment < n)
    decode_segments_tail(in + k * segment, out + k * segment, n - k * segment, segment, scale_invs + k, p);
}

void decode_segments_avx2(const std::uint8_t* in, float* out, std::size_t n, std::size_t segment,
                          const float* scale_invs, const DecodeParams& p) {
  if (segment == 0 || segment % 16 != 0) return decode_segments_tail(in, out, n, segment, scale_invs, p);
  // (a segment is a multiple of 64 bytes of output: an aligned start keeps every store aligned)
  const int store = !can_stream(p.streaming_stores, out)                 ? kCached
                    : (reinterpret_cast<std::uintptr_t>(out) & 31u) == 0 ? kStreaming32
                                                                         : kStreaming16;
  const auto run = [&]<bool kE8M0>() {
    switch (store) {
      case kStreaming32:
        return decode_segments_body<kE8M0, kStreaming32>(in, out, n, segment, scale_invs, p);
      case kStreaming16:
        return decode_segments_body<kE8M0, kStreaming16>(in, out, n, segment, scale_invs, p);
      default:
        return decode_segments_body<kE8M0, kCached>(in, out, n, segment, scale_invs, p);
    }
  };
  if (p.format == Format::e8m0fnu) return run.template operator()<true>();
  run.template operator()<false>();
}

template <typename Out, bool kE8M0>
void decode_variant(const std::uint8_t* in, Out* out, std::size_t n, const DecodeParams& p) {
  const int variant = (p.scale_inv != 1.0f ? 1 : 0) | (p.streaming_stores ? 2 : 0);
  switch (variant) {
    case 0:
      return decode_body<Out, kE8M0, false, false>(in, out, n, p);
    case 1:
      return decode_body<Out, kE8M0, true, false>(in, out, n, p);
    case 2:
      return decode_body<Out, kE8M0, false, true>(in, out, n, p);
    default:
      return decode_body<Out, kE8M0, true, true>(in, out, n, p);
  }
}

template <typename Out>
void decode_avx2(const std::uint8_t* in, Out* out, std::size_t n, const DecodeParams& p) {
  if (p.format == Format::e8m0fnu) {
    decode_variant<Out, true>(in, out, n, p);
  } else {
    decode_variant<Out, false>(in, out, n, p);
  }
}

}  // namespace

const KernelTable& avx2_kernels() {
  static const KernelTable table{
      "avx2",
      Isa::kAvx2,
      KernelContract::kBitIdentical,
      &encode_avx2<float>,
      &encode_segments_avx2,
      &encode_avx2<bfloat16>,
      &encode_avx2<float16>,
      &decode_avx2<float>,
      &decode_segments_avx2,
      &decode_avx2<bfloat16>,
      &decode_avx2<float16>,
  };
  return table;
}

}  // namespace fp8kit::convert_detail
