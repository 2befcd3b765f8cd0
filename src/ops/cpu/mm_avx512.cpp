// AVX-512 (F/BW/VL/DQ) matrix-multiply kernels: the FP32 FMA GEMM every level from avx512 up runs for float32
// operands (and for FP8 ones at this level), and the register-decode GEMV.
//
// GEMM micro-kernel: a 12 x 32 tile of C in 24 zmm accumulators; per k, two 16-float loads of the packed right strip,
// twelve broadcasts of the packed left strip, 24 fused multiply-adds. Products of FP8 (and bfloat16) values are exact
// in FP32 and a float32 activation times a weight is one fused rounding, in increasing k: the reference's sums in
// its order, so the results are bit-identical.
//
// GEMV: the AVX2 design in 16 lanes. An FP8 code c (sign-extended to 32 bits) becomes the float with bits
// ((c << (23 - m)) & (sign | magnitude field)), the FP8 value times 2^(bias - 127) (as a float subnormal for FP8
// subnormals); the driver folds 2^(127 - bias) into the activations where that is exact, else one multiply per
// weight restores it. Inf/NaN codes (found per 64 bytes) and DAZ on the calling thread make the kernel decline, and
// the driver recomputes those rows exactly. Whole 64-byte chunks are decoded without sign extension: each byte is
// brought to the top of its 16-bit half and shifted arithmetically into place (split_lanes, decode_lane), so the
// 16 floats of one vector are the codes 4i + b of the chunk, and the driver hands this kernel its activations in
// that order (GemvKernel::lane_chunk). Where the CPU has VBMI the tables name the table decode instead
// (gemv_avx512_vbmi: exact float32 weights, activations in k order, nothing declined).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "common/cpu/fp8_decode_avx512.hpp"
#include "fp8kit/common/cpu.hpp"
#include "gemv_avx512.hpp"
#include "mm_kernels.hpp"
#include "tile_avx512.hpp"

namespace fp8kit::mm_detail {
namespace {

// ---------------------------------------------------------------- GEMM micro-kernel

constexpr std::int64_t kMr = kTileRows, kNr = 32;

template <bool kScale>
[[gnu::always_inline]] inline void tile_12x32(std::int64_t kc, const float* a, const float* b, float* c,
                                              std::int64_t ldc, const float* sa, const float* sb, bool zero = false) {
  TileAcc acc;
  tile_start<kScale>(acc, c, ldc, zero);
  for (std::int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 12
    for (int i = 0; i < kMr; ++i) {
      const __m512 ai = _mm512_set1_ps(a[i]);
      acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
    }
    a += kMr;
    b += kNr;
  }
  tile_finish<kScale>(acc, c, ldc, sa, sb);
}

void accumulate_avx512(const void* left, const void* right, std::int64_t, std::int64_t k_off, std::int64_t k_len,
                       float* c, std::int64_t ldc, bool overwrite) {
  tile_12x32<false>(k_len, static_cast<const float*>(left) + k_off * kMr,
                    static_cast<const float*>(right) + k_off * kNr, c, ldc, nullptr, nullptr, overwrite);
}

void scale_accumulate_avx512(const void* left, const void* right, std::int64_t, std::int64_t k_off, std::int64_t k_len,
                             float* c, std::int64_t ldc, const float* sa, const float* sb) {
  tile_12x32<true>(k_len, static_cast<const float*>(left) + k_off * kMr, static_cast<const float*>(right) + k_off * kNr,
                   c, ldc, sa, sb);
}

void pack_f32(const Operand& x, std::int64_t width, std::int64_t r0, std::int64_t rows, std::int64_t k0,
              std::int64_t kc, void* dst) {
  pack_f32_strips(x, width, r0, rows, k0, kc, dst);
}

}  // namespace

// The epilogue (FinishRowFn) in 16 lanes, the tail under masks; per-tensor and per-channel scales (every unblocked
// product's) vectorized.
float finish_row_avx512(float* row, std::int64_t n, const float* sa, ScaleIndex sb, const float* bias, bool bf16_out) {
  const bool vector_scales = sb.r_div == 1 && (sb.r_stride == 0 || sb.r_stride == 1);
  if (sa != nullptr && !vector_scales) return finish_row_scalar(row, n, sa, sb, bias, bf16_out);
  const __m512 zero = _mm512_setzero_ps();
  const __m512i hi16 = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m512 amax = zero;
  for (std::int64_t j = 0; j < n; j += 16) {
    const auto lanes = static_cast<__mmask16>(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1u);
    __m512 v = _mm512_maskz_loadu_ps(lanes, row + j);
    if (sa != nullptr) {
      const __m512 b = sb.r_stride == 0 ? _mm512_set1_ps(sb.data[0]) : _mm512_maskz_loadu_ps(lanes, sb.data + j);
      v = _mm512_fmadd_ps(_mm512_mul_ps(v, _mm512_set1_ps(*sa)), b, zero);
    }
    if (bias != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(lanes, bias + j));
    if (bf16_out) {
      const __m512i u = _mm512_castps_si512(v);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
      const __m512i rounded =
          _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)), hi16);
      const __m512i quiet = _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x400000)), hi16);
      v = _mm512_castsi512_ps(_mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), quiet));
    }
    _mm512_mask_storeu_ps(row + j, lanes, v);
    const __m512 a = _mm512_abs_ps(v);
    amax = _mm512_mask_max_ps(amax, _mm512_cmp_ps_mask(a, _mm512_set1_ps(INFINITY), _CMP_LT_OQ) & lanes, amax, a);
  }
  return _mm512_reduce_max_ps(amax);
}

namespace {

// ---------------------------------------------------------------- GEMV

struct Decode {
  __m512i fields;  // sign | magnitude bits after the shift
  __m512 rebias;   // 2^(127 - bias)
  __m512i special_mask, special_value;
};

Decode make_decode(Format f) {
  const RegisterDecodeRule rule = register_decode_rule(f);
  return {_mm512_set1_epi32(static_cast<int>(rule.fields)),
          _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(rule.rebias_bits))),
          _mm512_set1_epi8(static_cast<char>(rule.special_mask)),
          _mm512_set1_epi8(static_cast<char>(rule.special_value))};
}

template <int kShift, bool kRebiased>
[[gnu::always_inline]] inline __m512 decode16(__m128i codes16, const Decode& d) {
  const __m512i v = _mm512_cvtepi8_epi32(codes16);
  const __m512 bits = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(v, kShift), d.fields));
  if constexpr (kRebiased) return bits;
  return _mm512_mul_ps(bits, d.rebias);
}

// A 64-byte load of codes split for decode_lane: in each 16-bit half of each 32-bit lane, the half's high byte
// (`odd`) and its low byte (`even`) at the top of the half, shifted arithmetically down by 24 - kShift (so the
// code's sign fills the bits above its magnitude). Three single-cycle integer operations for 64 codes.
struct LaneCodes {
  __m512i odd, even;
};
template <int kShift>
[[gnu::always_inline]] inline LaneCodes split_lanes(__m512i codes64) {
  return {_mm512_srai_epi16(codes64, 24 - kShift), _mm512_srai_epi16(_mm512_slli_epi16(codes64, 8), 24 - kShift)};
}

// The 16 codes 4i + kByte (i = 0..15) of the load decoded as decode16 does: bytes 3 and 2 are already in the upper
// half of their lane (one AND with the fields), bytes 1 and 0 move up by 16 first (two operations). decode16's sign
// extension is a lane-crossing operation; with it the one-thread float32 GEMV was bound by the decode on Zen 4 (a
// microbenchmark of the loop over weights in L1: 14 GB/s with it, 23-24 shifting each byte to the top of its
// 32-bit lane, 29 with these 16-bit shifts).
template <bool kRebiased, int kByte>
[[gnu::always_inline]] inline __m512 decode_lane(const LaneCodes& c, const Decode& d) {
  const __m512i half = kByte % 2 == 1 ? c.odd : c.even;
  const __m512i top = kByte >= 2 ? half : _mm512_slli_epi32(half, 16);
  const __m512 bits = _mm512_castsi512_ps(_mm512_and_si512(top, d.fields));
  if constexpr (kRebiased) return bits;
  return _mm512_mul_ps(bits, d.rebias);
}

[[gnu::always_inline]] inline __mmask64 special64(__m512i codes, const Decode& d) {
  const __m512i masked = _mm512_and_si512(codes, d.special_mask);
  return _mm512_cmpeq_epi8_mask(masked, d.special_value);
}

// kM activation rows times kR weight rows starting at row j, all of K. Returns false on a special code.
template <int kShift, bool kRebiased, int kM, int kR>
bool gemv_rows(const Decode& d, std::int64_t j, std::int64_t k, std::int64_t kblock, const float* x, std::int64_t ldx,
               float sum_scale, const std::uint8_t* w, const ScaleIndex& sa, const ScaleIndex& sb, float* out,
               std::int64_t ldo) {
  const std::uint8_t* rows[kR];
#pragma GCC unroll 4
  for (int r = 0; r < kR; ++r) rows[r] = w + (j + r) * k;
  const GemvPrefetch<kR> prefetch(w, j, k);
  float total[kM][kR] = {};
  __mmask64 special = 0;
  for (std::int64_t k0 = 0, kb = 0; k0 < k; k0 += kblock, ++kb) {
    const std::int64_t k1 = std::min(k, k0 + kblock);
    __m512 acc[kM][kR];
#pragma GCC unroll 4
    for (int i = 0; i < kM; ++i)
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) acc[i][r] = _mm512_setzero_ps();
    // 64 weights per row per step, one load, decoded a byte of each 32-bit lane at a time (x is in lane order:
    // its 16 values for byte b at kk + 16b); the rest of the block 16 at a time under masks, in x's own order
    // (code 0 is +0 in every format).
    std::int64_t kk = k0;
    for (; kk + 64 <= k1; kk += 64) {
      LaneCodes codes[kR];
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) {
        prefetch(kk, r, 64);
        const __m512i loaded = _mm512_loadu_si512(rows[r] + kk);
        special |= special64(loaded, d);
        codes[r] = split_lanes<kShift>(loaded);
      }
      const auto step = [&](auto byte) {
        __m512 xs[kM];
#pragma GCC unroll 4
        for (int i = 0; i < kM; ++i) xs[i] = _mm512_loadu_ps(x + i * ldx + kk + 16 * byte());
#pragma GCC unroll 4
        for (int r = 0; r < kR; ++r) {
          const __m512 wv = decode_lane<kRebiased, byte()>(codes[r], d);
#pragma GCC unroll 4
          for (int i = 0; i < kM; ++i) acc[i][r] = _mm512_fmadd_ps(xs[i], wv, acc[i][r]);
        }
      };
      step(std::integral_constant<int, 0>{});
      step(std::integral_constant<int, 1>{});
      step(std::integral_constant<int, 2>{});
      step(std::integral_constant<int, 3>{});
    }
    for (; kk < k1; kk += 16) {
      const std::int64_t len = std::min<std::int64_t>(16, k1 - kk);
      const auto lanes = static_cast<__mmask16>(len == 16 ? 0xFFFF : (1u << len) - 1u);
      __m512 xs[kM];
#pragma GCC unroll 4
      for (int i = 0; i < kM; ++i) xs[i] = _mm512_maskz_loadu_ps(lanes, x + i * ldx + kk);
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) {
        const __m128i codes = _mm_maskz_loadu_epi8(lanes, rows[r] + kk);
        special |= special64(_mm512_zextsi128_si512(codes), d) & lanes;
        const __m512 wv = decode16<kShift, kRebiased>(codes, d);
#pragma GCC unroll 4
        for (int i = 0; i < kM; ++i) acc[i][r] = _mm512_fmadd_ps(xs[i], wv, acc[i][r]);
      }
    }
    // This block's sum (its lanes added), scaled as the reference does: total = fma(sum * sa, sb, total).
#pragma GCC unroll 4
    for (int i = 0; i < kM; ++i) {
      const float s = sa.at(i, kb);
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) {
        float sum = _mm512_reduce_add_ps(acc[i][r]);
        if constexpr (kRebiased) sum *= sum_scale;  // exact: a power of two
        total[i][r] = std::fma(sum * s, sb.at(j + r, kb), total[i][r]);
      }
    }
  }
  if (special != 0) return false;
#pragma GCC unroll 4
  for (int i = 0; i < kM; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < kR; ++r) out[i * ldo + j + r] = total[i][r];
  return true;
}

template <int kShift, bool kRebiased, int kM>
bool gemv_m(const Decode& d, std::int64_t j0, std::int64_t j1, std::int64_t k, std::int64_t kblock, const float* x,
            std::int64_t ldx, float sum_scale, const std::uint8_t* w, const ScaleIndex& sa, const ScaleIndex& sb,
            float* out, std::int64_t ldo) {
  constexpr int kR = kM <= 2 ? 4 : 2;
  std::int64_t j = j0;
  for (; j + kR <= j1; j += kR) {
    if (!gemv_rows<kShift, kRebiased, kM, kR>(d, j, k, kblock, x, ldx, sum_scale, w, sa, sb, out, ldo)) return false;
  }
  for (; j < j1; ++j) {
    if (!gemv_rows<kShift, kRebiased, kM, 1>(d, j, k, kblock, x, ldx, sum_scale, w, sa, sb, out, ldo)) return false;
  }
  return true;
}

template <int kShift, bool kRebiased>
bool gemv_shift(const Decode& d, std::int64_t m, std::int64_t j0, std::int64_t j1, std::int64_t k, std::int64_t kblock,
                const float* x, std::int64_t ldx, float sum_scale, const std::uint8_t* w, const ScaleIndex& sa,
                const ScaleIndex& sb, float* out, std::int64_t ldo) {
  return with_gemv_rows(m, [&](auto rows) {
    return gemv_m<kShift, kRebiased, rows()>(d, j0, j1, k, kblock, x, ldx, sum_scale, w, sa, sb, out, ldo);
  });
}

bool gemv_avx512(Format f, std::int64_t m, std::int64_t j0, std::int64_t j1, std::int64_t k, std::int64_t kblock,
                 const GemvInput& in, const std::uint8_t* w, ScaleIndex sa, ScaleIndex sb, float* out,
                 std::int64_t ldo) {
  if (denormals_are_zero()) return false;
  const Decode d = make_decode(f);
  const bool e4 = descriptor(f).mantissa_bits == 3;
  if (in.rebiased != nullptr) {
    return e4 ? gemv_shift<20, true>(d, m, j0, j1, k, kblock, in.rebiased, in.ldx, in.sum_scale, w, sa, sb, out, ldo)
              : gemv_shift<21, true>(d, m, j0, j1, k, kblock, in.rebiased, in.ldx, in.sum_scale, w, sa, sb, out, ldo);
  }
  return e4 ? gemv_shift<20, false>(d, m, j0, j1, k, kblock, in.x, in.ldx, 1.0f, w, sa, sb, out, ldo)
            : gemv_shift<21, false>(d, m, j0, j1, k, kblock, in.x, in.ldx, 1.0f, w, sa, sb, out, ldo);
}

// The float32 GEMV where the CPU has VBMI: each 64-byte load of codes looked up in the bfloat16 byte tables and
// placed in the top half of 32-bit lanes (FloatDecoder: two vpermt2b, a ternary logic op and four masked vpermt2b),
// which is each weight's exact value as a float32, NaN, Inf and subnormal codes included. So, unlike gemv_avx512, it
// needs no check for special codes, no rebiased activations and no lane order: x in k order, as it is; and seven
// vector operations decode 64 weights where the shift decode takes nine, with three more for the special codes and
// a mask register moved to a general one. kM activation rows times kR weight rows starting at row j (gemv_k_blocks).
template <int kM, int kR, class Decoder>
void gemv_rows_vbmi(const Decoder& d, std::int64_t j, std::int64_t k, std::int64_t kblock, const float* x,
                    std::int64_t ldx, const std::uint8_t* w, const ScaleIndex& sa, const ScaleIndex& sb, float* out,
                    std::int64_t ldo) {
  const std::uint8_t* rows[kR];
#pragma GCC unroll 4
  for (int r = 0; r < kR; ++r) rows[r] = w + (j + r) * k;
  const GemvPrefetch<kR, kPrefetchToL1> prefetch(w, j, k);
  gemv_k_blocks<kM, kR>(j, k, kblock, sa, sb, out, ldo, [&]<bool kFull>(auto& acc, std::int64_t kk, std::int64_t len) {
    __m512 xs[kM][4];
#pragma GCC unroll 4
    for (int i = 0; i < kM; ++i)
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) {
        const float* xq = x + i * ldx + kk + 16 * q;
        xs[i][q] = kFull ? _mm512_loadu_ps(xq)
                         : _mm512_maskz_loadu_ps(
                               static_cast<__mmask16>(first_n64(std::clamp<std::int64_t>(len - 16 * q, 0, 16))), xq);
      }
#pragma GCC unroll 4
    for (int r = 0; r < kR; ++r) {
      if constexpr (kFull) prefetch(kk, r, 64);
      __m512 wv[4];
      d.floats(kFull ? _mm512_loadu_si512(rows[r] + kk) : _mm512_maskz_loadu_epi8(first_n64(len), rows[r] + kk), wv);
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q)
#pragma GCC unroll 4
        for (int i = 0; i < kM; ++i) acc[i][r] = _mm512_fmadd_ps(xs[i][q], wv[q], acc[i][r]);
    }
  });
}

bool gemv_avx512_vbmi(Format f, std::int64_t m, std::int64_t j0, std::int64_t j1, std::int64_t k, std::int64_t kblock,
                      const GemvInput& in, const std::uint8_t* w, ScaleIndex sa, ScaleIndex sb, float* out,
                      std::int64_t ldo) {
  // The weights are normal floats (FP8 subnormals included), so a caller's denormals-are-zero changes nothing the
  // scalar kernel would not flush as well: no decline for it. The CPU check is the table's (it names this kernel only
  // where the CPU has VBMI), repeated here for direct callers.
  if (!cpu_features().avx512vbmi) return false;
  return fp8_simd::with_float_decoder(fp8_simd::byte_tables<bfloat16>(f), [&](const auto& d) {
    return with_gemv_rows(m, [&](auto rows) {
      constexpr int kR = rows() <= 2 ? 4 : 2;
      std::int64_t j = j0;
      for (; j + kR <= j1; j += kR) gemv_rows_vbmi<rows(), kR>(d, j, k, kblock, in.x, in.ldx, w, sa, sb, out, ldo);
      for (; j < j1; ++j) gemv_rows_vbmi<rows(), 1>(d, j, k, kblock, in.x, in.ldx, w, sa, sb, out, ldo);
      return true;
    });
  });
}

// Goto blocking: the left strip (12 x 256 floats: 12 KiB) and the right strip (256 x 32: 32 KiB) in L1, the left
// panel (96 x 256: 96 KiB) in L2, the right panel (256 x 4096: 4 MiB) in L3.
}  // namespace

constinit const GemmKernel kAvx512Gemm{.name = "avx512-fma 12x32",
                                       .contract = KernelContract::kBitIdentical,
                                       .bf16_operands = false,
                                       .mr = kMr,
                                       .nr = kNr,
                                       .kc = 256,
                                       .mc = 96,
                                       .nc = 4096,
                                       .k_align = 1,
                                       .elem_bytes = sizeof(float),
                                       .weights_left_max_m = 0,
                                       .pack_left = &pack_f32,
                                       .pack_right = &pack_f32,
                                       .accumulate = &accumulate_avx512,
                                       .scale_accumulate = &scale_accumulate_avx512,
                                       .prefetch_next_tile = true};
constinit const GemvKernel kAvx512Gemv{.name = "avx512-gemv",
                                       .contract = KernelContract::kFp32Bound,
                                       .run = &gemv_avx512,
                                       .lane_chunk = 64,
                                       .rebiased_input = true};
constinit const GemvKernel kAvx512VbmiGemv{
    .name = "avx512-vbmi-gemv", .contract = KernelContract::kFp32Bound, .run = &gemv_avx512_vbmi};

}  // namespace fp8kit::mm_detail
