// The scalar codec: all 256 codes of every format, the boundary tables of reference §2.2 in both overflow
// policies, an independent brute-force nearest-value oracle, inputs of every type, and stochastic rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "fp8kit/format/codec.hpp"
#include "fp8kit/format/codec_inline.hpp"
#include "fp8kit/format/float8.hpp"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace fp8kit {
namespace {

constexpr Overflow kPolicies[] = {Overflow::kNonSaturating, Overflow::kSaturate};
const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::uint8_t enc(Format f, Overflow o, double x) {
  return encode(x, EncodeSpec{f, o});
}
std::uint8_t encf(Format f, Overflow o, float x) {
  return encode(x, EncodeSpec{f, o});
}

// The float decode table is built on its first use, once per process. Built under flush-to-zero (a caller's
// MXCSR), its one float32 subnormal, e8m0fnu's 2^-127, became 0 for the rest of the process, where the SIMD decodes
// still gave 2^-127. (ctest runs each test in a process of its own, so this one makes the first use.)
#if defined(__x86_64__)
TEST(Codec, DecodeTableIsExactWhenFirstUsedUnderFlushToZero) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // FTZ and DAZ
  const float first = decode_to_float(Format::e8m0fnu, 0x00);
  _mm_setcsr(saved);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(first), 0x00400000u);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(decode_to_float(Format::e8m0fnu, 0x00)), 0x00400000u);
  EXPECT_EQ(decode_to_bfloat16(Format::e8m0fnu, 0x00).bits, 0x0040u);
}
#endif

// ---------------------------------------------------------------- all 256 codes

TEST(Codec, DecodeEveryCodeAndRoundTrip) {
  for (Format f : kAllFormats) {
    const FormatDescriptor& d = descriptor(f);
    int nan_codes = 0;
    for (int c = 0; c < 256; ++c) {
      const auto code = static_cast<std::uint8_t>(c);
      SCOPED_TRACE(std::string(d.name) + " code " + std::to_string(c));
      const double x = decode_to_double(f, code);
      const float xf = decode_to_float(f, code);
      if (d.is_nan(code)) {
        ++nan_codes;
        EXPECT_TRUE(std::isnan(x));
        EXPECT_TRUE(std::isnan(xf));
        for (Overflow o : kPolicies) EXPECT_TRUE(d.is_nan(enc(f, o, x)));
        continue;
      }
      EXPECT_EQ(static_cast<double>(xf), x);                                      // exact in float
      EXPECT_EQ(static_cast<double>(decode_to_bfloat16(f, code).to_float()), x);  // exact in bfloat16
      if (f != Format::e8m0fnu) EXPECT_EQ(static_cast<double>(decode_to_float16(f, code).to_float()), x);
      for (Overflow o : kPolicies) {
        if (d.is_inf(code) && o == Overflow::kSaturate) {
          EXPECT_EQ(enc(f, o, x), static_cast<std::uint8_t>(d.max_code() | (code & 0x80)));
          continue;
        }
        // Every finite code (and Inf, non-saturating) survives the round trip from every input type.
        EXPECT_EQ(enc(f, o, x), code);
        EXPECT_EQ(encf(f, o, xf), code);
        EXPECT_EQ(encode(decode_to_bfloat16(f, code), EncodeSpec{f, o}), code);
        if (f != Format::e8m0fnu) EXPECT_EQ(encode(decode_to_float16(f, code), EncodeSpec{f, o}), code);
      }
    }
    const int expected_nans = d.nan == NanEncoding::kIeee ? 6 : d.nan == NanEncoding::kAllOnes ? 2 : 1;
    EXPECT_EQ(nan_codes, expected_nans) << d.name;
  }
}

// The table-free decode the CUDA kernels run (codec_inline.hpp's decode_code, the same definition on host and
// device) gives decode_to_float's bits for every code of every format, NaN signs included.
TEST(Codec, InlineDecodeIsDecodeToFloatBitForBit) {
  for (Format f : kAllFormats) {
    for (int c = 0; c < 256; ++c) {
      const auto code = static_cast<std::uint8_t>(c);
      EXPECT_EQ(std::bit_cast<std::uint32_t>(codec_detail::decode_code(descriptor(f), code)),
                std::bit_cast<std::uint32_t>(decode_to_float(f, code)))
          << name(f) << " code " << c;
    }
  }
}

TEST(Codec, DecodedValuesAreStrictlyIncreasing) {
  for (Format f : kAllFormats) {
    const FormatDescriptor& d = descriptor(f);
    double previous = -1.0;
    for (int c = 0; c <= d.max_code(); ++c) {
      const double x = decode_to_double(f, static_cast<std::uint8_t>(c));
      EXPECT_GT(x, previous) << d.name << " code " << c;
      previous = x;
    }
  }
}

// ---------------------------------------------------------------- reference §2.2 boundary tables

struct Row {
  double x;
  std::uint8_t nonsat, sat;
};

void check_rows(Format f, std::initializer_list<Row> rows) {
  for (const Row& r : rows) {
    EXPECT_EQ(enc(f, Overflow::kNonSaturating, r.x), r.nonsat) << name(f) << " non-saturating x=" << r.x;
    EXPECT_EQ(enc(f, Overflow::kSaturate, r.x), r.sat) << name(f) << " saturating x=" << r.x;
    EXPECT_EQ(encf(f, Overflow::kNonSaturating, static_cast<float>(r.x)), r.nonsat) << name(f) << " float x=" << r.x;
    EXPECT_EQ(encf(f, Overflow::kSaturate, static_cast<float>(r.x)), r.sat) << name(f) << " float x=" << r.x;
  }
}

TEST(Codec, BoundaryTableE4M3FN) {
  check_rows(
      Format::e4m3fn,
      {{0x1p-10, 0x00, 0x00},  // half the smallest subnormal: tie to even 0
       {0.3, 0x2A, 0x2A},      {240.0, 0x77, 0x77},  {247.9, 0x77, 0x77}, {248.0, 0x78, 0x78}, {448.0, 0x7E, 0x7E},
       {449.0, 0x7E, 0x7E},    {463.9, 0x7E, 0x7E},  {464.0, 0x7E, 0x7E},  // midpoint 448|480: tie to even (448)
       {464.0001, 0x7F, 0x7E}, {465.0, 0x7F, 0x7E},  {470.0, 0x7F, 0x7E}, {479.9, 0x7F, 0x7E}, {480.0, 0x7F, 0x7E},
       {1000.0, 0x7F, 0x7E},   {-465.0, 0xFF, 0xFE}, {kInf, 0x7F, 0x7E},  {-kInf, 0xFF, 0xFE}, {kNaN, 0x7F, 0x7F},
       {-kNaN, 0xFF, 0xFF},    {-0.0, 0x80, 0x80},   {0.0, 0x00, 0x00}});
}

TEST(Codec, BoundaryTableE4M3FNUZ) {
  check_rows(Format::e4m3fnuz, {{0x1p-10, 0x01, 0x01},
                                {0.3, 0x32, 0x32},
                                {240.0, 0x7F, 0x7F},
                                {247.9, 0x7F, 0x7F},
                                {248.0, 0x80, 0x7F},
                                {448.0, 0x80, 0x7F},
                                {464.0, 0x80, 0x7F},
                                {1000.0, 0x80, 0x7F},
                                {-1000.0, 0x80, 0xFF},
                                {kInf, 0x80, 0x7F},
                                {-kInf, 0x80, 0xFF},
                                {kNaN, 0x80, 0x80},
                                {-0.0, 0x00, 0x00},
                                {-0x1p-12, 0x00, 0x00}});  // rounds to zero: +0, there is no -0
}

TEST(Codec, BoundaryTableE5M2) {
  check_rows(Format::e5m2, {{57344.0, 0x7B, 0x7B},
                            {61439.0, 0x7B, 0x7B},
                            {61440.0, 0x7C, 0x7B},  // midpoint, odd mantissa: ties to even rounds up, to Inf
                            {65536.0, 0x7C, 0x7B},
                            {1e6, 0x7C, 0x7B},
                            {-1e6, 0xFC, 0xFB},
                            {kInf, 0x7C, 0x7B},
                            {-kInf, 0xFC, 0xFB},
                            {kNaN, 0x7E, 0x7E},
                            {0x1p-17, 0x00, 0x00},
                            {1.5 * 0x1p-16, 0x02, 0x02},
                            {-0.0, 0x80, 0x80}});
}

TEST(Codec, BoundaryTableE5M2FNUZ) {
  check_rows(Format::e5m2fnuz, {{57344.0, 0x7F, 0x7F},
                                {61440.0, 0x80, 0x7F},
                                {kInf, 0x80, 0x7F},
                                {kNaN, 0x80, 0x80},
                                {0x1p-17, 0x01, 0x01},
                                {0x1p-18, 0x00, 0x00},
                                {-0.0, 0x00, 0x00}});
}

// e8m0fnu: fp8kit follows ml_dtypes (non-saturating): the nearest power of two with ties up, negatives and
// zero are NaN. Saturating: zero becomes the minimum 2^-127, overflow and +Inf the maximum 2^127.
TEST(Codec, E8M0Choices) {
  check_rows(Format::e8m0fnu, {{1.0, 0x7F, 0x7F},
                               {1.4999, 0x7F, 0x7F},
                               {1.5, 0x80, 0x80},  // tie: up
                               {3.0, 0x81, 0x81},
                               {6.0, 0x82, 0x82},
                               {0x1p-127, 0x00, 0x00},
                               {0x1p-128, 0x00, 0x00},  // below the minimum: the minimum (there is no zero)
                               {0x1p-140, 0x00, 0x00},
                               {1.5 * 0x1p-127, 0x01, 0x01},
                               {1.25 * 0x1p-127, 0x00, 0x00},  // nearest (ml_dtypes rounds float subnormals up)
                               {0x1p127, 0xFE, 0xFE},
                               {1.5 * 0x1p127, 0xFF, 0xFE},
                               {0.0, 0xFF, 0x00},
                               {-0.0, 0xFF, 0x00},
                               {-1.0, 0xFF, 0xFF},
                               {kInf, 0xFF, 0xFE},
                               {-kInf, 0xFF, 0xFF},
                               {kNaN, 0xFF, 0xFF}});
}

// ---------------------------------------------------------------- an independent oracle

// The nearest finite value by search over all codes (ties to the even code), then the overflow rule by value.
std::uint8_t oracle(Format f, Overflow o, double x) {
  const FormatDescriptor& d = descriptor(f);
  if (std::isnan(x)) return d.nan_code(std::signbit(x));
  const bool neg = std::signbit(x);
  if (!d.has_sign && neg && x != 0) return d.nan_code(false);
  const double a = std::fabs(x);
  const double max = max_finite(f);
  auto overflow = [&] {
    if (o == Overflow::kSaturate) return static_cast<std::uint8_t>(d.max_code() | (neg ? d.sign_mask() : 0));
    return d.has_inf ? d.inf_code(neg) : d.nan_code(neg);
  };
  if (std::isinf(a)) return overflow();
  if (a == 0 && !d.has_zero()) return o == Overflow::kSaturate ? 0x00 : d.nan_code(false);
  // The value one step past max (what rounding would reach): max + ulp(max).
  const int max_exp = std::ilogb(max);
  const double beyond = max + std::ldexp(1.0, max_exp - d.mantissa_bits);
  if (a > 2 * beyond) return overflow();  // (far away the differences below would lose their low bits)
  // Candidates: every finite code plus "beyond"; pick the nearest, ties to the even code (beyond counts as
  // even when max's code is odd). With no mantissa bits (e8m0fnu) every significand is 1, odd: ties go up.
  const bool ties_up = d.mantissa_bits == 0;
  std::uint8_t best = 0;
  double best_err = INFINITY;
  bool best_beyond = false;
  for (int c = 0; c <= d.max_code(); ++c) {
    const double err = std::fabs(finite_value(d, static_cast<std::uint8_t>(c)) - a);
    if (err < best_err || (err == best_err && (ties_up || c % 2 == 0))) {
      best = static_cast<std::uint8_t>(c);
      best_err = err;
    }
  }
  const double err_beyond = std::fabs(beyond - a);
  if (err_beyond < best_err || (err_beyond == best_err && (ties_up || d.max_code() % 2 == 1))) best_beyond = true;
  if (best_beyond) return overflow();
  if (best == 0 && !d.has_negative_zero()) return 0;
  return static_cast<std::uint8_t>(best | (neg ? d.sign_mask() : 0));
}

TEST(Codec, AgreesWithBruteForceOracle) {
  std::mt19937_64 rng(12345);
  std::vector<float> inputs;
  for (Format f : kAllFormats) {
    // every code's value, its neighbours and the midpoints between codes, nudged by one float ulp either way
    for (int c = 0; c < 256; ++c) {
      const double x = decode_to_double(f, static_cast<std::uint8_t>(c));
      const double y = decode_to_double(f, static_cast<std::uint8_t>(c + 1));
      for (double v : {x, (x + y) / 2}) {
        if (!std::isfinite(v)) continue;
        const float fv = static_cast<float>(v);
        inputs.insert(inputs.end(), {fv, std::nextafter(fv, 0.0f), std::nextafter(fv, kInf), -fv});
      }
    }
  }
  for (int i = 0; i < 20000; ++i) inputs.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  std::uniform_real_distribution<float> log_mag(-30.0f, 20.0f);
  for (int i = 0; i < 20000; ++i) inputs.push_back(std::exp2(log_mag(rng)) * ((i & 1) ? -1.0f : 1.0f));
  long mismatches = 0;
  for (Format f : kAllFormats) {
    for (Overflow o : kPolicies) {
      for (float x : inputs) {
        const std::uint8_t want = oracle(f, o, x);
        const std::uint8_t got = encf(f, o, x);
        if (want != got && ++mismatches < 20) {
          ADD_FAILURE() << name(f) << " x=" << std::hexfloat << x << " oracle " << int(want) << " codec " << int(got);
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// ---------------------------------------------------------------- input types: no intermediate rounding

TEST(Codec, DoubleIsRoundedOnceNotThroughFloat) {
  // 464 + 2^-30 rounds to 480 (NaN) in e4m3fn. Through float it would first become 464 and tie to 448.
  const double x = 464.0 + 0x1p-30;
  EXPECT_EQ(static_cast<float>(x), 464.0f);
  EXPECT_EQ(enc(Format::e4m3fn, Overflow::kNonSaturating, x), 0x7F);
  EXPECT_EQ(encf(Format::e4m3fn, Overflow::kNonSaturating, static_cast<float>(x)), 0x7E);
  // Just below a midpoint between 1.0 and 1.125: down, although float would round it onto the midpoint.
  const double y = 1.0625 - 0x1p-40;
  EXPECT_EQ(static_cast<float>(y), 1.0625f);
  EXPECT_EQ(enc(Format::e4m3fn, Overflow::kSaturate, y), 0x38);
  EXPECT_EQ(enc(Format::e4m3fn, Overflow::kSaturate, 1.0625 + 0x1p-40), 0x39);
  // Double subnormals and huge doubles.
  EXPECT_EQ(enc(Format::e5m2, Overflow::kSaturate, 4.9e-324), 0x00);
  EXPECT_EQ(enc(Format::e5m2, Overflow::kSaturate, -4.9e-324), 0x80);
  EXPECT_EQ(enc(Format::e5m2, Overflow::kSaturate, 1e300), 0x7B);
  EXPECT_EQ(enc(Format::e8m0fnu, Overflow::kSaturate, 1e-300), 0x00);
}

TEST(Codec, HalfInputsMatchTheirExactFloatValue) {
  for (Format f : kAllFormats) {
    for (Overflow o : kPolicies) {
      for (std::uint32_t b = 0; b < 65536; ++b) {
        const auto bits = static_cast<std::uint16_t>(b);
        const bfloat16 h = bfloat16::from_bits(bits);
        ASSERT_EQ(encode(h, EncodeSpec{f, o}), encf(f, o, h.to_float())) << name(f) << " bf16 " << b;
        const float16 g = float16::from_bits(bits);
        ASSERT_EQ(encode(g, EncodeSpec{f, o}), encf(f, o, g.to_float())) << name(f) << " f16 " << b;
      }
    }
  }
}

TEST(Codec, ScalarTypes) {
  const auto x = float8_e4m3fn::from_float(449.0f, Overflow::kNonSaturating);
  EXPECT_EQ(x.bits, 0x7E);
  EXPECT_EQ(x.to_float(), 448.0f);
  EXPECT_TRUE(float8_e4m3fn::from_float(465.0f, Overflow::kNonSaturating).is_nan());
  EXPECT_EQ(float8_e4m3fn::from_float(465.0f, Overflow::kSaturate).to_float(), 448.0f);
  EXPECT_TRUE(float8_e5m2::from_float(1e6f, Overflow::kNonSaturating).is_inf());
  EXPECT_EQ(float8_e4m3fnuz::from_float(-0.0f, Overflow::kSaturate).bits, 0x00);
  EXPECT_EQ(float8_e8m0fnu::from_double(0.25, Overflow::kSaturate).to_double(), 0.25);
  static_assert(!std::is_convertible_v<float8_e4m3fn, float>);
  static_assert(!std::is_convertible_v<float, float8_e4m3fn>);
  static_assert(sizeof(float8_e4m3fn) == 1);
}

// ---------------------------------------------------------------- stochastic rounding

TEST(Codec, StochasticRoundingIsUnbiasedAndReproducible) {
  const EncodeSpec spec{Format::e4m3fn, Overflow::kSaturate, Rounding::kStochastic};
  for (float x : {1.1f, 0.1f, -3.3f, 300.0f, 0.0031f, 1.0f + 0x1p-20f}) {
    // The two neighbours of x among the format's values.
    double lo = -INFINITY, hi = INFINITY;
    for (int c = 0; c < 256; ++c) {
      const double v = decode_to_double(Format::e4m3fn, static_cast<std::uint8_t>(c));
      if (std::isnan(v)) continue;
      if (v <= x && v > lo) lo = v;
      if (v >= x && v < hi) hi = v;
    }
    double sum = 0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
      const std::uint8_t c = encode(x, spec, stochastic_bits(7, static_cast<std::uint64_t>(i)));
      const double v = decode_to_double(Format::e4m3fn, c);
      ASSERT_TRUE(v == lo || v == hi) << "x=" << x << " gave " << v;
      sum += v;
    }
    const double mean = sum / n;
    // Each sample is lo or hi: the standard error of the mean is at most (hi - lo) / 2 / sqrt(n); allow 5 of them.
    EXPECT_NEAR(mean, x, 5 * (hi - lo) / 2 / std::sqrt(n)) << "x=" << x;
  }
  // Exactly representable values never move.
  for (std::uint32_t r : {0u, 1u, 0x7FFFFFFFu, 0xFFFFFFFFu}) EXPECT_EQ(encode(1.125f, spec, r), 0x39);
  // Same seed and index: same bits; the stream differs across seeds.
  EXPECT_EQ(stochastic_bits(1, 5), stochastic_bits(1, 5));
  EXPECT_NE(stochastic_bits(1, 5), stochastic_bits(2, 5));
  EXPECT_NE(stochastic_bits(1, 5), stochastic_bits(1, 6));
  // Overflow still follows the policy: just below max + ulp rounds up with high probability.
  EXPECT_EQ(encode(479.0f, EncodeSpec{Format::e4m3fn, Overflow::kNonSaturating, Rounding::kStochastic}, 0), 0x7F);
  EXPECT_EQ(encode(479.0f, EncodeSpec{Format::e4m3fn, Overflow::kSaturate, Rounding::kStochastic}, 0), 0x7E);
}

}  // namespace
}  // namespace fp8kit
