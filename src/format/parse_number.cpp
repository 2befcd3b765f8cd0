// Numbers from text, rounded once and correctly (see parse_number.hpp). Binary floating types through from_chars
// (correctly rounded: decimal and hex-float); 16-bit types by narrowing that double, except where the double lies
// exactly halfway between two 16-bit neighbours: there the exact text decides, compared digit by digit with the
// double in the text's own base.
#include "fp8kit/format/parse_number.hpp"

#include <locale.h>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include "fp8kit/format/half.hpp"

namespace fp8kit {

namespace {
// Each precision's name and its short spelling.
struct PrecisionNames {
  Precision precision;
  std::string_view name, short_name;
};
constexpr PrecisionNames kPrecisionNames[] = {{Precision::kFloat32, "float32", "f32"},
                                              {Precision::kFloat64, "float64", "f64"},
                                              {Precision::kBfloat16, "bfloat16", "bf16"},
                                              {Precision::kFloat16, "float16", "f16"}};
}  // namespace

std::string_view name(Precision precision) {
  for (const PrecisionNames& n : kPrecisionNames) {
    if (n.precision == precision) return n.name;
  }
  return "?";
}

std::optional<Precision> parse_precision(std::string_view text) {
  for (const PrecisionNames& n : kPrecisionNames) {
    if (text == n.name || text == n.short_name) return n.precision;
  }
  return std::nullopt;
}

std::string_view trim_space(std::string_view text) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return text;
}

namespace {

// A number's text split into sign, kind and body: "-0x1.8p3" -> {negative, kHex, "1.8p3"}.
struct NumberText {
  enum class Kind : std::uint8_t { kDecimal, kHex, kInf, kNan };
  bool negative = false;
  Kind kind = Kind::kDecimal;
  std::string_view body;  // digits onwards: "1.8p3", "1e-5", ".5"; empty for inf and nan
};

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_hex_digit(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

bool equals_ignoring_case(std::string_view a, std::string_view lower) {
  if (a.size() != lower.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const char c = (a[i] >= 'A' && a[i] <= 'Z') ? static_cast<char>(a[i] - 'A' + 'a') : a[i];
    if (c != lower[i]) return false;
  }
  return true;
}

// Whether a body is DIGITS [. DIGITS] [MARK [SIGN] DECIMAL-DIGITS] with at least one digit before the mark, MARK
// 'e' or 'E' (decimal) or 'p' or 'P' (hex, whose DIGITS are hex digits). Checked here, not left to from_chars:
// libstdc++ 12's hex from_chars reads "0x1p+-3" as 0x1p-3 (found by fuzz/fuzz_parse_number against strtod).
bool well_formed_body(std::string_view body, bool hex) {
  std::size_t i = 0;
  std::size_t digits = 0;
  const auto digit = [&](char c) { return hex ? is_hex_digit(c) : is_digit(c); };
  for (; i < body.size() && digit(body[i]); ++i) ++digits;
  if (i < body.size() && body[i] == '.') {
    for (++i; i < body.size() && digit(body[i]); ++i) ++digits;
  }
  if (digits == 0) return false;
  if (i == body.size()) return true;
  if ((body[i] | 0x20) != (hex ? 'p' : 'e')) return false;
  ++i;
  if (i < body.size() && (body[i] == '+' || body[i] == '-')) ++i;
  const std::size_t exponent_start = i;
  for (; i < body.size() && is_digit(body[i]); ++i) {
  }
  return i == body.size() && i > exponent_start;
}

// Sign, then nan | inf | infinity (any case) | 0x/0X hex-float body | decimal body, the body well formed.
std::optional<NumberText> split_number(std::string_view text) {
  NumberText n;
  if (!text.empty() && (text.front() == '+' || text.front() == '-')) {
    n.negative = text.front() == '-';
    text.remove_prefix(1);
  }
  if (equals_ignoring_case(text, "nan")) {
    n.kind = NumberText::Kind::kNan;
    return n;
  }
  if (equals_ignoring_case(text, "inf") || equals_ignoring_case(text, "infinity")) {
    n.kind = NumberText::Kind::kInf;
    return n;
  }
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    n.kind = NumberText::Kind::kHex;
    n.body = text.substr(2);
    if (!well_formed_body(n.body, true)) return std::nullopt;
    return n;
  }
  n.body = text;
  if (!well_formed_body(n.body, false)) return std::nullopt;
  return n;
}

// The text rounded to nearest even in T (float or double); nothing unless the whole text is a number.
template <typename T>
std::optional<T> parse_binary(const NumberText& n) {
  T value{};
  if (n.kind == NumberText::Kind::kNan) {
    value = std::numeric_limits<T>::quiet_NaN();
  } else if (n.kind == NumberText::Kind::kInf) {
    value = std::numeric_limits<T>::infinity();
  } else {
    const bool hex = n.kind == NumberText::Kind::kHex;
    const char* first = n.body.data();
    const char* last = first + n.body.size();
    const auto [ptr, ec] =
        std::from_chars(first, last, value, hex ? std::chars_format::hex : std::chars_format::general);
    if (ptr != last) return std::nullopt;
    if (ec == std::errc::result_out_of_range) {
      // from_chars leaves the value alone on overflow and underflow; strtod/strtof round those correctly too.
      const std::string text = (hex ? "0x" : "") + std::string(n.body);
      // In the C locale whatever the program's is (a "," decimal separator would stop strtod at the ".").
      static const locale_t c_locale = newlocale(LC_ALL_MASK, "C", static_cast<locale_t>(0));
      if constexpr (std::is_same_v<T, float>) {
        value = strtof_l(text.c_str(), nullptr, c_locale);
      } else {
        value = strtod_l(text.c_str(), nullptr, c_locale);
      }
    } else if (ec != std::errc()) {
      return std::nullopt;
    }
  }
  return n.negative ? -value : value;
}

// A positive number as 0.DIGITS x base^exponent, DIGITS without leading or trailing zeros ('0'..'9' or
// '0'/'1').
struct Normalized {
  std::string digits;
  long long exponent = 0;
};

void strip_trailing_zeros(Normalized& n) {
  while (!n.digits.empty() && n.digits.back() == '0') n.digits.pop_back();
  if (n.digits.empty()) n.exponent = 0;
}

// Reads a decimal exponent "+12", "-3", "7" at text[i...], saturating far beyond any double's range.
long long read_exponent(std::string_view text, std::size_t i) {
  bool negative = false;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
  long long value = 0;
  for (; i < text.size() && is_digit(text[i]); ++i) {
    value = std::min(value * 10 + (text[i] - '0'), 1'000'000'000LL);
  }
  return negative ? -value : value;
}

// The sign of a - b for two normalized numbers in the same base (a zero has empty digits).
int compare_normalized(const Normalized& a, const Normalized& b) {
  if (a.digits.empty() || b.digits.empty()) return (a.digits.empty() ? 0 : 1) - (b.digits.empty() ? 0 : 1);
  if (a.exponent != b.exponent) return a.exponent < b.exponent ? -1 : 1;
  const std::size_t common = std::min(a.digits.size(), b.digits.size());
  for (std::size_t i = 0; i < common; ++i) {
    if (a.digits[i] != b.digits[i]) return a.digits[i] < b.digits[i] ? -1 : 1;
  }
  if (a.digits.size() == b.digits.size()) return 0;
  return a.digits.size() > b.digits.size() ? 1 : -1;  // the longer one has a nonzero digit left
}

// A number body as 0.DIGITS x base^exponent, exactly: decimal ("1.0039062500000000001", "12e-3", ".5") with
// digits 0-9 and exponent 'e' (base 10), or hex-float ("1.008p0", "c.8P-3") written out as binary digits with
// exponent 'p' (base 2).
Normalized normalize_number(std::string_view body, bool hex) {
  Normalized n;
  bool after_point = false;
  auto push = [&](bool zero, char digit) {
    if (n.digits.empty() && zero) {
      if (after_point) --n.exponent;  // a leading zero after the point: 0.0012 = 0.12 x 10^-2
      return;
    }
    n.digits += digit;
    if (!after_point) ++n.exponent;
  };
  std::size_t i = 0;
  for (; i < body.size(); ++i) {
    const char c = body[i];
    if (c == '.') {
      after_point = true;
    } else if (!hex && is_digit(c)) {
      push(c == '0', c);
    } else if (hex && is_hex_digit(c)) {
      const int value = is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
      for (int bit = 3; bit >= 0; --bit) push(((value >> bit) & 1) == 0, ((value >> bit) & 1) ? '1' : '0');
    } else {
      break;
    }
  }
  const char exponent_mark = hex ? 'p' : 'e';
  if (i < body.size() && (body[i] | 0x20) == exponent_mark) n.exponent += read_exponent(body, i + 1);
  strip_trailing_zeros(n);
  return n;
}

// A positive finite double's exact value, in decimal (base 10) or binary digits.
Normalized normalize_double(double a, bool binary) {
  Normalized n;
  if (binary) {
    int exponent = 0;
    const double fraction = std::frexp(a, &exponent);  // a = 0.1bbb (binary) x 2^exponent
    const auto significand = static_cast<std::uint64_t>(std::ldexp(fraction, 53));
    for (int bit = 52; bit >= 0; --bit) n.digits += ((significand >> bit) & 1) ? '1' : '0';
    n.exponent = exponent;
  } else {
    // glibc prints every digit exactly; a double has at most 767 significant decimal digits.
    char buffer[840];
    std::snprintf(buffer, sizeof buffer, "%.800e", a);
    const std::string_view text(buffer);
    const std::size_t e = text.find('e');
    n.digits.assign(1, text[0]);
    n.digits.append(text.substr(2, e - 2));
    n.exponent = read_exponent(text, e + 1) + 1;
  }
  strip_trailing_zeros(n);
  return n;
}

// The sign of |exact value of the text| - a, for a positive finite double a that the text was rounded to.
int compare_text_to_double(const NumberText& n, double a) {
  const bool hex = n.kind == NumberText::Kind::kHex;
  const Normalized text = normalize_number(n.body, hex);
  return compare_normalized(text, normalize_double(a, hex));
}

// A 16-bit IEEE-style layout: bfloat16 (8 exponent bits, 7 mantissa bits) or float16 (5, 10).
struct HalfLayout {
  int exponent_bits;
  int mantissa_bits;
};
inline constexpr HalfLayout kBfloat16Layout{8, 7};
inline constexpr HalfLayout kFloat16Layout{5, 10};

// d rounded to nearest into the layout, as bits. A magnitude exactly halfway between two neighbours goes up
// when tiebreak > 0, down when < 0, to even when 0, and sets *tie: the caller passes the sign of (exact -
// |d|) when d is itself a rounding of the real value. Overflow gives Inf (as IEEE: the rounded magnitude
// exceeds the maximum).
std::uint16_t narrow_to_half(double d, HalfLayout layout, int tiebreak, bool* tie) {
  const int m = layout.mantissa_bits;
  const int bias = (1 << (layout.exponent_bits - 1)) - 1;
  const int max_field = (1 << layout.exponent_bits) - 1;
  const auto sign = static_cast<std::uint16_t>(std::signbit(d) ? 0x8000u : 0u);
  const auto inf = static_cast<std::uint16_t>(sign | (max_field << m));
  if (std::isnan(d)) return static_cast<std::uint16_t>(inf | (1 << (m - 1)));
  const double a = std::fabs(d);
  if (std::isinf(a)) return inf;
  if (a == 0) return sign;
  int exponent = 0;
  std::frexp(a, &exponent);                            // a in [2^(exponent-1), 2^exponent)
  int quantum = std::max(exponent - 1, 1 - bias) - m;  // the spacing of the values around a is 2^quantum
  const double scaled = std::ldexp(a, -quantum);       // exact: a power-of-two scaling well inside double
  double k = std::floor(scaled);
  const double rest = scaled - k;
  bool up = rest > 0.5;
  if (rest == 0.5) {
    if (tie != nullptr) *tie = true;
    up = tiebreak > 0 || (tiebreak == 0 && std::fmod(k, 2.0) != 0.0);
  }
  if (up) k += 1;
  auto significand = static_cast<std::uint32_t>(k);  // value = significand x 2^quantum
  if (significand == (2u << m)) {                    // rounded up into the next binade
    significand >>= 1;
    ++quantum;
  }
  if (significand < (1u << m)) return static_cast<std::uint16_t>(sign | significand);  // subnormal (or zero)
  const int field = quantum + m + bias;
  if (field >= max_field) return inf;
  return static_cast<std::uint16_t>(sign | (field << m) | (significand - (1u << m)));
}

}  // namespace

std::optional<ParsedNumber> parse_number(std::string_view text, Precision precision) {
  const auto number = split_number(trim_space(text));
  if (!number) return std::nullopt;
  if (precision == Precision::kFloat32) {
    const auto f = parse_binary<float>(*number);
    if (!f) return std::nullopt;
    return ParsedNumber{static_cast<double>(*f), 0};
  }
  const auto d = parse_binary<double>(*number);
  if (!d) return std::nullopt;
  if (precision == Precision::kFloat64) return ParsedNumber{*d, 0};
  // Narrowing the double is right unless the double sits exactly halfway between two 16-bit neighbours: then
  // the text itself decides (it may lie above or below the double it was rounded to, or be exactly on it).
  const HalfLayout layout = precision == Precision::kBfloat16 ? kBfloat16Layout : kFloat16Layout;
  bool tie = false;
  std::uint16_t bits = narrow_to_half(*d, layout, 0, &tie);
  if (tie) bits = narrow_to_half(*d, layout, compare_text_to_double(*number, std::fabs(*d)), nullptr);
  const float widened =
      precision == Precision::kBfloat16 ? bfloat16::from_bits(bits).to_float() : float16::from_bits(bits).to_float();
  return ParsedNumber{static_cast<double>(widened), bits};
}

}  // namespace fp8kit
