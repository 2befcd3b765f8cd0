// Linear: y = x W^T + b through the run's precision recipe (fp32, bf16, or FP8 with per-role scaling state), with
// its two backward GEMMs (input gradient, weight gradient) under the same recipe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "fp8kit/nn/context.hpp"
#include "fp8kit/nn/precision.hpp"

namespace fp8kit::nn {

struct Linear {
  Parameter weight;               // (out, in), normal(0, init_std)
  std::optional<Parameter> bias;  // (out), zeros
  Fp8LayerState fp8;              // per-role delayed-scaling state (used by fp8-delayed)

  Linear(std::string name, std::int64_t in_features, std::int64_t out_features, bool with_bias, std::uint64_t seed,
         double init_std = 0.02, const PrecisionRecipe* recipe = nullptr);

  // What backward needs: x^T prepared as the weight-gradient GEMM's right operand (in, R) — in FP8 for FP8 recipes
  // (one byte per element), bfloat16 for bf16, float32 for fp32.
  struct Saved {
    RecipeOperand input_t;
  };

  // x (R, in) -> y (R, out); any leading dimensions are rows.
  Tensor forward(const Context& ctx, const Tensor& x, Saved& saved);
  // The same for an input handed over (std::move): its float32 storage is released before the output is
  // allocated (under FP8 and bf16 recipes nothing else needs it once it is quantized or rounded).
  Tensor forward(const Context& ctx, Tensor&& x, Saved& saved);
  // dy (R, out) -> dx (R, in); accumulates weight.grad (dW = dy^T x) and bias.grad (column sums of dy), and releases
  // `saved`. The weight gradient runs first: its output, dy^T's operand and the saved x^T are gone before dx is
  // allocated.
  Tensor backward(const Context& ctx, const Tensor& dy, Saved& saved);
  // The same for a gradient handed over (std::move): dy's float32 storage is released once both of its GEMM operands
  // are prepared, before the GEMMs allocate their outputs (under FP8 recipes the operands are codes; a block's widest
  // gradient, the MLP's, is then gone before dx exists).
  Tensor backward(const Context& ctx, Tensor&& dy, Saved& saved);

  std::vector<Parameter*> parameters();
  const std::string& name() const { return fp8.layer; }
  std::int64_t in_features() const { return in_features_; }
  std::int64_t out_features() const { return out_features_; }

 private:
  std::int64_t in_features_, out_features_;  // weight's shape, also while a sharded run holds no full value
};

}  // namespace fp8kit::nn
