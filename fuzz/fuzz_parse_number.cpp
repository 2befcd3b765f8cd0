// The value parser of `fp8kit cast` (parse_number) on any text, against the C library: whatever it accepts as a
// float64 number strtod reads whole and to the same value (NaN as NaN, the sign of zero kept), and its float32 is
// that text rounded to nearest even in float, from strtod's two directed roundings (float32_oracle);
// its bfloat16 and float16 results are numbers of those types (the stored bits decode to the value), and a text it
// accepts in one precision it accepts in all.
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fp8kit/format/half.hpp"
#include "fp8kit/format/parse_number.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace fp8kit;

bool same(double a, double b) {
  return std::isnan(a) ? std::isnan(b) : std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

// Whether the double v lies exactly halfway between two neighbouring floats (where rounding to float is a tie),
// the one between the largest float and 2^128 included (where the tie overflows to infinity: found by this harness,
// "-3.4028235677973366e38", just inside it, was taken for a value past it).
bool float_midpoint(double v) {
  if (std::fabs(v) == 0x1.ffffffp127) return true;  // (FLT_MAX + 2^128) / 2
  const float f = static_cast<float>(v);
  if (static_cast<double>(f) == v || !std::isfinite(f)) return false;
  const float g = std::nextafter(f, static_cast<float>(v > f ? INFINITY : -INFINITY));
  return (static_cast<double>(f) + static_cast<double>(g)) / 2 == v;  // exact in double
}

// The text rounded to nearest even in float, from strtod alone. glibc's strtof is not the oracle: glibc 2.36 rounds
// some hex subnormals wrongly ("0x1.ff0205p-128" is 0x1.ff0208p-128 to nearest; strtof gives 0x1.ff02p-128; found
// by this harness). strtod rounded down and up brackets the exact value x between neighbouring doubles lo <= x <=
// hi. If they agree, x is a double and its float rounding is the cast's. Otherwise x lies strictly between them,
// no float midpoint (a double) lies strictly between them, and x rounds as hi does when lo is a midpoint, as lo does
// when hi is one, and as both do otherwise.
float float32_oracle(const std::string& text) {
  const int mode = std::fegetround();
  std::fesetround(FE_DOWNWARD);
  const double lo = std::strtod(text.c_str(), nullptr);
  std::fesetround(FE_UPWARD);
  const double hi = std::strtod(text.c_str(), nullptr);
  std::fesetround(mode);
  if (same(lo, hi) || std::isnan(lo)) return static_cast<float>(lo);
  if (float_midpoint(lo)) return static_cast<float>(hi);
  return static_cast<float>(lo);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto f64 = parse_number(text, Precision::kFloat64);
  const auto f32 = parse_number(text, Precision::kFloat32);
  const auto bf16 = parse_number(text, Precision::kBfloat16);
  const auto f16 = parse_number(text, Precision::kFloat16);
  fuzz::check(
      f64.has_value() == f32.has_value() && f64.has_value() == bf16.has_value() && f64.has_value() == f16.has_value(),
      "a text accepted in one precision and not another");
  if (!f64) return 0;
  // The C library's reading, of the text without its white space (strtod would also skip leading white space, and
  // stops at the first character it cannot use: it must use them all).
  const std::string trimmed(trim_space(text));
  char* end = nullptr;
  const double d = std::strtod(trimmed.c_str(), &end);
  fuzz::check(end == trimmed.c_str() + trimmed.size(), "parse_number accepted a text strtod stops in: " + trimmed);
  fuzz::check(same(f64->value, d), "float64 of '" + trimmed + "' is not strtod's");
  fuzz::check(same(f32->value, static_cast<double>(float32_oracle(trimmed))),
              "float32 of '" + trimmed + "' is not its correctly rounded float");
  fuzz::check(same(bf16->value, static_cast<double>(bfloat16::from_bits(bf16->bits).to_float())),
              "the bfloat16 bits of '" + trimmed + "' are not its value");
  fuzz::check(same(f16->value, static_cast<double>(float16::from_bits(f16->bits).to_float())),
              "the float16 bits of '" + trimmed + "' are not its value");
  return 0;
}
