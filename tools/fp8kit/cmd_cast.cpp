// `fp8kit cast`: the scalar experiment. Each value is rounded once, correctly, into the source precision,
// then encoded to each FP8 format by the exact codec; prints code, bits, value and error per pair.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
#include "fp8kit/format/codec.hpp"
#include "fp8kit/format/format.hpp"
#include "fp8kit/format/half.hpp"
#include "fp8kit/format/parse_number.hpp"

namespace fp8kit::cli {

namespace cast_detail {

// A value in the source precision (exact in a double; bits: the storage of a bfloat16 or float16 source).
using Source = Precision;
using SourceValue = ParsedNumber;

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
  OverflowFlags overflow;
  std::string rounding = "nearest";
  std::string seed = "0";  // parsed here: CLI11 would wrap "-1" to 2^64 - 1
  bool seed_given = false;
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
    const std::string overflow =
        setup_.overflow == Overflow::kSaturate
            ? "saturating (+-max finite)"
            : "non-saturating (Inf or NaN, as ml_dtypes, and PyTorch .to() but for e4m3fn from 2.12)";
    const std::string rounding = setup_.rounding == Rounding::kStochastic
                                     ? fmt::format("stochastic (seed {})", setup_.seed)
                                     : std::string("nearest, ties to even");
    fmt::format_to(fmt::appender(out_), "{} -> {}; overflow: {}; rounding: {}\n", name(setup_.source), formats,
                   overflow, rounding);
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
    if (std::fflush(output()) != 0 || std::ferror(output())) throw std::runtime_error("writing to stdout failed");
  }

  void flush() {
    std::fwrite(out_.data(), 1, out_.size(), output());
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
      errno = 0;
      const std::size_t got = std::fread(buffer_.data() + old_size, 1, kBlock, stdin);
      const int err = errno;
      buffer_.resize(old_size + got);
      if (got == 0) {
        if (std::ferror(stdin)) {
          throw std::runtime_error(std::string("reading stdin failed: ") +
                                   (err != 0 ? std::strerror(err) : "a read error"));
        }
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
  const auto source = parse_precision(args.from);
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
  setup.overflow = args.overflow.overflow();
  setup.seed = parse_integer_option<std::uint64_t>("--seed", args.seed);
  if (args.seed_given && setup.rounding != Rounding::kStochastic) {
    throw UsageError("--seed is for --rounding stochastic (nearest rounding draws nothing)");
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
    const auto value = parse_number(token, setup.source);
    if (!value) {
      if (!after_separator && looks_like_option(token)) {
        throw UsageError("unknown option " + quote_token(token));
      }
      throw UsageError(unparsable(token));
    }
    pending.add(trim_space(token), *value);
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
    const std::string_view text = trim_space(line);
    if (text.empty()) continue;
    const auto value = parse_number(text, setup.source);
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
  add_overflow_flags(cast, args->overflow);
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
  cast->callback([args, cast] {
    args->seed_given = cast->count("--seed") > 0;
    run_cast(*args, cast->remaining());
  });
}

}  // namespace fp8kit::cli
