// The portable matrix-multiply kernels: the same operations, in the same order, as the AVX2 ones (one fused
// multiply-add per product, in increasing k), so every CPU computes the GEMM path bit-identically. They are the
// fallback where AVX2 and FMA are missing, and the exact GEMV for rows the fast decode cannot handle.
#include <cmath>
#include <vector>

#include "fp8kit/codec.hpp"
#include "fp8kit/cpu.hpp"
#include "mm_kernels.hpp"

namespace fp8kit::mm_detail {

const DecodeTable& decode_table(Format f) {
  static const auto tables = [] {
    std::array<DecodeTable, kAllFormats.size()> t{};
    for (Format format : kAllFormats) {
      for (int code = 0; code < 256; ++code) {
        t[static_cast<std::size_t>(format)][static_cast<std::size_t>(code)] =
            decode_to_float(format, static_cast<std::uint8_t>(code));
      }
    }
    return t;
  }();
  return tables[static_cast<std::size_t>(f)];
}

namespace {

void accumulate_scalar(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc) {
  for (std::int64_t i = 0; i < kMr; ++i) {
    for (std::int64_t j = 0; j < kNr; ++j) {
      float acc = c[i * ldc + j];
      for (std::int64_t k = 0; k < kc; ++k) acc = std::fma(a[k * kMr + i], b[k * kNr + j], acc);
      c[i * ldc + j] = acc;
    }
  }
}

void scale_accumulate_scalar(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc,
                             const float* sa, const float* sb) {
  for (std::int64_t i = 0; i < kMr; ++i) {
    for (std::int64_t j = 0; j < kNr; ++j) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < kc; ++k) acc = std::fma(a[k * kMr + i], b[k * kNr + j], acc);
      c[i * ldc + j] = std::fma(acc * sa[i], sb[j], c[i * ldc + j]);
    }
  }
}

void scale_row_scalar(float* row, std::int64_t n, float sa, ScaleIndex sb) {
  for (std::int64_t j = 0; j < n; ++j) row[j] = std::fma(row[j] * sa, sb.at(j, 0), 0.0f);
}

// Exact for every code (the decode table), sequential sums per K block.
bool gemv_scalar(Format f, std::int64_t m, std::int64_t j0, std::int64_t j1, std::int64_t k, std::int64_t kblock,
                 const GemvInput& in, const std::uint8_t* w, ScaleIndex sa, ScaleIndex sb, float* out,
                 std::int64_t ldo) {
  const DecodeTable& table = decode_table(f);
  const float* x = in.x;
  const std::int64_t ldx = in.ldx;
  for (std::int64_t j = j0; j < j1; ++j) {
    const std::uint8_t* row = w + j * k;
    for (std::int64_t i = 0; i < m; ++i) {
      float total = 0.0f;
      for (std::int64_t k0 = 0, kb = 0; k0 < k; k0 += kblock, ++kb) {
        float acc = 0.0f;
        const std::int64_t k1 = std::min(k, k0 + kblock);
        for (std::int64_t kk = k0; kk < k1; ++kk) acc = std::fma(x[i * ldx + kk], table[row[kk]], acc);
        total = std::fma(acc * sa.at(i, kb), sb.at(j, kb), total);
      }
      out[i * ldo + j] = total;
    }
  }
  return true;
}

}  // namespace

const MmKernelTable& scalar_mm_kernels() {
  static const MmKernelTable table{"scalar",          Isa::kScalar, &accumulate_scalar, &scale_accumulate_scalar,
                                   &scale_row_scalar, &gemv_scalar};
  return table;
}

const detail::IsaTables<MmKernelTable>& mm_tables() {
  static const detail::IsaTables<MmKernelTable> tables(
      {&scalar_mm_kernels(), &avx2_mm_kernels(), nullptr, nullptr, nullptr});
  return tables;
}

}  // namespace fp8kit::mm_detail
