// `fp8kit formats`: every FP8 format fp8kit knows, with its layout, range and special encodings, all derived
// from the format descriptors (nothing here is a hand-typed constant). A table by default, JSON with --json.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "fp8kit/format/format.hpp"

namespace fp8kit::cli {
namespace {

// Every code of the format for which `predicate(code)` holds, in increasing order.
template <typename Predicate>
std::vector<int> codes_where(Predicate predicate) {
  std::vector<int> codes;
  for (int code = 0; code < 256; ++code) {
    if (predicate(static_cast<std::uint8_t>(code))) codes.push_back(code);
  }
  return codes;
}

// The exponent of a power of two: "2^-9".
std::string power_of_two(double value) {
  int exponent = 0;
  std::frexp(value, &exponent);
  return fmt::format("2^{}", exponent - 1);
}

nlohmann::ordered_json format_json(const FormatDescriptor& d) {
  const Format f = d.format;
  const auto min_sub = min_subnormal(f);
  nlohmann::ordered_json out;
  out["name"] = d.name;
  out["torch_name"] = d.torch_name;
  out["sign_bits"] = d.has_sign ? 1 : 0;
  out["exponent_bits"] = d.exponent_bits;
  out["mantissa_bits"] = d.mantissa_bits;
  out["bias"] = d.bias;
  out["max"] = max_finite(f);
  out["max_code"] = d.max_code();
  out["min_normal"] = min_normal(f);
  out["min_subnormal"] = min_sub ? nlohmann::ordered_json(*min_sub) : nlohmann::ordered_json(nullptr);
  out["epsilon"] = epsilon(f);
  out["has_zero"] = d.has_zero();
  out["has_negative_zero"] = d.has_negative_zero();
  out["has_inf"] = d.has_inf;
  out["inf_encoding"] = d.has_inf ? nlohmann::ordered_json(inf_encoding(f)) : nlohmann::ordered_json(nullptr);
  out["inf_codes"] = codes_where([&](std::uint8_t c) { return d.is_inf(c); });
  out["nan_encoding"] = nan_encoding(f);
  out["nan_codes"] = codes_where([&](std::uint8_t c) { return d.is_nan(c); });
  return out;
}

// One row of the table: a label and one cell per format.
struct Row {
  std::string label;
  std::vector<std::string> cells;
};

std::vector<Row> table_rows() {
  std::vector<Row> rows = {{"format", {}},        {"torch dtype", {}}, {"sign bits", {}},     {"exponent bits", {}},
                           {"mantissa bits", {}}, {"bias", {}},        {"max finite", {}},    {"  code", {}},
                           {"min normal", {}},    {"  exactly", {}},   {"min subnormal", {}}, {"  exactly", {}},
                           {"epsilon", {}},       {"inf", {}},         {"nan", {}},           {"negative zero", {}}};
  for (Format f : kAllFormats) {
    const FormatDescriptor& d = descriptor(f);
    const auto min_sub = min_subnormal(f);
    const std::vector<std::string> cells = {
        std::string(d.name),
        std::string(d.torch_name),
        std::to_string(d.has_sign ? 1 : 0),
        std::to_string(d.exponent_bits),
        std::to_string(d.mantissa_bits),
        std::to_string(d.bias),
        format_exact(max_finite(f)),
        fmt::format("{} (0x{:02x})", code_bits(f, d.max_code()), d.max_code()),
        power_of_two(min_normal(f)),
        format_exact(min_normal(f)),
        min_sub ? power_of_two(*min_sub) : "none",
        min_sub ? format_exact(*min_sub) : "",
        power_of_two(epsilon(f)) + " = " + format_exact(epsilon(f)),
        inf_encoding(f),
        nan_encoding(f),
        d.has_negative_zero() ? fmt::format("yes (0x{:02x})", d.sign_mask()) : "no",
    };
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i].cells.push_back(cells[i]);
  }
  return rows;
}

void print_table() {
  const std::vector<Row> rows = table_rows();
  std::size_t label_width = 0;
  std::vector<std::size_t> widths(kAllFormats.size(), 0);
  for (const Row& row : rows) {
    label_width = std::max(label_width, row.label.size());
    for (std::size_t i = 0; i < row.cells.size(); ++i) widths[i] = std::max(widths[i], row.cells[i].size());
  }
  std::string out;
  for (const Row& row : rows) {
    std::string line = fmt::format("{:<{}}", row.label, label_width);
    for (std::size_t i = 0; i < row.cells.size(); ++i) line += fmt::format("  {:<{}}", row.cells[i], widths[i]);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  out +=
      "\nBit patterns: sign.exponent.mantissa; S = either sign. Values are exact (every FP8 value is a "
      "dyadic\n"
      "rational); e8m0fnu has no sign, no mantissa and no zero: every code is a power of two.\n";
  std::fputs(out.c_str(), output());
}

}  // namespace

void add_formats_command(CLI::App& app) {
  CLI::App* formats = app.add_subcommand("formats", "Describe every FP8 format: layout, range, special encodings");
  auto json = std::make_shared<bool>(false);
  formats->add_flag("--json", *json, "Print a JSON array (one object per format) instead of the table");
  formats->callback([json] {
    if (*json) {
      nlohmann::ordered_json out = nlohmann::ordered_json::array();
      for (Format f : kAllFormats) out.push_back(format_json(descriptor(f)));
      std::fprintf(output(), "%s\n", json_text(out).c_str());
      return;
    }
    print_table();
  });
}

}  // namespace fp8kit::cli
