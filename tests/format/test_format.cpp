// Format descriptors and numeric_limits against hand-written goldens (reference/fp8-systems-and-numerics.md
// §2.1).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "fp8kit/format/float8.hpp"
#include "fp8kit/format/format.hpp"

namespace fp8kit {
namespace {

struct Golden {
  Format format;
  int exponent_bits, mantissa_bits, bias;
  double max, min_normal;
  double min_subnormal;  // 0: none
  std::uint8_t max_code;
  bool has_inf, has_negative_zero;
};

// Written by hand from the OCP spec, c10 and ml_dtypes; not derived from the descriptors.
const Golden kGoldens[] = {
    {Format::e4m3fn, 4, 3, 7, 448.0, 0x1p-6, 0x1p-9, 0x7E, false, true},
    {Format::e5m2, 5, 2, 15, 57344.0, 0x1p-14, 0x1p-16, 0x7B, true, true},
    {Format::e4m3fnuz, 4, 3, 8, 240.0, 0x1p-7, 0x1p-10, 0x7F, false, false},
    {Format::e5m2fnuz, 5, 2, 16, 57344.0, 0x1p-15, 0x1p-17, 0x7F, false, false},
    {Format::e8m0fnu, 8, 0, 127, 0x1p127, 0x1p-127, 0.0, 0xFE, false, false},
};

TEST(Format, EveryFormatHasAGolden) {
  EXPECT_EQ(std::size(kGoldens), kAllFormats.size());
}

TEST(Format, DescriptorsMatchHandGoldens) {
  for (const Golden& g : kGoldens) {
    SCOPED_TRACE(std::string(name(g.format)));
    const FormatDescriptor& d = descriptor(g.format);
    EXPECT_EQ(d.format, g.format);
    EXPECT_EQ(d.exponent_bits, g.exponent_bits);
    EXPECT_EQ(d.mantissa_bits, g.mantissa_bits);
    EXPECT_EQ(d.bias, g.bias);
    EXPECT_EQ(d.max_code(), g.max_code);
    EXPECT_EQ(max_finite(g.format), g.max);
    EXPECT_EQ(min_normal(g.format), g.min_normal);
    EXPECT_EQ(min_subnormal(g.format).value_or(0.0), g.min_subnormal);
    EXPECT_EQ(d.has_inf, g.has_inf);
    EXPECT_EQ(d.has_negative_zero(), g.has_negative_zero);
  }
}

TEST(Format, SpecialEncodings) {
  const auto& e4 = descriptor(Format::e4m3fn);
  EXPECT_TRUE(e4.is_nan(0x7F));
  EXPECT_TRUE(e4.is_nan(0xFF));
  for (int c = 0x78; c <= 0x7E; ++c) EXPECT_FALSE(e4.is_nan(static_cast<std::uint8_t>(c))) << c;  // 256..448 finite
  EXPECT_EQ(e4.nan_code(false), 0x7F);
  EXPECT_EQ(e4.nan_code(true), 0xFF);
  const auto& e5 = descriptor(Format::e5m2);
  EXPECT_TRUE(e5.is_inf(0x7C));
  EXPECT_TRUE(e5.is_inf(0xFC));
  for (int c : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}) EXPECT_TRUE(e5.is_nan(static_cast<std::uint8_t>(c))) << c;
  EXPECT_EQ(e5.nan_code(false), 0x7E);
  EXPECT_EQ(e5.inf_code(true), 0xFC);
  for (Format f : {Format::e4m3fnuz, Format::e5m2fnuz}) {
    const auto& d = descriptor(f);
    int nans = 0;
    for (int c = 0; c < 256; ++c) nans += d.is_nan(static_cast<std::uint8_t>(c));
    EXPECT_EQ(nans, 1);
    EXPECT_TRUE(d.is_nan(0x80));
    EXPECT_EQ(d.nan_code(true), 0x80);
  }
  const auto& e8 = descriptor(Format::e8m0fnu);
  EXPECT_TRUE(e8.is_nan(0xFF));
  EXPECT_FALSE(e8.is_nan(0x80));  // no sign bit: 0x80 is 2^1
  EXPECT_EQ(finite_value(e8, 0x80), 2.0);
  EXPECT_EQ(finite_value(e8, 0x00), 0x1p-127);
}

TEST(Format, ParseNames) {
  for (Format f : kAllFormats) {
    EXPECT_EQ(parse_format(descriptor(f).name), f);
    EXPECT_EQ(parse_format(descriptor(f).torch_name), f);
  }
  EXPECT_FALSE(parse_format("e4m3").has_value());
  EXPECT_FALSE(parse_format("").has_value());
  EXPECT_FALSE(parse_format("E4M3FN").has_value());
}

template <typename T>
double v(T x) {
  return x.to_double();
}

TEST(NumericLimits, E4M3FN) {
  using L = std::numeric_limits<float8_e4m3fn>;
  EXPECT_EQ(L::max().bits, 0x7E);
  EXPECT_EQ(v(L::max()), 448.0);
  EXPECT_EQ(L::lowest().bits, 0xFE);
  EXPECT_EQ(v(L::lowest()), -448.0);
  EXPECT_EQ(L::min().bits, 0x08);
  EXPECT_EQ(v(L::min()), 0x1p-6);
  EXPECT_EQ(L::epsilon().bits, 0x20);
  EXPECT_EQ(v(L::epsilon()), 0.125);
  EXPECT_EQ(v(L::round_error()), 0.5);
  EXPECT_EQ(v(L::denorm_min()), 0x1p-9);
  EXPECT_TRUE(L::quiet_NaN().is_nan());
  EXPECT_FALSE(L::has_infinity);
  EXPECT_EQ(L::digits, 4);
  EXPECT_EQ(L::min_exponent, -5);
  EXPECT_EQ(L::max_exponent, 9);
  EXPECT_TRUE(L::is_signed);
}

TEST(NumericLimits, E5M2) {
  using L = std::numeric_limits<float8_e5m2>;
  EXPECT_EQ(v(L::max()), 57344.0);
  EXPECT_EQ(v(L::lowest()), -57344.0);
  EXPECT_EQ(v(L::min()), 0x1p-14);
  EXPECT_EQ(v(L::epsilon()), 0.25);
  EXPECT_EQ(v(L::denorm_min()), 0x1p-16);
  EXPECT_TRUE(L::has_infinity);
  EXPECT_TRUE(std::isinf(v(L::infinity())));
  EXPECT_EQ(L::infinity().bits, 0x7C);
  EXPECT_EQ(L::digits, 3);
  EXPECT_EQ(L::min_exponent, -13);
  EXPECT_EQ(L::max_exponent, 16);
}

TEST(NumericLimits, Fnuz) {
  using A = std::numeric_limits<float8_e4m3fnuz>;
  EXPECT_EQ(v(A::max()), 240.0);
  EXPECT_EQ(v(A::lowest()), -240.0);
  EXPECT_EQ(v(A::min()), 0x1p-7);
  EXPECT_EQ(v(A::denorm_min()), 0x1p-10);
  EXPECT_EQ(v(A::epsilon()), 0.125);
  EXPECT_EQ(A::quiet_NaN().bits, 0x80);
  using B = std::numeric_limits<float8_e5m2fnuz>;
  EXPECT_EQ(v(B::max()), 57344.0);
  EXPECT_EQ(v(B::min()), 0x1p-15);
  EXPECT_EQ(v(B::denorm_min()), 0x1p-17);
  EXPECT_EQ(v(B::epsilon()), 0.25);
  EXPECT_FALSE(B::has_infinity);
}

TEST(NumericLimits, E8M0) {
  using L = std::numeric_limits<float8_e8m0fnu>;
  EXPECT_FALSE(L::is_signed);
  EXPECT_EQ(v(L::max()), 0x1p127);
  EXPECT_EQ(v(L::min()), 0x1p-127);
  EXPECT_EQ(v(L::lowest()), 0x1p-127);
  EXPECT_EQ(v(L::epsilon()), 1.0);
  EXPECT_EQ(v(L::round_error()), 0.5);
  EXPECT_EQ(L::quiet_NaN().bits, 0xFF);
  EXPECT_EQ(L::has_denorm, std::denorm_absent);
  EXPECT_EQ(L::digits, 1);
}

}  // namespace
}  // namespace fp8kit
