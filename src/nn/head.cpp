// The shared output layer: the head's recipe (bf16 under FP8 recipes), its Linear, and the FP32-logit loss.
#include "fp8kit/nn/head.hpp"

namespace fp8kit::nn {
namespace {

PrecisionRecipe head_recipe_for(const PrecisionRecipe& recipe) {
  if (!recipe.is_fp8()) return recipe;
  PrecisionRecipe bf16 = recipe;
  bf16.kind = RecipeKind::kBf16;
  bf16.mode = Fp8Mode::kReal;
  return bf16;
}

}  // namespace

ClassifierHead::ClassifierHead(std::string name, std::int64_t in_features, std::int64_t classes, bool with_bias,
                               std::uint64_t seed, double init_std, const PrecisionRecipe& run_recipe)
    : recipe(head_recipe_for(run_recipe)),
      linear(std::move(name), in_features, classes, with_bias, seed, init_std, &recipe) {}

float ClassifierHead::forward(const Context& ctx, Tensor h, const Tensor& targets, Saved& saved) {
  Context head_ctx = ctx;
  head_ctx.recipe = &recipe;
  const Tensor logits = linear.forward(head_ctx, std::move(h), saved.linear);
  Context loss_ctx = ctx;
  loss_ctx.saved_dtype = DType::float32;
  return CrossEntropy::forward(loss_ctx, logits, targets, saved.loss);
}

Tensor ClassifierHead::backward(const Context& ctx, Saved& saved) {
  Context loss_ctx = ctx;
  loss_ctx.saved_dtype = DType::float32;
  Tensor dlogits = CrossEntropy::backward(loss_ctx, 1.0f, std::move(saved.loss));  // over the logits
  Context head_ctx = ctx;
  head_ctx.recipe = &recipe;
  return linear.backward(head_ctx, std::move(dlogits), saved.linear);  // releases saved.linear
}

}  // namespace fp8kit::nn
