// `fp8kit cast`: the scalar experiment. Each value is rounded once, correctly, into the source precision,
// then encoded to each FP8 format by the exact codec; prints code, bits, value and error per pair.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include "cli_common.hpp"
#include "fp8kit/codec.hpp"
#include "fp8kit/format.hpp"
#include "fp8kit/half.hpp"

namespace fp8kit::cli {

// The parsing helpers, outside the anonymous namespace so they can be declared and unit-tested elsewhere.
namespace cast_detail {

// The precision a value's text is rounded into before the cast.
enum class Source : std::uint8_t { kFloat32, kFloat64, kBfloat16, kFloat16 };

std::optional<Source> parse_source(std::string_view text) {
  if (text == "float32" || text == "f32") return Source::kFloat32;
  if (text == "float64" || text == "f64") return Source::kFloat64;
  if (text == "bfloat16" || text == "bf16") return Source::kBfloat16;
  if (text == "float16" || text == "f16") return Source::kFloat16;
  return std::nullopt;
}

std::string_view source_name(Source source) {
  switch (source) {
    case Source::kFloat32:
      return "float32";
    case Source::kFloat64:
      return "float64";
    case Source::kBfloat16:
      return "bfloat16";
    case Source::kFloat16:
      return "float16";
  }
  return "?";
}

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

std::string_view trim(std::string_view text) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return text;
}

// Sign, then nan | inf | infinity (any case) | 0x/0X hex-float body | decimal body. The body is only checked
// to start like a number here; from_chars decides the rest.
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
    if (!is_hex_digit(n.body.front()) && n.body.front() != '.') return std::nullopt;
    return n;
  }
  n.body = text;
  if (text.empty() || (!is_digit(text.front()) && text.front() != '.')) return std::nullopt;
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
      if constexpr (std::is_same_v<T, float>) {
        value = std::strtof(text.c_str(), nullptr);
      } else {
        value = std::strtod(text.c_str(), nullptr);
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
    n.digits = std::string(1, text[0]) + std::string(text.substr(2, e - 2));
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

// A value in the source precision: `value` is exact (every source value is a double); `bits` holds the
// storage of a bfloat16 or float16 source.
struct SourceValue {
  double value = 0;
  std::uint16_t bits = 0;
};

// The text rounded once, to nearest even, into the source precision; nothing if it is not a number.
std::optional<SourceValue> parse_value(std::string_view text, Source source) {
  const auto number = split_number(trim(text));
  if (!number) return std::nullopt;
  if (source == Source::kFloat32) {
    const auto f = parse_binary<float>(*number);
    if (!f) return std::nullopt;
    return SourceValue{static_cast<double>(*f), 0};
  }
  const auto d = parse_binary<double>(*number);
  if (!d) return std::nullopt;
  if (source == Source::kFloat64) return SourceValue{*d, 0};
  // Narrowing the double is right unless the double sits exactly halfway between two 16-bit neighbours: then
  // the text itself decides (it may lie above or below the double it was rounded to, or be exactly on it).
  const HalfLayout layout = source == Source::kBfloat16 ? kBfloat16Layout : kFloat16Layout;
  bool tie = false;
  std::uint16_t bits = narrow_to_half(*d, layout, 0, &tie);
  if (tie) bits = narrow_to_half(*d, layout, compare_text_to_double(*number, std::fabs(*d)), nullptr);
  const float widened =
      source == Source::kBfloat16 ? bfloat16::from_bits(bits).to_float() : float16::from_bits(bits).to_float();
  return SourceValue{static_cast<double>(widened), bits};
}

std::uint8_t encode_source(Source source, const SourceValue& v, const EncodeSpec& spec, std::uint32_t random_bits) {
  switch (source) {
    case Source::kFloat32:
      return encode(static_cast<float>(v.value), spec, random_bits);
    case Source::kFloat64:
      return encode(v.value, spec, random_bits);
    case Source::kBfloat16:
      return encode(bfloat16::from_bits(v.bits), spec, random_bits);
    case Source::kFloat16:
      return encode(float16::from_bits(v.bits), spec, random_bits);
  }
  return 0;
}

}  // namespace cast_detail

namespace {

using cast_detail::Source;
using cast_detail::SourceValue;

// Command-line values are all validated before anything is printed; from stdin, the first kHoldValues values
// (or kHoldBytes of text) are validated before any output, then the rest streams in chunks of kStreamValues.
constexpr std::size_t kHoldValues = std::size_t{1} << 20;
constexpr std::size_t kHoldBytes = std::size_t{64} << 20;
constexpr std::size_t kStreamValues = std::size_t{1} << 13;
constexpr std::size_t kMaxInputWidth = 40;

struct CastArgs {
  std::string to = "e4m3fn,e5m2";
  std::string from = "float32";
  bool saturate = false;
  std::string rounding = "nearest";
  std::string seed = "0";  // parsed here: CLI11 would wrap "-1" to 2^64 - 1
  bool json = false;
  std::vector<std::string> values;  // never filled: see add_cast_command
};

// Everything a row needs besides the value, with each code's texts computed once per format.
struct CastSetup {
  Source source = Source::kFloat32;
  std::vector<Format> formats;
  Overflow overflow = Overflow::kNonSaturating;
  Rounding rounding = Rounding::kNearestEven;
  std::uint64_t seed = 0;
  bool json = false;
  struct CodeText {
    std::string value;  // exact: "448", "-0.001953125", "nan", "2^127 (1.70141e+38)"
    std::string bits;   // "0 1111 110"
    std::string hex;    // "0x7e"
  };
  std::vector<std::vector<CodeText>> texts;  // [format index][code]
};

// A token as it may appear in one line of an error message.
std::string quote_token(std::string_view token) {
  std::string out;
  for (char c : token.substr(0, 60)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (token.size() > 60) out += "...";
  return "'" + out + "'";
}

std::string unparsable(std::string_view token) {
  return "unparsable value " + quote_token(token) + " (expected a decimal or hex-float number, nan, inf or -inf)";
}

// "--bogus", "-x": an option this command does not have (a number such as -1.5 or -inf never gets here).
bool looks_like_option(std::string_view token) {
  if (token.size() < 2 || token[0] != '-') return false;
  const char c = token[1];
  return c == '-' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// Marks an error that is undefined (NaN or Inf involved, or a relative error of zero): null or "-".
constexpr std::optional<double> kNull = std::nullopt;

// JSON for a double: a number ("-0.0" keeps the sign of zero), the strings "nan", "inf", "-inf", or null.
void append_json_number(fmt::memory_buffer& out, std::optional<double> value) {
  const double v = value.value_or(0);
  if (!value) {
    fmt::format_to(fmt::appender(out), "null");
  } else if (std::isnan(v)) {
    fmt::format_to(fmt::appender(out), "\"nan\"");
  } else if (std::isinf(v)) {
    fmt::format_to(fmt::appender(out), "{}", v < 0 ? "\"-inf\"" : "\"inf\"");
  } else if (v == 0) {
    fmt::format_to(fmt::appender(out), "{}", std::signbit(v) ? "-0.0" : "0.0");
  } else {
    fmt::format_to(fmt::appender(out), "{}", v);
  }
}

// Writes the rows for each value: a table with fixed column widths or a streamed JSON array.
class CastPrinter {
 public:
  CastPrinter(const CastSetup& setup, std::size_t input_width) : setup_(setup), input_width_(input_width) {
    format_width_ = 6;
    value_width_ = 9;
    bits_width_ = 4;
    for (std::size_t i = 0; i < setup.formats.size(); ++i) {
      format_width_ = std::max(format_width_, name(setup.formats[i]).size());
      for (const auto& t : setup.texts[i]) {
        value_width_ = std::max(value_width_, t.value.size());
        bits_width_ = std::max(bits_width_, t.bits.size());
      }
    }
  }

  void header() {
    if (setup_.json) {
      fmt::format_to(fmt::appender(out_), "[");
      return;
    }
    std::string formats;
    for (Format f : setup_.formats) formats += (formats.empty() ? "" : ", ") + std::string(name(f));
    const std::string overflow = setup_.overflow == Overflow::kSaturate
                                     ? "saturating (+-max finite)"
                                     : "non-saturating (Inf or NaN, as PyTorch .to() and ml_dtypes)";
    const std::string rounding = setup_.rounding == Rounding::kStochastic
                                     ? fmt::format("stochastic (seed {})", setup_.seed)
                                     : std::string("nearest, ties to even");
    fmt::format_to(fmt::appender(out_), "{} -> {}; overflow: {}; rounding: {}\n",
                   cast_detail::source_name(setup_.source), formats, overflow, rounding);
    fmt::format_to(fmt::appender(out_), "{:<{}}  {:<{}}  {:>{}}  {:<{}}  {:<4}  {:>11}  {:>11}\n", "input",
                   input_width_, "format", format_width_, "fp8 value", value_width_, "bits", bits_width_, "hex",
                   "abs error", "rel error");
  }

  // All the rows of the value at 0-based input position `index`.
  void rows(std::string_view input, std::uint64_t index, const SourceValue& v) {
    const std::uint32_t random_bits =
        setup_.rounding == Rounding::kStochastic ? stochastic_bits(setup_.seed, index) : 0;
    for (std::size_t i = 0; i < setup_.formats.size(); ++i) {
      const Format f = setup_.formats[i];
      const std::uint8_t code =
          cast_detail::encode_source(setup_.source, v, EncodeSpec{f, setup_.overflow, setup_.rounding}, random_bits);
      const double value = decode_to_double(f, code);
      const bool defined = std::isfinite(value) && std::isfinite(v.value);
      const double abs_error = std::fabs(value - v.value);
      const bool relative = defined && v.value != 0;
      const double rel_error = abs_error / std::fabs(v.value);
      const auto& t = setup_.texts[i][code];
      const auto out = fmt::appender(out_);
      if (setup_.json) {
        fmt::format_to(out, "{}\n  {{\"input\": \"{}\", \"index\": {}, \"format\": \"{}\", \"source_value\": ",
                       first_ ? "" : ",", input, index, name(f));
        append_json_number(out_, v.value);
        fmt::format_to(out, ", \"code\": {}, \"hex\": \"{}\", \"bits\": \"{}\", \"value\": ", code, t.hex, t.bits);
        append_json_number(out_, value);
        fmt::format_to(out, ", \"abs_error\": ");
        append_json_number(out_, defined ? abs_error : kNull);
        fmt::format_to(out, ", \"rel_error\": ");
        append_json_number(out_, relative ? rel_error : kNull);
        fmt::format_to(out, "}}");
        first_ = false;
      } else {
        append_cell(input, input_width_, false, true);
        append_cell(name(f), format_width_, false);
        append_cell(t.value, value_width_, true);
        append_cell(t.bits, bits_width_, false);
        append_cell(t.hex, 4, false);
        append_error(defined ? abs_error : kNull);
        append_error(relative ? rel_error : kNull);
        fmt::format_to(out, "\n");
      }
    }
    if (out_.size() >= (std::size_t{1} << 20)) flush();
  }

  // A table cell padded to `width`, after a two-space gap unless it starts the row. (fmt's own padding
  // measures Unicode widths: too slow for millions of rows.)
  void append_cell(std::string_view text, std::size_t width, bool right, bool first = false) {
    static constexpr std::string_view kSpaces = "                                                  ";
    const std::string_view fill = kSpaces.substr(0, std::min(kSpaces.size(), width - std::min(width, text.size())));
    if (!first) out_.append(kSpaces.substr(0, 2));
    if (right) out_.append(fill);
    out_.append(text);
    if (!right) out_.append(fill);
  }

  // A table cell for an error: right-aligned, 6 significant digits, "-" when undefined.
  void append_error(std::optional<double> error) {
    char text[32];
    const auto end = error ? fmt::format_to_n(text, sizeof text, "{:.6g}", *error).out : text;
    append_cell(error ? std::string_view(text, static_cast<std::size_t>(end - text)) : "-", 11, true);
  }

  void finish() {
    if (setup_.json) fmt::format_to(fmt::appender(out_), "{}", first_ ? "]\n" : "\n]\n");
    flush();
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) throw std::runtime_error("writing to stdout failed");
  }

  void flush() {
    std::fwrite(out_.data(), 1, out_.size(), stdout);
    out_.clear();
  }

 private:
  const CastSetup& setup_;
  std::size_t input_width_;
  std::size_t format_width_;
  std::size_t value_width_;
  std::size_t bits_width_;
  bool first_ = true;
  fmt::memory_buffer out_;
};

// Values waiting to be printed: their texts in one arena, each with its parsed value.
struct PendingValues {
  struct Item {
    std::size_t offset;
    std::size_t length;
    SourceValue value;
  };
  std::string arena;
  std::vector<Item> items;

  void add(std::string_view text, const SourceValue& value) {
    items.push_back({arena.size(), text.size(), value});
    arena.append(text);
  }
  std::string_view text(const Item& item) const { return std::string_view(arena).substr(item.offset, item.length); }
  std::size_t widest() const {
    std::size_t width = 5;
    for (const Item& item : items) width = std::max(width, std::min(item.length, kMaxInputWidth));
    return width;
  }
};

// Prints pending values, creating the printer (and so fixing the table's column widths) on the first call.
class Emitter {
 public:
  explicit Emitter(const CastSetup& setup) : setup_(setup) {}
  void emit(PendingValues& pending) {
    if (!printer_) {
      printer_ = std::make_unique<CastPrinter>(setup_, pending.widest());
      printer_->header();
    }
    for (const auto& item : pending.items) printer_->rows(pending.text(item), next_index_++, item.value);
    pending.items.clear();
    pending.arena.clear();
  }
  void finish() {
    PendingValues none;
    emit(none);
    printer_->finish();
  }
  void flush() { printer_->flush(); }

 private:
  const CastSetup& setup_;
  std::unique_ptr<CastPrinter> printer_;
  std::uint64_t next_index_ = 0;
};

// Reads stdin in large blocks and hands out one line at a time (without its newline).
class LineReader {
 public:
  bool next(std::string_view& line) {
    for (;;) {
      const std::size_t newline = buffer_.find('\n', start_);
      if (newline != std::string::npos) {
        line = std::string_view(buffer_).substr(start_, newline - start_);
        start_ = newline + 1;
        return true;
      }
      if (eof_) {
        if (start_ >= buffer_.size()) return false;
        line = std::string_view(buffer_).substr(start_);
        start_ = buffer_.size();
        return true;
      }
      buffer_.erase(0, start_);
      start_ = 0;
      const std::size_t old_size = buffer_.size();
      buffer_.resize(old_size + kBlock);
      const std::size_t got = std::fread(buffer_.data() + old_size, 1, kBlock, stdin);
      buffer_.resize(old_size + got);
      if (got == 0) {
        if (std::ferror(stdin)) throw std::runtime_error("reading stdin failed");
        eof_ = true;
      }
    }
  }

 private:
  static constexpr std::size_t kBlock = std::size_t{1} << 20;
  std::string buffer_;
  std::size_t start_ = 0;
  bool eof_ = false;
};

CastSetup make_setup(const CastArgs& args) {
  CastSetup setup;
  setup.formats = parse_format_list(args.to);
  const auto source = cast_detail::parse_source(args.from);
  if (!source) {
    throw UsageError("--from: unknown source type " + quote_token(args.from) +
                     " (known: float32, float64, bfloat16, float16; or f32, f64, bf16, f16)");
  }
  setup.source = *source;
  if (args.rounding == "nearest") {
    setup.rounding = Rounding::kNearestEven;
  } else if (args.rounding == "stochastic") {
    setup.rounding = Rounding::kStochastic;
  } else {
    throw UsageError("--rounding: unknown rounding " + quote_token(args.rounding) + " (known: nearest, stochastic)");
  }
  setup.overflow = args.saturate ? Overflow::kSaturate : Overflow::kNonSaturating;
  const char* seed_end = args.seed.data() + args.seed.size();
  const auto [seed_ptr, seed_ec] = std::from_chars(args.seed.data(), seed_end, setup.seed);
  if (args.seed.empty() || seed_ptr != seed_end || seed_ec != std::errc()) {
    throw UsageError("--seed: " + quote_token(args.seed) + " is not an integer in 0..2^64-1");
  }
  setup.json = args.json;
  for (Format f : setup.formats) {
    std::vector<CastSetup::CodeText> texts(256);
    for (int c = 0; c < 256; ++c) {
      const auto code = static_cast<std::uint8_t>(c);
      texts[c] = {format_exact(decode_to_double(f, code)), code_bits(f, code), fmt::format("0x{:02x}", c)};
    }
    setup.texts.push_back(std::move(texts));
  }
  return setup;
}

void run_cast(const CastArgs& args, const std::vector<std::string>& tokens) {
  const CastSetup setup = make_setup(args);
  Emitter emitter(setup);
  PendingValues pending;

  // Command-line values. CLI11 leaves them (and anything it does not know) in order in remaining(); the first
  // "--" in that list marks where options end.
  bool after_separator = false;
  bool any = false;
  for (const std::string& token : tokens) {
    if (!after_separator && token == "--") {
      after_separator = true;
      continue;
    }
    const auto value = cast_detail::parse_value(token, setup.source);
    if (!value) {
      if (!after_separator && looks_like_option(token)) {
        throw UsageError("unknown option " + quote_token(token));
      }
      throw UsageError(unparsable(token));
    }
    pending.add(cast_detail::trim(token), *value);
    any = true;
  }
  if (any) {
    emitter.emit(pending);
    emitter.finish();
    return;
  }

  // One value per line from stdin. Output is held back until kHoldValues values have parsed, so a bad line
  // in an input of up to a million values leaves stdout empty; past that the output streams.
  if (isatty(STDIN_FILENO) == 1 && stderr_is_terminal()) {
    std::fputs("fp8kit cast: reading values from stdin, one per line (end with Ctrl-D)\n", stderr);
  }
  LineReader reader;
  std::string_view line;
  std::uint64_t line_number = 0;
  bool streaming = false;
  while (reader.next(line)) {
    ++line_number;
    const std::string_view text = cast_detail::trim(line);
    if (text.empty()) continue;
    const auto value = cast_detail::parse_value(text, setup.source);
    if (!value) {
      if (streaming) emitter.flush();  // what was printed stays printed; the error still exits with status 2
      throw UsageError(fmt::format("stdin line {}: {}", line_number, unparsable(text)));
    }
    pending.add(text, *value);
    if (streaming ? pending.items.size() >= kStreamValues
                  : (pending.items.size() > kHoldValues || pending.arena.size() > kHoldBytes)) {
      emitter.emit(pending);
      streaming = true;
    }
  }
  emitter.emit(pending);
  emitter.finish();
}

}  // namespace

void add_cast_command(CLI::App& app) {
  CLI::App* cast = app.add_subcommand(
      "cast", "Cast values to FP8 with the exact codec: code, bits, value and error for each format");
  auto args = std::make_shared<CastArgs>();
  cast->add_option("--to", args->to, "Target formats, comma-separated (default e4m3fn,e5m2; also float8_* names)");
  cast->add_option("--from", args->from,
                   "Source precision each value is first rounded to: float32 (default), float64, bfloat16, "
                   "float16 (or f32, f64, bf16, f16)");
  cast->add_flag("--saturate", args->saturate,
                 "Overflow to +-max finite (default: non-saturating, Inf or NaN as PyTorch .to() and ml_dtypes)");
  cast->add_option("--rounding", args->rounding, "nearest (default: to nearest, ties to even) or stochastic");
  cast->add_option("--seed", args->seed, "Seed for --rounding stochastic (default 0); value i uses stream index i")
      ->type_name("UINT");
  cast->add_flag("--json", args->json, "Print a JSON array, one object per (value, format)");
  // Values such as -inf or -.5 look like short options to CLI11, which would split them off from the other
  // values. So nothing is ever stored in VALUES (its check refuses every token) and extras are allowed: every
  // value, and any unknown option, stays in remaining() in command-line order, and run_cast sorts them out.
  // VALUES still makes "--" work: everything after it is a value, even "-1.5" or "--x" (then unparsable).
  cast->add_option("values", args->values,
                   "Values: decimal (1.1, -3e-5, .5), hex-float (0x1.8p+3), nan, inf, -inf. Read from stdin, one "
                   "per line, when none are given")
      ->check(CLI::Validator([](const std::string&) { return std::string("a value"); }, "", "value"));
  cast->validate_positionals();
  cast->allow_extras();
  cast->callback([args, cast] { run_cast(*args, cast->remaining()); });
}

}  // namespace fp8kit::cli
