// AVX-512 conversion kernels (F/BW/VL/DQ; VBMI where present), bit-identical to the scalar codec on every input,
// for round to nearest even and for stochastic rounding. They assume MXCSR's default rounding mode; DAZ/FTZ do not
// change the results of unscaled encodes (see the AVX2 kernels: a float32 subnormal rounds to 0 in every FP8 format
// but e8m0fnu, whose encoder reads bits, and the stochastic path never rounds one up either, since its fraction of an
// FP8 quantum is below 2^-32); a scaled encode's x * scale is a float32 multiply under the caller's mode, as in the
// scalar table (test EncodersUnderDenormalsAreZero).
//
// Round to nearest even into e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, in 32 lanes of 16 bits (bfloat16 and float16 inputs
// as they are; float32, and every scaled input, first rounded to odd into bfloat16), a = |x| as bits, m mantissa bits:
//   normal     ((a + 2^(s-1) - 1 + lsb) >> s) - (rebias << m), s = the input's mantissa bits - m, the carry moving
//              into the exponent
//   subnormal  bits(|x| + C) - bits(C) on the lanes widened to float32, C = 2^(24-bias-m): the float adder rounds
//              once onto the FP8 quantum
//   then the overflow policy (min() or compare), NaN, and the sign (never on the fnuz zero).
// Stochastic rounding, 16 lanes of 32 bits: the integer split of the normal path, with "round up" = random < the
// dropped fraction scaled to 2^32
// (normals: the low 23-m mantissa bits; subnormals: the fraction of |x| / quantum, exact in float32), the random
// bits from the vectorized SplitMix64 finalizer of stochastic_bits().
// FP8 -> bfloat16/float16 with VBMI: two 128-entry byte tables (the high and low bytes of the result for each
// magnitude, taken from the scalar codec) looked up with vpermi2b, the sign ORed in, the fnuz NaN 0x80 patched,
// and the bytes interleaved with vpermi2b; float32 output places the same two bytes in the top half of each dword.
// Without VBMI: the AVX2 shift/mask decode in 32 lanes of 16 bits.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "common/cpu/fp8_decode_avx512.hpp"
#include "convert_kernels.hpp"

namespace fp8kit::convert_detail {
namespace {

using namespace fp8_simd;  // NOLINT: the shared FP8 byte-table decode

constexpr int kPrefetchBytes = 2048;
// The segment encoder's prefetch of its own input when the caller's prefetch goes elsewhere (prefetch_ahead_bytes).
constexpr int kOwnPrefetchBytes = 1024;

[[gnu::always_inline]] inline __m512i splat(std::uint32_t v) {
  return _mm512_set1_epi32(static_cast<int>(v));
}

// Lanes [0, count) of a chunk of at most `width` elements.
[[gnu::always_inline]] inline __mmask16 mask16(std::size_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1u);
}
[[gnu::always_inline]] inline __mmask32 mask32(std::size_t count) {
  return count >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((std::uint32_t{1} << count) - 1u);
}
[[gnu::always_inline]] inline __mmask64 mask64(std::size_t count) {
  return count >= 64 ? ~__mmask64{0} : static_cast<__mmask64>((std::uint64_t{1} << count) - 1u);
}

// ---------------------------------------------------------------- loads (16 inputs as float32)

[[gnu::always_inline]] inline __m512 load16(const float* p, std::size_t count) {
  return count >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(mask16(count), p);
}
[[gnu::always_inline]] inline __m512 load16(const bfloat16* p, std::size_t count) {
  const __m256i h = count >= 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                : _mm256_maskz_loadu_epi16(mask16(count), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
[[gnu::always_inline]] inline __m512 load16(const float16* p, std::size_t count) {
  const __m256i h = count >= 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                : _mm256_maskz_loadu_epi16(mask16(count), p);
  return _mm512_cvtph_ps(h);
}

template <typename In>
[[gnu::always_inline]] inline void prefetch_chunk(const In* p) {
  // 64 inputs: 256 bytes of float32 (four lines), 128 of bfloat16/float16 (two).
  const char* c = reinterpret_cast<const char*>(p) + kPrefetchBytes * static_cast<int>(sizeof(In)) / 4;
  for (std::size_t line = 0; line < 64 * sizeof(In); line += 64) _mm_prefetch(c + line, _MM_HINT_T0);
}

// ---------------------------------------------------------------- encode constants

constexpr int kFoldNone = 0, kFoldMin = 1, kFoldClamp = 2;

int fold_mode(const EncodeParams& p) {
  if (p.options.overflow == Overflow::kSaturate) return kFoldClamp;
  return p.nan_code == p.overflow_code ? kFoldMin : kFoldNone;
}

// The constants of the stochastic and e8m0fnu encoders (round to nearest even of the other formats: HalfEncodeConsts).
struct EncodeConsts {
  explicit EncodeConsts(const EncodeParams& p)
      : scale(_mm512_set1_ps(p.options.scale)),
        rebias(splat(p.rebias)),
        min_normal_bits(splat(p.min_normal_bits)),
        max_code(splat(descriptor(p.options.format).max_code())),
        overflow_code(splat(p.overflow_code)),
        nan_code(splat(p.nan_code)),
        overflow_minus_1(splat(p.overflow_bits - 1u)),
        to_quanta(_mm512_set1_ps(fp8kit::min_subnormal(p.options.format)
                                     ? static_cast<float>(1.0 / *fp8kit::min_subnormal(p.options.format))
                                     : 1.0f)),
        zero_code(splat(p.options.overflow == Overflow::kSaturate ? 0x00u : 0xFFu)) {}
  __m512 scale;
  __m512i rebias, min_normal_bits, max_code, overflow_code, nan_code;
  __m512i overflow_minus_1;  // e8m0fnu: |x| bits past this overflow
  __m512 to_quanta;          // 1 / the smallest subnormal: |x| in units of the subnormal quantum (exact)
  __m512i zero_code;         // e8m0fnu: what 0 becomes (it has no zero)
};

// The sign of x applied to a code (where the format has -0, or the code is not 0).
template <bool kSignOnZero>
[[gnu::always_inline]] inline __m512i apply_sign(__m512i code, __m512i u) {
  __mmask16 neg = _mm512_movepi32_mask(u);
  if constexpr (!kSignOnZero) neg = _mm512_mask_test_epi32_mask(neg, code, code);
  return _mm512_mask_or_epi32(code, neg, code, splat(0x80));
}

// 16 floats -> 16 e8m0fnu codes: the nearest power of two, ties up; no sign, no zero.
template <bool kScaled>
[[gnu::always_inline]] inline __m512i encode16_e8m0(__m512 x, const EncodeConsts& c, __m512 scale) {
  if constexpr (kScaled) x = _mm512_mul_ps(x, scale);
  const __m512i u = _mm512_castps_si512(x);
  const __m512i a = _mm512_and_si512(u, splat(0x7FFFFFFFu));
  const __m512i field = _mm512_srli_epi32(a, 23);
  // normal float: the exponent field, plus one when the mantissa is >= 1.5
  const __mmask16 up = _mm512_cmpgt_epu32_mask(_mm512_and_si512(a, splat(0x7FFFFFu)), splat(0x3FFFFFu));
  __m512i code = _mm512_mask_add_epi32(field, up, field, splat(1));
  // subnormal float (< 2^-126): 2^-127 (code 0) or, from 1.5 * 2^-127 up, 2^-126 (code 1)
  const __m512i denormal = _mm512_maskz_mov_epi32(_mm512_cmpgt_epu32_mask(a, splat(0x5FFFFFu)), splat(1));
  code = _mm512_mask_mov_epi32(code, _mm512_cmpeq_epi32_mask(field, _mm512_setzero_si512()), denormal);
  code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epu32_mask(a, c.overflow_minus_1), c.overflow_code);
  const __mmask16 zero = _mm512_cmpeq_epi32_mask(a, _mm512_setzero_si512());
  code = _mm512_mask_mov_epi32(code, zero, c.zero_code);
  const __mmask16 nan = (_mm512_movepi32_mask(u) & ~zero) | _mm512_cmpgt_epu32_mask(a, splat(0x7F800000u));
  return _mm512_mask_mov_epi32(code, nan, splat(0xFF));
}

// ---------------------------------------------------------------- bfloat16 and float16 in 16-bit lanes

// Round-to-nearest-even bfloat16/float16 -> e4m3fn, e5m2, e4m3fnuz or e5m2fnuz without widening to float32 first: 32
// lanes of 16 bits, half the instructions per element of an encode in 32-bit lanes (which made the widened encode
// compute bound at about 0.64x memcpy on one Zen 4 thread). The normal path rounds the 16-bit magnitude in integers:
// shift 7 - m (bfloat16) or 10 - m (float16), the exponent re-biased from the input's bias, a carry moving into the
// exponent. The subnormal path is a float adder on the lanes widened exactly to float32
// (bfloat16: unpack with zero, and packus_epi32 restores the lane order; float16: vcvtph2ps and a qword permute).
// It takes every lane whose rounded magnitude is below the FP8 format's smallest normal and, for float16, every
// float16 subnormal: e5m2fnuz's first binade, [2^-15, 2^-14), is float16-subnormal, where the integer path's fixed
// shift does not hold; there the float adder's quantum count is the code, as in every format's first normal
// binade. Overflow: the code is clamped after rounding rather than |x| before (the same result: the rounding is
// monotone, and every magnitude past the largest finite one rounds to a code at or past its code).
template <typename In>
struct HalfEncodeConsts {
  HalfEncodeConsts(const EncodeParams& p, Widen widen) : HalfEncodeConsts(half_encode_rule<In>(p, widen)) {}
  explicit HalfEncodeConsts(const HalfEncodeRule& r)
      : subnormal_magic(_mm512_castsi512_ps(splat(r.magic_bits))),
        magic_bits(splat(r.magic_bits)),
        round_base(splat16(r.round_base)),
        rebias(splat16(r.rebias)),
        subnormal_below(splat16(r.subnormal_below)),
        fold_code(splat16(r.fold_code)),
        max_code(splat16(r.max_code)),
        overflow_code(splat16(r.overflow_code)),
        nan_code(splat16(r.nan_code)) {}
  static __m512i splat16(std::uint16_t v) { return _mm512_set1_epi16(static_cast<short>(v)); }
  __m512 subnormal_magic;
  __m512i magic_bits, round_base, rebias, subnormal_below, fold_code, max_code, overflow_code, nan_code;
};

// The float adder's quantum counts of 32 magnitudes (16-bit bits), in 16-bit lanes in order (only those of lanes
// in the subnormal path are used; the others may be anything).
template <typename In, Widen kHow>
[[gnu::always_inline]] inline __m512i quantum_counts(__m512i a, const HalfEncodeConsts<In>& c) {
  const auto count = [&c](__m512i x) {
    return _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(x), c.subnormal_magic)),
                            c.magic_bits);
  };
  if constexpr (kHow == Widen::kUnpack || kHow == Widen::kShift) {
    constexpr int kDown = kHow == Widen::kShift ? 3 : 0;
    const __m512i lo = _mm512_srli_epi32(_mm512_unpacklo_epi16(_mm512_setzero_si512(), a), kDown);
    const __m512i hi = _mm512_srli_epi32(_mm512_unpackhi_epi16(_mm512_setzero_si512(), a), kDown);
    return _mm512_packus_epi32(count(lo), count(hi));
  } else {
    const auto cvt = [](__m256i h) { return _mm512_castps_si512(_mm512_cvtph_ps(h)); };
    const __m512i lo = cvt(_mm512_castsi512_si256(a)), hi = cvt(_mm512_extracti64x4_epi64(a, 1));
    // 128-bit lane L of the pack: counts 4L..4L+3 of lo, then of hi
    return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
                                    _mm512_packus_epi32(count(lo), count(hi)));
  }
}

// 32 inputs (bits) -> 32 codes in 16-bit lanes.
template <typename In, int kM, bool kSignOnZero, int kFold>
[[gnu::always_inline]] inline __m512i encode32_half(__m512i u, const HalfEncodeConsts<In>& c) {
  constexpr int kShift = Half16<In>::kMantissa - kM;
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi16(0x7FFF));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi16(a, kShift), _mm512_set1_epi16(1));
  const __m512i rounded = _mm512_srli_epi16(_mm512_add_epi16(a, _mm512_add_epi16(c.round_base, lsb)), kShift);
  __m512i code = _mm512_sub_epi16(rounded, c.rebias);
  constexpr Widen kHow = kWiden<In, kM, kSignOnZero>;
  if constexpr (kHow != Widen::kNone) {
    __mmask32 below = _mm512_cmplt_epu16_mask(rounded, c.subnormal_below);
    if constexpr (kHow == Widen::kCvt) below |= _mm512_cmplt_epu16_mask(a, _mm512_set1_epi16(0x0400));
    code = _mm512_mask_mov_epi16(code, below, quantum_counts<In, kHow>(a, c));
  }
  const __mmask32 nan = _mm512_cmpgt_epu16_mask(a, _mm512_set1_epi16(Half16<In>::kInfBits));
  if constexpr (kFold == kFoldNone) {
    code = _mm512_mask_mov_epi16(code, _mm512_cmpgt_epu16_mask(code, c.max_code), c.overflow_code);
    code = _mm512_mask_mov_epi16(code, nan, c.nan_code);
  } else {
    // Saturating: everything past the largest finite code becomes it, NaN aside; otherwise (the overflow code is
    // the NaN code) everything past it becomes that code.
    code = _mm512_min_epu16(code, c.fold_code);
    if constexpr (kFold == kFoldClamp) code = _mm512_mask_mov_epi16(code, nan, c.nan_code);
  }
  __mmask32 neg = _mm512_movepi16_mask(u);
  if constexpr (!kSignOnZero) neg = _mm512_mask_test_epi16_mask(neg, code, code);
  return _mm512_or_si512(code, _mm512_maskz_mov_epi16(neg, _mm512_set1_epi16(0x80)));
}

// Up to 64 inputs -> codes; a partial chunk loads and stores under masks.
template <typename In, int kM, bool kSignOnZero, int kFold>
[[gnu::always_inline]] inline void encode_chunk_half(const In* in, std::uint8_t* out, std::size_t count,
                                                     const HalfEncodeConsts<In>& c) {
  const __m512i u0 = count >= 64 ? _mm512_loadu_si512(in) : _mm512_maskz_loadu_epi16(mask32(count), in);
  const __m512i u1 = count >= 64 ? _mm512_loadu_si512(in + 32)
                                 : _mm512_maskz_loadu_epi16(mask32(count > 32 ? count - 32 : 0), in + 32);
  const __m512i packed = _mm512_packus_epi16(encode32_half<In, kM, kSignOnZero, kFold>(u0, c),
                                             encode32_half<In, kM, kSignOnZero, kFold>(u1, c));
  // 128-bit lane L of packed: codes 8L..8L+7 of u0, then of u1.
  const __m512i bytes = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), packed);
  if (count >= 64) {
    _mm512_storeu_si512(out, bytes);
  } else {
    _mm512_mask_storeu_epi8(out, mask64(count), bytes);
  }
}

// float32 -> the four sign-magnitude formats through the 16-bit path: 32 floats become 32 bfloat16 patterns rounded to
// odd (truncated, the lowest bit set where a dropped bit was), which encode32_half rounds to nearest even. Rounding
// to odd first and to nearest even second gives the nearest-even result of the float itself wherever the first
// result keeps at least two more significant bits than the second: bfloat16 keeps 8, the FP8 formats at most 4
// (fewer in their subnormal range), and bfloat16 has float32's exponent range, so nothing overflows or underflows in
// between (a float32 subnormal becomes a bfloat16 subnormal, and both encode to 0). NaN stays NaN: a payload dropped
// by the truncation sets the lowest bit. Per element about two thirds of the instructions of a 32-bit-lane encode: on a
// Zen 4, 0.19 instead of 0.23 ns per float in L1, and the fused quantize per row 0.24 instead of 0.28 ns per element.
[[gnu::always_inline]] inline __m512i round_to_odd_bf16(__m512 x0, __m512 x1) {
  // Each float's bit 16 set where its low 16 bits are not all zero, then the high halves of the 32 floats in order.
  const auto sticky = [](__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    return _mm512_mask_or_epi32(u, _mm512_test_epi32_mask(u, splat(0xFFFFu)), u, splat(0x10000u));
  };
  alignas(64) static constexpr std::uint16_t kHighHalves[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21,
                                                                23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
                                                                45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  return _mm512_permutex2var_epi16(sticky(x0), _mm512_load_si512(kHighHalves), sticky(x1));
}

// Up to 64 inputs times scale(g) for each group g of 16 -> codes; a partial chunk loads and stores under masks.
template <typename In, int kM, bool kSignOnZero, int kFold, bool kScaled, bool kStream = false, typename Scale>
[[gnu::always_inline]] inline void encode_chunk_rto(const In* in, std::uint8_t* out, std::size_t count,
                                                    const HalfEncodeConsts<bfloat16>& c, const Scale& scale) {
  const auto sub = [count](std::size_t offset) { return count > offset ? count - offset : 0; };
  __m512 x[4];
  for (int g = 0; g < 4; ++g) {
    x[g] = load16(in + 16 * g, sub(16 * static_cast<std::size_t>(g)));
    if constexpr (kScaled) x[g] = _mm512_mul_ps(x[g], scale(g));
  }
  const __m512i packed =
      _mm512_packus_epi16(encode32_half<bfloat16, kM, kSignOnZero, kFold>(round_to_odd_bf16(x[0], x[1]), c),
                          encode32_half<bfloat16, kM, kSignOnZero, kFold>(round_to_odd_bf16(x[2], x[3]), c));
  // 128-bit lane L of packed: codes 8L..8L+7 of the first 32, then of the second.
  const __m512i bytes = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), packed);
  if (count < 64) {
    _mm512_mask_storeu_epi8(out, mask64(count), bytes);
  } else if constexpr (kStream) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(out), bytes);
  } else {
    _mm512_storeu_si512(out, bytes);
  }
}

// ---------------------------------------------------------------- stochastic rounding

// stochastic_bits(seed, index) for 16 consecutive indices: SplitMix64's finalizer in 64-bit lanes.
struct RandomStream {
  RandomStream(std::uint64_t seed, std::uint64_t first_index) {
    const std::uint64_t z0 = seed * 0x9E3779B97F4A7C15ull + first_index + 0x632BE59BD9B4E019ull;
    lo = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(z0)), _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
    hi = _mm512_add_epi64(lo, _mm512_set1_epi64(8));
  }
  static __m512i mix(__m512i z) {
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)),
                           _mm512_set1_epi64(static_cast<long long>(0xBF58476D1CE4E5B9ull)));
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)),
                           _mm512_set1_epi64(static_cast<long long>(0x94D049BB133111EBull)));
    return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
  }
  // The next 16 values (the top 32 bits of each finalized lane), in index order.
  __m512i next16() {
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512i r = _mm512_permutex2var_epi32(mix(lo), odd, mix(hi));
    lo = _mm512_add_epi64(lo, _mm512_set1_epi64(16));
    hi = _mm512_add_epi64(hi, _mm512_set1_epi64(16));
    return r;
  }
  __m512i lo, hi;
};

// 16 floats -> 16 codes of the sign-magnitude formats, rounding up where random < the dropped fraction * 2^32.
template <int kM, bool kScaled, bool kSignOnZero>
[[gnu::always_inline]] inline __m512i encode16_stochastic(__m512 x, __m512i random, const EncodeConsts& c) {
  constexpr int kShift = 23 - kM;
  if constexpr (kScaled) x = _mm512_mul_ps(x, c.scale);
  const __m512i u = _mm512_castps_si512(x);
  const __m512i a = _mm512_and_si512(u, splat(0x7FFFFFFFu));
  // Normal FP8 range: the truncated code (exponent carries included) and the low 23-m mantissa bits.
  const __mmask16 up_normal = _mm512_cmplt_epu32_mask(random, _mm512_slli_epi32(a, 32 - kShift));
  __m512i code = _mm512_sub_epi32(_mm512_srli_epi32(a, kShift), c.rebias);
  code = _mm512_mask_add_epi32(code, up_normal, code, splat(1));
  // Subnormal FP8 range: t = |x| / quantum (exact), kept = floor(t), fraction = t - kept (exact: Sterbenz).
  const __m512 t = _mm512_mul_ps(_mm512_castsi512_ps(a), c.to_quanta);
  const __m512i kept = _mm512_cvttps_epi32(t);
  const __m512 fraction = _mm512_sub_ps(t, _mm512_cvtepi32_ps(kept));
  const __m512i fraction32 = _mm512_cvttps_epu32(_mm512_mul_ps(fraction, _mm512_set1_ps(4294967296.0f)));
  const __m512i subnormal = _mm512_mask_add_epi32(kept, _mm512_cmplt_epu32_mask(random, fraction32), kept, splat(1));
  code = _mm512_mask_mov_epi32(code, _mm512_cmplt_epu32_mask(a, c.min_normal_bits), subnormal);
  code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epu32_mask(code, c.max_code), c.overflow_code);
  code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epu32_mask(a, splat(0x7F800000u)), c.nan_code);
  return apply_sign<kSignOnZero>(code, u);
}

// 16 floats -> 16 e8m0fnu codes, stochastic: 2^e or 2^(e+1), up with probability (|x| / 2^e - 1).
template <bool kScaled>
[[gnu::always_inline]] inline __m512i encode16_e8m0_stochastic(__m512 x, __m512i random, const EncodeConsts& c) {
  if constexpr (kScaled) x = _mm512_mul_ps(x, c.scale);
  const __m512i u = _mm512_castps_si512(x);
  const __m512i a = _mm512_and_si512(u, splat(0x7FFFFFFFu));
  const __m512i field = _mm512_srli_epi32(a, 23);
  __m512i code =
      _mm512_mask_add_epi32(field, _mm512_cmplt_epu32_mask(random, _mm512_slli_epi32(a, 9)), field, splat(1));
  // Subnormal floats: from 2^-127 up, code 0 or (up) 1 with the fraction of |x| / 2^-127 - 1; below it, code 0.
  const __mmask16 sub_up =
      _mm512_cmplt_epu32_mask(random, _mm512_slli_epi32(_mm512_sub_epi32(a, splat(0x400000u)), 10));
  const __m512i sub = _mm512_maskz_mov_epi32(_mm512_cmpge_epu32_mask(a, splat(0x400000u)) & sub_up, splat(1));
  code = _mm512_mask_mov_epi32(code, _mm512_cmpeq_epi32_mask(field, _mm512_setzero_si512()), sub);
  code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epu32_mask(code, splat(0xFEu)), c.overflow_code);
  const __mmask16 zero = _mm512_cmpeq_epi32_mask(a, _mm512_setzero_si512());
  code = _mm512_mask_mov_epi32(code, zero, c.zero_code);
  const __mmask16 nan = (_mm512_movepi32_mask(u) & ~zero) | _mm512_cmpgt_epu32_mask(a, splat(0x7F800000u));
  return _mm512_mask_mov_epi32(code, nan, splat(0xFF));
}

// ---------------------------------------------------------------- encode loops

// Four vectors of 16 codes (32-bit lanes, values <= 0xFF) -> 64 bytes in element order.
[[gnu::always_inline]] inline __m512i pack64(__m512i c0, __m512i c1, __m512i c2, __m512i c3) {
  // After the in-lane packs, 128-bit lane L holds c0[4L..4L+3], c1[4L..], c2[4L..], c3[4L..]: dword 4L+q is
  // output dword 4q+L.
  const __m512i bytes = _mm512_packus_epi16(_mm512_packus_epi32(c0, c1), _mm512_packus_epi32(c2, c3));
  return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), bytes);
}

// Codes of up to 64 inputs: enc16(x, g) for each group g of 16; a partial chunk loads and stores under masks.
template <typename In, typename Enc16, bool kStream = false>
[[gnu::always_inline]] inline void encode_chunk(const In* in, std::uint8_t* out, std::size_t count,
                                                const Enc16& enc16) {
  const auto sub = [count](std::size_t offset) { return count > offset ? count - offset : 0; };
  const __m512i c0 = enc16(load16(in, sub(0)), 0);
  const __m512i c1 = enc16(load16(in + 16, sub(16)), 1);
  const __m512i c2 = enc16(load16(in + 32, sub(32)), 2);
  const __m512i c3 = enc16(load16(in + 48, sub(48)), 3);
  const __m512i bytes = pack64(c0, c1, c2, c3);
  if (count >= 64) {
    if constexpr (kStream) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out), bytes);
    } else {
      _mm512_storeu_si512(out, bytes);
    }
  } else {
    _mm512_mask_storeu_epi8(out, mask64(count), bytes);
  }
}

// Runs chunk(in + i, out + i, count) over [0, n): 64-element chunks, then one masked chunk.
template <typename In, typename Chunk>
[[gnu::always_inline]] inline void chunk_loop(const In* in, std::uint8_t* out, std::size_t n, const Chunk& chunk) {
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    prefetch_chunk(in + i);
    chunk(in + i, out + i, 64);
  }
  if (i < n) chunk(in + i, out + i, n - i);
}

template <typename In, typename Enc16>
[[gnu::always_inline]] inline void encode_loop(const In* in, std::uint8_t* out, std::size_t n, const Enc16& enc16) {
  chunk_loop(in, out, n,
             [&enc16](const In* i, std::uint8_t* o, std::size_t count) { encode_chunk(i, o, count, enc16); });
}

// Long arrays (round to nearest even): four equal parts encoded side by side, a chunk of each in turn, so that one
// core keeps four sequential read streams in flight instead of one. One stream leaves memory bandwidth unused: on
// the Xeon this was written on, one thread reads 256 MiB at 11.6 GB/s as one stream and at 15.8 GB/s as four, and
// the 1-thread encode of 256 MiB of float32 went from 0.47x to 0.63-0.65x memcpy in `fp8kit bench convert`
// (2, 4 or 8 parts: the same).
constexpr std::size_t kInterleaveStreams = 4;
constexpr std::size_t kInterleaveMin = std::size_t{1} << 20;  // elements

template <typename In, typename Chunk>
[[gnu::always_inline]] inline void chunk_loop_interleaved(const In* in, std::uint8_t* out, std::size_t n,
                                                          const Chunk& chunk) {
  if (n < kInterleaveMin) return chunk_loop(in, out, n, chunk);
  const std::size_t part = n / kInterleaveStreams / 64 * 64;
  for (std::size_t i = 0; i < part; i += 64) {
    for (std::size_t s = 0; s < kInterleaveStreams; ++s) {
      prefetch_chunk(in + s * part + i);
      chunk(in + s * part + i, out + s * part + i, 64);
    }
  }
  const std::size_t done = kInterleaveStreams * part;
  chunk_loop(in + done, out + done, n - done, chunk);
}

// Elements to convert one by one before `out` reaches a 64-byte boundary (for streaming stores).
template <typename T>
std::size_t head_until_aligned(const T* out, std::size_t n) {
  const auto misalignment = reinterpret_cast<std::uintptr_t>(out) & 63u;
  return std::min(n, ((64u - misalignment) & 63u) / sizeof(T));
}

// The stochastic loops: the random stream starts at element 0 of this call.
template <typename In, bool kE8M0, int kM, bool kScaled, bool kSignOnZero>
void encode_stochastic_body(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  const EncodeConsts c(p);
  RandomStream random(p.options.seed, p.options.stream_offset);
  auto enc16 = [&](__m512 x, int) {
    if constexpr (kE8M0) {
      return encode16_e8m0_stochastic<kScaled>(x, random.next16(), c);
    } else {
      return encode16_stochastic<kM, kScaled, kSignOnZero>(x, random.next16(), c);
    }
  };
  encode_loop(in, out, n, enc16);
}

template <typename In, bool kE8M0, int kM, bool kScaled, bool kSignOnZero, int kFold>
void encode_body(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  if constexpr (kE8M0) {
    const EncodeConsts c(p);
    auto enc16 = [&c](__m512 x, int) { return encode16_e8m0<kScaled>(x, c, c.scale); };
    chunk_loop_interleaved(
        in, out, n, [&enc16](const In* i, std::uint8_t* o, std::size_t count) { encode_chunk(i, o, count, enc16); });
  } else {
    const HalfEncodeConsts<bfloat16> c(p, Widen::kUnpack);
    const __m512 scale = _mm512_set1_ps(p.options.scale);
    const auto scale_of = [&scale](int) { return scale; };
    chunk_loop_interleaved(in, out, n, [&](const In* i, std::uint8_t* o, std::size_t count) {
      encode_chunk_rto<In, kM, kSignOnZero, kFold, kScaled>(i, o, count, c, scale_of);
    });
  }
}

template <typename In, int kM, bool kSignOnZero, int kFold>
void encode_half_body(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  const HalfEncodeConsts<In> c(p, kWiden<In, kM, kSignOnZero>);
  chunk_loop_interleaved(in, out, n, [&c](const In* i, std::uint8_t* o, std::size_t count) {
    encode_chunk_half<In, kM, kSignOnZero, kFold>(i, o, count, c);
  });
}

// Calls run.template operator()<kE8M0, kM, kSignOnZero>() for the format.
template <typename Run>
void with_format(Format f, const Run& run) {
  switch (f) {
    case Format::e4m3fn:
      return run.template operator()<false, 3, true>();
    case Format::e5m2:
      return run.template operator()<false, 2, true>();
    case Format::e4m3fnuz:
      return run.template operator()<false, 3, false>();
    case Format::e5m2fnuz:
      return run.template operator()<false, 2, false>();
    case Format::e8m0fnu:
      return run.template operator()<true, 0, false>();
  }
}

// Calls run.template operator()<kE8M0, kM, kSignOnZero, kFold>() for the format and the overflow policy's fold.
template <typename Run>
void with_format_and_fold(const EncodeParams& p, const Run& run) {
  const int fold = fold_mode(p);
  with_format(p.options.format, [&]<bool kE8M0, int kM, bool kSign>() {
    switch (fold) {
      case kFoldClamp:
        return run.template operator()<kE8M0, kM, kSign, kFoldClamp>();
      case kFoldMin:
        return run.template operator()<kE8M0, kM, kSign, kFoldMin>();
      default:
        return run.template operator()<kE8M0, kM, kSign, kFoldNone>();
    }
  });
}

template <typename In>
void encode_avx512(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  const bool scaled = p.options.scale != 1.0f;
  if (p.options.rounding == Rounding::kStochastic) {
    with_format(p.options.format, [&]<bool kE8M0, int kM, bool kSign>() {
      if (scaled) return encode_stochastic_body<In, kE8M0, kM, true, kSign>(in, out, n, p);
      encode_stochastic_body<In, kE8M0, kM, false, kSign>(in, out, n, p);
    });
    return;
  }
  // Plain stores even for large outputs (p.streaming_stores): on the Xeon this was measured on, non-temporal stores
  // made the single-stream encode slower (256 MiB of float32: 0.49x -> 0.51x memcpy on 1 thread, 0.78x -> 0.88x on
  // 2) and the four-part one no faster (0.69x either way on 1 thread), while the decoders, which write four times
  // what they read, need them (1.05x with, 0.47x without).
  with_format_and_fold(p, [&]<bool kE8M0, int kM, bool kSign, int kFold>() {
    if constexpr (!std::is_same_v<In, float> && !kE8M0) {
      if (!scaled) return encode_half_body<In, kM, kSign, kFold>(in, out, n, p);
    }
    if (scaled) return encode_body<In, kE8M0, kM, true, kSign, kFold>(in, out, n, p);
    encode_body<In, kE8M0, kM, false, kSign, kFold>(in, out, n, p);
  });
}

// Segments of a multiple of 16 elements, each with its own scale (round to nearest even): 64-element chunks whose
// groups of 16 each take their segment's scale, so short segments (MX's 32) fill whole chunks; the last chunk (and a
// partial last segment) under masks.
template <bool kE8M0, int kM, bool kSignOnZero, int kFold>
void encode_segments_body(const float* in, std::uint8_t* out, std::size_t n, std::size_t segment, const float* scales,
                          const EncodeParams& p) {
  const EncodeConsts c(p);
  const HalfEncodeConsts<bfloat16> hc(p, Widen::kUnpack);
  const std::size_t ahead = p.prefetch_ahead_bytes != 0 ? p.prefetch_ahead_bytes : kPrefetchBytes;
  const bool own_ahead = p.prefetch_ahead_bytes != 0;  // else `ahead` is the input's own
  const bool stream = p.streaming_stores && (reinterpret_cast<std::uintptr_t>(out) & 63u) == 0;
  __m512 group_scale[4];
  const auto scale_of = [&group_scale](int g) { return group_scale[g]; };
  // Up to 64 elements with the group scales set.
  const auto chunk = [&]<bool kStream>(std::size_t i, std::size_t count) {
    if constexpr (kE8M0) {
      auto enc16 = [&c, &group_scale](__m512 x, int g) { return encode16_e8m0<true>(x, c, group_scale[g]); };
      encode_chunk<float, decltype(enc16), kStream>(in + i, out + i, count, enc16);
    } else {
      encode_chunk_rto<float, kM, kSignOnZero, kFold, true, kStream>(in + i, out + i, count, hc, scale_of);
    }
  };
  // The scale of each group of 16 in order: a counter instead of a division per group.
  const std::size_t groups_per_segment = segment / 16;
  const float* scale = scales;
  std::size_t groups_left = groups_per_segment;
  auto next_scale = [&] {
    const __m512 s = _mm512_set1_ps(*scale);
    if (--groups_left == 0) {
      ++scale;
      groups_left = groups_per_segment;
    }
    return s;
  };
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    // Into L2: `ahead` is a row or more (what the fused quantize reads next), and prefetches that far into L1 hold
    // the core's few L1 miss buffers (Zen 4, 2 threads: row quantize 0.78-0.87x memcpy with T0, 0.95-1.15x with T1).
    const char* ahead_line = reinterpret_cast<const char*>(in + i) + ahead;
    for (int line = 0; line < 256; line += 64) _mm_prefetch(ahead_line + line, _MM_HINT_T1);
    if (own_ahead) {
      // The input itself, 1 KiB ahead into L1: far from the last read when the caller reads ahead elsewhere
      // (128x128 quantize encodes a band the amax pass read 2 MiB before: from L3 on the Xeon, 0.64x -> 0.71x).
      const char* own_line = reinterpret_cast<const char*>(in + i) + kOwnPrefetchBytes;
      for (int line = 0; line < 256; line += 64) _mm_prefetch(own_line + line, _MM_HINT_T0);
    }
    for (__m512& s : group_scale) s = next_scale();
    if (stream) {
      chunk.template operator()<true>(i, 64);
    } else {
      chunk.template operator()<false>(i, 64);
    }
  }
  if (i < n) {
    // The last chunk under masks; its groups past n (masked off) repeat the last real group's scale.
    const std::size_t groups = (n - i + 15) / 16;
    for (std::size_t g = 0; g < 4; ++g) group_scale[g] = g < groups ? next_scale() : group_scale[groups - 1];
    chunk.template operator()<false>(i, n - i);
  }
  if (stream) _mm_sfence();
}

void encode_segments_avx512(const float* in, std::uint8_t* out, std::size_t n, std::size_t segment, const float* scales,
                            const EncodeParams& p) {
  if (segment == 0 || segment % 16 != 0 || p.options.rounding != Rounding::kNearestEven) {
    encode_segments_tail(in, out, n, segment, scales, p);
    return;
  }
  with_format_and_fold(p, [&]<bool kE8M0, int kM, bool kSign, int kFold>() {
    encode_segments_body<kE8M0, kM, kSign, kFold>(in, out, n, segment, scales, p);
  });
}

// ---------------------------------------------------------------- decode

// Without VBMI: the AVX2 shift/mask decode of 32 codes (zero-extended to 16 bits) to 16-bit results.
struct ShiftDecode {
  ShiftDecode(Format format, bool to_f16) {
    const ShiftDecodeRule r = shift_decode_rule(format, to_f16);
    shift = _mm_cvtsi32_si128(r.shift);
    rebias = _mm512_set1_epi16(static_cast<short>(r.rebias));
    small_table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r.small_table)));
    special_min16 = _mm512_set1_epi16(static_cast<short>(r.special_min));
    inf_magnitude = _mm512_set1_epi16(static_cast<short>(r.inf_magnitude));
    inf_bits = _mm512_set1_epi16(static_cast<short>(r.inf_bits));
    nan_bits = _mm512_set1_epi16(static_cast<short>(r.nan_bits));
    nan_at_0x80 = r.nan_at_0x80;
    nan_0x80_bits = _mm512_set1_epi16(static_cast<short>(r.nan_0x80_bits));
  }
  __m128i shift;
  __m512i rebias, small_table, special_min16, inf_magnitude, inf_bits, nan_bits, nan_0x80_bits;
  bool nan_at_0x80;
};

[[gnu::always_inline]] inline __m512i shift_decode32(__m512i code, const ShiftDecode& c) {
  const __m512i mag = _mm512_and_si512(code, _mm512_set1_epi16(0x7F));
  const __m512i normal = _mm512_add_epi16(_mm512_sll_epi16(mag, c.shift), c.rebias);
  const __m512i index = _mm512_add_epi16(_mm512_mullo_epi16(mag, _mm512_set1_epi16(0x0202)), _mm512_set1_epi16(0x0100));
  __m512i bits = _mm512_mask_mov_epi16(normal, _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8)),
                                       _mm512_shuffle_epi8(c.small_table, index));
  const __mmask32 special = _mm512_cmpge_epu16_mask(mag, c.special_min16);
  const __mmask32 inf = _mm512_cmpeq_epi16_mask(mag, c.inf_magnitude);
  bits = _mm512_mask_mov_epi16(bits, special & ~inf, c.nan_bits);
  bits = _mm512_mask_mov_epi16(bits, special & inf, c.inf_bits);
  bits = _mm512_or_si512(bits, _mm512_slli_epi16(_mm512_and_si512(code, _mm512_set1_epi16(0x80)), 8));
  if (c.nan_at_0x80)
    bits = _mm512_mask_mov_epi16(bits, _mm512_cmpeq_epi16_mask(code, _mm512_set1_epi16(0x80)), c.nan_0x80_bits);
  return bits;
}

// e8m0fnu codes (16-bit lanes) -> bfloat16 bits: 2^(code-127) is code << 7; 0x00 is 2^-127 (0x0040); 0xFF NaN.
[[gnu::always_inline]] inline __m512i e8m0_bf16_bits32(__m512i code) {
  __m512i bits = _mm512_slli_epi16(code, 7);
  bits = _mm512_mask_mov_epi16(bits, _mm512_cmpeq_epi16_mask(code, _mm512_setzero_si512()), _mm512_set1_epi16(0x0040));
  return _mm512_mask_mov_epi16(bits, _mm512_cmpeq_epi16_mask(code, _mm512_set1_epi16(0xFF)), _mm512_set1_epi16(0x7FC0));
}

// float32 -> bfloat16 bits in the low half of each lane (round to nearest even, NaN quieted), as from_float.
[[gnu::always_inline]] inline __m512i to_bf16_bits(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i rounded =
      _mm512_add_epi32(u, _mm512_add_epi32(splat(0x7FFF), _mm512_and_si512(_mm512_srli_epi32(u, 16), splat(1))));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, splat(0x7FFFFFFFu)), splat(0x7F800000u));
  return _mm512_mask_mov_epi32(_mm512_srli_epi32(rounded, 16), nan,
                               _mm512_or_si512(_mm512_srli_epi32(u, 16), splat(0x40)));
}

// Two vectors of 16 bfloat16-in-low-half lanes -> 32 bfloat16 values in order.
[[gnu::always_inline]] inline __m512i pack_bf16(__m512i lo16, __m512i hi16) {
  const __m512i even =
      _mm512_setr_epi32(0x00020000, 0x00060004, 0x000A0008, 0x000E000C, 0x00120010, 0x00160014, 0x001A0018, 0x001E001C,
                        0x00220020, 0x00260024, 0x002A0028, 0x002E002C, 0x00320030, 0x00360034, 0x003A0038, 0x003E003C);
  return _mm512_permutex2var_epi16(lo16, even, hi16);
}

// Stores of up to 32 16-bit results or 16 floats from one vector.
template <bool kStream>
[[gnu::always_inline]] inline void store_words(void* out, __m512i v, std::size_t count) {
  if (count >= 32) {
    if constexpr (kStream) {
      _mm512_stream_si512(static_cast<__m512i*>(out), v);
    } else {
      _mm512_storeu_si512(out, v);
    }
  } else if (count > 0) {
    _mm512_mask_storeu_epi16(out, mask32(count), v);
  }
}
template <bool kStream>
[[gnu::always_inline]] inline void store_floats(float* out, __m512 v, std::size_t count) {
  if (count >= 16) {
    if constexpr (kStream) {
      _mm512_stream_ps(out, v);
    } else {
      _mm512_storeu_ps(out, v);
    }
  } else if (count > 0) {
    _mm512_mask_storeu_ps(out, mask16(count), v);
  }
}

// What one kernel variant decodes with.
enum class DecodeVia { kVbmi, kShift, kE8m0 };

struct DecodeConsts {
  DecodeConsts(const DecodeParams& p, bool to_f16)
      : tables(to_f16 ? &byte_tables<float16>(p.format) : &byte_tables<bfloat16>(p.format)),
        shift(p.format == Format::e8m0fnu ? Format::e4m3fn : p.format, to_f16),
        scale_inv(_mm512_set1_ps(p.scale_inv)) {}
  const ByteTables* tables;
  ShiftDecode shift;
  __m512 scale_inv;
};

// 32 codes (in the low 256 bits of a zmm of bytes, or all 64 for kVbmi) -> 32 16-bit results.
template <DecodeVia kVia>
[[gnu::always_inline]] inline __m512i bits32(__m256i codes, const DecodeConsts& c) {
  const __m512i wide = _mm512_cvtepu8_epi16(codes);
  if constexpr (kVia == DecodeVia::kE8m0) {
    return e8m0_bf16_bits32(wide);
  } else {
    return shift_decode32(wide, c.shift);
  }
}

// Up to 64 codes -> outputs. Float outputs widen the bfloat16 bits (every FP8 value is a bfloat16).
template <typename Out, DecodeVia kVia, bool kScaled, bool kStream>
[[gnu::always_inline]] inline void decode_chunk(const std::uint8_t* in, Out* out, std::size_t count,
                                                const DecodeConsts& c) {
  constexpr bool kDirect16 =
      !kScaled && (std::is_same_v<Out, bfloat16> || (std::is_same_v<Out, float16> && kVia != DecodeVia::kE8m0));
  const auto sub = [count](std::size_t offset) { return count > offset ? count - offset : 0; };
  const __m512i codes = count >= 64 ? _mm512_loadu_si512(in) : _mm512_maskz_loadu_epi8(mask64(count), in);
  // 16-bit results (bfloat16, or float16 for the direct float16 output) of codes 0-31 and 32-63.
  __m512i part[2];
  if constexpr (kVia == DecodeVia::kVbmi) {
    __m512i hi, lo;
    lookup64(codes, *c.tables, hi, lo);
    if constexpr (std::is_same_v<Out, float> && !kScaled) {
      // float32 straight from the bytes: [0, 0, lo, hi] per lane.
      const Interleave& il = interleave();
      for (int q = 0; q < 4; ++q) {
        const __m512i f = permute2_bytes_maskz(kF32Bytes, lo, il.quarter[q], hi);
        store_floats<kStream>(out + 16 * q, _mm512_castsi512_ps(f), sub(16 * q));
      }
      return;
    }
    const Interleave& il = interleave();
    part[0] = permute2_bytes(lo, il.half[0], hi);
    part[1] = permute2_bytes(lo, il.half[1], hi);
  } else {
    part[0] = bits32<kVia>(_mm512_castsi512_si256(codes), c);
    part[1] = bits32<kVia>(_mm512_extracti64x4_epi64(codes, 1), c);
  }
  for (int h = 0; h < 2; ++h) {
    const std::size_t left = sub(32 * h);
    if (left == 0) break;
    if constexpr (kDirect16) {
      store_words<kStream>(out + 32 * h, part[h], left);
    } else {
      // Widen bfloat16 bits to float32 (16 + 16), scale, then narrow to the output type.
      __m512 f[2];
      f[0] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(part[h])), 16));
      f[1] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(part[h], 1)), 16));
      if constexpr (kScaled) {
        f[0] = _mm512_mul_ps(f[0], c.scale_inv);
        f[1] = _mm512_mul_ps(f[1], c.scale_inv);
      }
      if constexpr (std::is_same_v<Out, float>) {
        store_floats<kStream>(out + 32 * h, f[0], left);
        store_floats<kStream>(out + 32 * h + 16, f[1], left > 16 ? left - 16 : 0);
      } else if constexpr (std::is_same_v<Out, bfloat16>) {
        store_words<kStream>(out + 32 * h, pack_bf16(to_bf16_bits(f[0]), to_bf16_bits(f[1])), left);
      } else {
        const __m256i h0 = _mm512_cvtps_ph(f[0], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i h1 = _mm512_cvtps_ph(f[1], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        store_words<kStream>(out + 32 * h, _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1), left);
      }
    }
  }
}

template <typename Out, DecodeVia kVia, bool kScaled, bool kStream>
void decode_body(const std::uint8_t* in, Out* out, std::size_t n, const DecodeParams& p) {
  // The direct float16 results of the tables/shift decode only exist where float16 holds every value.
  const DecodeConsts c(p, std::is_same_v<Out, float16> && !kScaled && kVia != DecodeVia::kE8m0);
  std::size_t i = 0;
  if constexpr (kStream) {
    i = head_until_aligned(out, n);
    decode_tail(in, out, i, p);
  }
  for (; i + 64 <= n; i += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(in + i) + kPrefetchBytes / 2, _MM_HINT_T0);
    decode_chunk<Out, kVia, kScaled, kStream>(in + i, out + i, 64, c);
  }
  if constexpr (kStream) _mm_sfence();
  if (i < n) decode_chunk<Out, kVia, kScaled, false>(in + i, out + i, n - i, c);
}

template <typename Out, DecodeVia kVia>
void decode_variant(const std::uint8_t* in, Out* out, std::size_t n, const DecodeParams& p) {
  const int variant = (p.scale_inv != 1.0f ? 1 : 0) | (p.streaming_stores ? 2 : 0);
  switch (variant) {
    case 0:
      return decode_body<Out, kVia, false, false>(in, out, n, p);
    case 1:
      return decode_body<Out, kVia, true, false>(in, out, n, p);
    case 2:
      return decode_body<Out, kVia, false, true>(in, out, n, p);
    default:
      return decode_body<Out, kVia, true, true>(in, out, n, p);
  }
}

template <typename Out, bool kVbmi>
void decode_avx512(const std::uint8_t* in, Out* out, std::size_t n, const DecodeParams& p) {
  if (p.format == Format::e8m0fnu) return decode_variant<Out, DecodeVia::kE8m0>(in, out, n, p);
  if constexpr (kVbmi) {
    decode_variant<Out, DecodeVia::kVbmi>(in, out, n, p);
  } else {
    decode_variant<Out, DecodeVia::kShift>(in, out, n, p);
  }
}

// Segments of a multiple of 16 codes, each with its own dequantization scale; a large output (aligned to 64 bytes,
// so every segment is) is streamed as the bulk decoders stream it.
template <DecodeVia kVia, bool kStream>
void decode_segments_body(const std::uint8_t* in, float* out, std::size_t n, std::size_t segment,
                          const float* scale_invs, const DecodeParams& p) {
  DecodeConsts c(p, false);
  std::size_t k = 0;
  for (; (k + 1) * segment <= n; ++k) {
    const float s = scale_invs[k];
    c.scale_inv = _mm512_set1_ps(s);
    const std::uint8_t* src = in + k * segment;
    float* dst = out + k * segment;
    for (std::size_t i = 0; i < segment; i += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(src + i) + kPrefetchBytes / 2, _MM_HINT_T0);
      const std::size_t count = std::min<std::size_t>(64, segment - i);
      if (s == 1.0f) {
        decode_chunk<float, kVia, false, kStream>(src + i, dst + i, count, c);  // exact, as the scalar loop
      } else {
        decode_chunk<float, kVia, true, kStream>(src + i, dst + i, count, c);
      }
    }
  }
  if constexpr (kStream) _mm_sfence();
  if (k * segment < n)
    decode_segments_tail(in + k * segment, out + k * segment, n - k * segment, segment, scale_invs + k, p);
}

template <DecodeVia kVia>
void decode_segments_via(const std::uint8_t* in, float* out, std::size_t n, std::size_t segment,
                         const float* scale_invs, const DecodeParams& p) {
  if (p.streaming_stores && (reinterpret_cast<std::uintptr_t>(out) & 63u) == 0)
    return decode_segments_body<kVia, true>(in, out, n, segment, scale_invs, p);
  decode_segments_body<kVia, false>(in, out, n, segment, scale_invs, p);
}

template <bool kVbmi>
void decode_segments_avx512(const std::uint8_t* in, float* out, std::size_t n, std::size_t segment,
                            const float* scale_invs, const DecodeParams& p) {
  if (segment == 0 || segment % 16 != 0) return decode_segments_tail(in, out, n, segment, scale_invs, p);
  if (p.format == Format::e8m0fnu) return decode_segments_via<DecodeVia::kE8m0>(in, out, n, segment, scale_invs, p);
  if constexpr (kVbmi) {
    decode_segments_via<DecodeVia::kVbmi>(in, out, n, segment, scale_invs, p);
  } else {
    decode_segments_via<DecodeVia::kShift>(in, out, n, segment, scale_invs, p);
  }
}

template <bool kVbmi>
const KernelTable& table() {
  static const KernelTable t{
      kVbmi ? "avx512-vbmi" : "avx512", Isa::kAvx512,
      KernelContract::kBitIdentical,    &encode_avx512<float>,
      &encode_segments_avx512,          &encode_avx512<bfloat16>,
      &encode_avx512<float16>,          &decode_avx512<float, kVbmi>,
      &decode_segments_avx512<kVbmi>,   &decode_avx512<bfloat16, kVbmi>,
      &decode_avx512<float16, kVbmi>,
  };
  return t;
}

}  // namespace

const KernelTable& avx512_kernels_with_vbmi() {
  return table<true>();
}

const KernelTable& avx512_kernels_without_vbmi() {
  return table<false>();
}

}  // namespace fp8kit::convert_detail
