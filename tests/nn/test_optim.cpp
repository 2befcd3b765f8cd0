// AdamW against a two-step example computed by hand (torch.optim.AdamW's formula), decoupled weight decay, the
// decay policy, per-parameter state, zero_grad, the non-finite gradient check and thread independence.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/nn/optim.hpp"

namespace fp8kit::nn {
namespace {

Parameter parameter(std::string name, const std::vector<double>& values, Shape shape) {
  Parameter p = make_parameter(std::move(name), shape, 0.0, 0);
  for (std::size_t i = 0; i < values.size(); ++i) p.value.data<float>()[i] = static_cast<float>(values[i]);
  return p;
}

void set_grad(Parameter& p, const std::vector<double>& values) {
  for (std::size_t i = 0; i < values.size(); ++i) p.grad.data<float>()[i] = static_cast<float>(values[i]);
}

// lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.01; p0 = (1, -2, 0.5), g1 = (0.5, -1, 0), g2 = (-0.25, 2, 0).
// Step 1: the bias-corrected m/sqrt(v) is g/|g| = +-1, so p1 = 0.999 p0 - 0.1 sign(g1) = (0.899, -1.898, 0.4995)
//   (a zero gradient leaves only the decay).
// Step 2 (first element): m = 0.9 * 0.05 + 0.1 * (-0.25) = 0.02, v = 0.999 * 0.00025 + 0.001 * 0.0625 = 0.00031225,
//   m / (1 - 0.9^2) = 0.105263..., v / (1 - 0.999^2) = 0.156203..., update 0.1 * 0.105263 / 0.395225 = 0.026634,
//   p2 = 0.999 * 0.899 - 0.026634 = 0.871467 (the others likewise; evaluated in double).
TEST(AdamW, MatchesTwoStepsComputedByHand) {
  Parameter p = parameter("w", {1.0, -2.0, 0.5}, {3});
  AdamW opt({.lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01});
  Parameter* params[] = {&p};
  set_grad(p, {0.5, -1.0, 0.0});
  opt.step(params);
  const std::vector<double> step1 = {0.899000002, -1.898000001, 0.4995};
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(p.value.data<float>()[i], step1[i], 1e-6) << i;
  set_grad(p, {-0.25, 2.0, 0.0});
  opt.step(params);
  const std::vector<double> step2 = {0.871467299, -1.932712353, 0.4990005};
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(p.value.data<float>()[i], step2[i], 1e-6) << i;
  const AdamW::State& s = opt.state().at("w");
  EXPECT_EQ(s.step, 2);
  EXPECT_NEAR(s.m.data<float>()[0], 0.02, 1e-8);
  EXPECT_NEAR(s.v.data<float>()[1], 0.004999, 1e-9);
  // Gradients are left alone.
  EXPECT_EQ(p.grad.data<float>()[1], 2.0f);
}

TEST(AdamW, WeightDecayIsDecoupledFromTheMoments) {
  // A zero gradient: the update is exactly p * (1 - lr * wd) per step, and m and v stay zero. Adam with an L2
  // penalty would feed wd * p into m and v and move each weight by ~lr per step instead.
  Parameter p = parameter("w", {3.0, -1.5}, {1, 2});
  AdamW opt({.lr = 0.05, .weight_decay = 0.1});
  Parameter* params[] = {&p};
  const float keep = static_cast<float>(1.0 - 0.05 * 0.1);
  float expected[2] = {3.0f, -1.5f};
  for (int step = 0; step < 3; ++step) {
    opt.step(params);
    for (float& e : expected) e *= keep;
    EXPECT_EQ(p.value.data<float>()[0], expected[0]) << step;
    EXPECT_EQ(p.value.data<float>()[1], expected[1]) << step;
  }
  EXPECT_EQ(opt.state().at("w").m.data<float>()[0], 0.0f);
  EXPECT_EQ(opt.state().at("w").v.data<float>()[0], 0.0f);
  EXPECT_NEAR(p.value.data<float>()[0], 3.0 * std::pow(1.0 - 0.005, 3), 1e-6);
}

TEST(AdamW, MatricesOnlyPolicySkipsVectors) {
  Parameter matrix = parameter("w", {2.0, 2.0}, {1, 2});
  Parameter vector = parameter("b", {2.0, 2.0}, {2});
  AdamW opt({.lr = 0.1, .weight_decay = 0.5, .decay = DecayPolicy::kMatricesOnly});
  Parameter* params[] = {&matrix, &vector};
  opt.step(params);
  EXPECT_EQ(matrix.value.data<float>()[0], 2.0f * 0.95f);
  EXPECT_EQ(vector.value.data<float>()[0], 2.0f);
}

TEST(AdamW, StateIsPerParameterWithItsOwnStepCount) {
  Parameter a = parameter("a", {1.0}, {1});
  Parameter b = parameter("b", {1.0}, {1});
  AdamW opt({.lr = 0.1, .weight_decay = 0.0});
  Parameter* only_a[] = {&a};
  Parameter* both[] = {&b, &a};  // order does not matter: state is keyed by name
  set_grad(a, {1.0});
  set_grad(b, {1.0});
  opt.step(only_a);
  opt.step(both);
  EXPECT_EQ(opt.state().at("a").step, 2);
  EXPECT_EQ(opt.state().at("b").step, 1);
  // A parameter's first step moves it by lr (bias correction), whenever it joins.
  EXPECT_NEAR(b.value.data<float>()[0], 0.9, 1e-6);
  EXPECT_NEAR(a.value.data<float>()[0], 0.8, 1e-6);
  Parameter twin = parameter("a", {1.0}, {1});
  Parameter* duplicate[] = {&a, &twin};
  EXPECT_THROW(opt.step(duplicate), Error);
  Parameter reshaped = parameter("b", {1.0, 1.0}, {2});
  Parameter* changed[] = {&reshaped};
  EXPECT_THROW(opt.step(changed), Error);
  EXPECT_EQ(opt.state().at("a").step, 2);  // refused steps changed nothing
  EXPECT_EQ(opt.state().at("b").step, 1);
  EXPECT_NEAR(a.value.data<float>()[0], 0.8, 1e-6);
  EXPECT_THROW(AdamW({.beta1 = 1.0}), Error);
}

TEST(AdamW, ZeroGradAndRecordsAProfilerEvent) {
  Parameter p = parameter("w", {1.0, 2.0}, {2});
  set_grad(p, {3.0, -4.0});
  std::vector<Parameter*> params = {&p};
  Profiler profiler;
  AdamW opt;
  opt.step(params, &profiler);
  ASSERT_EQ(profiler.events().size(), 1u);
  EXPECT_EQ(profiler.events()[0].name, "adamw.step");
  EXPECT_EQ(profiler.events()[0].category, "optimizer");
  AdamW::zero_grad(params);
  EXPECT_EQ(p.grad.data<float>()[0], 0.0f);
  EXPECT_EQ(p.grad.data<float>()[1], 0.0f);
}

TEST(NonFiniteGrad, NamesTheFirstParameterWithNanOrInf) {
  Parameter a = parameter("a", {0.0, 0.0}, {2});
  Parameter b = parameter("b", {0.0, 0.0, 0.0}, {3});
  Parameter c = parameter("c", {0.0}, {1});
  std::vector<Parameter*> params = {&a, &b, &c};
  set_grad(a, {1.0, -1e30});
  EXPECT_EQ(first_nonfinite_grad(params), "");
  set_grad(c, {INFINITY});
  EXPECT_EQ(first_nonfinite_grad(params), "c");
  set_grad(b, {0.0, 0.0, NAN});
  EXPECT_EQ(first_nonfinite_grad(params), "b");
  Parameter big = make_parameter("big", {1 << 16}, 0.0, 0);  // the parallel path
  big.grad.data<float>()[(1 << 16) - 1] = -INFINITY;
  Parameter* one[] = {&big};
  EXPECT_EQ(first_nonfinite_grad(one), "big");
}

TEST(AdamW, BitIdenticalForOneAndTwoThreads) {
  const int before = num_threads();
  std::vector<Tensor> results;
  for (const int threads : {1, 2}) {
    set_num_threads(threads);
    Parameter p = make_parameter("w", {256, 160}, 0.5, 40);
    AdamW opt({.lr = 3e-3});
    std::vector<Parameter*> params = {&p};
    for (std::uint64_t step = 0; step < 3; ++step) {
      p.grad = randn({256, 160}, 41 + step, DType::float32);
      opt.step(params);
    }
    results.push_back(p.value);
  }
  set_num_threads(before);
  EXPECT_EQ(std::memcmp(results[0].raw(), results[1].raw(), results[0].nbytes()), 0);
}

}  // namespace
}  // namespace fp8kit::nn
