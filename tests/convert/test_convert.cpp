// Bulk conversions: every kernel table (one test instance per table, skipped where this CPU cannot run it) against
// the scalar reference, for every format, policy and input type, odd lengths, unaligned pointers, scales, both
// roundings; the public entries at every ISA level, threads, and stochastic rounding's reproducibility.
#include <gtest/gtest.h>
#include <xmmintrin.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "common/isa_levels.hpp"
#include "convert/cpu/convert_kernels.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/convert/convert.hpp"

namespace fp8kit {
namespace {

using convert_detail::KernelTable;

// Every SIMD table (the scalar one is the reference, checked against the codec in tests/format).
struct TableCase {
  const char* label;
  Isa isa;
  bool needs_vbmi;
  const KernelTable& (*table)();
};
const TableCase kTableCases[] = {
    {"avx2", Isa::kAvx2, false, &convert_detail::avx2_kernels},
    {"avx512_vbmi", Isa::kAvx512, true, &convert_detail::avx512_kernels},
    {"avx512_shift_decode", Isa::kAvx512, false, &convert_detail::avx512_kernels_without_vbmi},
};

void PrintTo(const TableCase& c, std::ostream* os) {
  *os << c.label;
}

class ConvertKernel : public ::testing::TestWithParam<TableCase> {
 protected:
  void SetUp() override {
    FP8KIT_SKIP_UNLESS_RUNS(GetParam().isa, GetParam().needs_vbmi);
    // The contract every conversion table must declare, and the one the tests below check: the scalar table's bits.
    ASSERT_EQ(kernels()->contract, KernelContract::kBitIdentical) << kernels()->name;
  }
  static const KernelTable* kernels() { return &GetParam().table(); }
};
INSTANTIATE_TEST_SUITE_P(Tables, ConvertKernel, ::testing::ValuesIn(kTableCases),
                         [](const ::testing::TestParamInfo<TableCase>& info) { return info.param.label; });

const std::size_t kLengths[] = {0, 1, 3, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129, 255, 1000, 4099};
const float kScales[] = {1.0f, 0.5f, 3.0f, 1e-3f, 448.0f / 17.0f, 1e30f};

// Random floats over every magnitude, with specials and FP8 boundary values mixed in.
std::vector<float> test_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  const float specials[] = {0.0f,   -0.0f,    INFINITY, -INFINITY, NAN,    -NAN, 448.0f,   464.0f,
                            465.0f, 61440.0f, 0x1p-10f, 240.0f,    248.0f, 1.5f, 0x1p-127f};
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = rng();
    if (r % 11 == 0) {
      v[i] = specials[(r >> 8) % std::size(specials)];
    } else if (r % 3 == 0) {
      v[i] = std::bit_cast<float>(static_cast<std::uint32_t>(r >> 32));
    } else {
      v[i] =
          std::ldexp(1.0f + static_cast<float>((r >> 8) & 0xFFFF) / 65536.0f, static_cast<int>((r >> 32) % 60) - 40) *
          ((r >> 40) & 1 ? -1.0f : 1.0f);
    }
  }
  return v;
}

template <typename T>
std::vector<T> narrow_all(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<T, float>) {
      out[i] = v[i];
    } else {
      out[i] = T::from_float(v[i]);
    }
  }
  return out;
}

template <typename In>
void check_encode(const KernelTable* table, convert_detail::EncodeFn<In>(KernelTable::*member)) {
  const auto base = test_floats(5000, 99);
  const auto input = narrow_all<In>(base);
  {
    for (Format f : kAllFormats) {
      for (Overflow o : {Overflow::kNonSaturating, Overflow::kSaturate}) {
        for (float scale : kScales) {
          auto params = convert_detail::make_encode_params(CastOptions{f, o, Rounding::kNearestEven, scale});
          for (std::size_t n : kLengths) {
            params.streaming_stores = (n % 2) == 1;  // both store kinds, on odd and even lengths alike
            for (std::size_t misalign : {0, 1, 3}) {
              if (n + misalign > input.size()) continue;
              std::vector<std::uint8_t> want(n + 1, 0xAB), got(n + 1 + misalign, 0xAB);
              (convert_detail::scalar_kernels().*member)(input.data() + misalign, want.data(), n, params);
              (table->*member)(input.data() + misalign, got.data() + misalign, n, params);
              for (std::size_t i = 0; i < n; ++i) {
                ASSERT_EQ(got[misalign + i], want[i])
                    << table->name << " " << name(f) << " scale " << scale << " n " << n << " i " << i << " x "
                    << std::hexfloat << base[misalign + i];
              }
              EXPECT_EQ(got[misalign + n], 0xAB) << "wrote past the end";
            }
          }
        }
      }
    }
  }
}

// Arrays long enough for the kernels' long-array loops (the AVX-512 encoder works on four parts side by side from
// 2^20 elements), with a length that leaves a remainder after the parts, against the scalar table.
template <typename In>
void check_long_encode(const KernelTable* table, convert_detail::EncodeFn<In>(KernelTable::*member)) {
  const std::size_t n = (std::size_t{1} << 20) * 2 + 4 * 64 * 3 + 45;
  const auto input = narrow_all<In>(test_floats(n, 31));
  for (Format f : {Format::e4m3fn, Format::e5m2, Format::e5m2fnuz, Format::e8m0fnu}) {
    for (Overflow o : {Overflow::kNonSaturating, Overflow::kSaturate}) {
      // unscaled (bfloat16 has its own kernels there) and scaled
      for (float scale : {1.0f, 0.75f}) {
        auto params = convert_detail::make_encode_params(CastOptions{f, o, Rounding::kNearestEven, scale});
        params.streaming_stores = true;
        std::vector<std::uint8_t> want(n), got(n + 1, 0xAB);
        (convert_detail::scalar_kernels().*member)(input.data(), want.data(), n, params);
        (table->*member)(input.data(), got.data(), n, params);
        std::size_t mismatches = 0, first = n;
        for (std::size_t i = 0; i < n; ++i) {
          if (got[i] != want[i]) {
            ++mismatches;
            first = std::min(first, i);
          }
        }
        EXPECT_EQ(mismatches, 0u) << table->name << " " << name(f) << " scale " << scale << ", first at " << first;
        EXPECT_EQ(got[n], 0xAB) << "wrote past the end";
      }
    }
  }
}

TEST_P(ConvertKernel, EncodeFloatMatchesScalar) {
  check_encode<float>(kernels(), &KernelTable::encode_f32);
}
TEST_P(ConvertKernel, EncodeLongArraysMatchScalar) {
  check_long_encode<float>(kernels(), &KernelTable::encode_f32);
  check_long_encode<bfloat16>(kernels(), &KernelTable::encode_bf16);
  check_long_encode<float16>(kernels(), &KernelTable::encode_f16);
}
TEST_P(ConvertKernel, EncodeBfloat16MatchesScalar) {
  check_encode<bfloat16>(kernels(), &KernelTable::encode_bf16);
}
TEST_P(ConvertKernel, EncodeFloat16MatchesScalar) {
  check_encode<float16>(kernels(), &KernelTable::encode_f16);
}

// Per-segment scales (block quantization): every table against the scalar one, full and partial segments.
TEST_P(ConvertKernel, EncodeSegmentsMatchesScalar) {
  const KernelTable* table = kernels();
  const auto x = test_floats(4096 + 77, 21);
  {
    for (Format f : kAllFormats) {
      for (Overflow o : {Overflow::kNonSaturating, Overflow::kSaturate}) {
        auto params = convert_detail::make_encode_params(CastOptions{f, o});
        for (std::size_t segment :
             {std::size_t{32}, std::size_t{64}, std::size_t{128}, std::size_t{48}, std::size_t{7}}) {
          for (std::size_t n : {std::size_t{0}, std::size_t{31}, std::size_t{32}, std::size_t{1000}, x.size()}) {
            params.streaming_stores = (n + segment) % 2 == 0;  // both store kinds
            std::vector<float> scales((n + segment - 1) / segment + 1);
            for (std::size_t k = 0; k < scales.size(); ++k)
              scales[k] = k % 3 == 0 ? 1.0f : 0.37f * static_cast<float>(k + 1);
            std::vector<std::uint8_t> want(n), got(n);
            convert_detail::scalar_kernels().encode_f32_segments(x.data(), want.data(), n, segment, scales.data(),
                                                                 params);
            table->encode_f32_segments(x.data(), got.data(), n, segment, scales.data(), params);
            ASSERT_EQ(want, got) << table->name << " " << name(f) << " segment " << segment << " n " << n;
            // and the scalar table is the codec applied with each segment's scale
            for (std::size_t i = 0; i < n; ++i) {
              const float s = scales[i / segment];
              ASSERT_EQ(want[i], encode(s == 1.0f ? x[i] : x[i] * s, EncodeSpec{f, o})) << i;
            }
          }
        }
      }
    }
  }
}

// Per-segment dequantization scales: every table against the scalar one and the codec.
TEST_P(ConvertKernel, DecodeSegmentsMatchesScalar) {
  const KernelTable* table = kernels();
  std::vector<std::uint8_t> codes(4096 + 40);
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint8_t>(i * 37 + (i >> 8));
  for (Format f : kAllFormats) {
    for (std::size_t segment : {std::size_t{16}, std::size_t{32}, std::size_t{128}, std::size_t{40}}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{15}, std::size_t{16}, std::size_t{1000}, codes.size()}) {
        std::vector<float> scales((n + segment - 1) / segment + 1);
        for (std::size_t k = 0; k < scales.size(); ++k)
          scales[k] = k % 3 == 0 ? 1.0f : 0.37f * static_cast<float>(k + 1);
        std::vector<float> want(n), storage(n + 12);
        // Both store kinds; the output 32-byte aligned and 16 bytes past that (AVX2 streams with 32-byte stores
        // where the output allows them, with 16-byte ones otherwise).
        const auto aligned = (32 - reinterpret_cast<std::uintptr_t>(storage.data()) % 32) % 32 / sizeof(float);
        for (bool streaming : {false, true}) {
          for (std::size_t offset : {aligned, aligned + 4}) {
            const convert_detail::DecodeParams params{f, 1.0f, streaming};
            float* got = storage.data() + offset;
            convert_detail::scalar_kernels().decode_f32_segments(codes.data(), want.data(), n, segment, scales.data(),
                                                                 params);
            table->decode_f32_segments(codes.data(), got, n, segment, scales.data(), params);
            for (std::size_t i = 0; i < n; ++i) {
              ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i]))
                  << table->name << " " << name(f) << " " << i << (streaming ? " streaming" : "") << " at offset "
                  << offset - aligned;
              const float s = scales[i / segment];
              const float v = decode_to_float(f, codes[i]);
              const float ref = s == 1.0f ? v : v * s;
              ASSERT_TRUE(std::bit_cast<std::uint32_t>(want[i]) == std::bit_cast<std::uint32_t>(ref) ||
                          (std::isnan(ref) && std::isnan(want[i])));
            }
          }
        }
      }
    }
  }
}

// All 2^16 values of a 16-bit type, in bit order.
template <typename T>
std::vector<T> every_half() {
  std::vector<T> all(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) all[i] = T::from_bits(static_cast<std::uint16_t>(i));
  return all;
}

// All 2^16 bfloat16 and float16 inputs, every format and policy.
TEST_P(ConvertKernel, EveryHalfInput) {
  const KernelTable* table = kernels();
  const auto bf = every_half<bfloat16>();
  const auto hf = every_half<float16>();
  {
    for (Format f : kAllFormats) {
      for (Overflow o : {Overflow::kNonSaturating, Overflow::kSaturate}) {
        const auto params = convert_detail::make_encode_params(CastOptions{f, o});
        std::vector<std::uint8_t> want(65536), got(65536);
        convert_detail::scalar_kernels().encode_bf16(bf.data(), want.data(), 65536, params);
        table->encode_bf16(bf.data(), got.data(), 65536, params);
        ASSERT_EQ(want, got) << table->name << " bf16 " << name(f);
        convert_detail::scalar_kernels().encode_f16(hf.data(), want.data(), 65536, params);
        table->encode_f16(hf.data(), got.data(), 65536, params);
        ASSERT_EQ(want, got) << table->name << " f16 " << name(f);
      }
    }
  }
}

// A caller's denormals-are-zero / flush-to-zero mode (MXCSR) changes no unscaled encoder's result: the kernels add
// float32 subnormals in places (the 16-bit input kernels widen float16 subnormals to them), so all 2^16 bfloat16 and
// float16 inputs and float32 subnormals of both signs run with DAZ and FTZ set, against the scalar table without.
// A scaled encode multiplies x * scale as float32 under the caller's mode, as the scalar table does: there the
// scalar table runs under the same mode.
TEST_P(ConvertKernel, EncodersUnderDenormalsAreZero) {
  const KernelTable* table = kernels();
  const auto bf = every_half<bfloat16>();
  const auto hf = every_half<float16>();
  std::vector<float> f32;
  for (std::uint32_t m = 1; m < (1u << 23); m = m * 3 + 1) {
    f32.push_back(std::bit_cast<float>(m));
    f32.push_back(std::bit_cast<float>(m | 0x80000000u));
  }
  for (Format f : kAllFormats) {
    for (Overflow o : {Overflow::kNonSaturating, Overflow::kSaturate}) {
      for (float scale : {1.0f, 0.5f}) {
        const auto params = convert_detail::make_encode_params(CastOptions{f, o, Rounding::kNearestEven, scale});
        std::vector<std::uint8_t> want_bf(65536), want_hf(65536), want_f(f32.size());
        std::vector<std::uint8_t> got_bf(65536), got_hf(65536), got_f(f32.size());
        const unsigned saved = _mm_getcsr();
        if (scale != 1.0f) _mm_setcsr(saved | 0x8040u);  // FTZ | DAZ
        convert_detail::scalar_kernels().encode_bf16(bf.data(), want_bf.data(), bf.size(), params);
        convert_detail::scalar_kernels().encode_f16(hf.data(), want_hf.data(), hf.size(), params);
        convert_detail::scalar_kernels().encode_f32(f32.data(), want_f.data(), f32.size(), params);
        _mm_setcsr(saved | 0x8040u);
        table->encode_bf16(bf.data(), got_bf.data(), bf.size(), params);
        table->encode_f16(hf.data(), got_hf.data(), hf.size(), params);
        table->encode_f32(f32.data(), got_f.data(), f32.size(), params);
        _mm_setcsr(saved);
        ASSERT_EQ(want_bf, got_bf) << table->name << " bf16 " << name(f) << " scale " << scale;
        ASSERT_EQ(want_hf, got_hf) << table->name << " f16 " << name(f) << " scale " << scale;
        ASSERT_EQ(want_f, got_f) << table->name << " f32 subnormals " << name(f) << " scale " << scale;
      }
    }
  }
}

template <typename Out>
std::uint32_t bits_of(Out x) {
  if constexpr (std::is_same_v<Out, float>) {
    return std::bit_cast<std::uint32_t>(x);
  } else {
    return x.bits;
  }
}

template <typename Out>
void check_decode(const KernelTable* table, convert_detail::DecodeFn<Out>(KernelTable::*member)) {
  std::vector<std::uint8_t> codes(4096 + 8);
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint8_t>(i * 37 + (i >> 8));
  for (int c = 0; c < 256; ++c) codes[c] = static_cast<std::uint8_t>(c);  // every code, in order
  {
    for (Format f : kAllFormats) {
      for (float scale_inv : kScales) {
        for (std::size_t n : kLengths) {
          const convert_detail::DecodeParams params{f, scale_inv, (n % 2) == 1};
          for (std::size_t misalign : {0, 1, 5}) {
            if (n + misalign > codes.size()) continue;
            Out guard{};
            if constexpr (std::is_same_v<Out, float>) {
              guard = -12345.0f;
            } else {
              guard = Out::from_bits(0xABCD);
            }
            std::vector<Out> want(n), got(n + misalign + 1, guard);
            (convert_detail::scalar_kernels().*member)(codes.data() + misalign, want.data(), n, params);
            (table->*member)(codes.data() + misalign, got.data() + misalign, n, params);
            for (std::size_t i = 0; i < n; ++i) {
              ASSERT_EQ(bits_of(got[misalign + i]), bits_of(want[i]))
                  << table->name << " " << name(f) << " code " << int(codes[misalign + i]) << " scale_inv "
                  << scale_inv;
            }
          }
        }
      }
    }
  }
}

TEST_P(ConvertKernel, DecodeFloatMatchesScalar) {
  check_decode<float>(kernels(), &KernelTable::decode_f32);
}
TEST_P(ConvertKernel, DecodeBfloat16MatchesScalar) {
  check_decode<bfloat16>(kernels(), &KernelTable::decode_bf16);
}
TEST_P(ConvertKernel, DecodeFloat16MatchesScalar) {
  check_decode<float16>(kernels(), &KernelTable::decode_f16);
}

// Stochastic rounding: each table's kernels give the scalar loop's results for the same seed and stream offset,
// for every format, policy, scale and input type (the AVX2 table delegates to the scalar loop).
TEST_P(ConvertKernel, StochasticMatchesScalar) {
  const KernelTable* table = kernels();
  const auto base = test_floats(3000, 17);
  const auto bf = narrow_all<bfloat16>(base);
  const auto hf = narrow_all<float16>(base);
  for (Format f : kAllFormats) {
    for (Overflow o : {Overflow::kNonSaturating, Overflow::kSaturate}) {
      for (float scale : {1.0f, 3.0f, 1e-3f}) {
        for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{12345}}) {
          auto params = convert_detail::make_encode_params(
              CastOptions{f, o, Rounding::kStochastic, scale, /*seed=*/7 + offset, offset});
          for (std::size_t n : {std::size_t{1}, std::size_t{17}, std::size_t{64}, std::size_t{100}, base.size()}) {
            std::vector<std::uint8_t> want(n), got(n);
            table->encode_f32(base.data(), got.data(), n, params);
            convert_detail::scalar_kernels().encode_f32(base.data(), want.data(), n, params);
            ASSERT_EQ(got, want) << table->name << " f32 " << name(f) << " scale " << scale << " n " << n;
            table->encode_bf16(bf.data(), got.data(), n, params);
            convert_detail::scalar_kernels().encode_bf16(bf.data(), want.data(), n, params);
            ASSERT_EQ(got, want) << table->name << " bf16 " << name(f) << " scale " << scale << " n " << n;
            table->encode_f16(hf.data(), got.data(), n, params);
            convert_detail::scalar_kernels().encode_f16(hf.data(), want.data(), n, params);
            ASSERT_EQ(got, want) << table->name << " f16 " << name(f) << " scale " << scale << " n " << n;
          }
        }
      }
    }
  }
}

// The public entries dispatch by level: capped at each level this CPU runs, they give the scalar results.
class ConvertLevel : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override { FP8KIT_SKIP_UNLESS_RUNS(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Levels, ConvertLevel, ::testing::ValuesIn(kAllIsas), testing::isa_param_name);

TEST_P(ConvertLevel, PublicEntriesMatchScalar) {
  testing::ScopedIsa cap(GetParam());
  EXPECT_EQ(conversion_isa(), name(convert_detail::kernel_tables().at(GetParam()).isa));
  const auto x = test_floats(70000, 3);
  for (Format f : kAllFormats) {
    for (Rounding r : {Rounding::kNearestEven, Rounding::kStochastic}) {
      const CastOptions options{f, Overflow::kSaturate, r, 0.75f, 99};
      std::vector<std::uint8_t> got(x.size()), want(x.size());
      cast_to_fp8(x, got, options);
      convert_detail::scalar_kernels().encode_f32(x.data(), want.data(), x.size(),
                                                  convert_detail::make_encode_params(options));
      ASSERT_EQ(got, want) << name(GetParam()) << " " << name(f);
      std::vector<float> back(x.size()), ref(x.size());
      cast_from_fp8(got, f, back, 3.0f);
      for (std::size_t i = 0; i < x.size(); ++i) ref[i] = decode_to_float(f, got[i]) * 3.0f;
      ASSERT_EQ(std::memcmp(back.data(), ref.data(), x.size() * sizeof(float)), 0) << name(f);
    }
  }
}

// The kernel-level entries (SegmentEncoder, decode_segments) at each level: one scale per segment, any segment
// length (multiples of the SIMD width and not), a short last segment; the codec is the reference.
TEST_P(ConvertLevel, SegmentEntriesMatchCodec) {
  testing::ScopedIsa cap(GetParam());
  const auto x = test_floats(4099, 8);
  for (Format f : kAllFormats) {
    for (Overflow o : {Overflow::kSaturate, Overflow::kNonSaturating}) {
      const SegmentEncoder encoder(f, o);
      const EncodeSpec spec{f, o};
      for (std::size_t segment : {std::size_t{1}, std::size_t{17}, std::size_t{32}, std::size_t{128}, x.size()}) {
        const std::size_t count = (x.size() + segment - 1) / segment;
        std::vector<float> scales(count), scale_invs(count);
        for (std::size_t k = 0; k < count; ++k) {
          scales[k] = kScales[k % std::size(kScales)];
          scale_invs[k] = 1.0f / scales[k];
        }
        std::vector<std::uint8_t> got(x.size()), want(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) want[i] = encode(x[i] * scales[i / segment], spec);
        for (std::size_t prefetch : {std::size_t{0}, std::size_t{4096}}) {
          encoder.encode_segments(x, got, segment, scales, prefetch);
          ASSERT_EQ(got, want) << name(GetParam()) << " " << name(f) << " segment " << segment;
        }
        // Streaming stores (which the kernels take where the output is 64-byte aligned, as here).
        std::vector<std::uint8_t> storage(x.size() + 64);
        const std::span<std::uint8_t> aligned(
            storage.data() + (64 - reinterpret_cast<std::uintptr_t>(storage.data()) % 64) % 64, x.size());
        encoder.encode_segments(x, aligned, segment, scales, 4096, Stores::kStreaming);
        ASSERT_TRUE(std::equal(aligned.begin(), aligned.end(), want.begin()))
            << name(GetParam()) << " " << name(f) << " segment " << segment << " streaming";
        std::vector<float> back(x.size()), ref(x.size());
        for (Stores stores : {Stores::kCached, Stores::kStreaming}) {
          decode_segments(got, f, back, segment, scale_invs, stores);
          for (std::size_t i = 0; i < x.size(); ++i) ref[i] = decode_to_float(f, got[i]) * scale_invs[i / segment];
          ASSERT_EQ(std::memcmp(back.data(), ref.data(), x.size() * sizeof(float)), 0)
              << name(GetParam()) << " " << name(f) << " segment " << segment;
        }
      }
      std::vector<std::uint8_t> got(x.size()), want(x.size());
      encoder.encode(x, got, 0.375f);
      for (std::size_t i = 0; i < x.size(); ++i) want[i] = encode(x[i] * 0.375f, spec);
      ASSERT_EQ(got, want) << name(GetParam()) << " " << name(f);
    }
  }
}

TEST(Convert, SegmentEntriesRejectBadSizes) {
  const SegmentEncoder encoder(Format::e4m3fn, Overflow::kSaturate);
  std::vector<float> x(100), scales(4), out_f(100);
  std::vector<std::uint8_t> q(100), short_q(99);
  EXPECT_NO_THROW(encoder.encode_segments(x, q, 32, scales));  // 32 + 32 + 32 + 4
  EXPECT_THROW(encoder.encode_segments(x, q, 25, std::span<const float>(scales).first(3)), Error);
  EXPECT_THROW(encoder.encode_segments(x, q, 0, scales), Error);
  EXPECT_THROW(encoder.encode_segments(x, short_q, 32, scales), Error);
  EXPECT_THROW(encoder.encode(x, short_q, 1.0f), Error);
  EXPECT_THROW(decode_segments(q, Format::e4m3fn, out_f, 50, scales), Error);
  // A segment longer than the input is one segment, one scale: SIZE_MAX wrapped the count to 0 (the call with one
  // scale refused, the one with none read a scale past the span).
  const std::span<const float> one = std::span<const float>(scales).first(1), none = one.first(0);
  EXPECT_NO_THROW(encoder.encode_segments(x, q, SIZE_MAX, one));
  EXPECT_THROW(encoder.encode_segments(x, q, SIZE_MAX, none), Error);
  EXPECT_NO_THROW(decode_segments(q, Format::e4m3fn, out_f, SIZE_MAX, one));
  EXPECT_THROW(decode_segments(q, Format::e4m3fn, out_f, SIZE_MAX, none), Error);
  EXPECT_EQ(stores_for(16u << 20), Stores::kStreaming);
  EXPECT_EQ(stores_for((16u << 20) - 1), Stores::kCached);
}

TEST(Convert, PublicEntryAndThreadsAgree) {
  const std::size_t n = (std::size_t{1} << 20) + 77;  // above the parallel threshold, odd tail
  const auto x = test_floats(n, 5);
  for (Format f : kAllFormats) {
    const CastOptions options{f, Overflow::kSaturate, Rounding::kNearestEven, 2.0f};
    std::vector<std::uint8_t> one(n), two(n), ref(n);
    set_num_threads(1);
    cast_to_fp8(x, one, options);
    set_num_threads(2);
    cast_to_fp8(x, two, options);
    convert_detail::scalar_kernels().encode_f32(x.data(), ref.data(), n, convert_detail::make_encode_params(options));
    EXPECT_EQ(one, ref) << name(f);
    EXPECT_EQ(two, ref) << name(f);
    std::vector<float> back1(n), back2(n);
    set_num_threads(1);
    cast_from_fp8(one, f, back1, 0.5f);
    set_num_threads(2);
    cast_from_fp8(one, f, back2, 0.5f);
    EXPECT_EQ(std::memcmp(back1.data(), back2.data(), n * sizeof(float)), 0) << name(f);
  }
}

TEST(Convert, StochasticRoundingIndependentOfThreadsAndChunks) {
  const std::size_t n = (std::size_t{1} << 19) + 3;
  const auto x = test_floats(n, 8);
  const CastOptions options{Format::e5m2, Overflow::kSaturate, Rounding::kStochastic, 1.0f, 42};
  std::vector<std::uint8_t> a(n), b(n), c(n);
  set_num_threads(1);
  cast_to_fp8(x, a, options);
  set_num_threads(2);
  cast_to_fp8(x, b, options);
  EXPECT_EQ(a, b);
  // The second half converted on its own, with the stream offset, continues the same stream.
  CastOptions tail = options;
  tail.stream_offset = n / 2;
  cast_to_fp8(std::span<const float>(x).subspan(n / 2), std::span<std::uint8_t>(c).subspan(n / 2), tail);
  EXPECT_TRUE(std::equal(a.begin() + n / 2, a.end(), c.begin() + n / 2));
  // A different seed changes some results.
  CastOptions other = options;
  other.seed = 43;
  cast_to_fp8(x, c, other);
  EXPECT_NE(a, c);
}

TEST(Convert, RoundTripEveryCodeThroughEveryType) {
  std::vector<std::uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<std::uint8_t>(i);
  for (Format f : kAllFormats) {
    const FormatDescriptor& d = descriptor(f);
    std::vector<float> xf(256);
    std::vector<bfloat16> xb(256);
    cast_from_fp8(codes, f, xf);
    cast_from_fp8(codes, f, xb);
    std::vector<std::uint8_t> back_f(256), back_b(256);
    cast_to_fp8(xf, back_f, CastOptions{f, Overflow::kNonSaturating});
    cast_to_fp8(xb, back_b, CastOptions{f, Overflow::kNonSaturating});
    for (int c = 0; c < 256; ++c) {
      const auto code = static_cast<std::uint8_t>(c);
      if (d.is_nan(code)) {
        EXPECT_TRUE(d.is_nan(back_f[c]));
        EXPECT_TRUE(d.is_nan(back_b[c]));
      } else {
        EXPECT_EQ(back_f[c], code) << name(f);
        EXPECT_EQ(back_b[c], code) << name(f);
      }
    }
  }
}

TEST(Convert, RejectsMismatchedSizes) {
  std::vector<float> x(10);
  std::vector<std::uint8_t> q(9);
  EXPECT_THROW(cast_to_fp8(x, q, CastOptions{Format::e4m3fn, Overflow::kSaturate}), Error);
  EXPECT_THROW(cast_from_fp8(q, Format::e4m3fn, std::span<float>(x)), Error);
  EXPECT_THROW(set_num_threads(0), Error);
}

// set_num_threads is the process's: a thread started later (a server's worker) uses its count, where OpenMP's own
// setting would be the calling thread's alone. ScopedNumThreads is one thread's (the Python package's threads=).
TEST(Convert, ThreadCountIsTheProcesssAndAScopeIsOneThreads) {
  const std::optional<int> before = num_threads_set();
  int seen = 0;
  for (int n : {1, 2}) {
    set_num_threads(n);
    EXPECT_EQ(num_threads(), n);
    std::thread([&] { seen = num_threads(); }).join();
    EXPECT_EQ(seen, n);
  }
  {
    const ScopedNumThreads one(1);
    EXPECT_EQ(num_threads(), 1);
    std::thread([&] { seen = num_threads(); }).join();
    EXPECT_EQ(seen, 2);  // another thread keeps the process's count
    {
      const ScopedNumThreads three(3);
      EXPECT_EQ(num_threads(), 3);
    }
    EXPECT_EQ(num_threads(), 1);
  }
  EXPECT_EQ(num_threads(), 2);
  EXPECT_THROW(ScopedNumThreads(0), Error);
  EXPECT_THROW(ScopedNumThreads(kMaxThreads + 1), Error);
  EXPECT_EQ(num_threads(), 2);
  // Every count gives the same bits (one chunk per thread, chunk boundaries on multiples of 64 elements).
  std::vector<float> x(std::size_t{1} << 19);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 1000) * 0.37f - 100.0f;
  std::vector<std::uint8_t> one(x.size()), three(x.size());
  const CastOptions options{Format::e4m3fn, Overflow::kSaturate};
  {
    const ScopedNumThreads scope(1);
    cast_to_fp8(x, one, options);
  }
  std::thread([&] {
    const ScopedNumThreads scope(3);
    cast_to_fp8(x, three, options);
  }).join();
  EXPECT_EQ(one, three);
  EXPECT_EQ(num_threads_set(), 2);
  set_num_threads(std::nullopt);  // each thread's OpenMP default again
  EXPECT_EQ(num_threads_set(), std::nullopt);
  set_num_threads(before);
}

TEST(Convert, ReportsIsa) {
  // The level in force is the CPU's best (unless FP8KIT_ISA caps it); conversions have tables up to avx512.
  const Isa level = std::min(active_isa(), Isa::kAvx512);
  EXPECT_EQ(conversion_isa(), name(level));
  std::printf("conversion kernels: %s (%s); levels: %s\n", std::string(conversion_kernel()).c_str(),
              std::string(conversion_isa()).c_str(), testing::level_report().c_str());
}

}  // namespace
}  // namespace fp8kit
