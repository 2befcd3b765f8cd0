// The value parser of `fp8kit cast` (parse_number) on any text, against the C library: whatever it accepts as a
// float64 or float32 number, strtod / strtof read whole and to the same value (NaN as NaN, the sign of zero kept);
// its bfloat16 and float16 results are numbers of those types (the stored bits decode to the value), and a text it
// accepts in one precision it accepts in all.
#include <bit>
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
  const float f = std::strtof(trimmed.c_str(), &end);
  fuzz::check(same(f32->value, static_cast<double>(f)), "float32 of '" + trimmed + "' is not strtof's");
  fuzz::check(same(bf16->value, static_cast<double>(bfloat16::from_bits(bf16->bits).to_float())),
              "the bfloat16 bits of '" + trimmed + "' are not its value");
  fuzz::check(same(f16->value, static_cast<double>(float16::from_bits(f16->bits).to_float())),
              "the float16 bits of '" + trimmed + "' are not its value");
  return 0;
}
