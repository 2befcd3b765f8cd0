// The portable matrix-multiply kernels: the same operations, in the same order, as the FMA ones (one fused
// multiply-add per product, in increasing k), so every CPU computes the FP32 GEMM bit-identically. They are the
// fallback where AVX2 and FMA are missing, and the exact GEMV for rows a fast decode cannot handle. Also the
// float32 strip packing every FMA kernel uses, and the decode tables.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>

#include "fp8kit/common/error.hpp"
#include "fp8kit/convert/convert.hpp"

#include "fp8kit/format/codec.hpp"
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

RegisterDecodeRule register_decode_rule(Format f) {
  const FormatDescriptor& d = descriptor(f);
  RegisterDecodeRule r{};
  r.fields = 0x80000000u | (0x7Fu << (23 - d.mantissa_bits));
  r.rebias_bits = static_cast<std::uint32_t>(127 - d.bias + 127) << 23;
  switch (d.nan) {
    case NanEncoding::kAllOnes:  // e4m3fn: 0x7F / 0xFF are NaN
      r.special_mask = 0x7F;
      r.special_value = 0x7F;
      break;
    case NanEncoding::kIeee:  // e5m2: the all-ones exponent (Inf and NaN)
      r.special_mask = static_cast<std::uint8_t>(d.max_exponent_field() << d.mantissa_bits);
      r.special_value = r.special_mask;
      break;
    default:  // fnuz: 0x80 is NaN
      r.special_mask = 0xFF;
      r.special_value = 0x80;
  }
  return r;
}

void pack_f32_strips(const Operand& x, std::int64_t width, std::int64_t r0, std::int64_t rows, std::int64_t k0,
                     std::int64_t kc, void* dst_bytes) {
  auto* dst = static_cast<float*>(dst_bytes);
  const DecodeTable* table = x.codes != nullptr ? &decode_table(x.format) : nullptr;
  for (std::int64_t s = 0; s * width < rows; ++s) {
    float* strip = dst + s * kc * width;
    const std::int64_t height = std::min(width, rows - s * width);
    if (height < width) std::fill(strip, strip + kc * width, 0.0f);
    if (!x.k_contiguous) {
      // K x N storage: each k reads `height` neighbours.
      for (std::int64_t kk = 0; kk < kc; ++kk) {
        float* d = strip + kk * width;
        const std::int64_t base = (k0 + kk) * x.ld + r0 + s * width;
        for (std::int64_t i = 0; i < height; ++i) {
          const std::int64_t idx = base + i;
          d[i] = table != nullptr ? (*table)[x.codes[idx]] : (x.f32 != nullptr ? x.f32[idx] : x.bf16[idx].to_float());
        }
      }
      continue;
    }
    // Rows side by side (written in order, reading `height` rows at once).
    for (std::int64_t i = 0; i < height; ++i) {
      const std::int64_t base = (r0 + s * width + i) * x.ld + k0;
      float* d = strip + i;
      if (table != nullptr) {
        const std::uint8_t* src = x.codes + base;
        for (std::int64_t kk = 0; kk < kc; ++kk) d[kk * width] = (*table)[src[kk]];
      } else if (x.f32 != nullptr) {
        const float* src = x.f32 + base;
        for (std::int64_t kk = 0; kk < kc; ++kk) d[kk * width] = src[kk];
      } else {
        const bfloat16* src = x.bf16 + base;
        for (std::int64_t kk = 0; kk < kc; ++kk) d[kk * width] = src[kk].to_float();
      }
    }
  }
}

namespace {

constexpr std::int64_t kMr = 6, kNr = 16;

void accumulate_scalar(const void* left, const void* right, std::int64_t kc_pad, std::int64_t k_off, std::int64_t k_len,
                       float* c, std::int64_t ldc, bool overwrite) {
  (void)kc_pad;
  const float* a = static_cast<const float*>(left) + k_off * kMr;
  const float* b = static_cast<const float*>(right) + k_off * kNr;
  for (std::int64_t i = 0; i < kMr; ++i) {
    for (std::int64_t j = 0; j < kNr; ++j) {
      float acc = overwrite ? 0.0f : c[i * ldc + j];
      for (std::int64_t k = 0; k < k_len; ++k) acc = std::fma(a[k * kMr + i], b[k * kNr + j], acc);
      c[i * ldc + j] = acc;
    }
  }
}

void scale_accumulate_scalar(const void* left, const void* right, std::int64_t kc_pad, std::int64_t k_off,
                             std::int64_t k_len, float* c, std::int64_t ldc, const float* sa, const float* sb) {
  (void)kc_pad;
  const float* a = static_cast<const float*>(left) + k_off * kMr;
  const float* b = static_cast<const float*>(right) + k_off * kNr;
  for (std::int64_t i = 0; i < kMr; ++i) {
    for (std::int64_t j = 0; j < kNr; ++j) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < k_len; ++k) acc = std::fma(a[k * kMr + i], b[k * kNr + j], acc);
      c[i * ldc + j] = std::fma(acc * sa[i], sb[j], c[i * ldc + j]);
    }
  }
}

void pack_f32(const Operand& x, std::int64_t width, std::int64_t r0, std::int64_t rows, std::int64_t k0,
              std::int64_t kc, void* dst) {
  pack_f32_strips(x, width, r0, rows, k0, kc, dst);
}

}  // namespace

float finish_row_scalar(float* row, std::int64_t n, const float* sa, ScaleIndex sb, const float* bias, bool bf16_out) {
  float amax = 0.0f;
  for (std::int64_t j = 0; j < n; ++j) {
    float v = row[j];
    if (sa != nullptr) v = std::fma(v * *sa, sb.at(j, 0), 0.0f);
    if (bias != nullptr) v += bias[j];
    if (bf16_out) v = bfloat16::from_float(v).to_float();
    row[j] = v;
    if (std::isfinite(v)) amax = std::max(amax, std::fabs(v));
  }
  return amax;
}

namespace {

// Exact for every code (the decode table), sequential sums per K block: the references' order.
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

constinit const GemmKernel kScalarGemm{.name = "scalar-fma 6x16",
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
                                       .accumulate = &accumulate_scalar,
                                       .scale_accumulate = &scale_accumulate_scalar};
constinit const GemvKernel kScalarGemv{
    .name = "scalar-gemv", .contract = KernelContract::kBitIdentical, .run = &gemv_scalar};

ScratchBuffer::~ScratchBuffer() {
  std::free(data_);
}

void* ScratchBuffer::get(std::size_t bytes) {
  if (bytes > size_) {
    std::free(data_);
    const std::size_t size = (bytes + 4095) / 4096 * 4096;
    data_ = std::aligned_alloc(64, size);
    size_ = data_ != nullptr ? size : 0;  // after a failure, the next call allocates again
    FP8KIT_CHECK(data_ != nullptr, "scaled_mm: could not allocate ", size,
                 " bytes of scratch (packed operands or GEMV rows)");
  }
  return data_;
}

void* thread_scratch(std::size_t bytes) {
  thread_local ScratchBuffer buffer;
  return buffer.get(bytes);
}

void decode_to_bf16(const std::uint8_t* codes, Format format, std::int64_t n, std::uint16_t* out) {
  cast_from_fp8(std::span<const std::uint8_t>(codes, static_cast<std::size_t>(n)), format,
                std::span<bfloat16>(reinterpret_cast<bfloat16*>(out), static_cast<std::size_t>(n)));
}

}  // namespace fp8kit::mm_detail
