// The training loop: bit-identical losses for the same seed and recipe, the non-finite guard (skip keeps the
// weights finite, abort names the tensor), the loss going down, and the memory order fp8 < bf16 < fp32.
#include <gtest/gtest.h>

#include <cmath>

#include "fp8kit/nn/gpt.hpp"
#include "fp8kit/nn/train.hpp"

namespace fp8kit::nn {
namespace {

TrainConfig short_run(std::int64_t steps) {
  TrainConfig c;
  c.steps = steps;
  c.seed = 3;
  c.final_loss_window = 2;
  return c;
}

TEST(Train, SameSeedAndRecipeGiveBitIdenticalLosses) {
  for (const char* name : {"fp32", "fp8-delayed", "mxfp8"}) {
    const PrecisionRecipe recipe = *PrecisionRecipe::parse(name);
    const TrainResult a = train(short_run(3), recipe), b = train(short_run(3), recipe);
    ASSERT_EQ(a.losses.size(), 3u);
    for (std::size_t i = 0; i < a.losses.size(); ++i) {
      EXPECT_EQ(std::bit_cast<std::uint32_t>(a.losses[i]), std::bit_cast<std::uint32_t>(b.losses[i])) << name << i;
    }
  }
}

TEST(Train, NanGradientSkipsTheStepAndNeverReachesTheWeights) {
  TrainConfig c = short_run(4);
  c.inject_nan_step = 1;
  const PrecisionRecipe recipe = *PrecisionRecipe::parse("fp8-delayed");
  const TrainResult r = train(c, recipe);
  EXPECT_EQ(r.skipped_steps, 1);
  for (float l : r.losses) EXPECT_TRUE(std::isfinite(l));  // the weights stayed finite: later losses are too
  c.on_nonfinite = OnNonfinite::kAbort;
  try {
    train(c, recipe);
    FAIL() << "abort expected";
  } catch (const NonfiniteAbort& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.wte.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("step 1"), std::string::npos) << e.what();
  }
}

TEST(Train, LossGoesDown) {
  const TrainResult r = train(short_run(25), *PrecisionRecipe::parse("fp32"));
  EXPECT_LT(r.final_loss, r.losses.front() - 1.0f);  // from ~ln(256) = 5.5
}

TEST(Train, PeakMemoryOrdersFp8Bf16Fp32) {
  const TrainResult f32 = train(short_run(1), *PrecisionRecipe::parse("fp32"));
  const TrainResult b16 = train(short_run(1), *PrecisionRecipe::parse("bf16"));
  const TrainResult f8 = train(short_run(1), *PrecisionRecipe::parse("fp8-delayed"));
  EXPECT_LT(f8.peak_bytes, b16.peak_bytes);
  EXPECT_LT(b16.peak_bytes, f32.peak_bytes);
  // parameters, gradients and AdamW's two moments alone: 16 bytes per parameter
  EXPECT_GT(f8.peak_bytes, 16 * f8.parameters);
}

TEST(Train, CorpusIsDeterministicAndStructured) {
  const std::string a = generate_corpus(5, 4096), b = generate_corpus(5, 4096);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, generate_corpus(6, 4096));
  EXPECT_NE(a.find('='), std::string::npos);
  EXPECT_EQ(a.size(), 4096u);
}

}  // namespace
}  // namespace fp8kit::nn
