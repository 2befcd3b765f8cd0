// cuda::scaled_mm (cuBLASLt's FP8 matmul) against the CPU's scaled_mm_reference: bit for bit where the sums are
// exact (integer-valued operands, power-of-two scales) for every scale combination, type pair and output, within the
// tensor cores' bound on random operands, and the refusals. Without a device the device tests skip and say why.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/format/codec.hpp"
#include "fp8kit/ops/cuda_scaled_mm.hpp"
#include "fp8kit/ops/scaled_mm.hpp"
#include "fp8kit/scaling/scaled_tensor.hpp"
#include "fp8kit/tensor/cuda.hpp"

namespace fp8kit {
namespace {

using testing::expect_error;

TEST(CudaScaledMmBuild, RefusesHostOperandsAndNamesItsCublasLt) {
  const Tensor a = zeros({16, 16}, DType::float8_e4m3fn), s = ones({1});
  if (!cuda::built()) {
    expect_error([&] { cuda::scaled_mm(a, a, s, s); }, ErrorKind::kUnsupported, {"no CUDA backend"});
    EXPECT_NE(cuda::cublaslt_version().find("no CUDA backend"), std::string::npos);
    return;
  }
  expect_error([&] { cuda::scaled_mm(a, a, s, s); }, ErrorKind::kInvalidArgument, {"a is on the CPU"});
  // Loaded on first use: a version where the toolkit's library is installed (CI's machines), else why not.
  const std::string version = cuda::cublaslt_version();
  EXPECT_TRUE(std::regex_match(version, std::regex(R"(\d+\.\d+\.\d+)")) ||
              version.find("could not be loaded") != std::string::npos)
      << version;
}

class CudaScaledMm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  }
};

// A ScaledTensor of integer values in [-4, 4] (exact in e4m3fn and e5m2) with power-of-two scales that differ from
// block to block (2^-2 .. 2^2), so that a scale read from the wrong block, row or layout changes the result. The
// sums stay exact in any order: a block's products are integers of at most 2^11 in all, times 2^-4 .. 2^4, so every
// partial sum spans fewer than 24 bits.
ScaledTensor integer_operand(std::int64_t rows, std::int64_t cols, Format format, Granularity g, std::uint32_t seed) {
  ScaledTensor t;
  t.format = format;
  t.granularity = g;
  t.rows = rows;
  t.cols = cols;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> value(-4, 4), exponent(-2, 2);
  const EncodeSpec spec{format, Overflow::kSaturate, Rounding::kNearestEven};
  t.data.resize(static_cast<std::size_t>(rows * cols));
  for (auto& code : t.data) code = encode(static_cast<float>(value(rng)), spec);
  t.scale_inv.resize(static_cast<std::size_t>(t.grid_rows() * t.grid_cols()));
  for (auto& s : t.scale_inv) s = std::ldexp(1.0f, exponent(rng));
  return t;
}

// The operand's codes and its scales as device tensors, the scales in the shape cuda::scaled_mm reads for `g`.
struct DeviceOperand {
  Tensor codes, scales;
};
DeviceOperand to_device(const ScaledTensor& t) {
  const Device gpu = Device::cuda(0);
  return {t.codes().to(gpu), t.scales().to(gpu)};
}

std::vector<float> to_floats(const Tensor& device_out) {
  const Tensor host = device_out.to(Device::cpu());
  if (host.dtype() == DType::float32) return {host.span<float>().begin(), host.span<float>().end()};
  const Tensor widened = host.to(DType::float32);
  return {widened.span<float>().begin(), widened.span<float>().end()};
}

struct Case {
  Format fa, fb;
  Granularity ga, gb;
};

// Every scale combination cuda::scaled_mm takes, the three type pairs, float32 and bfloat16 outputs with and
// without a bias, and fast accumulation with per-tensor scales: the reference's bits. K = 336: a partial last K
// block; N = 272: a partial last 128-row block of b; M = 36 (cuBLASLt's block scales take M in multiples of 4).
TEST_F(CudaScaledMm, ExactSumsGiveTheReferenceBits) {
  const std::int64_t m = 36, k = 336, n = 272;
  const Granularity tensor = Granularity::tensor(), row = Granularity::row(), vec = Granularity::block(1, 128),
                    square = Granularity::block(128, 128);
  const std::vector<std::pair<Granularity, Granularity>> scalings = {
      {tensor, tensor}, {row, row}, {row, tensor}, {tensor, row}, {vec, vec}, {vec, square}, {tensor, square}};
  const std::vector<std::pair<Format, Format>> types = {
      {Format::e4m3fn, Format::e4m3fn}, {Format::e4m3fn, Format::e5m2}, {Format::e5m2, Format::e4m3fn}};
  std::vector<float> bias_values(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) bias_values[static_cast<std::size_t>(j)] = static_cast<float>(j % 11) - 5.5f;
  Tensor bias_host = empty({n}, DType::bfloat16);  // the values are exact in bfloat16
  for (std::int64_t j = 0; j < n; ++j) {
    bias_host.span<bfloat16>()[j] = bfloat16::from_float(bias_values[static_cast<std::size_t>(j)]);
  }
  const Tensor bias_gpu = bias_host.to(Device::cuda(0));
  int cases = 0;
  for (const auto& [fa, fb] : types) {
    for (const auto& [ga, gb] : scalings) {
      const ScaledTensor a = integer_operand(m, k, fa, ga, 11), b = integer_operand(n, k, fb, gb, 12);
      const DeviceOperand da = to_device(a), db = to_device(b);
      for (DType out : {DType::float32, DType::bfloat16}) {
        for (bool with_bias : {false, true}) {
          SCOPED_TRACE(std::string(name(fa)) + " x " + std::string(name(fb)) + " " + ga.name() + "/" + gb.name() +
                       " -> " + std::string(name(out)) + (with_bias ? " +bias" : ""));
          ScaledMmOptions cpu;
          cpu.out_dtype = out;
          if (with_bias) cpu.bias = bias_values;
          const ScaledMmResult expected = scaled_mm_reference(a, b, cpu);
          cuda::MmOptions options;
          options.out_dtype = out;
          if (with_bias) options.bias = bias_gpu;
          const cuda::MmResult got = cuda::scaled_mm(da.codes, db.codes, da.scales, db.scales, options);
          EXPECT_EQ(got.out.shape(), (Shape{m, n}));
          EXPECT_EQ(got.a_scaling.name(), ga.name());
          EXPECT_EQ(got.b_scaling.name(), gb.name());
          const std::vector<float> values = to_floats(got.out);
          std::int64_t mismatches = 0;
          for (std::size_t i = 0; i < values.size(); ++i) {
            mismatches += std::bit_cast<std::uint32_t>(values[i]) != std::bit_cast<std::uint32_t>(expected.out[i]);
          }
          EXPECT_EQ(mismatches, 0) << "first: " << values[0] << " vs " << expected.out[0] << " (" << got.kernel << ")";
          ++cases;
        }
      }
      if (ga.kind == Granularity::Kind::kTensor && gb.kind == Granularity::Kind::kTensor) {
        cuda::MmOptions fast;
        fast.fast_accum = true;
        const std::vector<float> values =
            to_floats(cuda::scaled_mm(da.codes, db.codes, da.scales, db.scales, fast).out);
        EXPECT_EQ(values, scaled_mm_reference(a, b).out) << "fast accumulation, " << name(fa) << " x " << name(fb);
      }
    }
  }
  EXPECT_EQ(cases, 3 * 7 * 4);
}

// An FP8 output: cast(result * scale_result) with the CPU codec's round to nearest even, and the output amax
// (before the scale) equal to the reference's.
TEST_F(CudaScaledMm, Fp8OutputAndAmaxAreTheReferencesCast) {
  const std::int64_t m = 20, k = 256, n = 48;
  const Device gpu = Device::cuda(0);
  for (Format out_format : {Format::e4m3fn, Format::e5m2}) {
    // cuBLASLt gives an e5m2 output only when an operand is e5m2.
    const ScaledTensor a = integer_operand(m, k, Format::e4m3fn, Granularity::tensor(), 21),
                       b = integer_operand(n, k, out_format, Granularity::tensor(), 22);
    const ScaledMmResult expected = scaled_mm_reference(a, b);
    const float scale =
        std::ldexp(1.0f, static_cast<int>(std::floor(std::log2(max_finite(out_format) / expected.amax))));
    cuda::MmOptions options;
    options.out_dtype = dtype_of(out_format);
    options.scale_result = full({}, scale).to(gpu);
    options.amax = true;
    const DeviceOperand da = to_device(a), db = to_device(b);
    const cuda::MmResult got = cuda::scaled_mm(da.codes, db.codes, da.scales, db.scales, options);
    EXPECT_EQ(got.amax.to(Device::cpu()).item_as_double(0), expected.amax);
    const Tensor codes = got.out.to(Device::cpu());
    const EncodeSpec spec{out_format, Overflow::kSaturate, Rounding::kNearestEven};
    std::int64_t mismatches = 0;
    for (std::size_t i = 0; i < expected.out.size(); ++i) {
      mismatches += codes.span<std::uint8_t>()[i] != encode(expected.out[i] * scale, spec);
    }
    EXPECT_EQ(mismatches, 0) << name(out_format);
  }
}

// Random operands (normal, quantized by fp8kit per tensor and in DeepSeek-V3's blocks): within the FP32 bound plus
// the tensor cores' accumulation, assumed to keep at least 14 bits within a run of 128 along K (cuBLAS adds the runs
// in FP32 when fast accumulation is off). Prints the largest error measured relative to sum |products|.
TEST_F(CudaScaledMm, RandomOperandsStayWithinTheTensorCoreBound) {
  const std::int64_t m = 64, k = 1024, n = 512;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor x = empty({m, k}), w = empty({n, k});
  for (float& v : x.span<float>()) v = normal(rng);
  for (float& v : w.span<float>()) v = normal(rng) * 0.05f;
  for (const auto& [ga, gb] : {std::pair{Granularity::tensor(), Granularity::tensor()},
                               std::pair{Granularity::block(1, 128), Granularity::block(128, 128)}}) {
    QuantizeOptions qa, qb;
    qa.granularity = ga;
    qb.granularity = gb;
    const ScaledTensor a = quantize(x, qa), b = quantize(w, qb);
    const DeviceOperand da = to_device(a), db = to_device(b);
    const std::vector<float> got = to_floats(cuda::scaled_mm(da.codes, db.codes, da.scales, db.scales).out);
    std::vector<float> fa(a.data.size()), fb(b.data.size());
    dequantize(a, fa);
    dequantize(b, fb);
    double worst = 0.0;
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double exact = 0.0, abs_products = 0.0;
        for (std::int64_t p = 0; p < k; ++p) {
          const double product = static_cast<double>(fa[static_cast<std::size_t>(i * k + p)]) *
                                 static_cast<double>(fb[static_cast<std::size_t>(j * k + p)]);
          exact += product;
          abs_products += std::fabs(product);
        }
        const double error = std::fabs(static_cast<double>(got[static_cast<std::size_t>(i * n + j)]) - exact);
        const double bound =
            mm_error_bound(k, abs_products, std::fabs(exact)) + 128.0 * std::ldexp(1.0, -13) * abs_products;
        ASSERT_LE(error, bound) << ga.name() << "/" << gb.name() << " at (" << i << ", " << j << ")";
        worst = std::max(worst, error / abs_products);
      }
    }
    std::printf("[ measured ] %s/%s: max |error| / sum |products| = %.3g (2^%.1f)\n", ga.name().c_str(),
                gb.name().c_str(), worst, std::log2(worst));
  }
}

TEST_F(CudaScaledMm, RefusesWhatItCannotRun) {
  const Device gpu = Device::cuda(0);
  const Tensor a = zeros({8, 32}, DType::float8_e4m3fn, gpu), b = zeros({16, 32}, DType::float8_e4m3fn, gpu);
  const Tensor one = ones({1}).to(gpu);
  const auto call = [&](const Tensor& x, const Tensor& y, const Tensor& sx, const Tensor& sy,
                        const cuda::MmOptions& o = {}) { cuda::scaled_mm(x, y, sx, sy, o); };
  expect_error([&] { call(a, b, ones({1}), one); }, ErrorKind::kInvalidArgument, {"scale_a is on the CPU"});
  expect_error(
      [&] {
        call(zeros({8, 32}, DType::float8_e4m3fnuz, gpu), b, one, one);
      },
      ErrorKind::kInvalidArgument, {"fnuz"});
  expect_error(
      [&] {
        call(zeros({8, 32}, DType::float8_e5m2, gpu), zeros({16, 32}, DType::float8_e5m2, gpu), one, one);
      },
      ErrorKind::kInvalidArgument, {"e5m2 x e5m2"});
  expect_error(
      [&] {
        call(a, zeros({16, 48}, DType::float8_e4m3fn, gpu), one, one);
      },
      ErrorKind::kInvalidArgument, {"N x K"});
  expect_error(
      [&] {
        call(zeros({8, 24}, DType::float8_e4m3fn, gpu), zeros({16, 24}, DType::float8_e4m3fn, gpu), one, one);
      },
      ErrorKind::kInvalidArgument, {"multiples of 16"});
  expect_error([&] { call(a, b, ones({3}).to(gpu), one); }, ErrorKind::kInvalidArgument, {"scale_a has shape [3]"});
  expect_error([&] { call(a, b, one, ones({1}).to(DType::bfloat16).to(gpu)); }, ErrorKind::kInvalidArgument,
               {"float32 dequantization scales"});
  cuda::MmOptions o;
  o.bias = ones({16}).to(gpu);
  expect_error([&] { call(a, b, one, one, o); }, ErrorKind::kInvalidArgument, {"bfloat16 values"});
  o = {};
  o.scale_result = one;
  expect_error([&] { call(a, b, one, one, o); }, ErrorKind::kInvalidArgument, {"scale_result is for FP8 outputs"});
  o = {};
  o.amax = true;
  o.out_dtype = DType::bfloat16;
  expect_error([&] { call(a, b, one, one, o); }, ErrorKind::kInvalidArgument, {"amax is computed with FP8 outputs"});
  o = {};
  o.fast_accum = true;  // 1 x 128 blocks on a (K = 256: two blocks a row)
  expect_error(
      [&] {
        call(zeros({8, 256}, DType::float8_e4m3fn, gpu), zeros({16, 256}, DType::float8_e4m3fn, gpu),
             ones({8, 2}).to(gpu), one, o);
      },
      ErrorKind::kInvalidArgument, {"fast_accum"});
  expect_error(
      [&] {
        call(zeros({6, 256}, DType::float8_e4m3fn, gpu), zeros({16, 256}, DType::float8_e4m3fn, gpu),
             ones({6, 2}).to(gpu), one);
      },
      ErrorKind::kInvalidArgument, {"multiple of 4"});
  o = {};
  o.out_dtype = DType::float16;
  expect_error([&] { call(a, b, one, one, o); }, ErrorKind::kInvalidArgument, {"out_dtype float16"});
  // No rows: an empty output, nothing run.
  const cuda::MmResult empty_rows = cuda::scaled_mm(zeros({0, 32}, DType::float8_e4m3fn, gpu), b, one, one);
  EXPECT_EQ(empty_rows.out.shape(), (Shape{0, 16}));
}

}  // namespace
}  // namespace fp8kit
