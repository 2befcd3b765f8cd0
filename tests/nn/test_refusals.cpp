// Bad input to the training library is refused with one-line fp8kit::Errors, where each of these crashed (abort,
// segfault, SIGFPE), hung, wrote past a buffer, or went on with NaN (found by an audit of the public API).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "fp8kit/nn/conv2d.hpp"
#include "fp8kit/nn/conv_utils.hpp"
#include "fp8kit/nn/gpt.hpp"
#include "fp8kit/nn/layers.hpp"
#include "fp8kit/nn/linear.hpp"
#include "fp8kit/nn/optim.hpp"
#include "fp8kit/nn/train.hpp"

namespace fp8kit::nn {
namespace {

using fp8kit::testing::expect_error;

// A state made under other options (options() changed, a checkpoint of another recipe) was read as the wrong type
// inside the OpenMP loop: std::terminate. Now refused before anything changes.
TEST(Refusals, AdamWStateOfOtherOptions) {
  AdamW opt;
  Parameter p = make_parameter("p", {2}, 0.5, 1);
  p.grad = ones({2});
  Parameter* ps[] = {&p};
  opt.step(ps);
  const std::vector<float> before(p.value.span<float>().begin(), p.value.span<float>().end());
  opt.options().moments = MomentStorage::kFp8;
  expect_error([&] { opt.step(ps); }, ErrorKind::kInvalidArgument, {"adamw: parameter 'p'", "fp8 moments"});
  EXPECT_EQ(opt.state().at("p").step, 1);  // nothing changed
  EXPECT_EQ(std::vector<float>(p.value.span<float>().begin(), p.value.span<float>().end()), before);
  opt.options().moments = MomentStorage::kFloat32;
  EXPECT_NO_THROW(opt.step(ps));
}

// lr Inf, eps 0 (0 / 0 where gradient and moments are 0) and the like gave NaN weights without a word, also when set
// through options() after construction.
TEST(Refusals, AdamWOptionsThatMakeNaN) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [lr, eps, decay] : std::vector<std::tuple<double, double, double>>{{inf, 1e-8, 0.0},
                                                                                      {1e300, 1e-8, 0.0},
                                                                                      {nan, 1e-8, 0.0},
                                                                                      {1e-3, 0.0, 0.0},
                                                                                      {1e-3, 1e-50, 0.0},
                                                                                      {1e-3, 1e-8, inf}}) {
    AdamWOptions o;
    o.lr = lr;
    o.eps = eps;
    o.weight_decay = decay;
    EXPECT_THROW(AdamW{o}, Error) << lr << " " << eps << " " << decay;
  }
  AdamW opt;
  Parameter p = make_parameter("p", {2}, 0.5, 1);
  p.grad = zeros({2});
  Parameter* ps[] = {&p};
  opt.options().beta1 = 1.0;
  expect_error([&] { opt.step(ps); }, ErrorKind::kInvalidArgument, {"beta1"});
}

TEST(Refusals, GptWithoutHeadsOrLayers) {
  for (const auto& [heads, layers] : {std::pair<std::int64_t, std::int64_t>{0, 1}, {-2, 1}, {1, 0}, {1, -1}}) {
    GptConfig c;
    c.heads = heads;
    c.layers = layers;
    expect_error([&] { Gpt m(c, *PrecisionRecipe::parse("fp32")); }, ErrorKind::kInvalidArgument,
                 {"gpt: heads and layers must be at least 1"});
  }
}

// A backward without its forward, or with the Saved of a same-type layer of another size, read and wrote past the
// buffers (segfaults; garbage in the gradients of a smaller one).
TEST(Refusals, BackwardWithoutItsForward) {
  const Context ctx;
  LayerNorm small("small", 4), big("big", 8);
  LayerNorm::Saved none;
  expect_error(
      [&] {
        small.backward(ctx, ones({2, 4}), none);
      },
      ErrorKind::kInvalidArgument, {"layernorm.backward: no saved forward of 4 channels"});
  LayerNorm::Saved of_small;
  (void)small.forward(ctx, ones({2, 4}), of_small);
  expect_error(
      [&] {
        big.backward(ctx, ones({2, 4}), of_small);
      },
      ErrorKind::kInvalidArgument, {"no saved forward of 8 channels"});

  Embedding table("table", 100, 2, 0.02, 1), smaller("smaller", 3, 2, 0.02, 2);
  Tensor ids = zeros({1}, DType::int64);
  ids.data<std::int64_t>()[0] = 99;
  Embedding::Saved of_table;
  (void)table.forward(ctx, ids, of_table);
  smaller.weight.grad = zeros({3, 2});
  expect_error(
      [&] {
        smaller.backward(ctx, ones({1, 2}), of_table);
      },
      ErrorKind::kInvalidArgument, {"embedding.backward: saved id 99 is outside this table's 3 rows"});
  EXPECT_EQ(smaller.weight.grad.span<float>()[0], 0.0f);
  expect_error(
      [&] {
        smaller.backward(ctx, ones({1, 2}), Embedding::Saved{});
      },
      ErrorKind::kInvalidArgument, {"embedding.backward: no saved ids"});
  // Relu and cross entropy said "Tensor::data<T>(): T is the element type of ..." instead.
  expect_error([&] { (void)Relu::backward(ctx, ones({2}), Relu::Saved{}); }, ErrorKind::kInvalidArgument,
               {"relu.backward: no saved forward"});
  CrossEntropy::Saved ce;
  const Tensor targets = zeros({2}, DType::int64);
  (void)CrossEntropy::forward(ctx, ones({2, 3}), targets, ce);
  (void)CrossEntropy::backward(ctx, 1.0f, std::move(ce));
  expect_error([&] { (void)CrossEntropy::backward(ctx, 1.0f, std::move(ce)); }, ErrorKind::kInvalidArgument,
               {"cross_entropy.backward: no saved forward"});
}

// A Linear's backward given another layer's Saved added to the bias gradient before it refused.
TEST(Refusals, LinearBackwardWithAnotherLayersSaved) {
  const Context ctx;
  Linear a("a", 3, 2, true, 1), b("b", 5, 2, true, 2);
  Linear::Saved of_a;
  (void)a.forward(ctx, ones({4, 3}), of_a);
  expect_error(
      [&] {
        (void)b.backward(ctx, ones({4, 2}), of_a);
      },
      ErrorKind::kInvalidArgument, {"linear b: backward with 4 rows of 2 outputs, but the saved forward is 3 x 4"});
  for (const float g : b.bias->grad.span<float>()) EXPECT_EQ(g, 0.0f);
}

TEST(Refusals, TrainConfigAndSizes) {
  TrainConfig c;
  c.steps = 2;
  c.batch = 1;
  c.eval_batches = 1;
  for (const std::int64_t window : {std::int64_t{0}, std::numeric_limits<std::int64_t>::min()}) {
    c.final_loss_window = window;  // INT64_MIN segfaulted, 0 gave a NaN train loss
    expect_error([&] { (void)train(c, *PrecisionRecipe::parse("fp32")); }, ErrorKind::kInvalidArgument,
                 {"final_loss_window must be at least 1"});
  }
  c.final_loss_window = 1;
  c.data_path = std::filesystem::temp_directory_path().string();  // escaped as std::ios_base::failure
  expect_error([&] { (void)train(c, *PrecisionRecipe::parse("fp32")); }, ErrorKind::kInvalidArgument,
               {"is a directory"});
  c.data_path.clear();
  for (const auto& [index, count] : {std::pair<int, int>{5, 0}, {3, 1}, {-1, 2}}) {
    c.batch_shard = {index, count};  // was ignored: the whole batch trained
    expect_error([&] { (void)train(c, *PrecisionRecipe::parse("fp32")); }, ErrorKind::kInvalidArgument,
                 {"batch_shard must be part index"});
  }
  c.batch_shard = {};
  c.warmup_steps = -1;
  expect_error([&] { (void)train(c, *PrecisionRecipe::parse("fp32")); }, ErrorKind::kInvalidArgument,
               {"warmup_steps must be >= 0"});
  c.warmup_steps = 0;
  expect_error([&] { (void)learning_rate(c, -1); }, ErrorKind::kInvalidArgument, {"learning_rate"});  // was NaN
  // NaN or negative init stddevs gave zeros, a NaN fill NaN weights; a NaN eps NaN outputs.
  for (const double bad : {std::nan(""), -1.0, std::numeric_limits<double>::infinity()}) {
    expect_error([&] { (void)make_parameter("w", {2}, bad, 1); }, ErrorKind::kInvalidArgument, {"parameter 'w'"});
  }
  expect_error([] { (void)make_parameter("w", {2}, 0.0, 1, std::nan("")); }, ErrorKind::kInvalidArgument,
               {"the fill finite"});
  LayerNorm ln("ln", 4);
  ln.eps = std::nanf("");
  LayerNorm::Saved saved;
  expect_error(
      [&] {
        (void)ln.forward(Context{}, ones({1, 4}), saved);
      },
      ErrorKind::kInvalidArgument, {"layernorm: eps"});
  // N*H*W past int64 wrapped to 0, passed the check and looped 2^32 times.
  expect_error(
      [] {
        (void)rows_to_nchw(Context{}, zeros({0, 0}), std::int64_t{1} << 32, std::int64_t{1} << 32, 1);
      },
      ErrorKind::kInvalidArgument, {"rows_to_nchw: sizes"});
}

// A NaN or infinite init_std was taken as "0 or less" and gave He initialization without a word.
TEST(Refusals, ConvInitStdAndSizesPastInt64) {
  for (const double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
    expect_error([&] { Conv2d conv("c", 2, 3, Window2d::square(3), false, 1, bad); }, ErrorKind::kInvalidArgument,
                 {"conv2d c: init_std must be finite"});
  }
  const Conv2d he("c", 2, 3, Window2d::square(3), false, 1, -1.0);  // 0 or less: He, as documented
  EXPECT_TRUE(std::isfinite(he.weight.value.span<float>()[0]));
  // kh * kw past int64 (signed overflow, undefined) for the fallback check: now a reason naming both sides.
  const Window2d huge{std::int64_t{1} << 32, std::int64_t{1} << 32};
  const std::string reason = fp8_conv_fallback_reason(*PrecisionRecipe::parse("fp8-delayed"), huge);
  EXPECT_NE(reason.find("kernel area 4294967296 x 4294967296 > "), std::string::npos) << reason;
  const Window2d wraps_small{(std::int64_t{1} << 62) + 1, 4};  // wraps to 4, under the limit: no fallback said
  EXPECT_NE(fp8_conv_fallback_reason(*PrecisionRecipe::parse("fp8-delayed"), wraps_small).find(" x 4 > "),
            std::string::npos);
  // rows() x cols() of a tiny input with a 2^31 kernel and padding: ~2^62 x 2^62 wrapped around.
  const Window2d wide{std::int64_t{1} << 31, std::int64_t{1} << 31, 1, 1, std::int64_t{1} << 31, std::int64_t{1} << 31};
  expect_error(
      [&] {
        (void)ConvGeometry::make({1, 1, 1, 1}, wide);
      },
      ErrorKind::kInvalidArgument, {"conv geometry", "past 2^63 elements"});
}

// A RecipeKind cast from a number past the table read past its end.
TEST(Refusals, RecipeKindOutOfRange) {
  PrecisionRecipe r;
  r.kind = static_cast<RecipeKind>(200);
  expect_error([&] { (void)r.name(); }, ErrorKind::kInvalidArgument, {"kind 200 is not a RecipeKind"});
}

}  // namespace
}  // namespace fp8kit::nn
