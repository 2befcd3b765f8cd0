// Numbers from text, rounded once and correctly into a binary floating type: what `fp8kit cast` reads, and what
// anything that takes a number from a user should use so that "0.1" or "1.0039062500000000001" means the value
// written, not a double rounding of it.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace fp8kit {

// The types a text can be rounded into.
enum class Precision : std::uint8_t { kFloat32, kFloat64, kBfloat16, kFloat16 };

std::string_view name(Precision precision);  // "float32", "float64", "bfloat16", "float16"
// "float32" or "f32", "float64" or "f64", "bfloat16" or "bf16", "float16" or "f16".
std::optional<Precision> parse_precision(std::string_view text);

struct ParsedNumber {
  double value = 0;        // the rounded value, exact in a double (NaN for nan)
  std::uint16_t bits = 0;  // bfloat16 and float16: the 16-bit storage of the value (sign of zero included)
};

// The text rounded once, to nearest even, into `precision`; nullopt unless the whole text (surrounding whitespace
// aside) is a number: an optional sign, then a decimal ("12", "-0.5", ".5", "1e-3", "2.5E+4"), a hex float
// ("0x1.8p3", "0X.Cp-2"; the exponent optional), or inf / infinity / nan in any case. Correct for every text,
// however many digits: a 16-bit result is never a rounding of a rounding (a text that becomes exactly a tie between
// two bfloat16 or float16 values only once rounded to double is decided by its exact value); values past the
// largest finite one round to Inf as IEEE 754 says, and below the smallest subnormal to zero, keeping the sign.
std::optional<ParsedNumber> parse_number(std::string_view text, Precision precision);

// `text` without the white space (C locale: space, \t, \n, \v, \f, \r) around it that parse_number ignores.
std::string_view trim_space(std::string_view text);

}  // namespace fp8kit
