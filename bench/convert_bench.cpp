// The conversion benchmark: builds the list of operations, fills inputs, and times each operation interleaved
// with memcpy of the wide array at each thread count.
#include "convert_bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "convert/cpu/convert_kernels.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/convert/convert.hpp"
#include "harness.hpp"

namespace fp8kit::bench {
namespace {

enum class Wide { kF32, kBF16, kF16 };

std::size_t wide_size(Wide w) {
  return w == Wide::kF32 ? 4 : 2;
}
const char* wide_name(Wide w) {
  return w == Wide::kF32 ? "f32" : w == Wide::kBF16 ? "bf16" : "f16";
}

struct Op {
  bool encode;
  Wide wide;
  Format format;
  Overflow overflow;
  float scale;
  bool scalar;  // time the scalar reference instead of the dispatched kernels
};

std::string op_name(const Op& op) {
  return op.encode ? std::string(wide_name(op.wide)) + "->" + std::string(name(op.format))
                   : std::string(name(op.format)) + "->" + wide_name(op.wide);
}

std::vector<Op> operations(bool scalar_reference) {
  std::vector<Op> ops;
  for (Format f : kAllFormats) ops.push_back({true, Wide::kF32, f, Overflow::kSaturate, 1.0f, false});
  for (Format f : {Format::e4m3fn, Format::e5m2})
    ops.push_back({true, Wide::kF32, f, Overflow::kNonSaturating, 1.0f, false});
  ops.push_back({true, Wide::kF32, Format::e4m3fn, Overflow::kSaturate, 0.37f, false});
  for (Wide w : {Wide::kBF16, Wide::kF16}) {
    for (Format f : {Format::e4m3fn, Format::e5m2}) ops.push_back({true, w, f, Overflow::kSaturate, 1.0f, false});
  }
  for (Wide w : {Wide::kF32, Wide::kBF16}) {
    for (Format f : kAllFormats) ops.push_back({false, w, f, Overflow::kSaturate, 1.0f, false});
  }
  for (Format f : {Format::e4m3fn, Format::e5m2})
    ops.push_back({false, Wide::kF16, f, Overflow::kSaturate, 1.0f, false});
  ops.push_back({false, Wide::kF32, Format::e4m3fn, Overflow::kSaturate, 2.7f, false});
  if (scalar_reference) {
    ops.push_back({true, Wide::kF32, Format::e4m3fn, Overflow::kSaturate, 1.0f, true});
    ops.push_back({false, Wide::kF32, Format::e4m3fn, Overflow::kSaturate, 1.0f, true});
  }
  return ops;
}

// Values spread like activations: mostly within a few decades of 1, some tiny, a few large.
void fill_inputs(std::span<float> x, std::span<std::uint8_t> codes) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> decade(-6, 3);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * std::ldexp(1.0f, decade(rng) * 3);
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint8_t>(rng());
}

}  // namespace

std::vector<std::string> convert_bench_ops() {
  std::vector<std::string> names;
  for (const Op& op : operations(false)) {
    if (std::find(names.begin(), names.end(), op_name(op)) == names.end()) names.push_back(op_name(op));
  }
  return names;
}

std::vector<ConvertResult> run_convert_bench(const ConvertBenchOptions& options,
                                             const std::function<void(int, int)>& progress) {
  const std::size_t max_elements = options.bytes / 2;
  Buffer f32(max_elements * 4), bf16(max_elements * 2), f16(max_elements * 2), codes(max_elements);
  Buffer wide_out(max_elements * 4), copy_src(options.bytes), copy_dst(options.bytes);
  fill_inputs(f32.as<float>(), codes.as<std::uint8_t>());
  {
    // bf16 and f16 inputs: the same values, narrowed.
    auto x = f32.as<float>();
    auto b = bf16.as<bfloat16>();
    auto h = f16.as<float16>();
    for (std::size_t i = 0; i < max_elements; ++i) {
      b[i] = bfloat16::from_float(x[i]);
      h[i] = float16::from_float(x[i]);
    }
  }
  std::vector<Op> ops = operations(options.scalar_reference && options.ops.empty());
  if (!options.ops.empty()) {
    std::erase_if(ops, [&](const Op& op) {
      return std::find(options.ops.begin(), options.ops.end(), op_name(op)) == options.ops.end();
    });
  }
  const int total = static_cast<int>(ops.size() * options.threads.size());
  int done = 0;
  std::vector<ConvertResult> results;
  const auto& scalar = convert_detail::scalar_kernels();
  for (int threads : options.threads) {
    set_num_threads(threads);
    bind_openmp_threads(threads);
    {
      // The read-bandwidth probe: how fast this machine streams the wide array in at all. An encode reads
      // 4 bytes (float32) per byte it writes, so read bandwidth * 5/4 bounds it when reads are the limit.
      ConvertResult r;
      r.op = "read-bandwidth";
      r.isa = "-";
      r.kernel = "-";
      r.elements = options.bytes / 8;
      volatile std::uint64_t sink = 0;
      const auto probe = [&] { sink = sink ^ read_all(copy_src.data(), options.bytes, threads); };
      const auto baseline = [&] { parallel_memcpy(copy_dst.data(), copy_src.data(), options.bytes, threads); };
      r.timing = measure(probe, baseline, options.reps, threads, options.bytes, 2 * options.bytes);
      results.push_back(r);
    }
    for (const Op& op : ops) {
      const std::size_t n = options.bytes / wide_size(op.wide);
      ConvertResult r;
      r.op = op_name(op);
      r.isa = op.scalar ? "scalar" : std::string(conversion_isa());
      r.kernel = op.scalar ? "scalar" : std::string(conversion_kernel());
      r.overflow = op.encode ? (op.overflow == Overflow::kSaturate ? "saturate" : "non-saturating") : "";
      r.scale = op.scale;
      const int op_threads = op.scalar ? 1 : threads;
      r.elements = n;
      std::function<void()> kernel;
      const CastOptions cast{op.format, op.overflow, Rounding::kNearestEven, op.scale};
      auto q = codes.as<std::uint8_t>().first(n);
      if (op.scalar) {
        // The reference loop on one thread, over the same arrays.
        const auto enc = convert_detail::make_encode_params(cast);
        const convert_detail::DecodeParams dec{op.format, op.scale};
        kernel =
            op.encode
                ? std::function<void()>([&, n, enc] { scalar.encode_f32(f32.as<float>().data(), q.data(), n, enc); })
                : std::function<void()>(
                      [&, n, dec] { scalar.decode_f32(q.data(), wide_out.as<float>().data(), n, dec); });
      } else if (op.encode) {
        switch (op.wide) {
          case Wide::kF32:
            kernel = [&, n, cast] { cast_to_fp8(f32.as<const float>().first(n), q, cast); };
            break;
          case Wide::kBF16:
            kernel = [&, n, cast] { cast_to_fp8(bf16.as<const bfloat16>().first(n), q, cast); };
            break;
          case Wide::kF16:
            kernel = [&, n, cast] { cast_to_fp8(f16.as<const float16>().first(n), q, cast); };
            break;
        }
      } else {
        const Format f = op.format;
        const float s = op.scale;
        switch (op.wide) {
          case Wide::kF32:
            kernel = [&, n, f, s] { cast_from_fp8(q, f, wide_out.as<float>().first(n), s); };
            break;
          case Wide::kBF16:
            kernel = [&, n, f, s] { cast_from_fp8(q, f, wide_out.as<bfloat16>().first(n), s); };
            break;
          case Wide::kF16:
            kernel = [&, n, f, s] { cast_from_fp8(q, f, wide_out.as<float16>().first(n), s); };
            break;
        }
      }
      const auto baseline = [&, op_threads] {
        parallel_memcpy(copy_dst.data(), copy_src.data(), options.bytes, op_threads);
      };
      const int reps = op.scalar ? std::max(3, options.reps / 3) : options.reps;
      r.timing = measure(kernel, baseline, reps, op_threads, n * (wide_size(op.wide) + 1), 2 * options.bytes);
      results.push_back(r);
      if (progress) progress(++done, total);
    }
  }
  return results;
}

}  // namespace fp8kit::bench
