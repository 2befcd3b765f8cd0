// `fp8kit bench convert|scaling|gemm|peak|comm|checkpoint`: kernels against baselines (memcpy, the read probe,
// OpenBLAS) measured in the same run (medians of interleaved repetitions). Benchmarks report ratios to a baseline,
// never a pass/fail on absolute times.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "bench_checkpoint.hpp"
#include "bf16_baseline.hpp"
#include "cli_common.hpp"
#include "comm_bench.hpp"
#include "convert_bench.hpp"
#include "cuda_bench.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/convert/convert.hpp"
#include "fp8kit/dist/communicator.hpp"
#include "gemm_bench.hpp"
#include "peak_bench.hpp"
#include "scaling_bench.hpp"

namespace fp8kit::cli {
namespace {

// --bytes: any size parse_byte_size reads, between 4 KiB and 16 GiB.
std::size_t parse_size(const std::string& text) {
  const std::uint64_t bytes = parse_byte_size(text, "--bytes");
  if (bytes < 4096 || bytes > (16ull << 30)) throw UsageError("--bytes: " + text + " is outside 4KiB..16GiB");
  return static_cast<std::size_t>(bytes);
}

// Refuses a --bytes whose buffers would not fit in memory (the kernel would kill the process part-way instead).
void check_memory(std::size_t needed, const std::string& bytes_text, const char* option = "--bytes") {
  const std::uint64_t available = available_memory();
  if (available != 0 && needed > available) {
    throw UsageError(
        fmt::format("{} {} needs {:.1f} GB of memory for its buffers and {:.1f} GB is available; "
                    "use a smaller size",
                    option, bytes_text, static_cast<double>(needed) / 1e9, static_cast<double>(available) / 1e9));
  }
}

// --threads N: just N; absent (kThreadsAbsent): one thread, then all of them.
constexpr int kThreadsAbsent = std::numeric_limits<int>::min();

std::vector<int> thread_counts(int requested) {
  if (requested == kThreadsAbsent) {
    std::vector<int> counts = {1};
    if (num_threads() > 1) counts.push_back(num_threads());
    return counts;
  }
  if (requested < 1) throw UsageError("--threads must be at least 1, got " + std::to_string(requested));
  if (requested > kMaxThreads) {
    throw UsageError("--threads must be at most " + std::to_string(kMaxThreads) + ", got " + std::to_string(requested));
  }
  return {requested};
}

struct BenchArgs {
  bool json = false;
  int threads = kThreadsAbsent;
  std::string bytes = "256M";
  int reps = 11;
  std::string isa;             // --isa
  std::string ops;             // --ops (convert)
  std::string device = "cpu";  // --device
};

// --device: "cpu" (nothing: the CPU kernels), "cuda" or "cuda:N" (the device's index).
std::optional<int> cuda_device(const std::string& text) {
  if (text == "cpu") return std::nullopt;
  if (text == "cuda") return 0;
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() < 9 &&
      std::all_of(text.begin() + 5, text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::stoi(text.substr(5));
  }
  throw UsageError("--device: '" + text + "' is not a device (use cpu, cuda or cuda:N)");
}

// `bench convert|scaling --device cuda`: the CUDA kernels against device-to-device memcpy.
void run_cuda_stream(const BenchArgs& args, const std::string& which, int device) {
  if (!args.isa.empty() || args.threads != kThreadsAbsent || !args.ops.empty()) {
    throw UsageError("--isa, --threads and --ops choose CPU kernels: leave them out with --device cuda");
  }
  if (args.reps < 3) throw UsageError("--reps must be at least 3, got " + std::to_string(args.reps));
  const std::size_t bytes = parse_size(args.bytes);
  const std::string where = bench::cuda_device_description(device);  // a missing device fails here, before any work
  const std::vector<bench::CudaStreamResult> results = bench::run_cuda_stream_bench(which, bytes, args.reps, device);
  if (args.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : results) {
      out.push_back({{"op", r.op},
                     {"device", where},
                     {"bytes", r.bytes},
                     {"reps", r.reps},
                     {"seconds", r.seconds},
                     {"gbps", r.gbps},
                     {"baseline", "cudaMemcpy device to device"},
                     {"baseline_gbps", r.memcpy_gbps},
                     {"ratio", r.ratio}});
    }
    std::fprintf(output(), "%s\n", json_text(out).c_str());
    return;
  }
  fmt::print(output(), "CUDA {} kernels against cudaMemcpy device to device of the {} input (medians of {} rounds)\n",
             which, args.bytes, args.reps);
  fmt::print(output(), "device: {}\nGB/s count bytes read + written, for the kernel and for memcpy\n\n", where);
  fmt::print(output(), "{:<20} {:>12} {:>10} {:>12} {:>7}\n", "op", "bytes", "GB/s", "memcpy GB/s", "ratio");
  for (const auto& r : results) {
    fmt::print(output(), "{:<20} {:>12} {:>10.1f} {:>12.1f} {:>6.2f}x\n", r.op, r.bytes, r.gbps, r.memcpy_gbps,
               r.ratio);
  }
}

// --isa: "" (the level in force), "all" (every level this CPU runs, lowest first) or a comma list of levels. A level
// the CPU cannot run is refused, naming what it lacks.
std::vector<Isa> bench_levels(const std::string& text) {
  if (text.empty()) return {active_isa()};
  if (text == "all") return cpu_isa_levels();
  std::vector<Isa> levels;
  std::size_t begin = 0;
  while (true) {
    const std::size_t comma = text.find(',', begin);
    const std::string item = text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    const std::optional<Isa> isa = parse_isa(item);
    if (item == "all") throw UsageError("--isa: 'all' (every level this CPU runs) stands alone; give it or a list");
    if (!isa) throw UsageError("--isa: '" + item + "' is not an ISA level (use all or some of " + isa_names() + ")");
    if (std::find(levels.begin(), levels.end(), *isa) != levels.end())
      throw UsageError("--isa: " + item + " is named twice; name each level once");
    if (const std::string missing = missing_for(*isa); !missing.empty())
      throw UsageError("--isa: this CPU cannot run " + item + " (it lacks " + missing + ")");
    levels.push_back(*isa);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return levels;
}

// Runs `bench` once per level with dispatch capped there, and concatenates the rows.
template <typename Row, typename Bench>
std::vector<Row> for_each_level(const std::vector<Isa>& levels, const Bench& bench) {
  const KeepDispatchSettings keep;
  std::vector<Row> rows;
  for (Isa isa : levels) {
    set_max_isa(isa);
    std::vector<Row> part = bench();
    rows.insert(rows.end(), part.begin(), part.end());
  }
  return rows;
}

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

// "bench NAME: done/total" on the progress line while a benchmark runs.
class BenchProgress {
 public:
  explicit BenchProgress(std::string name) : name_(std::move(name)) {}
  void operator()(int done, int total) const { line_.show(fmt::format("bench {}: {}/{}", name_, done, total)); }

 private:
  std::string name_;
  ProgressLine line_;
};

// The fields every benchmark row has in --json output.
nlohmann::json timing_json(const bench::Timing& t, const std::string& baseline, const std::string& cpu) {
  return {{"threads", t.threads},
          {"reps", t.reps},
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
  if (const std::optional<int> device = cuda_device(args.device)) return run_cuda_stream(args, "convert", *device);
  auto options = common_options<bench::ConvertBenchOptions>(args);
  check_memory(bench::convert_bench_memory(options.bytes), args.bytes);
  const std::vector<std::string> known = bench::convert_bench_ops();
  for (std::size_t begin = 0; !args.ops.empty();) {
    const std::size_t comma = args.ops.find(',', begin);
    const std::string op = args.ops.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    if (std::find(known.begin(), known.end(), op) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      throw UsageError("--ops: unknown op '" + op + "' (use some of " + list + ")");
    }
    options.ops.push_back(op);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  // Levels that run the same conversion table (avx512, avx512-bf16 and amx share one: no conversion needs BF16
  // or AMX instructions) are measured once, under the lowest of them; a row's `levels` are those it stands for.
  std::vector<Isa> levels;
  std::vector<std::vector<std::string>> same_as;  // per measured level: the --isa levels it stands for
  std::vector<std::string> kernels;
  {
    const KeepDispatchSettings keep;
    for (Isa level : bench_levels(args.isa)) {
      set_max_isa(level);
      const std::string kernel(conversion_kernel());
      const auto seen = std::find(kernels.begin(), kernels.end(), kernel);
      if (seen == kernels.end()) {
        levels.push_back(level);
        kernels.push_back(kernel);
        same_as.push_back({std::string(name(level))});
      } else {
        same_as[static_cast<std::size_t>(seen - kernels.begin())].emplace_back(name(level));
      }
    }
  }
  std::vector<bench::ConvertResult> results;
  std::vector<std::size_t> block_of;  // per row: its index in `levels`
  {
    const BenchProgress progress("convert");
    std::size_t level = 0;
    results = for_each_level<bench::ConvertResult>(levels, [&] {
      std::vector<bench::ConvertResult> part = bench::run_convert_bench(options, std::cref(progress));
      block_of.resize(block_of.size() + part.size(), level++);
      return part;
    });
  }
  const std::string cpu = cpu_features().brand;
  if (args.json) {
    nlohmann::json out = nlohmann::json::array();
    for (std::size_t i = 0; i < results.size(); ++i) {
      const bench::ConvertResult& r = results[i];
      nlohmann::json row = timing_json(r.timing, "memcpy", cpu);
      row["op"] = r.op;
      row["isa"] = r.isa;
      row["levels"] = same_as[block_of[i]];
      row["kernel"] = r.kernel;
      row["overflow"] = string_or_null(r.overflow);
      row["scale"] = r.scale;
      row["elements"] = r.elements;
      out.push_back(row);
    }
    std::fprintf(output(), "%s\n", json_text(out).c_str());
    return;
  }
  fmt::print(output(), "conversion kernels vs memcpy of the same {} array ({} repetitions, medians; CPU: {})\n",
             byte_size_text(options.bytes), options.reps, cpu.empty() ? "unknown" : cpu);
  fmt::print(output(), "GB/s counts input + output bytes; memcpy counts its reads + writes\n\n");
  fmt::print(output(), "{:<16} {:<7} {:<15} {:>6} {:>7} {:>9} {:>12} {:>7}\n", "op", "isa", "overflow", "scale",
             "threads", "GB/s", "memcpy GB/s", "ratio");
  for (const auto& r : results) {
    fmt::print(output(), "{:<16} {:<7} {:<15} {:>6.3g} {:>7} {:>9.1f} {:>12.1f} {:>6.2f}x\n", r.op, r.isa,
               r.overflow.empty() ? "-" : r.overflow, r.scale, r.timing.threads, r.timing.gbps, r.timing.baseline_gbps,
               r.timing.ratio);
  }
  for (std::size_t i = 0; i < levels.size(); ++i) {
    if (same_as[i].size() < 2) continue;
    std::string list;
    for (std::size_t j = 1; j < same_as[i].size(); ++j) list += (j > 1 ? ", " : "") + same_as[i][j];
    fmt::print(output(), "--isa {}: the same conversion kernels ({}) as {}, measured once\n", list, kernels[i],
               same_as[i].front());
  }
}

void run_bench_scaling(const BenchArgs& args) {
  if (const std::optional<int> device = cuda_device(args.device)) return run_cuda_stream(args, "scaling", *device);
  const auto options = common_options<bench::ScalingBenchOptions>(args);
  check_memory(bench::scaling_bench_memory(options.bytes), args.bytes);
  const std::vector<Isa> levels = bench_levels(args.isa);
  std::vector<bench::ScalingResult> results;
  {
    const BenchProgress progress("scaling");
    results = for_each_level<bench::ScalingResult>(
        levels, [&] { return bench::run_scaling_bench(options, std::cref(progress)); });
  }
  const std::string cpu = cpu_features().brand;
  if (args.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : results) {
      nlohmann::json row = timing_json(r.timing, r.baseline, cpu);
      row["op"] = r.op;
      row["isa"] = r.isa;
      row["kernel"] = string_or_null(r.kernel);
      row["granularity"] = string_or_null(r.granularity);
      row["format"] = r.op == "quantize" || r.op == "dequantize" ? nlohmann::json("e4m3fn") : nlohmann::json(nullptr);
      out.push_back(row);
    }
    std::fprintf(output(), "%s\n", json_text(out).c_str());
    return;
  }
  fmt::print(output(),
             "scaling kernels on a {} float32 matrix ({} x {}, e4m3fn, saturating; {} repetitions, medians; "
             "CPU: {})\n",
             byte_size_text(bench::scaling_bench_matrix_bytes(options.bytes)),
             bench::scaling_bench_matrix_bytes(options.bytes) / 4 / bench::kScalingBenchCols, bench::kScalingBenchCols,
             options.reps, cpu.empty() ? "unknown" : cpu);
  fmt::print(output(),
             "GB/s counts bytes read + written; amax is compared with the read probe, the rest with memcpy\n\n");
  fmt::print(output(), "{:<15} {:<11} {:<15} {:>7} {:>9} {:<15} {:>13} {:>7}\n", "op", "isa", "granularity", "threads",
             "GB/s", "baseline", "baseline GB/s", "ratio");
  for (const auto& r : results) {
    fmt::print(output(), "{:<15} {:<11} {:<15} {:>7} {:>9.1f} {:<15} {:>13.1f} {:>6.2f}x\n", r.op, r.isa,
               r.granularity.empty() ? "-" : r.granularity, r.timing.threads, r.timing.gbps, r.baseline,
               r.timing.baseline_gbps, r.timing.ratio);
  }
}

struct GemmArgs {
  bool json = false;
  int threads = kThreadsAbsent;
  std::string isa;
  std::string shapes;  // "" (not given): the default shapes
  bool shapes_given = false;
  int reps = 0;
  bool reps_given = false;
  std::string device = "cpu";
};

constexpr std::int64_t kMaxGemmDim = 65536;
constexpr double kMaxGemmBufferBytes = 16.0 * (1ull << 30);

// One dimension of a --shapes entry: a positive integer up to kMaxGemmDim.
std::int64_t parse_dim(const std::string& text, const std::string& entry) {
  std::size_t pos = 0;
  long long value = 0;
  try {
    if (text.empty() || text.front() < '0' || text.front() > '9') throw std::invalid_argument(text);
    value = std::stoll(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != text.size())
    throw UsageError("--shapes: '" + entry + "': '" + text + "' is not a dimension (a positive integer)");
  if (value < 1 || value > kMaxGemmDim)
    throw UsageError("--shapes: '" + entry + "': " + text + " is outside 1.." + std::to_string(kMaxGemmDim));
  return value;
}

// Bytes the benchmark allocates for a shape. GEMM: the float32 operands (4 per element), their FP8 codes (1) and
// bfloat16 copies (2), three float32 outputs (FP8, sgemm, bf16). GEMV: the float32 weights, their FP8 codes and the
// read probe's copy of them.
double gemm_buffer_bytes(const bench::GemmShape& s) {
  const auto m = static_cast<double>(s.m), n = static_cast<double>(s.n), k = static_cast<double>(s.k);
  return s.gemv ? 6 * n * k : 7 * (m * k + n * k) + 12 * m * n;
}

// "gemm:2048,gemm:1024x4096x512,gemv:8192x8192" -> shapes (gemm:S is S x S x S; gemv:NxK, N x K weights).
std::vector<bench::GemmShape> parse_gemm_shapes(const std::string& text) {
  if (text.empty()) throw UsageError("--shapes: the list is empty (e.g. gemm:2048,gemv:8192x8192)");
  std::vector<bench::GemmShape> shapes;
  std::size_t begin = 0;
  while (true) {
    const std::size_t comma = text.find(',', begin);
    const std::string entry = text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    const std::size_t colon = entry.find(':');
    const std::string kind = entry.substr(0, colon);
    if (colon == std::string::npos || (kind != "gemm" && kind != "gemv"))
      throw UsageError("--shapes: '" + entry + "' is not a shape (use gemm:S, gemm:MxNxK or gemv:NxK)");
    std::vector<std::string> parts;
    for (std::size_t p = colon + 1;;) {
      const std::size_t x = entry.find('x', p);
      parts.push_back(entry.substr(p, x == std::string::npos ? std::string::npos : x - p));
      if (x == std::string::npos) break;
      p = x + 1;
    }
    bench::GemmShape s;
    s.gemv = kind == "gemv";
    std::vector<std::int64_t> dims;
    for (const auto& part : parts) dims.push_back(parse_dim(part, entry));
    if (s.gemv && dims.size() == 2) {
      s.m = 1, s.n = dims[0], s.k = dims[1];
    } else if (!s.gemv && dims.size() == 1) {
      s.m = s.n = s.k = dims[0];
    } else if (!s.gemv && dims.size() == 3) {
      s.m = dims[0], s.n = dims[1], s.k = dims[2];
    } else {
      throw UsageError("--shapes: '" + entry + "' has " + std::to_string(dims.size()) +
                       (dims.size() == 1 ? " dimension" : " dimensions") + " (use " +
                       (s.gemv ? "gemv:NxK" : "gemm:S or gemm:MxNxK") + ")");
    }
    if (gemm_buffer_bytes(s) > kMaxGemmBufferBytes)
      throw UsageError("--shapes: '" + entry + "' needs more than 16 GiB of buffers");
    shapes.push_back(s);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return shapes;
}

nlohmann::json positive_or_null(double v) {
  return v > 0 && std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

// `bench gemm --device cuda`: cuda::scaled_mm against a direct cuBLASLt FP8 call and a cuBLASLt bf16 matmul.
void run_cuda_gemm(const GemmArgs& args, int device) {
  if (!args.isa.empty() || args.threads != kThreadsAbsent) {
    throw UsageError("--isa and --threads choose CPU kernels: leave them out with --device cuda");
  }
  if (args.reps_given && args.reps < 3) throw UsageError("--reps must be at least 3, got " + std::to_string(args.reps));
  const std::vector<bench::GemmShape> shapes =
      parse_gemm_shapes(args.shapes_given ? args.shapes : "gemm:4096,gemm:8192,gemm:16x8192x8192");
  const int reps = args.reps_given ? args.reps : 7;
  const std::string where = bench::cuda_device_description(device);
  const std::vector<bench::CudaGemmResult> results = bench::run_cuda_gemm_bench(shapes, reps, device);
  if (args.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : results) {
      out.push_back({{"op", "fp8-gemm"},
                     {"device", where},
                     {"kernel", r.kernel},
                     {"shape", r.shape.name()},
                     {"m", r.shape.gemv ? 1 : r.shape.m},
                     {"n", r.shape.n},
                     {"k", r.shape.k},
                     {"reps", r.reps},
                     {"seconds", r.seconds},
                     {"tflops", r.tflops},
                     {"direct_seconds", r.direct_seconds},
                     {"direct_tflops", r.direct_tflops},
                     {"bf16_seconds", r.bf16_seconds},
                     {"bf16_tflops", r.bf16_tflops},
                     {"vs_direct", r.vs_direct},
                     {"vs_bf16", r.vs_bf16},
                     {"peak_tflops", positive_or_null(r.peak_tflops)}});
    }
    std::fprintf(output(), "%s\n", json_text(out).c_str());
    return;
  }
  fmt::print(output(),
             "cuda::scaled_mm (e4m3fn x e4m3fn -> bf16, per-tensor scales) against a direct cuBLASLt FP8 call and a "
             "cuBLASLt bf16 matmul of the same shape, same run (medians of {} rounds)\n",
             reps);
  fmt::print(output(), "device: {}\nTFLOP/s = 2MNK/s; vs direct, vs bf16: ratios of TFLOP/s; peak: dense FP8\n\n",
             where);
  fmt::print(output(), "{:<22} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9}  {}\n", "shape", "TFLOP/s", "direct", "bf16",
             "vs direct", "vs bf16", "of peak", "kernel");
  for (const auto& r : results) {
    fmt::print(output(), "{:<22} {:>9.1f} {:>9.1f} {:>9.1f} {:>8.3f}x {:>7.2f}x {:>9}  {}\n", r.shape.name(), r.tflops,
               r.direct_tflops, r.bf16_tflops, r.vs_direct, r.vs_bf16,
               r.peak_tflops > 0 ? fmt::format("{:.0f}%", 100.0 * r.tflops / r.peak_tflops) : std::string("-"),
               r.kernel);
  }
}

void run_bench_gemm(const GemmArgs& args) {
  if (const std::optional<int> device = cuda_device(args.device)) return run_cuda_gemm(args, *device);
  bench::GemmBenchOptions options;
  if (args.shapes_given) options.shapes = parse_gemm_shapes(args.shapes);
  if (args.reps_given) {
    if (args.reps < 3) throw UsageError("--reps must be at least 3, got " + std::to_string(args.reps));
    options.reps = args.reps;
  }
  options.threads = thread_counts(args.threads);
  const std::vector<Isa> levels = bench_levels(args.isa);
  const bench::OpenBlasInfo& blas = bench::load_openblas();  // fails here, before any work, when it is missing
  if (blas.max_threads > 0) {
    // Past its build's MAX_THREADS OpenBLAS runs fewer threads than asked: the baseline would not run the row's count.
    if (args.threads != kThreadsAbsent && args.threads > blas.max_threads) {
      throw UsageError(
          fmt::format("--threads {}: OpenBLAS runs at most {} threads (its build's MAX_THREADS), so the "
                      "sgemm/sgemv baselines would run fewer threads than fp8kit; give at most {}",
                      args.threads, blas.max_threads, blas.max_threads));
    }
    for (int& t : options.threads) t = std::min(t, blas.max_threads);
    options.threads.erase(std::unique(options.threads.begin(), options.threads.end()), options.threads.end());
  }
  const auto largest = std::max_element(options.shapes.begin(), options.shapes.end(), [](const auto& a, const auto& b) {
    return gemm_buffer_bytes(a) < gemm_buffer_bytes(b);
  });
  check_memory(static_cast<std::size_t>(gemm_buffer_bytes(*largest)), "'" + largest->name() + "'", "--shapes");
  const bench::Bf16Library& bf16 = bench::bf16_library();
  std::vector<bench::GemmResult> results;
  {
    const BenchProgress progress("gemm");
    results =
        for_each_level<bench::GemmResult>(levels, [&] { return bench::run_gemm_bench(options, std::cref(progress)); });
  }
  const std::string cpu = cpu_features().brand;
  if (args.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : results) {
      const bool fp8 = !r.baseline.empty();
      const bool gemv_row = r.op != "fp8-gemm" && r.op != "sgemm" && r.op != "bf16-gemm";
      out.push_back({{"op", r.op},
                     {"isa", r.isa},
                     {"kernel", string_or_null(r.kernel)},
                     {"library", string_or_null(r.library)},
                     {"shape", r.shape.name()},
                     {"m", r.shape.m},
                     {"n", r.shape.n},
                     {"k", r.shape.k},
                     {"threads", r.threads},
                     {"openblas_threads", r.openblas_threads},
                     {"reps", r.reps},
                     {"path", string_or_null(r.path)},
                     {"seconds", r.seconds},
                     {"gflops", positive_or_null(r.gflops)},
                     {"gbps", gemv_row ? positive_or_null(r.gbps) : nlohmann::json(nullptr)},
                     {"gweights", positive_or_null(r.gweights)},
                     {"bytes", gemv_row ? nlohmann::json(r.bytes) : nlohmann::json(nullptr)},
                     {"baseline", string_or_null(r.baseline)},
                     {"baseline_seconds", fp8 ? positive_or_null(r.baseline_seconds) : nlohmann::json(nullptr)},
                     {"ratio", fp8 ? positive_or_null(r.ratio) : nlohmann::json(nullptr)},
                     {"bf16_ratio", positive_or_null(r.bf16_ratio)},
                     {"read_bandwidth_gbps", positive_or_null(r.read_bandwidth_gbps)},
                     {"read_bandwidth_ratio", positive_or_null(r.read_bandwidth_ratio)},
                     {"rel_diff", r.rel_diff >= 0 ? nlohmann::json(r.rel_diff) : nlohmann::json(nullptr)},
                     {"openblas_core", blas.core},
                     {"openblas_config", blas.config},
                     {"cpu", cpu}});
    }
    std::fprintf(output(), "%s\n", json_text(out).c_str());
    return;
  }
  std::string thread_list, rep_list;
  for (int t : options.threads) thread_list += (thread_list.empty() ? "" : ", ") + std::to_string(t);
  rep_list = args.reps_given ? std::to_string(options.reps)
                             : "15 per GEMM under 1024^3, 5 under 4096^3, 3 from 4096^3 on, 11 per GEMV";
  fmt::print(
      output(),
      "FP8 (e4m3fn) GEMM and GEMV against OpenBLAS sgemm, sgemv, a BF16 GEMM library and the read probe, same run "
      "(medians)\n");
  fmt::print(output(), "CPU: {}; OpenBLAS core: {} ({}); threads: {}; reps: {}\n", cpu.empty() ? "unknown" : cpu,
             blas.core.empty() ? "unknown" : blas.core, blas.config.empty() ? blas.library : blas.config, thread_list,
             rep_list);
  fmt::print(output(), "BF16 baseline: {}\n",
             bf16.available ? bf16.name + " bf16 matmul (bf16-gemm rows)" : bf16.why_missing);
  fmt::print(
      output(),
      "GEMM: A M x K and B N x K, per-tensor scales; GFLOP/s = 2MNK/s. GEMV: N x K weights, per-row scales, float32 "
      "activations (fp8-gemv-bf16x: bfloat16); GB/s = weight bytes/s (1 per FP8 weight, 4 per float32), bytes read "
      "for the probe\n");
  fmt::print(
      output(),
      "ratio: fp8-gemm GFLOP/s / sgemm's; fp8-gemv weights/s / sgemv's. vs bf16: fp8-gemm GFLOP/s / bf16-gemm's. vs "
      "read: fp8-gemv GB/s / read-bandwidth GB/s\n\n");
  fmt::print(output(),
             "{:<15} {:<11} {:>6} {:>6} {:>6} {:<5} {:>7} {:>4} {:>9} {:>8} {:<8} {:>7} {:>7} {:>7} {:>9}  {}\n", "op",
             "isa", "M", "N", "K", "path", "threads", "reps", "GFLOP/s", "GB/s", "baseline", "ratio", "vs bf16",
             "vs read", "rel diff", "kernel / library");
  const auto num = [](double v, int precision) {
    return v > 0 && std::isfinite(v) ? fmt::format("{:.{}f}", v, precision) : std::string("-");
  };
  const auto times = [](double v) { return v > 0 && std::isfinite(v) ? fmt::format("{:.2f}x", v) : std::string("-"); };
  for (const auto& r : results) {
    fmt::print(
        output(), "{:<15} {:<11} {:>6} {:>6} {:>6} {:<5} {:>7} {:>4} {:>9} {:>8} {:<8} {:>7} {:>7} {:>7} {:>9}  {}\n",
        r.op, r.isa, r.shape.m, r.shape.n, r.shape.k, r.path.empty() ? "-" : r.path, r.threads, r.reps,
        num(r.gflops, 1), num(r.gbps, 1), r.baseline.empty() ? "-" : r.baseline, times(r.ratio), times(r.bf16_ratio),
        times(r.read_bandwidth_ratio), r.rel_diff >= 0 ? fmt::format("{:.2e}", r.rel_diff) : std::string("-"),
        !r.kernel.empty() ? r.kernel : (!r.library.empty() ? r.library : std::string("-")));
  }
}

void run_bench_peak(bool json, int reps) {
  if (reps < 3) throw UsageError("--reps must be at least 3, got " + std::to_string(reps));
  const std::vector<bench::PeakResult> results = bench::run_peak_bench(reps);
  const std::string cpu = cpu_features().brand;
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : results) {
      const bool ran = r.skipped.empty();
      out.push_back({{"op", r.op},
                     {"instruction", r.instruction},
                     {"isa", r.isa},
                     {"flops_per_instruction", r.flops_per_instruction},
                     {"chains", r.chains},
                     {"threads", 1},
                     {"reps", reps},
                     {"ns_per_instruction", ran ? nlohmann::json(r.ns_per_instruction) : nlohmann::json(nullptr)},
                     {"gflops", ran ? nlohmann::json(r.gflops) : nlohmann::json(nullptr)},
                     {"baseline", "fp32-fma"},
                     {"ratio", ran && r.ratio > 0 ? nlohmann::json(r.ratio) : nlohmann::json(nullptr)},
                     {"skipped", ran ? nlohmann::json(nullptr) : nlohmann::json(r.skipped)},
                     {"cpu", cpu}});
    }
    std::fprintf(output(), "%s\n", json_text(out).c_str());
    return;
  }
  fmt::print(output(), "arithmetic instruction peaks on one thread ({} repetitions, medians; CPU: {})\n", reps,
             cpu.empty() ? "unknown" : cpu);
  fmt::print(output(),
             "what one core issues of the instructions under each level's GEMM kernels; ratio: GFLOP/s over the widest "
             "FP32 FMA's (sgemm's instruction)\n\n");
  fmt::print(output(), "{:<13} {:<16} {:<12} {:>12} {:>7} {:>9} {:>9} {:>7}\n", "op", "instruction", "isa",
             "flops/instr", "chains", "ns/instr", "GFLOP/s", "ratio");
  for (const auto& r : results) {
    if (!r.skipped.empty()) {
      fmt::print(output(), "{:<13} {:<16} {:<12} {:>12} {:>7}  skipped: this CPU lacks {}\n", r.op, r.instruction,
                 r.isa, r.flops_per_instruction, r.chains, r.skipped);
      continue;
    }
    fmt::print(output(), "{:<13} {:<16} {:<12} {:>12} {:>7} {:>9.3f} {:>9.1f} {:>6.2f}x\n", r.op, r.instruction, r.isa,
               r.flops_per_instruction, r.chains, r.ns_per_instruction, r.gflops, r.ratio);
  }
}

void run_bench_comm(bool json, const std::string& sizes_text, int reps) {
  if (reps < 3) throw UsageError("--reps must be at least 3, got " + std::to_string(reps));
  std::vector<std::size_t> sizes;
  std::size_t begin = 0;
  while (begin <= sizes_text.size()) {
    const std::size_t end = std::min(sizes_text.find(',', begin), sizes_text.size());
    const std::string item = sizes_text.substr(begin, end - begin);
    const std::uint64_t bytes = parse_byte_size(item, "--sizes");
    if (bytes < 1024 || bytes > (1ull << 30)) throw UsageError("--sizes: " + item + " is outside 1KiB..1GiB");
    sizes.push_back(static_cast<std::size_t>(bytes));
    begin = end + 1;
  }
  std::size_t largest = 0;
  for (std::size_t s : sizes) largest = std::max(largest, s);
  // Per rank about 6 payloads at the largest size (the values, the work copy, the encoded copy, the exchanged parts,
  // the decode buffer, the gathered codes), for every rank on this machine (they share its memory).
  check_memory(6 * largest * static_cast<std::size_t>(local_ranks()), sizes_text, "--sizes");
  std::unique_ptr<Communicator> comm = job_communicator();
  const std::vector<bench::CommResult> results = bench::run_comm_bench(*comm, sizes, reps);
  if (comm->rank() != 0) return;  // one report, from rank 0 (every rank has the same results)
  const std::string cpu = cpu_features().brand;
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : results) {
      out.push_back({{"op", r.op},
                     {"dtype", r.dtype},
                     {"scaling", r.scaling.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.scaling)},
                     {"ranks", r.ranks},
                     {"backend", std::string(comm->backend())},
                     {"elements", r.elements},
                     {"bytes", r.bytes},
                     {"seconds", r.seconds},
                     {"gbps", r.gbps},
                     {"elements_per_second", r.elements_per_second},
                     {"baseline", "fp32"},
                     {"ratio", r.ratio},
                     {"threads", num_threads()},
                     {"reps", reps},
                     {"cpu", cpu}});
    }
    std::fprintf(output(), "%s\n", json_text(out).c_str());
    return;
  }
  fmt::print(output(),
             "collectives on {} rank{} ({} backend, {} thread{} per rank; {} repetitions, medians of the slowest "
             "rank; CPU: {})\n",
             comm->size(), comm->size() == 1 ? "" : "s", comm->backend(), num_threads(), num_threads() == 1 ? "" : "s",
             reps, cpu.empty() ? "unknown" : cpu);
  fmt::print(output(),
             "size: an fp32 payload of that many bytes (every dtype moves the same elements); bytes: what one rank "
             "hands to the backend per call; ratio: elements/s over the fp32 row's\n\n");
  fmt::print(output(), "{:<15} {:<15} {:>12} {:>13} {:>10} {:>9} {:>10} {:>7}\n", "op", "dtype", "elements",
             "bytes/rank", "ms", "GB/s", "Melem/s", "ratio");
  for (const auto& r : results) {
    const std::string dtype = r.scaling.empty() ? r.dtype : r.dtype + "/" + r.scaling;
    fmt::print(output(), "{:<15} {:<15} {:>12} {:>13} {:>10.3f} {:>9.2f} {:>10.1f} {:>6.2f}x\n", r.op, dtype,
               r.elements, r.bytes, r.seconds * 1e3, r.gbps, r.elements_per_second / 1e6, r.ratio);
  }
}

}  // namespace

constexpr const char* kIsaHelp =
    "ISA levels to run, each with dispatch capped there: all, or a comma list of scalar, avx2, avx512, avx512-bf16, "
    "amx (default: the level in force)";

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks: kernels against baselines measured in the same run");
  bench->require_subcommand(1);
  // The options every benchmark takes; `what` names the array --bytes sizes.
  auto add = [bench](const char* name, const char* help, const char* what, void (*run)(const BenchArgs&)) {
    auto args = std::make_shared<BenchArgs>();
    CLI::App* cmd = bench->add_subcommand(name, help);
    cmd->add_flag("--json", args->json, "Print a JSON array instead of the table");
    add_integer_option(cmd, "--threads", args->threads, "Thread count (default: 1, then all cores)");
    cmd->add_option("--bytes", args->bytes, std::string("Size of the ") + what + ", e.g. 256M (default 256M)");
    add_integer_option(cmd, "--reps", args->reps, "Repetitions per measurement (default 11)");
    cmd->add_option("--isa", args->isa, kIsaHelp);
    cmd->add_option("--device", args->device,
                    "cpu (default), cuda or cuda:N: the CUDA kernels against device-to-device cudaMemcpy");
    if (run == &run_bench_convert) {
      cmd->add_option("--ops", args->ops,
                      "Comma list of ops to time, each in all its variants, e.g. f32->e4m3fn,e4m3fn->f32 (default: "
                      "all; the scalar reference rows only then)");
    }
    cmd->callback([args, run] { run(*args); });
  };
  add("convert", "Conversion kernels against memcpy of the same bytes", "wide array", &run_bench_convert);
  add("scaling", "amax, quantize and dequantize against the read probe and memcpy", "float32 matrix",
      &run_bench_scaling);
  // gemm sizes its work by shapes, not bytes; --reps defaults per shape.
  auto args = std::make_shared<GemmArgs>();
  CLI::App* gemm = bench->add_subcommand(
      "gemm", "FP8 GEMM and GEMV against OpenBLAS sgemm and sgemv, oneDNN's bf16 matmul and the read probe");
  gemm->add_flag("--json", args->json, "Print a JSON array instead of the table");
  add_integer_option(gemm, "--threads", args->threads, "Thread count (default: 1, then all cores)");
  gemm->add_option("--isa", args->isa, kIsaHelp);
  gemm->add_option("--device", args->device,
                   "cpu (default), cuda or cuda:N: cuda::scaled_mm against direct cuBLASLt FP8 and bf16 calls (shapes "
                   "default to gemm:4096,gemm:8192,gemm:16x8192x8192)");
  CLI::Option* shapes = gemm->add_option("--shapes", args->shapes,
                                         "Comma list of gemm:S (S^3), gemm:MxNxK, gemv:NxK (N x K weights) (default "
                                         "gemm:2048,gemm:4096,gemm:16x4096x4096,gemm:64x4096x4096,gemv:8192x8192,"
                                         "gemv:16384x8192)");
  CLI::Option* reps = add_integer_option(
      gemm, "--reps", args->reps,
      "Repetitions per measurement (default per GEMM 15 below 1024^3, 5 below 4096^3, 3 from it on; 11 per GEMV)");
  auto peak_json = std::make_shared<bool>(false);
  auto peak_reps = std::make_shared<int>(5);
  CLI::App* peak = bench->add_subcommand(
      "peak", "Arithmetic instruction peaks on one thread (FP32 FMA, vdpbf16ps, AMX tdpbf16ps): what bounds the GEMMs");
  peak->add_flag("--json", *peak_json, "Print a JSON array instead of the table");
  add_integer_option(peak, "--reps", *peak_reps, "Repetitions per instruction (default 5)");
  peak->callback([peak_json, peak_reps] { run_bench_peak(*peak_json, *peak_reps); });
  auto checkpoint = std::make_shared<CheckpointBenchArgs>();
  CLI::App* ck = bench->add_subcommand(
      "checkpoint", "quantize, dequantize and convert of a generated checkpoint against cp + fsync on the same disk");
  ck->add_flag("--json", checkpoint->json, "Print a JSON array instead of the table");
  ck->add_option("--bytes", checkpoint->bytes, "Size of the bf16 checkpoint (the f32 one is twice it; default 1GiB)");
  add_integer_option(ck, "--reps", checkpoint->reps, "Repetitions of each command and copy, interleaved (default 5)");
  ck->add_option("--dir", checkpoint->dir, "Where to write the files (default: the temporary directory, /tmp)");
  ck->callback([checkpoint] { run_bench_checkpoint(*checkpoint); });
  auto comm_json = std::make_shared<bool>(false);
  auto comm_sizes = std::make_shared<std::string>("1MiB,4MiB,16MiB,64MiB,256MiB");
  auto comm_reps = std::make_shared<int>(5);
  CLI::App* comm = bench->add_subcommand(
      "comm", "Collectives (all-gather, reduce-scatter, all-reduce) in fp32, bf16 and FP8; run under mpirun -np N");
  comm->add_flag("--json", *comm_json, "Print a JSON array instead of the table (rank 0 prints)");
  comm->add_option("--sizes", *comm_sizes,
                   "Comma list of payload sizes (bytes of the fp32 payload; default 1MiB,4MiB,16MiB,64MiB,256MiB)");
  add_integer_option(comm, "--reps", *comm_reps, "Repetitions per measurement (default 5)");
  comm->callback([comm_json, comm_sizes, comm_reps] { run_bench_comm(*comm_json, *comm_sizes, *comm_reps); });
  gemm->callback([args, shapes, reps] {
    args->shapes_given = shapes->count() > 0;
    args->reps_given = reps->count() > 0;
    run_bench_gemm(*args);
  });
}

}  // namespace fp8kit::cli
