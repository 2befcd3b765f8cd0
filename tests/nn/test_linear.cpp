// Linear under every precision recipe: exact FP32 gradients, each recipe's error against FP32, real FP8 against
// fake quantization, delayed-scaling state, saved-activation bytes, profiler events and the small-GEMM fallback.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/nn/linear.hpp"
#include "fp8kit/tensor/memory.hpp"

#include "nn_test_util.hpp"

namespace fp8kit::nn {
namespace {

using testing::Expected;
using testing::random;
using testing::rel_error;
using testing::RunResult;

// y = x W^T + b, dx = dy W, dW = dy^T x, db = sum dy, in double.
Expected expected(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy) {
  const std::int64_t r = x.size(0), in = x.size(1), out = w.size(0);
  const float *xs = x.data<float>(), *ws = w.data<float>(), *bs = b.data<float>(), *ds = dy.data<float>();
  Expected e;
  e.y.assign(r * out, 0);
  e.dx.assign(r * in, 0);
  e.dw.assign(out * in, 0);
  e.db.assign(out, 0);
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t o = 0; o < out; ++o) {
      double s = bs[o];
      for (std::int64_t k = 0; k < in; ++k) s += double{xs[i * in + k]} * ws[o * in + k];
      e.y[i * out + o] = s;
      e.db[o] += ds[i * out + o];
      for (std::int64_t k = 0; k < in; ++k) {
        e.dx[i * in + k] += double{ds[i * out + o]} * ws[o * in + k];
        e.dw[o * in + k] += double{ds[i * out + o]} * xs[i * in + k];
      }
    }
  return e;
}

RunResult run(const PrecisionRecipe& recipe, const Tensor& x, const Tensor& dy, std::int64_t in, std::int64_t out,
              Profiler* profiler = nullptr, StepReport* report = nullptr) {
  Linear layer("fc", in, out, true, 7, 0.5, &recipe);
  for (float& v : layer.bias->value.span<float>()) v = 0.25f;
  Context ctx;
  ctx.recipe = &recipe;
  ctx.saved_dtype = recipe.saved_dtype();
  ctx.profiler = profiler;
  ctx.report = report;
  Linear::Saved saved;
  RunResult r;
  r.y = layer.forward(ctx, x, saved);
  r.saved_bytes = saved.input_t.nbytes();
  r.dx = layer.backward(ctx, dy, saved);
  r.dw = layer.weight.grad.clone();
  r.db = layer.bias->grad.clone();
  return r;
}

// The recipe table, row by row: formats, granularities and delayed scaling per role.
TEST(Recipe, TableRows) {
  const auto r = [](const char* n) { return *PrecisionRecipe::parse(n); };
  for (const char* hybrid : {"fp8-delayed", "fp8-current"}) {
    EXPECT_EQ(format_of(r(hybrid), TensorRole::kInput), Format::e4m3fn);
    EXPECT_EQ(format_of(r(hybrid), TensorRole::kWeight), Format::e4m3fn);
    EXPECT_EQ(format_of(r(hybrid), TensorRole::kGradOutput), Format::e5m2);
    EXPECT_EQ(granularity_of(r(hybrid), TensorRole::kWeight).kind, Granularity::Kind::kTensor);
  }
  EXPECT_TRUE(delayed_scaling(r("fp8-delayed")));
  EXPECT_FALSE(delayed_scaling(r("fp8-current")));
  // Transformer Engine's Format.E4M3 under delayed scaling: the gradients E4M3 too, everything else fp8-delayed's.
  for (TensorRole role : {TensorRole::kInput, TensorRole::kWeight, TensorRole::kGradOutput}) {
    EXPECT_EQ(format_of(r("fp8-delayed-e4m3"), role), Format::e4m3fn);
    EXPECT_EQ(granularity_of(r("fp8-delayed-e4m3"), role).kind, Granularity::Kind::kTensor);
  }
  EXPECT_TRUE(delayed_scaling(r("fp8-delayed-e4m3")));
  EXPECT_TRUE(r("fp8-delayed-e4m3").is_fp8());
  EXPECT_EQ(r("fp8-delayed-e4m3").optimizer_state, MomentStorage::kFloat32);
  EXPECT_FALSE(delayed_scaling(r("fp8-block")));
  EXPECT_EQ(granularity_of(r("fp8-block"), TensorRole::kWeight).name(), "block:128x128");
  EXPECT_EQ(granularity_of(r("fp8-block"), TensorRole::kInput).name(), "block:1x128");
  EXPECT_EQ(granularity_of(r("fp8-block"), TensorRole::kGradOutput).name(), "block:1x128");
  EXPECT_EQ(format_of(r("fp8-block"), TensorRole::kGradOutput), Format::e4m3fn);
  for (TensorRole role : {TensorRole::kInput, TensorRole::kWeight, TensorRole::kGradOutput}) {
    const Granularity g = granularity_of(r("mxfp8"), role);
    EXPECT_EQ(g.kind, Granularity::Kind::kMx);
    EXPECT_EQ(g.mx_mode, MxScaleMode::kRceil);
  }
  for (const char* n : {"fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block", "mxfp8", "fp8-o2",
                        "fp8-delayed-e4m3", "fp8-block-fake", "fp8-delayed-e4m3-fake"}) {
    EXPECT_EQ(r(n).name(), n);
  }
  EXPECT_FALSE(r("fp32").is_fp8());
  EXPECT_FALSE(r("bf16").is_fp8());
  EXPECT_TRUE(r("mxfp8").is_fp8());
  EXPECT_FALSE(PrecisionRecipe::parse("bf16-fake"));
}

TEST(Linear, Fp32ExactToFp64Rounding) {
  const std::int64_t rows = 37, in = 200, out = 130;
  const Tensor x = random({rows, in}, 1), dy = random({rows, out}, 2);
  const PrecisionRecipe fp32;
  const RunResult r = run(fp32, x, dy, in, out);
  Linear ref("fc", in, out, true, 7, 0.5, &fp32);
  for (float& v : ref.bias->value.span<float>()) v = 0.25f;
  const Expected e = expected(x, ref.weight.value, ref.bias->value, dy);
  EXPECT_LT(rel_error(r.y, e.y), 1e-6);
  EXPECT_LT(rel_error(r.dx, e.dx), 1e-6);
  EXPECT_LT(rel_error(r.dw, e.dw), 1e-6);
  EXPECT_LT(rel_error(r.db, e.db), 1e-6);
  EXPECT_EQ(r.saved_bytes, rows * in * 4);
}

// A layer without inputs or outputs is refused where it is made, naming it (it failed in its first GEMM).
TEST(Linear, ZeroOrNegativeFeaturesAreRefusedAtConstruction) {
  for (const auto& [in, out] : {std::pair<std::int64_t, std::int64_t>{0, 4}, {4, 0}, {-1, 4}}) {
    try {
      Linear layer("fc", in, out, true, 1);
      ADD_FAILURE() << in << " x " << out << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("linear fc: in_features and out_features must be at least 1"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Linear, EveryRecipeCloseToFp32) {
  const std::int64_t rows = 64, in = 256, out = 128;
  const Tensor x = random({rows, in}, 3), dy = random({rows, out}, 4, 1e-3);
  const PrecisionRecipe fp32;
  Linear ref("fc", in, out, true, 7, 0.5, &fp32);
  for (float& v : ref.bias->value.span<float>()) v = 0.25f;
  const Expected e = expected(x, ref.weight.value, ref.bias->value, dy);
  for (const char* name : {"bf16", "fp8-delayed", "fp8-current", "fp8-block", "mxfp8", "fp8-current-fake"}) {
    const PrecisionRecipe recipe = *PrecisionRecipe::parse(name);
    const RunResult r = run(recipe, x, dy, in, out);
    // bf16 rounds inputs to 8 bits (~0.4% each); E4M3 to 4 bits (~3%), E5M2 gradients to 3 bits (~6%).
    const double tol = recipe.kind == RecipeKind::kBf16 ? 0.01 : 0.08;
    EXPECT_LT(rel_error(r.y, e.y), tol) << name;
    EXPECT_LT(rel_error(r.dx, e.dx), tol) << name;
    EXPECT_LT(rel_error(r.dw, e.dw), tol) << name;
    EXPECT_LT(rel_error(r.db, e.db), 1e-6) << name;  // the bias gradient is a plain FP32 sum
  }
  // Delayed scaling starts from scale 1: in-range inputs quantize as current scaling does only after an update.
}

TEST(Linear, RealFp8AgreesWithFakeQuant) {
  // The same quantized values: real FP8 multiplies codes and applies scales after the sum, fake-quant multiplies
  // the dequantized values in FP32. Per-tensor scales: they differ by FP32 rounding only.
  const std::int64_t rows = 48, in = 160, out = 96;
  const Tensor x = random({rows, in}, 5), dy = random({rows, out}, 6);
  for (const char* name : {"fp8-current", "fp8-block", "mxfp8"}) {
    const PrecisionRecipe real = *PrecisionRecipe::parse(name);
    const PrecisionRecipe fake = *PrecisionRecipe::parse(std::string(name) + "-fake");
    const RunResult a = run(real, x, dy, in, out), b = run(fake, x, dy, in, out);
    std::vector<double> ya(a.y.span<float>().begin(), a.y.span<float>().end());
    std::vector<double> dwa(a.dw.span<float>().begin(), a.dw.span<float>().end());
    EXPECT_LT(rel_error(b.y, ya), 1e-5) << name;
    EXPECT_LT(rel_error(b.dw, dwa), 1e-5) << name;
    EXPECT_LT(a.saved_bytes, rows * in * 1.25) << name;  // one byte per element (+ scales: MX 5 bytes per 32)
    EXPECT_EQ(b.saved_bytes, rows * in * 4) << name;     // fake-quant saves FP32 values
  }
}

TEST(Linear, DelayedScalingStateAndReport) {
  const std::int64_t rows = 16, in = 64, out = 32;
  const Tensor x = random({rows, in}, 8, 300.0), dy = random({rows, out}, 9);
  const PrecisionRecipe recipe = *PrecisionRecipe::parse("fp8-delayed");
  Linear layer("fc", in, out, false, 3, 0.5, &recipe);
  Context ctx;
  ctx.recipe = &recipe;
  StepReport report;
  report.log_scales = true;
  ctx.report = &report;
  Linear::Saved saved;
  layer.forward(ctx, x, saved);
  layer.backward(ctx, dy, saved);
  EXPECT_EQ(layer.fp8.input.scale(), 1.0f);  // nothing updates before update()
  EXPECT_FALSE(layer.fp8.input.calibrated());
  float amax = 0;
  for (float v : x.span<float>()) amax = std::max(amax, std::fabs(v));
  EXPECT_FALSE(report.first_nonfinite.has_value());
  ASSERT_FALSE(report.scales.empty());
  EXPECT_EQ(report.scales[0].role, TensorRole::kInput);
  EXPECT_EQ(report.scales[0].amax, amax);
  // The first step, with no amax in the history yet, takes its own (not Transformer Engine's initial 1, under which
  // this input, amax ~ 1000, would saturate).
  EXPECT_EQ(report.scales[0].scale, 448.0f / amax);
  EXPECT_EQ(report.scales[0].saturated, 0u);
  layer.fp8.update();
  EXPECT_TRUE(layer.fp8.input.calibrated());
  EXPECT_EQ(layer.fp8.input.scale(), 448.0f / amax);
  // From the second step on, the history's scale: an input twice as large now saturates (delayed scaling).
  const Tensor x2 = random({rows, in}, 8, 600.0);
  StepReport second;
  second.log_scales = true;
  ctx.report = &second;
  layer.forward(ctx, x2, saved);
  ASSERT_FALSE(second.scales.empty());
  EXPECT_EQ(second.scales[0].scale, 448.0f / amax);
  EXPECT_GT(second.scales[0].saturated, 0u);
}

TEST(Linear, NonFiniteInputIsReported) {
  const PrecisionRecipe recipe = *PrecisionRecipe::parse("fp8-current");
  Tensor x = random({4, 32}, 10);
  x.data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  Linear layer("fc", 32, 8, false, 3, 0.5, &recipe);
  Context ctx;
  ctx.recipe = &recipe;
  StepReport report;
  ctx.report = &report;
  Linear::Saved saved;
  layer.forward(ctx, x, saved);
  ASSERT_TRUE(report.first_nonfinite.has_value());
  EXPECT_EQ(report.first_nonfinite->layer, "fc");
  EXPECT_EQ(report.first_nonfinite->role, TensorRole::kInput);
}

TEST(Linear, ProfilerShowsPathsAndSmallGemmFallback) {
  const Tensor x = random({8, 64}, 11), dy = random({8, 16}, 12);
  PrecisionRecipe recipe = *PrecisionRecipe::parse("fp8-current");
  Profiler profiler;
  run(recipe, x, dy, 64, 16, &profiler);
  int fp8_gemms = 0;
  for (const ProfileEvent& e : profiler.events())
    if (e.category == "gemm" && e.args.at("path") == "fp8") ++fp8_gemms;
  EXPECT_EQ(fp8_gemms, 3);  // forward, dgrad, wgrad
  recipe.min_fp8_gemm_macs = 1 << 20;
  profiler.clear();
  run(recipe, x, dy, 64, 16, &profiler);
  int fallbacks = 0, casts = 0;
  for (const ProfileEvent& e : profiler.events()) {
    if (e.category == "gemm" && e.args.at("path") == "fallback") {
      ++fallbacks;
      EXPECT_NE(e.args.at("reason").find("multiply-adds"), std::string::npos);
    }
    if (e.category == "cast" && e.name.find("->bfloat16") != std::string::npos) ++casts;
  }
  EXPECT_EQ(fallbacks, 3);
  EXPECT_EQ(casts, 6);  // both FP8 operands of each GEMM cast explicitly
}

// The transposed operand of block-scaled recipes is quantized band by band (no float32 transpose): bit for bit the
// operand of the materialized transpose — codes, scales, E8M0 codes, fake-quant values, and the logged report —
// for shapes whose rows and columns are not multiples of any block or band.
TEST(Linear, TransposedOperandWithoutTheFloatTransposeIsBitIdentical) {
  for (const char* name : {"fp8-block", "mxfp8", "fp8-block-fake", "mxfp8-fake", "fp8-current", "bf16"}) {
    const PrecisionRecipe recipe = *PrecisionRecipe::parse(name);
    for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{300, 200}, {130, 70}, {1, 33}, {257, 129}}) {
      const Tensor x = random({rows, cols}, 91, 3.0);
      for (const TensorRole role : {TensorRole::kInput, TensorRole::kGradOutput}) {
        StepReport report_a, report_b;
        report_a.log_scales = report_b.log_scales = true;
        GemmCall a{&recipe, nullptr, &report_a, "t", nullptr, {}};
        GemmCall b{&recipe, nullptr, &report_b, "t", nullptr, {}};
        const RecipeOperand want = prepare_operand(a, role, transpose(x));
        const RecipeOperand got = prepare_operand_transposed(b, role, x);
        const std::string what = std::string(name) + " " + std::to_string(rows) + "x" + std::to_string(cols);
        ASSERT_EQ(got.rows(), cols) << what;
        ASSERT_EQ(got.cols(), rows) << what;
        ASSERT_EQ(got.fp8.has_value(), want.fp8.has_value()) << what;
        if (want.fp8) {
          EXPECT_TRUE(std::equal(got.fp8->data.begin(), got.fp8->data.end(), want.fp8->data.begin())) << what;
          EXPECT_EQ(got.fp8->data.size(), want.fp8->data.size()) << what;
          EXPECT_TRUE(std::equal(got.fp8->scale_inv.begin(), got.fp8->scale_inv.end(), want.fp8->scale_inv.begin()))
              << what;
          EXPECT_EQ(got.fp8->scale_inv.size(), want.fp8->scale_inv.size()) << what;
          EXPECT_TRUE(std::equal(got.fp8->scale_e8m0.begin(), got.fp8->scale_e8m0.end(), want.fp8->scale_e8m0.begin()))
              << what;
        } else {
          ASSERT_EQ(got.values.nbytes(), want.values.nbytes()) << what;
          EXPECT_EQ(std::memcmp(got.values.raw(), want.values.raw(), want.values.nbytes()), 0) << what;
        }
        ASSERT_EQ(report_a.scales.size(), report_b.scales.size()) << what;
        for (std::size_t i = 0; i < report_a.scales.size(); ++i) {
          EXPECT_EQ(report_b.scales[i].amax, report_a.scales[i].amax) << what;
          EXPECT_EQ(report_b.scales[i].scale, report_a.scales[i].scale) << what;
          EXPECT_EQ(report_b.scales[i].underflow_fraction, report_a.scales[i].underflow_fraction) << what;
          EXPECT_EQ(report_b.scales[i].saturated, report_a.scales[i].saturated) << what;
        }
      }
    }
  }
}

// A handed-over input gives the same output and saved operand as a borrowed one, under every kind of recipe, and
// under FP8 its float32 storage is gone when forward returns (nothing else held it).
TEST(Linear, HandedOverInputGivesTheSameResultAndIsFreed) {
  for (const char* name : {"fp32", "bf16", "fp8-delayed", "fp8-block", "mxfp8"}) {
    const PrecisionRecipe recipe = *PrecisionRecipe::parse(name);
    Linear a("fc", 96, 40, true, 7, 0.5, &recipe), b("fc", 96, 40, true, 7, 0.5, &recipe);
    Context ctx;
    ctx.recipe = &recipe;
    ctx.saved_dtype = recipe.saved_dtype();
    const Tensor x = random({33, 96}, 5);
    Linear::Saved sa, sb;
    const Tensor ya = a.forward(ctx, x, sa);
    Tensor moved = x.clone();
    const std::int64_t before = memory_stats().current_bytes;
    const Tensor yb = b.forward(ctx, std::move(moved), sb);
    EXPECT_EQ(std::memcmp(ya.raw(), yb.raw(), ya.nbytes()), 0) << name;
    EXPECT_EQ(sa.input_t.nbytes(), sb.input_t.nbytes()) << name;
    if (recipe.is_fp8()) {  // the 33 x 96 float32 input (12,672 bytes) was released; y and x^T in FP8 were added
      EXPECT_LT(memory_stats().current_bytes - before, yb.nbytes() + sb.input_t.nbytes()) << name;
    }
  }
}

// A handed-over gradient gives the same dx and parameter gradients as a borrowed one, and under FP8 its float32
// storage is released before the GEMMs allocate their outputs: with outputs larger than dy's FP8 operands (here
// dx and dW of 512 KiB each, dy 256 KiB), the backward's footprint, dy included, is lower by about dy's bytes.
TEST(Linear, HandedOverGradientGivesTheSameResultAndIsFreedEarly) {
  for (const char* name : {"fp32", "bf16", "fp8-delayed", "fp8-block", "fp8-o2"}) {
    const PrecisionRecipe recipe = *PrecisionRecipe::parse(name);
    Linear a("fc", 512, 256, true, 7, 0.5, &recipe), b("fc", 512, 256, true, 7, 0.5, &recipe);
    Context ctx;
    ctx.recipe = &recipe;
    ctx.saved_dtype = recipe.saved_dtype();
    const Tensor x = random({256, 512}, 5);
    Linear::Saved sa, sb;
    a.forward(ctx, x, sa);
    b.forward(ctx, x, sb);
    const Tensor dy = random({256, 256}, 6);
    // Footprints from before dy existed: the borrowed dy stays the caller's throughout; the handed-over one
    // (a clone, counted in base_b) is the layer's to free.
    reset_peak_memory();
    const std::int64_t base = memory_stats().current_bytes;
    const Tensor dxa = a.backward(ctx, dy, sa);
    const std::int64_t borrowed = memory_stats().peak_bytes - base + dy.nbytes();
    Tensor moved = dy.clone();
    reset_peak_memory();
    const std::int64_t base_b = memory_stats().current_bytes;
    const Tensor dxb = b.backward(ctx, std::move(moved), sb);
    const std::int64_t handed = memory_stats().peak_bytes - base_b + dy.nbytes();
    EXPECT_EQ(std::memcmp(dxa.raw(), dxb.raw(), dxa.nbytes()), 0) << name;
    EXPECT_EQ(std::memcmp(a.weight.grad.raw(), b.weight.grad.raw(), a.weight.grad.nbytes()), 0) << name;
    EXPECT_EQ(std::memcmp(a.bias->grad.raw(), b.bias->grad.raw(), a.bias->grad.nbytes()), 0) << name;
    if (recipe.is_fp8()) EXPECT_LE(handed, borrowed - dy.nbytes() / 2) << name;
    // backward releases what forward saved (the weight gradient runs first, so x^T is gone before dx exists)
    EXPECT_EQ(sa.input_t.nbytes(), 0) << name;
    EXPECT_EQ(sb.input_t.nbytes(), 0) << name;
  }
}

TEST(Linear, RecipeNames) {
  for (const char* name :
       {"fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block", "mxfp8", "fp8-o2", "fp8-delayed-fake"}) {
    ASSERT_TRUE(PrecisionRecipe::parse(name).has_value()) << name;
    EXPECT_EQ(PrecisionRecipe::parse(name)->name(), name);
  }
  EXPECT_FALSE(PrecisionRecipe::parse("fp16").has_value());
  EXPECT_FALSE(PrecisionRecipe::parse("bf16-fake").has_value());
}

}  // namespace
}  // namespace fp8kit::nn
