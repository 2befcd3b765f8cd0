// The output layer the models share: a Linear to the classes (or vocabulary) and the cross-entropy loss, with the
// precision practice around it — the head in bf16 under FP8 recipes, the loss's logits in FP32 under every recipe.
#pragma once

#include <string>
#include <vector>

#include "fp8kit/nn/layers.hpp"
#include "fp8kit/nn/linear.hpp"

namespace fp8kit::nn {

// FP8 recipes keep the output head in bf16 (as DeepSeek-V3 and common Transformer Engine practice keep the last
// layer in higher precision); other recipes run it as they run everything. The loss saves FP32 logits (autocast
// runs cross-entropy in FP32): the softmax of bfloat16-rounded logits would make the output gradient noisy.
struct ClassifierHead {
  PrecisionRecipe recipe;  // the head's own recipe (declared before `linear`, which is built with it)
  Linear linear;

  ClassifierHead(std::string name, std::int64_t in_features, std::int64_t classes, bool with_bias, std::uint64_t seed,
                 double init_std, const PrecisionRecipe& run_recipe);

  struct Saved {
    Linear::Saved linear;
    CrossEntropy::Saved loss;
  };
  // h (..., in) and targets (...) int64 -> the mean loss. h handed over (std::move) is released once the head's GEMM
  // operands are prepared, before the logits are allocated.
  float forward(const Context& ctx, Tensor h, const Tensor& targets, Saved& saved);
  // -> dh (..., in); accumulates the head's gradients and releases `saved`.
  Tensor backward(const Context& ctx, Saved& saved);
};

}  // namespace fp8kit::nn
