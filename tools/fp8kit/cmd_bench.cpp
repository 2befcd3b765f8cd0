// `fp8kit bench convert`: the conversion kernels against memcpy, measured in the same run (medians of
// interleaved repetitions). Benchmarks report ratios to a baseline, never a pass/fail on absolute times.
#include <fmt/core.h>

#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_common.hpp"
#include "convert_bench.hpp"
#include "fp8kit/convert.hpp"
#include "fp8kit/cpu.hpp"
#include "scaling_bench.hpp"

namespace fp8kit::cli {
namespace {

// "268435456", "256M", "256MiB", "1G": bytes.
std::size_t parse_size(const std::string& text) {
  std::size_t pos = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &pos);
  } catch (const std::exception&) {
    throw UsageError("--bytes: '" + text + "' is not a size (examples: 268435456, 256M, 1G)");
  }
  const std::string suffix = text.substr(pos);
  unsigned long long unit = 1;
  if (suffix == "K" || suffix == "KiB")
    unit = 1ull << 10;
  else if (suffix == "M" || suffix == "MiB")
    unit = 1ull << 20;
  else if (suffix == "G" || suffix == "GiB")
    unit = 1ull << 30;
  else if (!suffix.empty())
    throw UsageError("--bytes: unknown unit '" + suffix + "' (use K, M or G)");
  const unsigned long long bytes = value * unit;
  if (bytes < 4096 || bytes > (16ull << 30)) throw UsageError("--bytes: " + text + " is outside 4K..16G");
  return static_cast<std::size_t>(bytes);
}

// --threads N: just N; absent (0): one thread, then all of them.
std::vector<int> thread_counts(int requested) {
  if (requested < 0) throw UsageError("--threads must be at least 1, got " + std::to_string(requested));
  if (requested > 0) return {requested};
  std::vector<int> counts = {1};
  if (num_threads() > 1) counts.push_back(num_threads());
  return counts;
}

struct BenchArgs {
  bool json = false;
  int threads = 0;
  std::string bytes = "256M";
  int reps = 11;
};

// The options every benchmark shares, validated, copied into its own options struct.
template <typename Options>
Options common_options(const BenchArgs& args) {
  if (args.reps < 3) throw UsageError("--reps must be at least 3, got " + std::to_string(args.reps));
  Options options;
  options.bytes = parse_size(args.bytes);
  options.reps = args.reps;
  options.threads = thread_counts(args.threads);
  return options;
}

// "bench NAME: done/total" on stderr while a benchmark runs, only on a terminal; erased at the end.
class Progress {
 public:
  explicit Progress(std::string name) : name_(std::move(name)), shown_(stderr_is_terminal()) {}
  ~Progress() {
    if (shown_) std::fprintf(stderr, "\r\033[K");
  }
  void operator()(int done, int total) const {
    if (shown_) std::fprintf(stderr, "\rbench %s: %d/%d", name_.c_str(), done, total);
  }

 private:
  std::string name_;
  bool shown_;
};

// The fields every benchmark row has in --json output.
nlohmann::json timing_json(const bench::Timing& t, const std::string& baseline, const std::string& cpu) {
  return {{"threads", t.threads},
          {"bytes", t.bytes_moved},
          {"seconds", t.seconds},
          {"gbps", t.gbps},
          {"baseline", baseline},
          {"baseline_seconds", t.baseline_seconds},
          {"baseline_gbps", t.baseline_gbps},
          {"ratio", t.ratio},
          {"cpu", cpu}};
}

nlohmann::json string_or_null(const std::string& s) {
  return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s);
}

void run_bench_convert(const BenchArgs& args) {
  const auto options = common_options<bench::ConvertBenchOptions>(args);
  std::vector<bench::ConvertResult> results;
  {
    const Progress progress("convert");
    results = bench::run_convert_bench(options, std::cref(progress));
  }
  const std::string cpu = cpu_features().brand;
  if (args.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : results) {
      nlohmann::json row = timing_json(r.timing, "memcpy", cpu);
      row["op"] = r.op;
      row["isa"] = r.isa;
      row["overflow"] = string_or_null(r.overflow);
      row["scale"] = r.scale;
      row["elements"] = r.elements;
      out.push_back(row);
    }
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  fmt::print("conversion kernels vs memcpy of the same {} MiB array ({} repetitions, medians; CPU: {})\n",
             options.bytes >> 20, options.reps, cpu.empty() ? "unknown" : cpu);
  fmt::print("GB/s counts input + output bytes; memcpy counts its reads + writes\n\n");
  fmt::print("{:<16} {:<7} {:<15} {:>6} {:>7} {:>9} {:>12} {:>7}\n", "op", "isa", "overflow", "scale", "threads",
             "GB/s", "memcpy GB/s", "ratio");
  for (const auto& r : results) {
    fmt::print("{:<16} {:<7} {:<15} {:>6.3g} {:>7} {:>9.1f} {:>12.1f} {:>6.2f}x\n", r.op, r.isa,
               r.overflow.empty() ? "-" : r.overflow, r.scale, r.timing.threads, r.timing.gbps, r.timing.baseline_gbps,
               r.timing.ratio);
  }
}

void run_bench_scaling(const BenchArgs& args) {
  const auto options = common_options<bench::ScalingBenchOptions>(args);
  std::vector<bench::ScalingResult> results;
  {
    const Progress progress("scaling");
    results = bench::run_scaling_bench(options, std::cref(progress));
  }
  const std::string cpu = cpu_features().brand;
  if (args.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : results) {
      nlohmann::json row = timing_json(r.timing, r.baseline, cpu);
      row["op"] = r.op;
      row["granularity"] = string_or_null(r.granularity);
      row["format"] = r.op == "quantize" || r.op == "dequantize" ? nlohmann::json("e4m3fn") : nlohmann::json(nullptr);
      out.push_back(row);
    }
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  fmt::print(
      "scaling kernels on a {} MiB float32 matrix (rows x 4096, e4m3fn, saturating; {} repetitions, medians; "
      "CPU: {})\n",
      options.bytes >> 20, options.reps, cpu.empty() ? "unknown" : cpu);
  fmt::print("GB/s counts bytes read + written; amax is compared with the read probe, the rest with memcpy\n\n");
  fmt::print("{:<15} {:<15} {:>7} {:>9} {:<15} {:>13} {:>7}\n", "op", "granularity", "threads", "GB/s", "baseline",
             "baseline GB/s", "ratio");
  for (const auto& r : results) {
    fmt::print("{:<15} {:<15} {:>7} {:>9.1f} {:<15} {:>13.1f} {:>6.2f}x\n", r.op,
               r.granularity.empty() ? "-" : r.granularity, r.timing.threads, r.timing.gbps, r.baseline,
               r.timing.baseline_gbps, r.timing.ratio);
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks: kernels against baselines measured in the same run");
  bench->require_subcommand(1);
  // The options every benchmark takes; `what` names the array --bytes sizes.
  auto add = [bench](const char* name, const char* help, const char* what, void (*run)(const BenchArgs&)) {
    auto args = std::make_shared<BenchArgs>();
    CLI::App* cmd = bench->add_subcommand(name, help);
    cmd->add_flag("--json", args->json, "Print a JSON array instead of the table");
    cmd->add_option("--threads", args->threads, "Thread count (default: 1, then all cores)");
    cmd->add_option("--bytes", args->bytes, std::string("Size of the ") + what + ", e.g. 256M (default 256M)");
    cmd->add_option("--reps", args->reps, "Repetitions per measurement (default 11)");
    cmd->callback([args, run] { run(*args); });
  };
  add("convert", "Conversion kernels against memcpy of the same bytes", "wide array", &run_bench_convert);
  add("scaling", "amax, quantize and dequantize against the read probe and memcpy", "float32 matrix",
      &run_bench_scaling);
}

}  // namespace fp8kit::cli
