// parse_number against an oracle of its own: for every tie between neighbouring bfloat16 and float16 values (and
// float32 ones across every exponent), the exact decimal and hex-float texts of the tie and texts just above and just
// below it, built with exact digit arithmetic here (no library parsing or printing), must round to even, up and
// down; then the spellings, white space, huge exponents and texts that are not numbers.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fp8kit/format/half.hpp"
#include "fp8kit/format/parse_number.hpp"

namespace fp8kit {
namespace {

// ---------------------------------------------------------------- exact texts of m * 2^e

// Decimal digits (most significant first) of a non-negative integer, times a small factor.
void multiply(std::string& digits, int factor) {
  int carry = 0;
  for (auto it = digits.rbegin(); it != digits.rend(); ++it) {
    const int d = (*it - '0') * factor + carry;
    *it = static_cast<char>('0' + d % 10);
    carry = d / 10;
  }
  while (carry > 0) {
    digits.insert(digits.begin(), static_cast<char>('0' + carry % 10));
    carry /= 10;
  }
}

// The exact decimal text of mantissa * 2^exponent (mantissa > 0): "257", "0.0000152587890625".
std::string exact_decimal(std::uint64_t mantissa, int exponent) {
  std::string digits = std::to_string(mantissa);
  if (exponent >= 0) {
    for (int i = 0; i < exponent; ++i) multiply(digits, 2);
    return digits;
  }
  // mantissa * 2^-k = mantissa * 5^k / 10^k
  const int k = -exponent;
  for (int i = 0; i < k; ++i) multiply(digits, 5);
  if (static_cast<int>(digits.size()) <= k) digits.insert(0, static_cast<std::size_t>(k + 1) - digits.size(), '0');
  std::string text = digits.substr(0, digits.size() - static_cast<std::size_t>(k)) + "." +
                     digits.substr(digits.size() - static_cast<std::size_t>(k));
  while (text.back() == '0') text.pop_back();
  if (text.back() == '.') text.pop_back();
  return text;
}

// A decimal text a little above / below the exact one (by 10^-26 of its last place).
std::string decimal_above(std::string exact) {
  if (exact.find('.') == std::string::npos) exact += ".";
  return exact + std::string(25, '0') + "1";
}
std::string decimal_below(std::string exact) {
  if (exact.find('.') == std::string::npos) {
    // An integer: one less, then .999...
    std::size_t i = exact.size();
    while (i-- > 0) {
      if (exact[i] != '0') {
        --exact[i];
        break;
      }
      exact[i] = '9';
    }
    if (exact.size() > 1 && exact[0] == '0') exact.erase(0, 1);
    return exact + "." + std::string(26, '9');
  }
  // The last fractional digit is not 0 (exact_decimal strips them): one less there, then 9s.
  --exact.back();
  return exact + std::string(26, '9');
}

std::string hex(std::uint64_t v) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  do {
    s.insert(s.begin(), kDigits[v % 16]);
    v /= 16;
  } while (v != 0);
  return s;
}

// "0x<m>p<e>" and texts a little above and below it in hex digits.
std::string hex_exact(std::uint64_t mantissa, int exponent) {
  return "0x" + hex(mantissa) + "p" + std::to_string(exponent);
}
std::string hex_above(std::uint64_t mantissa, int exponent) {
  return "0x" + hex(mantissa) + "." + std::string(24, '0') + "1p" + std::to_string(exponent);
}
std::string hex_below(std::uint64_t mantissa, int exponent) {
  return "0x" + hex(mantissa - 1) + "." + std::string(25, 'f') + "p" + std::to_string(exponent);
}

// ---------------------------------------------------------------- the 16-bit layouts

struct Layout {
  Precision precision;
  int mantissa_bits, bias, max_field;  // max_field: the all-ones exponent (Inf/NaN)
};
constexpr Layout kBf16{Precision::kBfloat16, 7, 127, 255};
constexpr Layout kF16{Precision::kFloat16, 10, 15, 31};

// The value of positive bits `b` (finite) of the layout as mantissa * 2^exponent, mantissa an integer.
void value_of(const Layout& l, std::uint32_t b, std::uint64_t& mantissa, int& exponent) {
  const std::uint32_t field = b >> l.mantissa_bits, fraction = b & ((1u << l.mantissa_bits) - 1);
  mantissa = field == 0 ? fraction : (fraction | (1u << l.mantissa_bits));
  exponent = (field == 0 ? 1 : static_cast<int>(field)) - l.bias - l.mantissa_bits;
}

struct Case {
  std::string text;
  std::uint16_t want;
};

// For each pair of neighbours (b, b + 1) among the positive finite values, and (max, Inf): the tie between them
// m = (v(b) + v(b + 1)) / 2 = (2 mantissa + 1) * 2^(exponent - 1) exactly, as six texts.
std::vector<Case> tie_cases(const Layout& l) {
  std::vector<Case> cases;
  const std::uint32_t inf = static_cast<std::uint32_t>(l.max_field) << l.mantissa_bits;
  for (std::uint32_t b = 0; b < inf; ++b) {
    std::uint64_t mantissa = 0;
    int exponent = 0;
    value_of(l, b, mantissa, exponent);
    // The tie's odd mantissa at one exponent lower (b + 1 has the same exponent, or the next one at a binade edge,
    // where its value 2^k is still (mantissa + 1) * 2^exponent).
    const std::uint64_t tie = 2 * mantissa + 1;
    const int tie_exponent = exponent - 1;
    const auto up = static_cast<std::uint16_t>(b + 1);  // inf for b = the largest finite value
    const auto even = static_cast<std::uint16_t>((b & 1) == 0 ? b : b + 1);
    const auto down = static_cast<std::uint16_t>(b);
    const std::string decimal = exact_decimal(tie, tie_exponent);
    cases.push_back({decimal, even});
    cases.push_back({decimal_above(decimal), up});
    cases.push_back({decimal_below(decimal), down});
    cases.push_back({hex_exact(tie, tie_exponent), even});
    cases.push_back({hex_above(tie, tie_exponent), up});
    cases.push_back({hex_below(tie, tie_exponent), down});
  }
  return cases;
}

void check_ties(const Layout& l) {
  std::size_t checked = 0, wrong = 0;
  for (const Case& c : tie_cases(l)) {
    for (bool negative : {false, true}) {
      const std::string text = (negative ? "-" : "") + c.text;
      const auto want = static_cast<std::uint16_t>(c.want | (negative ? 0x8000u : 0u));
      const auto got = parse_number(text, l.precision);
      ++checked;
      if (!got || got->bits != want) {
        if (++wrong <= 10) {
          ADD_FAILURE() << name(l.precision) << " '" << text << "': want 0x" << std::hex << want << ", got "
                        << (got ? "0x" + hex(got->bits) : std::string("nothing"));
        }
        continue;
      }
      // The double is the 16-bit value, exactly (Inf for Inf).
      const double value = l.precision == Precision::kBfloat16 ? bfloat16::from_bits(want).to_float()
                                                               : float16::from_bits(want).to_float();
      if (got->value != value) ADD_FAILURE() << text << ": value " << got->value << ", want " << value;
    }
  }
  EXPECT_EQ(wrong, 0u) << "of " << checked;
  std::printf("%s: %zu texts around every tie, %zu wrong\n", std::string(name(l.precision)).c_str(), checked, wrong);
}

TEST(ParseNumber, EveryBfloat16TieFromBothSides) {
  check_ties(kBf16);
}

TEST(ParseNumber, EveryFloat16TieFromBothSides) {
  check_ties(kF16);
}

// The double-rounding trap itself: both texts become the same double (the exact tie), and only their digits say
// which way the 16-bit value goes.
TEST(ParseNumber, TextsThatRoundToTheSameDoubleStillRoundApart) {
  EXPECT_EQ(parse_number("1.00390625", Precision::kBfloat16)->bits, 0x3F80);  // 1 + 2^-8: the tie, to even
  EXPECT_EQ(parse_number("1.0039062500000000001", Precision::kBfloat16)->bits, 0x3F81);
  EXPECT_EQ(parse_number("1.0039062499999999999", Precision::kBfloat16)->bits, 0x3F80);
  EXPECT_EQ(parse_number("1.00048828125000000001", Precision::kFloat16)->bits, 0x3C01);  // 1 + 2^-11 and above
  EXPECT_EQ(parse_number("0x1.0100000000000000001p0", Precision::kBfloat16)->bits, 0x3F81);
  EXPECT_EQ(std::strtod("1.0039062500000000001", nullptr), 1.00390625);  // what a double-first parser sees
}

// float32 through every exponent: for seven significands per binade (zero's binade included: the tie between 0 and
// the smallest subnormal, 2^-150, rounds to 0), the tie with the next float and texts around it.
TEST(ParseNumber, Float32TiesAcrossEveryExponent) {
  std::size_t wrong = 0, checked = 0;
  auto check = [&](const std::string& text, float want) {
    ++checked;
    const auto got = parse_number(text, Precision::kFloat32);
    if (!got || std::bit_cast<std::uint64_t>(got->value) != std::bit_cast<std::uint64_t>(static_cast<double>(want))) {
      if (++wrong <= 10) ADD_FAILURE() << "'" << text << "': want " << want << ", got " << (got ? got->value : -1.0);
    }
  };
  for (std::uint32_t field = 0; field < 255; ++field) {
    for (std::uint32_t fraction : {0u, 1u, 2u, 0x2AAAAAu, 0x400000u, 0x7FFFFEu, 0x7FFFFFu}) {
      const std::uint32_t b = (field << 23) | fraction;
      const std::uint64_t mantissa = field == 0 ? fraction : (fraction | (1u << 23));
      const int exponent = (field == 0 ? 1 : static_cast<int>(field)) - 127 - 23;
      const std::uint64_t tie = 2 * mantissa + 1;
      const float down = std::bit_cast<float>(b), up = std::bit_cast<float>(b + 1);
      const float even = (b & 1) == 0 ? down : up;
      const std::string decimal = exact_decimal(tie, exponent - 1);
      check(decimal, even);
      check(decimal_above(decimal), up);
      check(decimal_below(decimal), down);
      check(hex_exact(tie, exponent - 1), even);
      check(hex_above(tie, exponent - 1), up);
      check(hex_below(tie, exponent - 1), down);
    }
  }
  EXPECT_EQ(wrong, 0u) << "of " << checked;
}

TEST(ParseNumber, SpellingsSignsAndWhiteSpace) {
  for (Precision p : {Precision::kFloat32, Precision::kFloat64, Precision::kBfloat16, Precision::kFloat16}) {
    SCOPED_TRACE(std::string(name(p)));
    for (const char* text : {"nan", "NaN", "NAN", "-nan", "+nan"}) {
      const auto v = parse_number(text, p);
      ASSERT_TRUE(v) << text;
      EXPECT_TRUE(std::isnan(v->value)) << text;
    }
    for (const char* text : {"inf", "INF", "+Infinity", "infinity", " inf\t"}) {
      ASSERT_TRUE(parse_number(text, p)) << text;
      EXPECT_EQ(parse_number(text, p)->value, std::numeric_limits<double>::infinity()) << text;
    }
    EXPECT_EQ(parse_number("-inf", p)->value, -std::numeric_limits<double>::infinity());
    EXPECT_EQ(parse_number("  1.5 \n", p)->value, 1.5);
    EXPECT_EQ(parse_number("+.5", p)->value, 0.5);
    EXPECT_EQ(parse_number("2.5E+1", p)->value, 25.0);
    EXPECT_EQ(parse_number("0X.Cp-2", p)->value, 0.1875);
    EXPECT_EQ(parse_number("0x10", p)->value, 16.0);  // a hex float without an exponent
    EXPECT_EQ(parse_number("1e999999999999", p)->value, std::numeric_limits<double>::infinity());
    const auto tiny = parse_number("-1e-999999999999", p);
    ASSERT_TRUE(tiny);
    EXPECT_EQ(tiny->value, 0.0);
    EXPECT_TRUE(std::signbit(tiny->value));
    for (const char* text : {"", " ", "1.2.3", "0x", "0xg", "e5", "1e", "--1", "+-1", "1 2", "nan1", "inf ity", "1e+",
                             ".", "-.", "1f", "0x1p", "infinit", "1,5", "١",
                             // exponents with two signs (libstdc++ 12's hex from_chars reads "0x1p+-3" as 0x1p-3)
                             "0x1p+-3", "0x1dfp+-3", "0x1p-+3", "0x1p++3", "1e+-3", "1e--3", "0x1.p+-0"}) {
      EXPECT_FALSE(parse_number(text, p)) << "'" << text << "'";
    }
  }
  EXPECT_EQ(parse_number("-0", Precision::kBfloat16)->bits, 0x8000);
  EXPECT_EQ(parse_number("-0", Precision::kFloat16)->bits, 0x8000);
  EXPECT_EQ(parse_number("65504", Precision::kFloat16)->bits, 0x7BFF);
  EXPECT_EQ(parse_number("65520", Precision::kFloat16)->bits, 0x7C00);  // the overflow tie: to Inf
  EXPECT_EQ(parse_number("65519.999999999999999999", Precision::kFloat16)->bits, 0x7BFF);
  EXPECT_EQ(parse_number("0.1", Precision::kFloat64)->value, 0.1);
}

TEST(ParseNumber, PrecisionNames) {
  for (Precision p : {Precision::kFloat32, Precision::kFloat64, Precision::kBfloat16, Precision::kFloat16}) {
    EXPECT_EQ(parse_precision(name(p)), p);
  }
  EXPECT_EQ(parse_precision("bf16"), Precision::kBfloat16);
  EXPECT_EQ(parse_precision("f16"), Precision::kFloat16);
  EXPECT_EQ(parse_precision("f32"), Precision::kFloat32);
  EXPECT_EQ(parse_precision("f64"), Precision::kFloat64);
  EXPECT_FALSE(parse_precision("half"));
}

TEST(ParseNumber, TrimSpace) {
  EXPECT_EQ(trim_space(" \t1.5\r\n"), "1.5");
  EXPECT_EQ(trim_space(""), "");
  EXPECT_EQ(trim_space("  "), "");
}

}  // namespace
}  // namespace fp8kit
