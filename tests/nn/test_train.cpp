// The training loop: bit-identical losses for the same seed and recipe, the non-finite guard (skip keeps the
// weights finite, abort names the tensor), the loss going down, the memory order fp8 < bf16 < fp32, and the
// held-out evaluation (other data, no effect on training).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "fp8kit/common/error.hpp"
#include "fp8kit/nn/cnn.hpp"
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
    EXPECT_EQ(std::bit_cast<std::uint32_t>(a.final_loss), std::bit_cast<std::uint32_t>(b.final_loss)) << name;
  }
}

// The evaluation loss is a forward over held-out batches that leaves the model alone: after evaluate(), the
// parameters and every delayed-scaling state (scale, history) are byte for byte what they were; and it is not a
// training loss.
TEST(Train, EvaluationIsHeldOutAndLeavesTrainingAlone) {
  for (const char* name : {"fp32", "fp8-delayed"}) {
    const PrecisionRecipe recipe = *PrecisionRecipe::parse(name);
    TrainConfig c = short_run(2);
    const auto model = make_model(c, recipe);
    const auto data = make_dataset(c);
    StepReport report;
    Context ctx;
    ctx.saved_dtype = recipe.saved_dtype();
    ctx.recipe = &recipe;
    ctx.report = &report;
    for (std::int64_t step = 0; step < 2; ++step) {  // train a little, so that the states hold histories
      model->forward(ctx, data->batch(step));
      model->backward(ctx);
      for (Fp8LayerState* st : model->fp8_states()) st->update();
    }
    const auto snapshot = [&] {
      std::vector<std::vector<std::uint8_t>> out;
      for (const Parameter* p : model->parameters()) {
        const auto* b = reinterpret_cast<const std::uint8_t*>(p->value.raw());
        out.emplace_back(b, b + p->value.nbytes());
      }
      for (Fp8LayerState* st : model->fp8_states()) {
        for (const DelayedScaling* d : {&st->input, &st->weight, &st->grad_output}) out.push_back(d->serialize());
      }
      return out;
    };
    const auto before = snapshot();
    const float loss = evaluate(*model, *data, recipe, 3);
    EXPECT_TRUE(std::isfinite(loss)) << name;
    EXPECT_EQ(snapshot(), before) << name;
    EXPECT_EQ(evaluate(*model, *data, recipe, 3), loss) << name;  // and so it is repeatable
    const TrainResult r = train(c, recipe);
    EXPECT_NE(r.final_loss, r.train_loss) << name;
  }
}

TEST(Train, HeldOutBatchesComeFromTheHeldOutText) {
  const TextDataset data(std::string(500, 'a'), std::string(200, 'b'), 4, 16, 1, "test");
  const auto values = [](const Batch& b) {
    const auto v = b.inputs.span<std::int64_t>();
    return std::vector<std::int64_t>(v.begin(), v.end());
  };
  for (std::int64_t i = 0; i < 3; ++i) {
    for (const std::int64_t v : values(data.eval_batch(i))) EXPECT_EQ(v, 'b');
    for (const std::int64_t v : values(data.batch(i))) EXPECT_EQ(v, 'a');
  }
  // Deterministic per index, different across indices.
  const TextDataset mixed(generate_corpus(1, 8192), generate_corpus(2, 8192), 4, 16, 1, "test");
  EXPECT_EQ(values(mixed.eval_batch(1)), values(mixed.eval_batch(1)));
  std::set<std::vector<std::int64_t>> seen;
  for (std::int64_t i = 0; i < 4; ++i) seen.insert(values(mixed.eval_batch(i)));
  EXPECT_EQ(seen.size(), 4u);
  // Images: held-out draws are not training draws.
  const ShapesDataset shapes(8, 32, 4, 1);
  const Batch train_images = shapes.batch(0), held_out = shapes.eval_batch(0);
  const auto a = train_images.inputs.span<float>(), b = held_out.inputs.span<float>();
  EXPECT_FALSE(std::equal(a.begin(), a.end(), b.begin()));
  // Seed 0 too: no held-out batch is a training batch (a bit flip of the training stream would have been one step
  // away from it).
  const ShapesDataset zero(4, 16, 4, 0);
  for (std::int64_t i = 0; i < 4; ++i) {
    const Batch e = zero.eval_batch(i);
    for (std::int64_t step = 0; step < 8; ++step) {
      const Batch t = zero.batch(step);
      EXPECT_FALSE(
          std::equal(t.inputs.span<float>().begin(), t.inputs.span<float>().end(), e.inputs.span<float>().begin()))
          << "eval " << i << " = step " << step;
    }
  }
  EXPECT_THROW(TextDataset(std::string(500, 'a'), std::string(10, 'b'), 4, 16, 1, "test"), Error);
}

// A --data file holds out its last 10%; one too small for that is refused with the size it needs.
TEST(Train, DataFileTooSmallToHoldOutIsRefused) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "fp8kit_test_small_text.txt";
  std::ofstream(path) << std::string(300, 'x');
  TrainConfig c = short_run(1);
  c.data_path = path.string();
  try {
    make_dataset(c);
    FAIL() << "a 300-byte text was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("held out"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
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
  EXPECT_LT(r.train_loss, r.losses.front() - 1.0f);  // from ~ln(256) = 5.5
  EXPECT_LT(r.final_loss, r.losses.front() - 1.0f);  // on held-out text too
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
