// `fp8kit inspect FILE`: what a safetensors file or checkpoint directory holds: every tensor's dtype, shape and
// bytes, the detected FP8 layout and why, which weights are quantized with which scales, and for high-precision
// tensors what `fp8kit analyze` would say in e4m3fn (--json for machines).
#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "checkpoint_io.hpp"
#include "cli_common.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/io/checkpoint_layout.hpp"
#include "fp8kit/io/safetensors.hpp"
#include "fp8kit/scaling/analysis.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit::cli {
namespace {

struct InspectArgs {
  std::string file;
  bool json = false;
  bool no_analysis = false;
};

// What `fp8kit analyze` would say about a high-precision tensor in e4m3fn (saturating) at its default
// granularities: the coarsest that holds, with its SQNR; nullopt for tensors that are not floating point.
struct Fp8Analysis {
  std::optional<AnalysisRow> best;  // none holds when empty
  double best_sqnr_db = 0.0;        // the best SQNR tried, when none holds
  std::uint64_t nonfinite = 0;      // NaN and Inf values (not measured)
};

std::optional<Fp8Analysis> analyze_tensor(const SafetensorsTensor& t) {
  const auto dtype = tensor_dtype(t.dtype);
  if (!dtype || !(*dtype == DType::float32 || *dtype == DType::float16 || *dtype == DType::bfloat16 ||
                  *dtype == DType::float64)) {
    return std::nullopt;
  }
  const Tensor x = to_tensor(t);
  if (x.numel() == 0) return std::nullopt;
  const MatrixRef m = x.matrix();  // analyze() takes every floating dtype (float64 rounded, its losses counted)
  const Format e4m3fn = Format::e4m3fn;
  const std::vector<AnalysisRow> rows =
      analyze(m, std::span(&e4m3fn, 1), default_analysis_granularities(), Overflow::kSaturate);
  Fp8Analysis a;
  if (const AnalysisRow* best = best_holding(rows)) a.best = *best;
  if (!rows.empty()) a.nonfinite = rows[0].d.nonfinite_count;
  for (const AnalysisRow& r : rows) a.best_sqnr_db = std::max(a.best_sqnr_db, r.d.sqnr_db.value_or(0.0));
  return a;
}

std::string analysis_text(const Fp8Analysis& a) {
  // NaN and Inf values are not measured: said beside the verdict, not hidden behind "holds".
  const std::string nonfinite = a.nonfinite == 0 ? "" : fmt::format("; {} NaN/Inf not measured", a.nonfinite);
  if (a.best) {
    const QuantDiagnostics& d = a.best->d;
    // No SQNR: no error (exact), or no signal to measure one against.
    const std::string sqnr = d.sqnr_db ? fmt::format("{:.1f} dB", *d.sqnr_db) : d.exact ? "exact" : "no signal";
    return fmt::format("e4m3fn holds at '{}' ({}{})", a.best->granularity.name(), sqnr, nonfinite);
  }
  return fmt::format("e4m3fn does not hold (best {:.1f} dB{})", a.best_sqnr_db, nonfinite);
}

void run_inspect(const InspectArgs& args) {
  const CheckpointInput in = open_checkpoint_input(args.file);
  LayoutDetection detection;
  try {
    detection = detect_layout(in.checkpoint, in.config.value_or(""));
  } catch (const Error& e) {  // a weight with two scales: shown as the evidence, as invalid scales are below
    detection = {std::nullopt, std::string("undecided: ") + e.what()};
  }
  const QuantizationConfig config =
      in.config ? parse_quantization_config(*in.config).value_or(QuantizationConfig{}) : QuantizationConfig{};
  // Roles: weight -> its scales, scale -> its weight.
  std::map<std::string, std::string> role;
  std::vector<QuantizedWeight> weights;
  std::map<std::string, std::string> granularity;
  if (detection.layout) {
    weights = quantized_weights(in.checkpoint, *detection.layout);
    for (const QuantizedWeight& w : weights) {
      try {
        granularity[w.weight] = scale_granularity(*detection.layout, in.checkpoint.at(w.weight),
                                                  in.checkpoint.at(w.scale), config, in.metadata)
                                    .name();
      } catch (const Error& e) {  // shown, not fatal: inspect is how one finds out what is wrong
        granularity[w.weight] = std::string("invalid: ") + e.what();
      }
      role[w.weight] = "weight (" + granularity[w.weight] + ", scale " + w.scale + ")";
      role[w.scale] = "scale of " + w.weight;
      if (w.input_scale) role[*w.input_scale] = "input scale of " + w.weight;
    }
  }
  // High-precision tensors that are not scales: what analyze would say (skipped with --no-analysis), computed as
  // each tensor is printed, so that memory stays at what the headers take however many tensors there are (nothing
  // per tensor is kept for the output, --json included), with a progress line over the tensors it reads.
  const bool analyze = !args.no_analysis;
  Progress progress("inspect");
  std::uint64_t total = 0;
  for (const SafetensorsTensor* t : in.checkpoint.tensors()) {
    total += t->bytes.size();
    if (analyze && !role.count(t->name)) progress.expect(t->bytes.size());
  }
  const auto analysis_of = [&](const SafetensorsTensor& t) -> std::optional<Fp8Analysis> {
    if (!analyze || role.count(t.name)) return std::nullopt;
    progress.step(t.name, t.bytes.size());
    return analyze_tensor(t);
  };
  const std::string layout = detection.layout ? std::string(name(*detection.layout)) : "none";

  if (args.json) {
    // One object, written as it is made: the tensors one per line.
    const auto str = [](const nlohmann::ordered_json& j) { return json_text(j, -1); };
    fmt::print(output(),
               "{{\n  \"path\": {},\n  \"shards\": {},\n  \"layout\": {},\n  \"evidence\": {},\n  "
               "\"total_bytes\": {},\n  \"tensors\": [",
               str(args.file), in.checkpoint.shards().size(), detection.layout ? str(layout) : std::string("null"),
               str(detection.evidence), total);
    bool first = true;
    for (const SafetensorsTensor* t : in.checkpoint.tensors()) {
      nlohmann::ordered_json e = {{"name", t->name},
                                  {"dtype", std::string(name(t->dtype))},
                                  {"shape", t->shape},
                                  {"bytes", t->bytes.size()},
                                  {"shard", in.checkpoint.weight_map().count(t->name)
                                                ? in.checkpoint.weight_map().at(t->name)
                                                : in.checkpoint.shards().front().path().filename().string()}};
      e["role"] = role.count(t->name) ? nlohmann::ordered_json(role.at(t->name)) : nlohmann::ordered_json(nullptr);
      if (const std::optional<Fp8Analysis> a = analysis_of(*t)) {
        e["e4m3fn_holds_at"] =
            a->best ? nlohmann::ordered_json(a->best->granularity.name()) : nlohmann::ordered_json(nullptr);
        // null where the analysis has none: the tensor comes back exactly (as `fp8kit analyze` prints it).
        e["e4m3fn_sqnr_db"] = !a->best             ? nlohmann::ordered_json(a->best_sqnr_db)
                              : a->best->d.sqnr_db ? nlohmann::ordered_json(*a->best->d.sqnr_db)
                                                   : nlohmann::ordered_json(nullptr);
      }
      fmt::print(output(), "{}\n    {}", first ? "" : ",", str(e));
      first = false;
    }
    fmt::print(output(), "{}],\n  \"quantized\": [", first ? "" : "\n  ");
    first = true;
    for (const QuantizedWeight& w : weights) {
      const nlohmann::ordered_json q = {
          {"weight", w.weight},
          {"scale", w.scale},
          {"input_scale", w.input_scale ? nlohmann::ordered_json(*w.input_scale) : nlohmann::ordered_json(nullptr)},
          {"granularity", granularity.at(w.weight)}};
      fmt::print(output(), "{}\n    {}", first ? "" : ",", str(q));
      first = false;
    }
    fmt::print(output(), "{}]\n}}\n", first ? "" : "\n  ");
    return;
  }
  fmt::print(output(), "{}: {} tensors in {} shard{}, {} bytes\n", one_line(args.file), in.checkpoint.size(),
             in.checkpoint.shards().size(), in.checkpoint.shards().size() == 1 ? "" : "s", total);
  fmt::print(output(), "layout: {} ({})\n", layout, one_line(detection.evidence));
  fmt::print(output(), "quantized weights: {}\n", weights.size());
  std::size_t width = 4;
  for (const SafetensorsTensor* t : in.checkpoint.tensors()) width = std::max(width, one_line(t->name).size());
  width = std::min<std::size_t>(width, 72);
  fmt::print(output(), "{:<{}} {:<11} {:<18} {:>12}  {}\n", "name", width, "dtype", "shape", "bytes", "role");
  for (const SafetensorsTensor* t : in.checkpoint.tensors()) {
    const std::optional<Fp8Analysis> a = analysis_of(*t);
    fmt::print(output(), "{:<{}} {:<11} {:<18} {:>12}  {}\n", one_line(t->name), width, name(t->dtype),
               shape_string(t->shape), t->bytes.size(),
               role.count(t->name) ? role.at(t->name) : (a ? analysis_text(*a) : ""));
  }
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "List a safetensors file's or checkpoint's tensors, its FP8 layout and its quantized weights");
  cmd->add_option("FILE", args->file,
                  "A .safetensors file, or a checkpoint directory (model.safetensors, or shards with "
                  "model.safetensors.index.json)")
      ->required();
  cmd->add_flag("--json", args->json, "Print a JSON object instead of the table");
  cmd->add_flag("--no-analysis", args->no_analysis,
                "Skip the e4m3fn analysis of high-precision tensors (it reads and quantizes each one)");
  add_quiet_flag(cmd);
  cmd->callback([args] { run_inspect(*args); });
}

}  // namespace fp8kit::cli
