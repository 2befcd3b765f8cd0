// AVX512-BF16 matrix-multiply kernels for operands exact in bfloat16 (every FP8 format, bfloat16 activations): the
// bfloat16 packing the AMX kernels share, a vdpbf16ps GEMM micro-kernel and a vdpbf16ps GEMV.
//
// FP8 codes are decoded exactly to bfloat16 while packing (64 at a time through the VBMI byte tables where the CPU
// has VBMI, the conversion kernels otherwise); the products of two bfloat16 values are exact in FP32, so the only
// roundings are the sums'. vdpbf16ps adds each lane's pair of products into its FP32 accumulator in its own order,
// with round to nearest even, reading bfloat16 subnormals as zero and flushing subnormal results (it ignores MXCSR):
// the kFp32Bound contract. With FP8 operands on both sides no value, product or partial sum is subnormal (every FP8
// value is a normal bfloat16, every product a multiple of 2^-34), so DAZ/FTZ change nothing there.
//
// GEMM micro-kernel: a 12 x 32 tile in 24 zmm accumulators; per K pair, the right strip's two 16-column groups
// (64 bytes each, [pair][column][2]) and a broadcast of each left row's pair.
// GEMV: each weight row's 64 codes decoded to two vectors of 32 bfloat16 and multiplied pairwise with the
// activations in bfloat16 (exact for FP8 and bfloat16 activations; float32 ones run the FMA GEMV).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/cpu/fp8_decode_avx512.hpp"
#include "fp8kit/common/cpu.hpp"
#include "gemv_avx512.hpp"
#include "mm_kernels.hpp"
#include "tile_avx512.hpp"
#include "transpose_avx512.hpp"

namespace fp8kit::mm_detail {
namespace {

using fp8_simd::byte_tables;
using fp8_simd::ByteTables;

std::int64_t round_up(std::int64_t x, std::int64_t to) {
  return (x + to - 1) / to * to;
}

__m512bh as_bh(__m512i v) {
  return reinterpret_cast<__m512bh&>(v);
}

// n codes -> n bfloat16 (exact).
void decode_codes(const std::uint8_t* codes, Format f, std::int64_t n, std::uint16_t* out) {
  if (!cpu_features().avx512vbmi) {
    decode_to_bf16(codes, f, n, out);  // the conversion kernels' decode
    return;
  }
  fp8_simd::with_word_decoder(byte_tables<bfloat16>(f), [&](const auto& d) {
    for (std::int64_t i = 0; i < n; i += 64) {
      const std::int64_t len = std::min<std::int64_t>(64, n - i);
      const __mmask64 valid = len == 64 ? ~__mmask64{0} : (__mmask64{1} << len) - 1;
      __m512i first, second;
      d.words(_mm512_maskz_loadu_epi8(valid, codes + i), first, second);
      if (len == 64) {
        _mm512_storeu_si512(out + i, first);
        _mm512_storeu_si512(out + i + 32, second);
      } else {
        const auto lo = static_cast<__mmask32>(len >= 32 ? 0xFFFFFFFFu : (std::uint32_t{1} << len) - 1u);
        const auto hi = static_cast<__mmask32>(len <= 32 ? 0u : (std::uint32_t{1} << (len - 32)) - 1u);
        _mm512_mask_storeu_epi16(out + i, lo, first);
        if (hi != 0) _mm512_mask_storeu_epi16(out + i + 32, hi, second);
      }
    }
  });
}

// Row r of an operand, K [k0, k0 + kc), as bfloat16 bits (k-contiguous operands).
void row_bf16(const Operand& x, std::int64_t r, std::int64_t k0, std::int64_t kc, std::uint16_t* out) {
  const std::int64_t base = r * x.ld + k0;
  if (x.codes != nullptr) {
    decode_codes(x.codes + base, x.format, kc, out);
  } else {
    std::memcpy(out, x.bf16 + base, static_cast<std::size_t>(kc) * sizeof(std::uint16_t));
  }
}

// Element (r, kk) of an operand as bfloat16 bits.
std::uint16_t element_bf16(const Operand& x, std::int64_t r, std::int64_t kk) {
  const std::int64_t idx = x.k_contiguous ? r * x.ld + kk : kk * x.ld + r;
  if (x.codes != nullptr) return decode_to_bfloat16(x.format, x.codes[idx]).bits;
  return x.bf16[idx].bits;
}

// 16 rows x kc_pad of a k-contiguous operand (rows beyond `rows` zero) -> [kc_pad / 2][16][2].
void vnni_group_contiguous(const Operand& x, std::int64_t r0, std::int64_t rows, std::int64_t k0, std::int64_t kc,
                           std::int64_t kc_pad, std::uint16_t* dst) {
  static const TransposeIndex index;
  auto* lines = static_cast<std::uint16_t*>(thread_scratch(static_cast<std::size_t>(16 * kc_pad) * 2));
  for (std::int64_t i = 0; i < 16; ++i) {
    std::uint16_t* line = lines + i * kc_pad;
    if (i < rows) {
      row_bf16(x, r0 + i, k0, kc, line);
      std::memset(line + kc, 0, static_cast<std::size_t>(kc_pad - kc) * sizeof(std::uint16_t));
    } else {
      std::memset(line, 0, static_cast<std::size_t>(kc_pad) * sizeof(std::uint16_t));
    }
  }
  for (std::int64_t kk = 0; kk < kc_pad; kk += 32) {
    __m512i r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(lines + i * kc_pad + kk);
    transpose16x16(r, index);  // row p: pair p of the 16 rows, side by side
#pragma GCC unroll 16
    for (int p = 0; p < 16; ++p) _mm512_storeu_si512(dst + (kk / 2 + p) * 32, r[p]);
  }
}

}  // namespace

void pack_bf16_rows(const Operand& x, std::int64_t width, std::int64_t r0, std::int64_t rows, std::int64_t k0,
                    std::int64_t kc, void* dst_bytes) {
  auto* dst = static_cast<std::uint16_t*>(dst_bytes);
  const std::int64_t kc_pad = round_up(kc, kBf16KAlign);
  const std::int64_t total = round_up(rows, width);
  for (std::int64_t i = 0; i < total; ++i) {
    std::uint16_t* row = dst + i * kc_pad;
    if (i >= rows) {
      std::memset(row, 0, static_cast<std::size_t>(kc_pad) * sizeof(std::uint16_t));
      continue;
    }
    if (x.k_contiguous) {
      row_bf16(x, r0 + i, k0, kc, row);
    } else {
      for (std::int64_t kk = 0; kk < kc; ++kk) row[kk] = element_bf16(x, r0 + i, k0 + kk);
    }
    std::memset(row + kc, 0, static_cast<std::size_t>(kc_pad - kc) * sizeof(std::uint16_t));
  }
}

void pack_bf16_vnni(const Operand& x, std::int64_t width, std::int64_t r0, std::int64_t rows, std::int64_t k0,
                    std::int64_t kc, void* dst_bytes) {
  // (width is a multiple of 16: every kernel using this layout has nr = 32, the stream kernel 16)
  auto* dst = static_cast<std::uint16_t*>(dst_bytes);
  const std::int64_t kc_pad = round_up(kc, kBf16KAlign);
  const std::int64_t groups = round_up(rows, width) / 16;
  for (std::int64_t g = 0; g < groups; ++g) {
    std::uint16_t* group = dst + g * 16 * kc_pad;
    const std::int64_t g_rows = std::clamp<std::int64_t>(rows - 16 * g, 0, 16);
    if (x.k_contiguous) {
      vnni_group_contiguous(x, r0 + 16 * g, g_rows, k0, kc, kc_pad, group);
      continue;
    }
    // K x N storage: each K pair of 16 neighbouring columns.
    for (std::int64_t kk = 0; kk < kc_pad; ++kk) {
      for (std::int64_t c = 0; c < 16; ++c) {
        const bool inside = c < g_rows && kk < kc;
        group[(kk / 2) * 32 + c * 2 + (kk % 2)] = inside ? element_bf16(x, r0 + 16 * g + c, k0 + kk) : 0;
      }
    }
  }
}

namespace {

// ---------------------------------------------------------------- GEMM micro-kernel

constexpr std::int64_t kMr = kTileRows, kNr = 32;

template <bool kScale>
void tile_12x32(const void* left, const void* right, std::int64_t kc_pad, std::int64_t k_off, std::int64_t k_len,
                float* c, std::int64_t ldc, const float* sa, const float* sb, bool zero = false) {
  const auto* a = static_cast<const std::uint16_t*>(left) + k_off;
  const auto* b0 = static_cast<const std::uint16_t*>(right) + k_off * 16;
  const std::uint16_t* b1 = b0 + 16 * kc_pad;
  TileAcc acc;
  tile_start<kScale>(acc, c, ldc, zero);
  const std::int64_t pairs = (k_len + 1) / 2;  // the padding past k_len is zero
  for (std::int64_t p = 0; p < pairs; ++p) {
    const __m512bh v0 = as_bh(_mm512_loadu_si512(b0 + 32 * p)), v1 = as_bh(_mm512_loadu_si512(b1 + 32 * p));
#pragma GCC unroll 12
    for (int i = 0; i < kMr; ++i) {
      std::int32_t pair;
      std::memcpy(&pair, a + i * kc_pad + 2 * p, sizeof(pair));
      const __m512bh ai = as_bh(_mm512_set1_epi32(pair));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, v0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, v1);
    }
  }
  tile_finish<kScale>(acc, c, ldc, sa, sb);
}

void accumulate_dpbf16(const void* left, const void* right, std::int64_t kc_pad, std::int64_t k_off, std::int64_t k_len,
                       float* c, std::int64_t ldc, bool overwrite) {
  tile_12x32<false>(left, right, kc_pad, k_off, k_len, c, ldc, nullptr, nullptr, overwrite);
}

void scale_accumulate_dpbf16(const void* left, const void* right, std::int64_t kc_pad, std::int64_t k_off,
                             std::int64_t k_len, float* c, std::int64_t ldc, const float* sa, const float* sb) {
  tile_12x32<true>(left, right, kc_pad, k_off, k_len, c, ldc, sa, sb);
}

// ---------------------------------------------------------------- GEMV

// kM activation rows (bfloat16) times kR weight rows starting at row j, all of K (gemv_k_blocks): per step, 64 codes
// of each row decoded to two vectors of 32 bfloat16 and multiplied pairwise with the activations into one accumulator
// per output. The weights are prefetched a block ahead (GemvPrefetch, into L1); eight rows at a time (M = 1) measured
// faster from DRAM than one row at a time in longer sequential runs.
template <int kM, int kR, class Decoder>
void gemv_rows(const Decoder& d, std::int64_t j, std::int64_t k, std::int64_t kblock, const std::uint16_t* x,
               std::int64_t ldx, const std::uint8_t* w, const ScaleIndex& sa, const ScaleIndex& sb, float* out,
               std::int64_t ldo) {
  const std::uint8_t* rows[kR];
#pragma GCC unroll 8
  for (int r = 0; r < kR; ++r) rows[r] = w + (j + r) * k;
  const GemvPrefetch<kR, kPrefetchToL1> prefetch(w, j, k);
  gemv_k_blocks<kM, kR>(j, k, kblock, sa, sb, out, ldo, [&]<bool kFull>(auto& acc, std::int64_t kk, std::int64_t len) {
    const __mmask64 valid = first_n64(len);
    __m512bh xs[kM][2];
#pragma GCC unroll 4
    for (int i = 0; i < kM; ++i) {
      const std::uint16_t* xi = x + i * ldx + kk;
      xs[i][0] = as_bh(kFull ? _mm512_loadu_si512(xi) : _mm512_maskz_loadu_epi16(static_cast<__mmask32>(valid), xi));
      xs[i][1] = as_bh(kFull ? _mm512_loadu_si512(xi + 32)
                             : _mm512_maskz_loadu_epi16(static_cast<__mmask32>(valid >> 32), xi + 32));
    }
#pragma GCC unroll 8
    for (int r = 0; r < kR; ++r) {
      if constexpr (kFull) prefetch(kk, r, 64);
      __m512i first, second;
      d.words(kFull ? _mm512_loadu_si512(rows[r] + kk) : _mm512_maskz_loadu_epi8(valid, rows[r] + kk), first, second);
#pragma GCC unroll 4
      for (int i = 0; i < kM; ++i) {
        acc[i][r] = _mm512_dpbf16_ps(acc[i][r], xs[i][0], as_bh(first));
        acc[i][r] = _mm512_dpbf16_ps(acc[i][r], xs[i][1], as_bh(second));
      }
    }
  });
}

template <int kM, class Decoder>
void gemv_m(const Decoder& d, std::int64_t j0, std::int64_t j1, std::int64_t k, std::int64_t kblock,
            const std::uint16_t* x, std::int64_t ldx, const std::uint8_t* w, const ScaleIndex& sa, const ScaleIndex& sb,
            float* out, std::int64_t ldo) {
  constexpr int kR = kM == 1 ? 8 : kM == 2 ? 4 : 2;
  std::int64_t j = j0;
  for (; j + kR <= j1; j += kR) gemv_rows<kM, kR>(d, j, k, kblock, x, ldx, w, sa, sb, out, ldo);
  for (; j < j1; ++j) gemv_rows<kM, 1>(d, j, k, kblock, x, ldx, w, sa, sb, out, ldo);
}

bool gemv_dpbf16(Format f, std::int64_t m, std::int64_t j0, std::int64_t j1, std::int64_t k, std::int64_t kblock,
                 const GemvInput& in, const std::uint8_t* w, ScaleIndex sa, ScaleIndex sb, float* out,
                 std::int64_t ldo) {
  if (in.x_bf16 == nullptr || !cpu_features().avx512vbmi) return false;
  const auto* x = reinterpret_cast<const std::uint16_t*>(in.x_bf16);
  return fp8_simd::with_word_decoder(byte_tables<bfloat16>(f), [&](const auto& d) {
    return with_gemv_rows(m, [&](auto rows) {
      gemv_m<rows()>(d, j0, j1, k, kblock, x, in.ldx, w, sa, sb, out, ldo);
      return true;
    });
  });
}

// Panels: the left strip (12 rows x 512 K: 12 KiB) and the right strip (512 x 32: 32 KiB) in L1, the left panel
// (96 x 512: 96 KiB) in L2, the right panel (512 x 2048: 2 MiB) in L2/L3.
}  // namespace

// 24 < M <= 128 with N x K weights runs in the weights-left orientation (each weight decoded once into an L1 strip;
// up to M = 24 the GEMV takes FP8 and bfloat16 activations): on a Zen 5, N = K = 4096, 0.67-0.80x oneDNN's bf16
// matmul packed as for large M, 0.85-1.00x weights-left (docs/gemm.md).
constinit const GemmKernel kAvx512Bf16Gemm{.name = "avx512bf16-dpbf16 12x32",
                                           .contract = KernelContract::kFp32Bound,
                                           .bf16_operands = true,
                                           .mr = kMr,
                                           .nr = kNr,
                                           .kc = 512,
                                           .mc = 96,
                                           .nc = 2048,
                                           .k_align = kBf16KAlign,
                                           .elem_bytes = sizeof(std::uint16_t),
                                           .weights_left_max_m = 128,
                                           .pack_left = &pack_bf16_rows,
                                           .pack_right = &pack_bf16_vnni,
                                           .accumulate = &accumulate_dpbf16,
                                           .scale_accumulate = &scale_accumulate_dpbf16,
                                           .prefetch_next_tile = true};
constinit const GemvKernel kAvx512Bf16Gemv{
    .name = "avx512bf16-gemv", .contract = KernelContract::kFp32Bound, .bf16_input = true, .run = &gemv_dpbf16};

}  // namespace fp8kit::mm_detail
