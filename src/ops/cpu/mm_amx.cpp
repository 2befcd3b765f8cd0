// AMX-BF16 GEMM kernel for operands exact in bfloat16 (every FP8 format, bfloat16 activations): a 32 x 32 tile of
// C in four 16 x 16 FP32 tiles, two left tiles (16 rows x 32 K) and two right tiles (16 K pairs x 16 columns, the
// VNNI layout of pack_bf16_vnni) per step of 32 K, four tdpbf16ps. The packing is the AVX512-BF16 kernels' (FP8
// decoded exactly to bfloat16 once per panel, not per tile).
//
// Contract kFp32Bound: tdpbf16ps sums 32 products per step into each FP32 accumulator in its own order (products of
// bfloat16 values are exact), rounds to nearest even, reads bfloat16 subnormals as zero and flushes subnormal
// results regardless of MXCSR; with FP8 operands on both sides nothing is subnormal (see mm_avx512bf16.cpp).
// GEMV (M <= 4) stays on the AVX512-BF16 register kernels: for so few rows a tile would be mostly empty.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/cpu/fp8_decode_avx512.hpp"
#include "fp8kit/common/cpu.hpp"
#include "mm_kernels.hpp"
#include "transpose_avx512.hpp"

namespace fp8kit::mm_detail {
namespace {

constexpr std::int64_t kTile = 16;  // rows and FP32 columns of a C tile
constexpr std::int64_t kMr = 32, kNr = 32, kStepK = 32;

// The tile shapes: 0-3 C (16 rows x 64 bytes of FP32), 4-5 left (16 rows x 32 bfloat16), 6-7 right (16 K pairs x
// 16 columns x 2 bfloat16).
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
  TileConfig() {
    for (int t = 0; t < 8; ++t) {
      colsb[t] = 64;
      rows[t] = 16;
    }
  }
};

// Once per thread and product (ldtilecfg is slow: done per tile it took a third of the kernel's time).
void configure_tiles() {
  static const TileConfig config;
  _tile_loadconfig(&config);
}

void release_tiles() {
  _tile_release();
}

// C tiles (0 + 2 * row half + column half) += left x right over [k_off, k_off + k_len), K rounded up to a step (the
// packing's padding is zero).
[[gnu::always_inline]] inline void dot_steps(const std::uint16_t* left, const std::uint16_t* right, std::int64_t kc_pad,
                                             std::int64_t k_off, std::int64_t k_len) {
  const std::int64_t left_stride = kc_pad * static_cast<std::int64_t>(sizeof(std::uint16_t));
  const std::uint16_t* right1 = right + kTile * kc_pad;
  const std::int64_t k_end = k_off + (k_len + kStepK - 1) / kStepK * kStepK;
  for (std::int64_t kk = k_off; kk < k_end; kk += kStepK) {
    _tile_loadd(4, left + kk, left_stride);
    _tile_loadd(5, left + kTile * kc_pad + kk, left_stride);
    _tile_loadd(6, right + kk * kTile, 64);
    _tile_loadd(7, right1 + kk * kTile, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

void accumulate_amx(const void* left, const void* right, std::int64_t kc_pad, std::int64_t k_off, std::int64_t k_len,
                    float* c, std::int64_t ldc, bool overwrite) {
  const std::int64_t stride = ldc * static_cast<std::int64_t>(sizeof(float));
  if (overwrite) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, c, stride);
    _tile_loadd(1, c + kTile, stride);
    _tile_loadd(2, c + kTile * ldc, stride);
    _tile_loadd(3, c + kTile * ldc + kTile, stride);
  }
  dot_steps(static_cast<const std::uint16_t*>(left), static_cast<const std::uint16_t*>(right), kc_pad, k_off, k_len);
  _tile_stored(0, c, stride);
  _tile_stored(1, c + kTile, stride);
  _tile_stored(2, c + kTile * ldc, stride);
  _tile_stored(3, c + kTile * ldc + kTile, stride);
}

void scale_accumulate_amx(const void* left, const void* right, std::int64_t kc_pad, std::int64_t k_off,
                          std::int64_t k_len, float* c, std::int64_t ldc, const float* s_row, const float* s_col) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  dot_steps(static_cast<const std::uint16_t*>(left), static_cast<const std::uint16_t*>(right), kc_pad, k_off, k_len);
  alignas(64) float sums[kMr * kNr];
  constexpr std::int64_t kStride = kNr * sizeof(float);
  _tile_stored(0, sums, kStride);
  _tile_stored(1, sums + kTile, kStride);
  _tile_stored(2, sums + kTile * kNr, kStride);
  _tile_stored(3, sums + kTile * kNr + kTile, kStride);
  // C = fma(sum * s_row, s_col, C), as the reference orders the scales.
  const __m512 col0 = _mm512_loadu_ps(s_col), col1 = _mm512_loadu_ps(s_col + 16);
  for (std::int64_t i = 0; i < kMr; ++i) {
    const __m512 s = _mm512_set1_ps(s_row[i]);
    float* row = c + i * ldc;
    _mm512_storeu_ps(row,
                     _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(sums + i * kNr), s), col0, _mm512_loadu_ps(row)));
    _mm512_storeu_ps(row + 16, _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(sums + i * kNr + 16), s), col1,
                                               _mm512_loadu_ps(row + 16)));
  }
}

// ---------------------------------------------------------------- small M: the weights streamed into the tiles

// 16 weight rows (out^T rows j0..j0+15) times kCols groups of 16 activation rows, all of K: per 64 K the 16 x 64
// codes are decoded (VBMI tables) into a 2 KiB buffer that two left-tile loads read back, while the tiles of the
// previous step compute; C: tiles 0..kCols-1 (16 x 16 FP32 each), weights: tile 4, activations: tiles 5-7 in turn.
template <int kCols, class Decoder>
void stream_strip(const Decoder& d, const Operand& w, std::int64_t j0, std::int64_t rows, const std::uint16_t* x,
                  std::int64_t k_pad, std::int64_t m, float* out, std::int64_t ldo) {
  alignas(64) std::uint16_t buf[2][kTile][32];
  const std::uint8_t* src[kTile];
  for (std::int64_t r = 0; r < kTile; ++r) src[r] = w.codes + std::min(j0 + r, j0 + rows - 1) * w.ld;
  if (kCols > 0) _tile_zero(0);
  if (kCols > 1) _tile_zero(1);
  if (kCols > 2) _tile_zero(2);
  if (kCols > 3) _tile_zero(3);
  const std::int64_t group = kTile * k_pad;  // elements between the activations' 16-row groups
  for (std::int64_t kk = 0; kk < k_pad; kk += 64) {
    const std::int64_t len = std::min<std::int64_t>(64, w.k - kk);
    const __mmask64 valid = len >= 64 ? ~__mmask64{0} : len <= 0 ? 0 : (__mmask64{1} << len) - 1;
#pragma GCC unroll 16
    for (std::int64_t r = 0; r < kTile; ++r) {
      __m512i first, second;
      _mm_prefetch(reinterpret_cast<const char*>(src[r] + kk) + 2048, _MM_HINT_T0);
      d.words(_mm512_maskz_loadu_epi8(valid, src[r] + kk), first, second);
      _mm512_store_si512(buf[0][r], first);
      _mm512_store_si512(buf[1][r], second);
    }
    for (int s = 0; s < 2 && kk + 32 * s < k_pad; ++s) {
      const std::uint16_t* xs = x + (kk + 32 * s) * kTile;
      _tile_loadd(4, buf[s], 64);
      if (kCols > 0) {
        _tile_loadd(5, xs, 64);
        _tile_dpbf16ps(0, 4, 5);
      }
      if (kCols > 1) {
        _tile_loadd(6, xs + group, 64);
        _tile_dpbf16ps(1, 4, 6);
      }
      if (kCols > 2) {
        _tile_loadd(7, xs + 2 * group, 64);
        _tile_dpbf16ps(2, 4, 7);
      }
      if (kCols > 3) {
        _tile_loadd(5, xs + 3 * group, 64);
        _tile_dpbf16ps(3, 4, 5);
      }
    }
  }
  // C^T: tile c holds (weight row r, activation row 16 c + i); out[16 c + i][j0 + r] after a 16 x 16 transpose.
  static const TransposeIndex index;
  alignas(64) float sums[kTile][kTile];
  for (int c = 0; c < kCols; ++c) {
    switch (c) {
      case 0:
        _tile_stored(0, sums, 64);
        break;
      case 1:
        _tile_stored(1, sums, 64);
        break;
      case 2:
        _tile_stored(2, sums, 64);
        break;
      default:
        _tile_stored(3, sums, 64);
    }
    __m512i v[16];
    for (int r = 0; r < 16; ++r) v[r] = _mm512_load_si512(sums[r]);
    transpose16x16(v, index);
    const auto lanes = static_cast<__mmask16>(rows >= 16 ? 0xFFFF : (1u << rows) - 1u);
    for (std::int64_t i = 0; i < std::min<std::int64_t>(16, m - 16 * c); ++i)
      _mm512_mask_storeu_ps(out + (16 * c + i) * ldo + j0, lanes, _mm512_castsi512_ps(v[i]));
  }
}

bool stream_weights_amx(const Operand& w, std::int64_t j0, std::int64_t j1, const void* x, std::int64_t m,
                        std::int64_t k_pad, float* out, std::int64_t ldo) {
  if (!cpu_features().avx512vbmi || w.codes == nullptr || !w.k_contiguous) return false;
  configure_tiles();
  const auto* xs = static_cast<const std::uint16_t*>(x);
  const std::int64_t cols = (m + 15) / 16;
  fp8_simd::with_word_decoder(fp8_simd::byte_tables<bfloat16>(w.format), [&](const auto& d) {
    for (std::int64_t j = j0; j < j1; j += kTile) {
      const std::int64_t rows = std::min(kTile, j1 - j);
      switch (cols) {
        case 1:
          stream_strip<1>(d, w, j, rows, xs, k_pad, m, out, ldo);
          break;
        case 2:
          stream_strip<2>(d, w, j, rows, xs, k_pad, m, out, ldo);
          break;
        case 3:
          stream_strip<3>(d, w, j, rows, xs, k_pad, m, out, ldo);
          break;
        default:
          stream_strip<4>(d, w, j, rows, xs, k_pad, m, out, ldo);
      }
    }
  });
  release_tiles();
  return true;
}

// Panels of 256 K: a left strip (32 rows: 16 KiB) stays in L1 while the right strips (16 KiB each) of a right panel
// of up to 4096 columns (2 MiB) stream from L2/L3; A is decoded once per thread and panel. Products with M <= 128
// and weights N x K stream the weights instead (out^T = B A^T, see scaled_mm.cpp).
}  // namespace

constinit const GemmKernel kAmxGemm{.name = "amx-bf16 32x32",
                                    .contract = KernelContract::kFp32Bound,
                                    .bf16_operands = true,
                                    .mr = kMr,
                                    .nr = kNr,
                                    .kc = 256,
                                    .mc = 32,
                                    .nc = 4096,
                                    .k_align = kBf16KAlign,
                                    .elem_bytes = sizeof(std::uint16_t),
                                    .weights_left_max_m = 128,
                                    .pack_left = &pack_bf16_rows,
                                    .pack_right = &pack_bf16_vnni,
                                    .accumulate = &accumulate_amx,
                                    .scale_accumulate = &scale_accumulate_amx,
                                    .start = &configure_tiles,
                                    .finish = &release_tiles,
                                    .stream_weights = &stream_weights_amx,
                                    .stream_max_m = 64,
                                    .stream_name = "amx-bf16 stream 16x64"};

}  // namespace fp8kit::mm_detail
