// The training loop: bit-identical losses for the same seed and recipe, the non-finite guard (skip keeps the
// weights finite, abort names the tensor), the loss going down, the memory order fp8 < bf16 < fp32, and the
// held-out evaluation (other data, no effect on training).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "fp8kit/common/error.hpp"
#include "fp8kit/nn/cnn.hpp"
#include "fp8kit/nn/gpt.hpp"
#include "fp8kit/nn/train.hpp"
#include "fp8kit/tensor/memory.hpp"

namespace fp8kit::nn {
namespace {

TrainConfig short_run(std::int64_t steps) {
  TrainConfig c;
  c.steps = steps;
  c.seed = 3;
  c.final_loss_window = 2;
  c.eval_batches = 2;  // the tests compare held-out losses between runs, which 2 batches do as well as 16
  c.batch = 4;         // sequences per step: what these tests check does not need the default 16
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

// TrainConfig::perturb_seed: every nonzero value one ulp away (up or down at random, about half each way), zeros
// left alone, the same seed the same values, another seed other values; for float32 and bfloat16 master weights.
TEST(Train, PerturbSeedMovesEveryInitialValueOneUlp) {
  for (const char* name : {"fp32", "fp8-o2"}) {
    const PrecisionRecipe recipe = *PrecisionRecipe::parse(name);
    TrainConfig c = short_run(1);
    const Trainer plain(c, recipe);
    c.perturb_seed = 7;
    const Trainer moved(c, recipe), again(c, recipe);
    c.perturb_seed = 8;
    const Trainer other(c, recipe);
    std::int64_t up = 0, down = 0, zeros = 0, differ = 0;
    for (std::size_t p = 0; p < plain.parameters().size(); ++p) {
      const Tensor& a = plain.parameters()[p]->value;
      const bool f32 = a.dtype() == DType::float32;
      ASSERT_TRUE(f32 || a.dtype() == DType::bfloat16) << name;
      const auto bits = [&](const Tensor& t, std::int64_t i) -> std::int64_t {
        return f32 ? std::bit_cast<std::uint32_t>(t.data<float>()[i]) : t.data<bfloat16>()[i].bits;
      };
      for (std::int64_t i = 0; i < a.numel(); ++i) {
        const std::int64_t b0 = bits(a, i), b1 = bits(moved.parameters()[p]->value, i);
        ASSERT_EQ(b1, bits(again.parameters()[p]->value, i)) << name;
        differ += bits(other.parameters()[p]->value, i) != b1;
        const std::int64_t sign = f32 ? std::int64_t{1} << 31 : std::int64_t{1} << 15;
        if ((b0 & (sign - 1)) == 0) {
          ++zeros;
          EXPECT_EQ(b1, b0) << name << " " << plain.parameters()[p]->name;
          continue;
        }
        ASSERT_EQ(b1 & sign, b0 & sign) << name;  // the magnitude moves, the sign stays
        ASSERT_TRUE(b1 == b0 + 1 || b1 == b0 - 1) << name << " " << plain.parameters()[p]->name << "[" << i << "]";
        (b1 == b0 + 1 ? up : down) += 1;
      }
    }
    EXPECT_GT(zeros, 0) << name;  // the biases and LayerNorm shifts start at zero
    const double total = static_cast<double>(up + down);
    EXPECT_NEAR(static_cast<double>(up) / total, 0.5, 0.02) << name << ": " << up << " up, " << down << " down";
    EXPECT_GT(differ, static_cast<std::int64_t>(total / 3)) << name;
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

// The default GPT at batch 16 (every step allocates alike, so one step's peak is a long run's): the order, and the
// issue's figures against fp32 in the same run, fp8-delayed <= 0.58x and fp8-o2 <= 0.42x.
TEST(Train, PeakMemoryOrdersFp8Bf16Fp32) {
  TrainConfig c = short_run(1);
  c.batch = 0;  // the default batch: the ratios below are the training table's
  const TrainResult f32 = train(c, *PrecisionRecipe::parse("fp32"));
  const TrainResult b16 = train(c, *PrecisionRecipe::parse("bf16"));
  const TrainResult f8 = train(c, *PrecisionRecipe::parse("fp8-delayed"));
  const TrainResult o2 = train(c, *PrecisionRecipe::parse("fp8-o2"));
  EXPECT_LT(o2.peak_bytes, f8.peak_bytes);
  EXPECT_LT(f8.peak_bytes, b16.peak_bytes);
  EXPECT_LT(b16.peak_bytes, f32.peak_bytes);
  EXPECT_LE(static_cast<double>(f8.peak_bytes), 0.58 * static_cast<double>(f32.peak_bytes));
  EXPECT_LE(static_cast<double>(o2.peak_bytes), 0.42 * static_cast<double>(f32.peak_bytes));
  // the float32 parameters and AdamW's two moments alone: 12 bytes per parameter
  EXPECT_GT(f8.peak_bytes, 12 * f8.parameters);
}

// Gradients are held from a step's backward to its update only (set to none between steps): none while the next
// forward saves its activations, every trained parameter's after backward (zeros where nothing was added).
TEST(Trainer, GradientsAreHeldFromBackwardToTheUpdate) {
  const auto gradient_bytes = [] {
    return memory_stats().current_by_category[static_cast<std::size_t>(MemoryCategory::kGradients)];
  };
  for (const char* name : {"fp32", "fp8-o2"}) {
    const std::int64_t before = gradient_bytes();
    Trainer t(short_run(2), *PrecisionRecipe::parse(name));
    EXPECT_EQ(gradient_bytes(), before) << name;
    for (const Parameter* p : t.parameters()) EXPECT_EQ(p->grad.numel(), 0) << name << " " << p->name;
    const float loss = t.forward(t.data().batch(0));
    EXPECT_EQ(gradient_bytes(), before) << name;
    t.backward();
    std::int64_t bytes = 0;
    for (const Parameter* p : t.parameters()) {
      EXPECT_EQ(p->grad.shape(), p->value.shape()) << name << " " << p->name;
      EXPECT_EQ(p->grad.dtype(), p->value.dtype()) << name << " " << p->name;
      bytes += p->grad.nbytes();
    }
    EXPECT_GE(gradient_bytes() - before, bytes) << name;
    ASSERT_EQ(t.nonfinite(loss), "") << name;
    t.optimizer_step(0);
    t.zero_grad();
    EXPECT_EQ(gradient_bytes(), before) << name;
    for (const Parameter* p : t.parameters()) EXPECT_EQ(p->grad.numel(), 0) << name << " " << p->name;
  }
}

// The phases, driven by hand in train()'s order, give train()'s losses bit for bit.
TEST(Trainer, PhasesDrivenByHandGiveTrainsLosses) {
  const PrecisionRecipe recipe = *PrecisionRecipe::parse("fp8-delayed");
  const TrainConfig c = short_run(3);
  const TrainResult want = train(c, recipe);
  Trainer t(c, recipe);
  for (std::int64_t step = 0; step < c.steps; ++step) {
    const float loss = t.forward(t.data().batch(step));
    t.backward();
    ASSERT_EQ(t.nonfinite(loss), "");
    t.optimizer_step(step);
    t.update_scales();
    t.zero_grad();
    EXPECT_EQ(std::bit_cast<std::uint32_t>(loss), std::bit_cast<std::uint32_t>(want.losses[step])) << step;
  }
}

// Every hook runs where the phases say: resume first, then per step reduce_gradients before the guard and
// agree_amax only for a step that is not skipped, after_step with the progress that includes the step, on_step,
// and finish at the end.
TEST(Trainer, HooksRunInTheirPlaces) {
  TrainConfig c = short_run(3);
  c.inject_nan_step = 1;
  std::vector<std::string> calls;
  TrainHooks hooks;
  hooks.resume = [&](Trainer& t, TrainProgress& p) {
    EXPECT_EQ(p.next_step, 0);
    EXPECT_FALSE(t.parameters().empty());
    calls.push_back("resume");
  };
  hooks.reduce_gradients = [&](Trainer& t) {
    // after backward and the injection: the gradient is there
    const bool nan = std::isnan(t.parameters().front()->grad.data<float>()[0]);
    calls.push_back(nan ? "reduce(nan)" : "reduce");
  };
  hooks.agree_nonfinite = [&](Trainer&, const std::string& bad) {
    calls.push_back(bad.empty() ? "agree" : "agree(" + bad + ")");
    return bad;
  };
  hooks.agree_amax = [&](Trainer&) { calls.push_back("amax"); };
  hooks.after_step = [&](Trainer&, const TrainProgress& p) {
    calls.push_back("after " + std::to_string(p.next_step) + "/" + std::to_string(p.losses.size()) + "/" +
                    std::to_string(p.skipped_steps));
  };
  hooks.on_step = [&](const StepLog& s) { calls.push_back(std::string("log") + (s.skipped ? " skipped" : "")); };
  hooks.finish = [&](Trainer&, const TrainProgress& p) { calls.push_back("finish " + std::to_string(p.next_step)); };
  const TrainResult r = train(c, *PrecisionRecipe::parse("fp8-delayed"), nullptr, hooks);
  const std::vector<std::string> want = {
      "resume",      "reduce",      "agree",       "amax",
      "after 1/1/0", "log",         "reduce(nan)", "agree(non-finite gradient of transformer.wte.weight)",
      "after 2/2/1", "log skipped", "reduce",      "agree",
      "amax",        "after 3/3/1", "log",         "finish 3"};
  EXPECT_EQ(calls, want);
  EXPECT_EQ(r.skipped_steps, 1);
}

// What reduce_gradients leaves is what the guard and the optimizer see: a hook that spoils a gradient makes every
// step skip; one that zeroes them all leaves only the weight decay, which changes the run.
TEST(Trainer, ReducedGradientsAreTheOnesUsed) {
  const PrecisionRecipe recipe = *PrecisionRecipe::parse("fp32");
  const TrainConfig c = short_run(3);
  TrainHooks spoil;
  spoil.reduce_gradients = [](Trainer& t) {
    t.parameters().back()->grad.data<float>()[0] = std::numeric_limits<float>::infinity();
  };
  EXPECT_EQ(train(c, recipe, nullptr, spoil).skipped_steps, 3);
  TrainHooks zero;
  zero.reduce_gradients = [](Trainer& t) { t.zero_grad(); };
  const TrainResult plain = train(c, recipe), zeroed = train(c, recipe, nullptr, zero);
  EXPECT_EQ(plain.losses[0], zeroed.losses[0]);  // the first forward precedes any update
  EXPECT_GT(std::abs(plain.losses[2] - zeroed.losses[2]), 1e-3f);
}

// The run's verdict decides: another rank's non-finite amax (agree_nonfinite says so) skips this rank's finite step
// too, and a resume hook whose progress does not fit the run is refused before any step.
TEST(Trainer, AgreedVerdictAndCheckedResume) {
  const PrecisionRecipe recipe = *PrecisionRecipe::parse("fp8-delayed");
  const TrainConfig c = short_run(3);
  TrainHooks other_rank;
  other_rank.agree_nonfinite = [](Trainer&, const std::string& bad) {
    return bad.empty() ? std::string("non-finite amax on rank 1") : bad;
  };
  int amax_calls = 0;
  other_rank.agree_amax = [&](Trainer&) { ++amax_calls; };
  const TrainResult r = train(c, recipe, nullptr, other_rank);
  EXPECT_EQ(r.skipped_steps, 3);
  EXPECT_EQ(amax_calls, 0);
  TrainHooks bad_resume;
  bool stepped = false;
  bad_resume.resume = [](Trainer&, TrainProgress& p) { p.next_step = 2; };  // no losses for the steps it claims
  bad_resume.on_step = [&](const StepLog&) { stepped = true; };
  try {
    train(c, recipe, nullptr, bad_resume);
    ADD_FAILURE() << "trained";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one loss per step done"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(stepped);
}

// AdamW's settings come from the config: other betas or weight decay change the run, the defaults are kTrainAdamW.
TEST(Trainer, OptimizerSettingsAreConfiguration) {
  const PrecisionRecipe recipe = *PrecisionRecipe::parse("fp32");
  TrainConfig c = short_run(3);
  EXPECT_EQ(c.adamw.beta2, 0.95);
  EXPECT_EQ(c.adamw.weight_decay, 0.1);
  EXPECT_EQ(c.adamw.decay, DecayPolicy::kMatricesOnly);
  const TrainResult base = train(c, recipe);
  c.adamw.beta1 = 0.5;
  const TrainResult other = train(c, recipe);
  EXPECT_NE(base.losses[2], other.losses[2]);
  Trainer t(c, recipe);
  EXPECT_EQ(t.optimizer().options().beta1, 0.5);
  t.optimizer_step(0);
  EXPECT_EQ(t.optimizer().options().lr, learning_rate(c, 0));
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
