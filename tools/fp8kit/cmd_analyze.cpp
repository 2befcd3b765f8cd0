// `fp8kit analyze FILE`: does FP8 hold this tensor, and at which granularity? Quantizes a .npy array (viewed
// as 2-D, last dimension as the row) for each format x granularity and reports what each loses, with a verdict.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/common/text.hpp"
#include "fp8kit/io/npy.hpp"
#include "fp8kit/io/safetensors.hpp"
#include "fp8kit/scaling/analysis.hpp"
#include "fp8kit/scaling/quantize.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit::cli {
namespace {

struct AnalyzeArgs {
  std::string file;
  std::string tensor;
  std::string formats = "e4m3fn,e5m2";
  std::string granularities = "tensor,row,block:1x128,mx32";
  OverflowFlags overflow_flags;
  bool json = false;
};

using Row = AnalysisRow;

std::string sqnr_text(const QuantDiagnostics& d) {
  if (d.sqnr_db) return fmt::format("{:.1f}", *d.sqnr_db);
  return d.exact ? "exact" : "-";
}

// "SQNR 31.6 dB", or "exact" where nothing was lost (no SQNR: no error to measure).
std::string sqnr_phrase(const QuantDiagnostics& d) {
  return d.sqnr_db ? "SQNR " + sqnr_text(d) + " dB" : d.exact ? "exact" : "no SQNR";
}

std::string verdict(const std::vector<Row>& rows) {
  // The measures cover the finite values: NaN and Inf ones (and float64 values past float32's range, which read as
  // Inf) are named beside whatever the verdict says, never hidden behind "holds".
  const std::uint64_t nonfinite = rows.empty() ? 0 : rows[0].d.nonfinite_count;
  const std::string unmeasured =
      nonfinite == 0 ? ""
                     : fmt::format("; {} value{} NaN or infinite (or past float32's range) and not measured", nonfinite,
                                   nonfinite == 1 ? " is" : "s are");
  // e4m3fn's precision is the point of FP8 for weights and activations; among holders prefer coarse, then SQNR
  const Row* best = best_holding(rows);
  if (best != nullptr) {
    return fmt::format("verdict: {} holds {}this tensor at '{}' granularity ({}, {:.3f}% underflow, 0 saturated){}",
                       name(best->format), nonfinite == 0 ? "" : "the finite values of ", best->granularity.name(),
                       sqnr_phrase(best->d), 100.0 * best->d.underflow_fraction(), unmeasured);
  }
  const Row* top = nullptr;
  for (const Row& r : rows) {
    if (top == nullptr || r.d.sqnr_db.value_or(-1e9) > top->d.sqnr_db.value_or(-1e9)) top = &r;
  }
  if (top == nullptr) return "verdict: nothing was analyzed";
  return fmt::format(
             "verdict: no combination tried holds this tensor (SQNR >= {:.0f} dB, <= {:.1f}% underflow, none "
             "saturated); "
             "best: {} '{}' with {}, {:.3f}% underflow, {} saturated",
             kGoodSqnrDb, 100.0 * kMaxUnderflowFraction, name(top->format), top->granularity.name(),
             sqnr_phrase(top->d), 100.0 * top->d.underflow_fraction(), top->d.saturated_count) +
         unmeasured;
}

nlohmann::json optional_number(std::optional<double> v) {
  if (!v || !std::isfinite(*v)) return nullptr;
  return *v;
}

void run_analyze(const AnalyzeArgs& args) {
  const Overflow overflow = args.overflow_flags.overflow();
  const std::vector<Format> formats = parse_format_list(args.formats);
  for (Format f : formats) {
    try {
      check_analysis_format(f);
    } catch (const Error& e) {
      throw UsageError(std::string("--format: ") + e.what());
    }
  }
  std::vector<Granularity> granularities;
  for (std::size_t start = 0; start <= args.granularities.size();) {
    const std::size_t comma = args.granularities.find(',', start);
    const std::string token =
        args.granularities.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const auto g = Granularity::parse(token);
    if (!g) {
      throw UsageError(
          "unknown granularity '" + token +
          "' (use tensor, row, col, block:RxC with sides 1..2147483648 such as block:1x128, mx32, mx32-rceil)");
    }
    for (const Granularity& seen : granularities) {
      if (seen.name() == g->name()) {
        throw UsageError("--granularity: " + g->name() + " is listed twice in '" + args.granularities +
                         "'; give each granularity once");
      }
    }
    granularities.push_back(*g);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  const std::filesystem::path path(args.file);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw UsageError("'" + args.file + "' is not a readable file");
  const std::string ext = path.extension().string();
  if (ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".pkl") {
    throw UsageError("'" + args.file + "': " + ext +
                     " is a pickle file's extension (PyTorch's format for .bin/.pt/.pth), which fp8kit never loads (it "
                     "can run code); save the tensor with "
                     "numpy.save or safetensors' save_file (a safetensors file named " +
                     ext + ": rename it)");
  }
  if (ext != ".npy" && ext != ".safetensors") {
    throw UsageError("'" + args.file + "': analyze reads NumPy .npy and .safetensors files (numpy.save, save_file)");
  }
  // The values as float32 with their shape and a description of where they came from.
  std::vector<float> values;
  std::vector<std::int64_t> shape;
  std::string source_dtype;
  // float64 data as it is (analyze() rounds it and counts what float32 loses): a .npy file's own buffer (aligned,
  // as operator new aligns), a copy of a safetensors tensor (its offset in the mapped file need not be).
  const double* values64 = nullptr;
  std::vector<double> copy64;
  NpyArray array;
  if (ext == ".npy") {
    if (!args.tensor.empty()) {
      throw UsageError("--tensor selects a tensor inside a .safetensors file; '" + args.file +
                       "' holds a single array");
    }
    try {
      array = load_npy(path);
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
    if (array.dtype == NpyDType::kFloat64) {
      values64 = reinterpret_cast<const double*>(array.data.data());
    } else {
      values = array.to_float32();
    }
    shape.assign(array.shape.begin(), array.shape.end());
    source_dtype = array.descr;
  } else {
    const SafetensorsFile file = SafetensorsFile::open(path);
    std::vector<std::string> floating;
    for (const SafetensorsTensor& t : file.tensors()) {
      const auto d = tensor_dtype(t.dtype);
      if (d && (*d == DType::float32 || *d == DType::float16 || *d == DType::bfloat16 || *d == DType::float64)) {
        floating.push_back(t.name);
      }
    }
    std::string name = args.tensor;
    if (name.empty()) {
      if (floating.empty()) {
        throw UsageError("'" + args.file +
                         "' holds no float32, float16, bfloat16 or float64 tensor: nothing to analyze (fp8kit inspect "
                         "lists what it holds)");
      }
      if (floating.size() != 1) {
        throw UsageError("'" + args.file + "' holds " + std::to_string(floating.size()) +
                         " floating-point tensors: choose one with --tensor NAME (fp8kit inspect lists them)");
      }
      name = floating.front();
    }
    const SafetensorsTensor* t = file.find(name);
    if (t == nullptr)
      throw UsageError("'" + args.file + "' has no tensor '" + printable(name) + "' (fp8kit inspect lists them)");
    if (std::find(floating.begin(), floating.end(), name) == floating.end()) {
      throw UsageError("tensor '" + printable(name) + "' is " + std::string(fp8kit::name(t->dtype)) +
                       ": analyze takes F32, F16, BF16 or F64 tensors");
    }
    if (t->dtype == SafetensorsDType::F64) {
      copy64.resize(t->bytes.size() / sizeof(double));
      std::memcpy(copy64.data(), t->bytes.data(), t->bytes.size());
      values64 = copy64.data();
    } else {
      const Tensor f32 = to_tensor(*t).to(DType::float32);
      values.assign(f32.span<float>().begin(), f32.span<float>().end());
    }
    shape.assign(t->shape.begin(), t->shape.end());
    source_dtype = std::string(fp8kit::name(t->dtype)) + " '" + printable(name) + "'";  // (a name from the file)
  }
  // The last dimension is the row; the leading ones are the rows (so [0, 16] is 0 x 16 and [16, 0] is 16 x 0).
  const std::int64_t cols = shape.empty() ? 1 : shape.back();
  std::int64_t rows = 1;  // (an empty tensor's leading dimensions can multiply past int64: (3, 2^62, 0))
  for (std::size_t i = 0; i + 1 < shape.size(); ++i) {
    if (__builtin_mul_overflow(rows, shape[i], &rows)) {
      throw UsageError("'" + one_line(args.file) + "': " + source_dtype + " " + shape_string(shape) +
                       " has more rows than a matrix can index (its leading dimensions multiply past 2^63)");
    }
  }
  const MatrixRef view =
      values64 == nullptr ? MatrixRef{values.data(), rows, cols} : MatrixRef{values64, DType::float64, rows, cols};
  const std::vector<Row> results = analyze(view, formats, granularities, overflow);
  if (args.json) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const Row& r : results) {
      out.push_back({{"format", std::string(name(r.format))},
                     {"granularity", r.granularity.name()},
                     {"overflow", overflow == Overflow::kSaturate ? "saturate" : "non-saturating"},
                     {"rows", rows},
                     {"cols", view.cols},
                     {"amax", r.d.amax},
                     {"scale", r.d.scale ? nlohmann::ordered_json(*r.d.scale) : nlohmann::ordered_json(nullptr)},
                     {"scales", r.scales},
                     {"sqnr_db", optional_number(r.d.sqnr_db)},
                     {"exact", r.d.exact},
                     {"underflow_fraction", r.d.underflow_fraction()},
                     {"underflow_count", r.d.underflow_count},
                     {"saturated_count", r.d.saturated_count},
                     {"nonfinite_count", r.d.nonfinite_count},
                     {"max_abs_error", optional_number(r.d.max_abs_error)},
                     {"max_rel_error", optional_number(r.d.max_rel_error)},
                     {"holds", r.holds()}});
    }
    fmt::print(output(), "{}\n", json_text(out));
    return;
  }
  fmt::print(output(), "{}: {} {}, viewed as {} x {}; {} overflow; amax {:.6g}, {} non-finite{}\n", one_line(args.file),
             source_dtype, shape.empty() ? "scalar" : shape_string(shape), rows, view.cols,
             overflow == Overflow::kSaturate ? "saturating" : "non-saturating",
             results.empty() ? 0.0f : results[0].d.amax, results.empty() ? 0 : results[0].d.nonfinite_count,
             values64 == nullptr
                 ? ""
                 : " (float64 read as float32: values past its range count as non-finite, below it as underflow)");
  fmt::print(output(), "{:<9} {:<14} {:>12} {:>9} {:>11} {:>10} {:>12} {:>6}\n", "format", "granularity", "scale",
             "SQNR dB", "underflow", "saturated", "max rel err", "holds");
  for (const Row& r : results) {
    fmt::print(output(), "{:<9} {:<14} {:>12} {:>9} {:>10.3f}% {:>10} {:>12.4g} {:>6}\n", name(r.format),
               r.granularity.name(), r.d.scale ? fmt::format("{:.6g}", *r.d.scale) : "per block", sqnr_text(r.d),
               100.0 * r.d.underflow_fraction(), r.d.saturated_count, r.d.max_rel_error, r.holds() ? "yes" : "no");
  }
  fmt::print(output(), "{}\n", verdict(results));
}

}  // namespace

void add_analyze_command(CLI::App& app) {
  auto args = std::make_shared<AnalyzeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "analyze", "Does FP8 hold this tensor, and at which granularity? (.npy and .safetensors files)");
  cmd->add_option("FILE", args->file, "A NumPy .npy file or a .safetensors file (floating tensors, any shape)")
      ->required();
  cmd->add_option("--tensor", args->tensor, "The tensor to analyze in a multi-tensor file");
  cmd->add_option("--format", args->formats, "Comma-separated formats (default e4m3fn,e5m2)");
  cmd->add_option(
      "--granularity", args->granularities,
      "Comma-separated: tensor, row, col, block:RxC, mx32, mx32-rceil (default tensor,row,block:1x128,mx32)");
  add_overflow_flags(cmd, args->overflow_flags);
  cmd->add_flag("--json", args->json, "Print a JSON array instead of the table");
  cmd->callback([args] { run_analyze(*args); });
}

}  // namespace fp8kit::cli
