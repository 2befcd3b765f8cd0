// Internal, shared by the AVX-512 kernels of two layers (the conversions, and GEMM packing and GEMV in ops), so it
// lives beside the dispatch infrastructure every kernel family shares: FP8 codes decoded exactly to
// bfloat16 or float16 (and, from the bfloat16 tables, float32) in registers, 64 at a time, through two 128-entry byte
// tables (the high and low bytes of the result for each magnitude, taken from the scalar codec) looked up with vpermt2b
// (VBMI), the sign ORed in and the fnuz NaN 0x80 patched. Include it only from files compiled for the avx512 level or
// above, and call the VBMI parts only where cpu_features().avx512vbmi: everything here has internal linkage, so each
// kernel file keeps its own copy compiled with its own flags.
#pragma once

#include <immintrin.h>

#include <array>
#include <cstdint>
#include <type_traits>

#include "fp8kit/format/codec.hpp"
#include "fp8kit/format/format.hpp"

namespace fp8kit::fp8_simd {
namespace {

// The 16-bit result (bfloat16 or float16 bits) of every code, from the scalar codec, as byte tables for vpermi2b.
struct ByteTables {
  __m512i hi0, hi1, lo0, lo1;  // entries 0-63 and 64-127 of the high and low bytes, by magnitude
  __m512i nan_hi, nan_lo;      // the fnuz NaN 0x80's bytes
  bool nan_at_0x80;
};

template <typename Out>
const ByteTables& byte_tables(Format f) {
  static const auto tables = [] {
    std::array<ByteTables, kAllFormats.size()> all{};
    for (Format format : kAllFormats) {
      alignas(64) std::uint8_t hi[128], lo[128];
      auto bits = [format](std::uint8_t code) -> std::uint16_t {
        if constexpr (std::is_same_v<Out, float16>) {
          return decode_to_float16(format, code).bits;
        } else {
          return decode_to_bfloat16(format, code).bits;
        }
      };
      for (int c = 0; c < 128; ++c) {
        hi[c] = static_cast<std::uint8_t>(bits(static_cast<std::uint8_t>(c)) >> 8);
        lo[c] = static_cast<std::uint8_t>(bits(static_cast<std::uint8_t>(c)) & 0xFF);
      }
      ByteTables& t = all[static_cast<std::size_t>(format)];
      t.hi0 = _mm512_load_si512(hi);
      t.hi1 = _mm512_load_si512(hi + 64);
      t.lo0 = _mm512_load_si512(lo);
      t.lo1 = _mm512_load_si512(lo + 64);
      const std::uint16_t nan = bits(0x80);
      t.nan_hi = _mm512_set1_epi8(static_cast<char>(nan >> 8));
      t.nan_lo = _mm512_set1_epi8(static_cast<char>(nan & 0xFF));
      t.nan_at_0x80 = descriptor(format).nan == NanEncoding::kNegativeZero;
    }
    return all;
  }();
  return tables[static_cast<std::size_t>(f)];
}

// vpermt2b (VBMI), as inline assembly: the file is compiled for the AVX-512 level, which does not include VBMI,
// so the compiler can emit VBMI instructions nowhere else; only the VBMI table's kernels reach these.
// Both give result[i] = (idx[i] & 64 ? b : a)[idx[i] & 63].
[[gnu::always_inline]] inline __m512i permute2_bytes(__m512i a, __m512i idx, __m512i b) {
  __asm__("vpermt2b %[b], %[idx], %[a]" : [a] "+v"(a) : [idx] "v"(idx), [b] "v"(b));
  return a;
}
[[gnu::always_inline]] inline __m512i permute2_bytes_maskz(__mmask64 keep, __m512i a, __m512i idx, __m512i b) {
  __asm__("vpermt2b %[b], %[idx], %[a]%{%[k]%}%{z%}" : [a] "+v"(a) : [idx] "v"(idx), [b] "v"(b), [k] "Yk"(keep));
  return a;
}

// Byte shuffles that interleave (lo, hi) into 16-bit results (part 0: elements 0-31, part 1: 32-63), or place them
// in the top half of 32-bit lanes (quarters 0-3) with the low half zeroed by the mask kF32Bytes.
struct Interleave {
  Interleave() {
    alignas(64) std::uint8_t idx[6][64];
    for (int i = 0; i < 32; ++i) {
      for (int part = 0; part < 2; ++part) {
        idx[part][2 * i] = static_cast<std::uint8_t>(32 * part + i);
        idx[part][2 * i + 1] = static_cast<std::uint8_t>(64 + 32 * part + i);
      }
    }
    for (int q = 0; q < 4; ++q) {
      for (int i = 0; i < 16; ++i) {
        idx[2 + q][4 * i] = idx[2 + q][4 * i + 1] = 0;
        idx[2 + q][4 * i + 2] = static_cast<std::uint8_t>(16 * q + i);
        idx[2 + q][4 * i + 3] = static_cast<std::uint8_t>(64 + 16 * q + i);
      }
    }
    for (int k = 0; k < 2; ++k) half[k] = _mm512_load_si512(idx[k]);
    for (int q = 0; q < 4; ++q) quarter[q] = _mm512_load_si512(idx[2 + q]);
  }
  __m512i half[2], quarter[4];
};
const Interleave& interleave() {
  static const Interleave table;
  return table;
}
constexpr __mmask64 kF32Bytes = 0xCCCCCCCCCCCCCCCCull;

// The tables of one format, as values for a loop: made once before the loop, the vectors stay in zmm registers.
// (Reached through a reference to the shared tables and the function-local static interleave(), they are reloaded
// on every step, and the static's guard check makes the compiler spill the loop's accumulators around each decode:
// that halved the GEMV's speed.) kNanAt0x80: the format is fnuz (0x80 is NaN).
template <bool kNanAt0x80>
struct ByteLookup {
  explicit ByteLookup(const ByteTables& t)
      : hi0(t.hi0), hi1(t.hi1), lo0(t.lo0), lo1(t.lo1), nan_hi(t.nan_hi), nan_lo(t.nan_lo) {}

  // 64 codes -> their results' high and low bytes, sign and fnuz NaN included.
  [[gnu::always_inline]] void operator()(__m512i code, __m512i& hi, __m512i& lo) const {
    const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
    hi = permute2_bytes(hi0, code, hi1);
    lo = permute2_bytes(lo0, code, lo1);
    hi = _mm512_ternarylogic_epi32(hi, code, sign, 0xF8);  // hi | (code & 0x80)
    if constexpr (kNanAt0x80) {
      const __mmask64 nan = _mm512_cmpeq_epi8_mask(code, sign);
      hi = _mm512_mask_mov_epi8(hi, nan, nan_hi);
      lo = _mm512_mask_mov_epi8(lo, nan, nan_lo);
    }
  }

  __m512i hi0, hi1, lo0, lo1, nan_hi, nan_lo;
};

// 64 codes -> their results' high and low bytes (VBMI), sign and fnuz NaN included, from the shared tables.
[[gnu::always_inline]] inline void lookup64(__m512i code, const ByteTables& t, __m512i& hi, __m512i& lo) {
  if (t.nan_at_0x80) {
    ByteLookup<true>{t}(code, hi, lo);
  } else {
    ByteLookup<false>{t}(code, hi, lo);
  }
}

template <bool kNanAt0x80>
struct WordDecoder {
  explicit WordDecoder(const ByteTables& t) : lookup(t), half0(interleave().half[0]), half1(interleave().half[1]) {}

  // 64 codes -> 64 bfloat16 (or, with float16 tables, float16) bit patterns in two vectors (codes 0-31, 32-63).
  [[gnu::always_inline]] void words(__m512i code, __m512i& first, __m512i& second) const {
    __m512i hi, lo;
    lookup(code, hi, lo);
    first = permute2_bytes(lo, half0, hi);
    second = permute2_bytes(lo, half1, hi);
  }

  ByteLookup<kNanAt0x80> lookup;
  __m512i half0, half1;
};

// With bfloat16 tables only: 64 codes -> 64 float32 values, exact (a bfloat16 in the top half of a 32-bit lane is
// the same number as a float32), in four vectors: codes 0-15, 16-31, 32-47, 48-63. FP8 subnormals come out as
// normal floats, NaN and Inf codes as NaN and Inf.
template <bool kNanAt0x80>
struct FloatDecoder {
  explicit FloatDecoder(const ByteTables& t)
      : lookup(t),
        quarter{interleave().quarter[0], interleave().quarter[1], interleave().quarter[2], interleave().quarter[3]} {}

  [[gnu::always_inline]] void floats(__m512i code, __m512 (&f)[4]) const {
    __m512i hi, lo;
    lookup(code, hi, lo);
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) f[q] = _mm512_castsi512_ps(permute2_bytes_maskz(kF32Bytes, lo, quarter[q], hi));
  }

  ByteLookup<kNanAt0x80> lookup;
  __m512i quarter[4];
};

// run(decoder) with the WordDecoder (or FloatDecoder) of these tables (fnuz or not as a compile-time choice).
template <class Run>
[[gnu::always_inline]] inline decltype(auto) with_word_decoder(const ByteTables& t, Run&& run) {
  if (t.nan_at_0x80) return run(WordDecoder<true>(t));
  return run(WordDecoder<false>(t));
}
template <class Run>
[[gnu::always_inline]] inline decltype(auto) with_float_decoder(const ByteTables& t, Run&& run) {
  if (t.nan_at_0x80) return run(FloatDecoder<true>(t));
  return run(FloatDecoder<false>(t));
}

}  // namespace
}  // namespace fp8kit::fp8_simd
