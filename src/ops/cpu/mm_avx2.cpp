// AVX2 + FMA matrix-multiply kernels.
//
// GEMM micro-kernel: a 6 x 16 tile of C in 12 ymm accumulators; per k, two 8-float loads of the packed B panel,
// six broadcasts of the packed A panel, twelve fused multiply-adds. FP8 values (and their products) are exact in
// FP32, so this is the reference's sum, in the same order: bit-identical results.
//
// GEMV: weights are streamed once and decoded in registers. An FP8 code c (sign-extended to 32 bits) becomes the
// float with bits ((c << (23 - m)) & (sign | magnitude field)): the code's exponent and mantissa land in the
// float's fields unchanged, which is the FP8 value times 2^(bias - 127) for normals and, as a float subnormal,
// for FP8 subnormals too; one multiply by 2^(127 - bias) makes it exact. Codes with no float equivalent this way
// (Inf/NaN of e4m3fn and e5m2, the fnuz NaN 0x80) are detected per 32 bytes: the kernel then reports failure and
// the driver recomputes those rows exactly. Flush-subnormal-inputs mode (DAZ) would break the decode of FP8
// subnormals: the kernel checks the MXCSR of the thread it runs on and declines when DAZ is set. Whole 32-byte
// chunks are decoded without sign extension, as the AVX-512 GEMV does (split_lanes, decode_lane: each byte brought
// to the top of its 16-bit half and shifted arithmetically into place), vector b holding the codes 4i + b; the
// driver hands the kernel its activations in that order (GemvKernel::lane_chunk = 32).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "fp8kit/common/cpu.hpp"
#include "mm_kernels.hpp"

namespace fp8kit::mm_detail {
namespace {

// ---------------------------------------------------------------- GEMM micro-kernel

constexpr std::int64_t kMr = 6, kNr = 16;

template <bool kScale>
[[gnu::always_inline]] inline void tile_6x16(std::int64_t kc, const float* a, const float* b, float* c,
                                             std::int64_t ldc, const float* sa, const float* sb, bool zero = false) {
  __m256 acc[kMr][2];
#pragma GCC unroll 6
  for (int i = 0; i < kMr; ++i) {
    if (kScale || zero) {
      acc[i][0] = _mm256_setzero_ps();
      acc[i][1] = _mm256_setzero_ps();
    } else {
      acc[i][0] = _mm256_loadu_ps(c + i * ldc);
      acc[i][1] = _mm256_loadu_ps(c + i * ldc + 8);
    }
  }
#pragma GCC unroll 4
  for (std::int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
    for (int i = 0; i < kMr; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + i);
      acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
    }
    a += kMr;
    b += kNr;
  }
  if constexpr (kScale) {
    const __m256 sb0 = _mm256_loadu_ps(sb), sb1 = _mm256_loadu_ps(sb + 8);
#pragma GCC unroll 6
    for (int i = 0; i < kMr; ++i) {
      const __m256 s = _mm256_broadcast_ss(sa + i);
      acc[i][0] = _mm256_fmadd_ps(_mm256_mul_ps(acc[i][0], s), sb0, _mm256_loadu_ps(c + i * ldc));
      acc[i][1] = _mm256_fmadd_ps(_mm256_mul_ps(acc[i][1], s), sb1, _mm256_loadu_ps(c + i * ldc + 8));
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < kMr; ++i) {
    _mm256_storeu_ps(c + i * ldc, acc[i][0]);
    _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);
  }
}

void accumulate_avx2(const void* left, const void* right, std::int64_t, std::int64_t k_off, std::int64_t k_len,
                     float* c, std::int64_t ldc, bool overwrite) {
  tile_6x16<false>(k_len, static_cast<const float*>(left) + k_off * kMr, static_cast<const float*>(right) + k_off * kNr,
                   c, ldc, nullptr, nullptr, overwrite);
}

void scale_accumulate_avx2(const void* left, const void* right, std::int64_t, std::int64_t k_off, std::int64_t k_len,
                           float* c, std::int64_t ldc, const float* sa, const float* sb) {
  tile_6x16<true>(k_len, static_cast<const float*>(left) + k_off * kMr, static_cast<const float*>(right) + k_off * kNr,
                  c, ldc, sa, sb);
}

void pack_f32(const Operand& x, std::int64_t width, std::int64_t r0, std::int64_t rows, std::int64_t k0,
              std::int64_t kc, void* dst) {
  pack_f32_strips(x, width, r0, rows, k0, kc, dst);
}

}  // namespace

// The epilogue (FinishRowFn) in 8 lanes; per-tensor and per-channel scales (every unblocked product's) vectorized.
float finish_row_avx2(float* row, std::int64_t n, const float* sa, ScaleIndex sb, const float* bias, bool bf16_out) {
  const bool vector_scales = sb.r_div == 1 && (sb.r_stride == 0 || sb.r_stride == 1);
  if (sa != nullptr && !vector_scales) return finish_row_scalar(row, n, sa, sb, bias, bf16_out);
  const __m256 zero = _mm256_setzero_ps(), inf = _mm256_set1_ps(INFINITY);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 amax = zero;
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 v = _mm256_loadu_ps(row + j);
    if (sa != nullptr) {
      const __m256 b = sb.r_stride == 0 ? _mm256_set1_ps(sb.data[0]) : _mm256_loadu_ps(sb.data + j);
      v = _mm256_fmadd_ps(_mm256_mul_ps(v, _mm256_set1_ps(*sa)), b, zero);
    }
    if (bias != nullptr) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + j));
    if (bf16_out) {
      const __m256i u = _mm256_castps_si256(v);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
      const __m256i rounded = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)),
                                               _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
      const __m256i quiet = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x400000)),
                                             _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
      const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
      v = _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), nan);
    }
    _mm256_storeu_ps(row + j, v);
    const __m256 a = _mm256_and_ps(v, abs_mask);
    amax = _mm256_max_ps(amax, _mm256_and_ps(a, _mm256_cmp_ps(a, inf, _CMP_LT_OQ)));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, amax);
  float m = *std::max_element(lanes, lanes + 8);
  if (j < n) {
    // (No scales: sb.data is null, and stays so: no offset is applied to a null pointer.)
    const float* rest_data = sb.data == nullptr || sb.r_stride == 0 ? sb.data : sb.data + j;
    const ScaleIndex rest{rest_data, sb.r_div, sb.r_stride, sb.kb_stride};
    m = std::max(m, finish_row_scalar(row + j, n - j, sa, rest, bias != nullptr ? bias + j : nullptr, bf16_out));
  }
  return m;
}

namespace {

// ---------------------------------------------------------------- GEMV

// How the codes of one format become floats (see the top of the file).
struct Decode {
  __m256i fields;  // sign | magnitude bits after the shift
  __m256 rebias;   // 2^(127 - bias)
  __m256i special_mask, special_value;
};

Decode make_decode(Format f) {
  const RegisterDecodeRule rule = register_decode_rule(f);
  return {_mm256_set1_epi32(static_cast<int>(rule.fields)),
          _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(rule.rebias_bits))),
          _mm256_set1_epi8(static_cast<char>(rule.special_mask)),
          _mm256_set1_epi8(static_cast<char>(rule.special_value))};
}

// kShift = 23 - mantissa bits (an immediate: the shift-by-register form is slower on Zen).
// kRebiased: the activations already carry the factor 2^(127 - bias), so the bit pattern is used as it is.
template <int kShift, bool kRebiased>
[[gnu::always_inline]] inline __m256 decode8(__m128i codes8, const Decode& d) {
  const __m256i v = _mm256_cvtepi8_epi32(codes8);
  const __m256 bits = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, kShift), d.fields));
  if constexpr (kRebiased) return bits;
  return _mm256_mul_ps(bits, d.rebias);
}

// A 32-byte load of codes split for decode_lane: in each 16-bit half of each 32-bit lane, the half's high byte
// (`odd`) and its low byte (`even`) at the top of the half, shifted arithmetically down by 24 - kShift.
struct LaneCodes {
  __m256i odd, even;
};
template <int kShift>
[[gnu::always_inline]] inline LaneCodes split_lanes(__m256i codes32) {
  return {_mm256_srai_epi16(codes32, 24 - kShift), _mm256_srai_epi16(_mm256_slli_epi16(codes32, 8), 24 - kShift)};
}

// The 8 codes 4i + kByte (i = 0..7) of the load decoded as decode8 does (bytes 3 and 2 are in the upper half of
// their lane already, bytes 1 and 0 move up by 16): in-lane shifts and masks where decode8's sign extension crosses
// lanes. A loop microbenchmark on Zen 4 with the weights in L1: 8.4 GB/s with decode8, 17.5 with this.
template <bool kRebiased, int kByte>
[[gnu::always_inline]] inline __m256 decode_lane(const LaneCodes& c, const Decode& d) {
  const __m256i half = kByte % 2 == 1 ? c.odd : c.even;
  const __m256i top = kByte >= 2 ? half : _mm256_slli_epi32(half, 16);
  const __m256 bits = _mm256_castsi256_ps(_mm256_and_si256(top, d.fields));
  if constexpr (kRebiased) return bits;
  return _mm256_mul_ps(bits, d.rebias);
}

[[gnu::always_inline]] inline __m256i special32(__m256i codes, const Decode& d) {
  const __m256i masked = _mm256_and_si256(codes, d.special_mask);
  return _mm256_cmpeq_epi8(masked, d.special_value);
}

[[gnu::always_inline]] inline __m128i load8_bytes(const std::uint8_t* p) {
  return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
}

[[gnu::always_inline]] inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
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
  __m256i special = _mm256_setzero_si256();
  for (std::int64_t k0 = 0, kb = 0; k0 < k; k0 += kblock, ++kb) {
    const std::int64_t k1 = std::min(k, k0 + kblock);
    __m256 acc[kM][kR];
#pragma GCC unroll 4
    for (int i = 0; i < kM; ++i)
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) acc[i][r] = _mm256_setzero_ps();
    auto step8 = [&](std::int64_t kk, const __m256* xs, const __m128i* codes) {
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) {
        const __m256 wv = decode8<kShift, kRebiased>(codes[r], d);
#pragma GCC unroll 4
        for (int i = 0; i < kM; ++i) acc[i][r] = _mm256_fmadd_ps(xs[i], wv, acc[i][r]);
      }
      (void)kk;
    };
    // 32 weights per row per step, one load, decoded a byte of each 32-bit lane at a time (x is in lane order: its
    // 8 values for byte b at kk + 8b); the rest of the block 8 at a time in x's own order.
    std::int64_t kk = k0;
    for (; kk + 32 <= k1; kk += 32) {
      LaneCodes codes[kR];
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) {
        prefetch(kk, r, 32);
        const __m256i loaded = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[r] + kk));
        special = _mm256_or_si256(special, special32(loaded, d));
        codes[r] = split_lanes<kShift>(loaded);
      }
      const auto step = [&](auto byte) {
        __m256 xs[kM];
#pragma GCC unroll 4
        for (int i = 0; i < kM; ++i) xs[i] = _mm256_loadu_ps(x + i * ldx + kk + 8 * byte());
#pragma GCC unroll 4
        for (int r = 0; r < kR; ++r) {
          const __m256 wv = decode_lane<kRebiased, byte()>(codes[r], d);
#pragma GCC unroll 4
          for (int i = 0; i < kM; ++i) acc[i][r] = _mm256_fmadd_ps(xs[i], wv, acc[i][r]);
        }
      };
      step(std::integral_constant<int, 0>{});
      step(std::integral_constant<int, 1>{});
      step(std::integral_constant<int, 2>{});
      step(std::integral_constant<int, 3>{});
    }
    // The rest of the block, 8 at a time; the last partial group zero-padded (code 0 is +0 in every format).
    for (; kk < k1; kk += 8) {
      const std::int64_t len = std::min<std::int64_t>(8, k1 - kk);
      __m256 xs[kM];
      __m128i codes[kR];
      if (len == 8) {
#pragma GCC unroll 4
        for (int i = 0; i < kM; ++i) xs[i] = _mm256_loadu_ps(x + i * ldx + kk);
#pragma GCC unroll 4
        for (int r = 0; r < kR; ++r) codes[r] = load8_bytes(rows[r] + kk);
      } else {
        alignas(32) static constexpr int kLanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
        const __m256i mask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLanes + 8 - len));
#pragma GCC unroll 4
        for (int i = 0; i < kM; ++i) xs[i] = _mm256_maskload_ps(x + i * ldx + kk, mask);
#pragma GCC unroll 4
        for (int r = 0; r < kR; ++r) {
          std::uint64_t bytes = 0;
          std::memcpy(&bytes, rows[r] + kk, static_cast<std::size_t>(len));
          codes[r] = _mm_cvtsi64_si128(static_cast<long long>(bytes));
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) special = _mm256_or_si256(special, special32(_mm256_zextsi128_si256(codes[r]), d));
      step8(kk, xs, codes);
    }
    // This block's sum (its lanes added), scaled as the reference does: total = fma(sum * sa, sb, total).
#pragma GCC unroll 4
    for (int i = 0; i < kM; ++i) {
      const float s = sa.at(i, kb);
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) {
        float sum = hsum(acc[i][r]);
        if constexpr (kRebiased) sum *= sum_scale;  // exact: a power of two
        total[i][r] = std::fma(sum * s, sb.at(j + r, kb), total[i][r]);
      }
    }
  }
  if (!_mm256_testz_si256(special, special)) return false;
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
  constexpr int kR = kM <= 2 ? 4 : 2;  // 8 accumulators either way
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

bool gemv_avx2(Format f, std::int64_t m, std::int64_t j0, std::int64_t j1, std::int64_t k, std::int64_t kblock,
               const GemvInput& in, const std::uint8_t* w, ScaleIndex sa, ScaleIndex sb, float* out, std::int64_t ldo) {
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

// Small M (up to weights_left_max_m, B as N x K): the weights-left orientation (gemm_weights_left) decodes each
// weight once into an L1-sized panel instead of packing all of B per call. AMD EPYC Zen 3, N = K = 4096, e4m3fn,
// 1 / 2 threads: M = 64 36 / 78 -> 58-67 / 101-128 GFLOP/s (sgemm 58-65 / 107-131), M = 32 52 / 73 (sgemm 47 / 86).
// Goto blocking: the A strip (6 x 256 floats) and the B strip (256 x 16) stay in L1, A's panel (96 x 256: 96 KiB)
// in L2, B's panel (256 x 4096: 4 MiB) in L3.
}  // namespace

constinit const GemmKernel kAvx2Gemm{.name = "avx2-fma 6x16",
                                     .contract = KernelContract::kBitIdentical,
                                     .bf16_operands = false,
                                     .mr = kMr,
                                     .nr = kNr,
                                     .kc = 256,
                                     .mc = 96,
                                     .nc = 4096,
                                     .k_align = 1,
                                     .elem_bytes = sizeof(float),
                                     .weights_left_max_m = 64,
                                     .pack_left = &pack_f32,
                                     .pack_right = &pack_f32,
                                     .accumulate = &accumulate_avx2,
                                     .scale_accumulate = &scale_accumulate_avx2,
                                     .prefetch_next_tile = true};
constinit const GemvKernel kAvx2Gemv{.name = "avx2-gemv",
                                     .contract = KernelContract::kFp32Bound,
                                     .run = &gemv_avx2,
                                     .lane_chunk = 32,
                                     .rebiased_input = true};

}  // namespace fp8kit::mm_detail
