// The scaling benchmark: a float32 matrix of activations-like values, timed interleaved with its baseline.
#include "scaling_bench.hpp"

#include <random>

#include "fp8kit/common/cpu.hpp"
#include "fp8kit/convert/convert.hpp"
#include "fp8kit/scaling/amax.hpp"
#include "fp8kit/scaling/quantize.hpp"
#include "harness.hpp"

namespace fp8kit::bench {
namespace {

constexpr std::int64_t kCols = kScalingBenchCols;

}  // namespace

std::vector<ScalingResult> run_scaling_bench(const ScalingBenchOptions& options,
                                             const std::function<void(int, int)>& progress) {
  const std::size_t bytes = scaling_bench_matrix_bytes(options.bytes);
  const std::size_t n = bytes / 4;
  const auto rows = static_cast<std::int64_t>(n) / kCols;
  Buffer x(bytes), copy_dst(bytes), back(bytes);
  {
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto v = x.as<float>();
    for (std::size_t i = 0; i < n; ++i) v[i] = normal(rng) * (i % 97 == 0 ? 50.0f : 1.0f);
  }
  const MatrixRef view{x.as<const float>().data(), rows, kCols};
  const Granularity granularities[] = {Granularity::tensor(), Granularity::row(), Granularity::block(1, 128),
                                       Granularity::block(128, 128), Granularity::mx()};
  const int total = static_cast<int>(options.threads.size() * (2 + std::size(granularities) + 2));
  int done = 0;
  std::vector<ScalingResult> results;
  for (int threads : options.threads) {
    set_num_threads(threads);
    bind_openmp_threads(threads);
    const auto memcpy_baseline = [&] { parallel_memcpy(copy_dst.data(), x.data(), bytes, threads); };
    volatile std::uint64_t sink = 0;
    const auto read_probe = [&] { sink = sink ^ read_all(x.data(), bytes, threads); };
    auto add = [&](std::string op, std::string granularity, std::string baseline_name, std::size_t moved,
                   const std::function<void()>& kernel, const std::function<void()>& baseline,
                   std::size_t baseline_bytes) {
      const bool probe = op == "read-bandwidth";
      // amax: the amax kernel; quantize: amax then encode; dequantize: the decode alone (its scales are known).
      const std::string amax_name = std::string(amax_kernel()) + " amax";
      const std::string codec_name = std::string(conversion_kernel()) + (op == "dequantize" ? " decode" : " encode");
      std::string kernel_name = probe              ? ""
                                : op == "amax"     ? amax_name
                                : op == "quantize" ? amax_name + " + " + codec_name
                                                   : codec_name;
      results.push_back({std::move(op), std::move(granularity), std::move(baseline_name),
                         std::string(name(active_isa())), std::move(kernel_name),
                         measure(kernel, baseline, options.reps, threads, moved, baseline_bytes)});
      if (progress) progress(++done, total);
    };
    // The read probe against memcpy (for reference), then amax against the read probe.
    add("read-bandwidth", "", "memcpy", bytes, read_probe, memcpy_baseline, 2 * bytes);
    volatile float amax_sink = 0;
    add(
        "amax", "", "read-bandwidth", bytes, [&] { amax_sink = amax(x.as<const float>()).amax; }, read_probe, bytes);
    ScaledTensor q;
    for (const Granularity& g : granularities) {
      const QuantizeOptions o{Format::e4m3fn, Overflow::kSaturate, g, ScaleOptions{}};
      quantize_into(view, o, q);  // allocate once, outside the timing
      add(
          "quantize", g.name(), "memcpy", bytes + n, [&] { quantize_into(view, o, q); }, memcpy_baseline, 2 * bytes);
    }
    for (const Granularity& g : {Granularity::tensor(), Granularity::block(128, 128)}) {
      q = quantize(view, QuantizeOptions{Format::e4m3fn, Overflow::kSaturate, g, ScaleOptions{}});
      add(
          "dequantize", g.name(), "memcpy", bytes + n, [&] { dequantize(q, back.as<float>().first(n)); },
          memcpy_baseline, 2 * bytes);
    }
  }
  return results;
}

}  // namespace fp8kit::bench
