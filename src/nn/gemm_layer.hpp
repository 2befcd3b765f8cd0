// Internal helpers of the GEMM-based layers (Linear, Conv2d): the recipe a context selects, the GemmCall of one of
// a layer's GEMMs, and the transposed operand that reuses a prepared one when its scales allow.
#pragma once

#include <string>
#include <utility>

#include "fp8kit/nn/context.hpp"
#include "fp8kit/nn/precision.hpp"

namespace fp8kit::nn::detail {

// The context's recipe; fp32 when the context sets none.
inline const PrecisionRecipe& recipe_of(const Context& ctx) {
  static const PrecisionRecipe kFp32;
  return ctx.recipe != nullptr ? *ctx.recipe : kFp32;
}

// The call of one GEMM of a layer: the context's recipe, report and profiler, the layer's FP8 state, event `op`.
inline GemmCall layer_gemm_call(const Context& ctx, Fp8LayerState& state, std::string op) {
  GemmCall call;
  call.recipe = &recipe_of(ctx);
  call.state = &state;
  call.report = ctx.report;
  call.op = std::move(op);
  call.profiler = ctx.profiler;
  return call;
}

// A prepared operand of x^T (x: rows x cols float32): the exact transpose of x's prepared form when its scales
// allow (transpose_operand; x is released first, so a caller that hands x over with std::move frees its float32
// storage before x^T is allocated), else x^T prepared anew from x as `role`.
inline RecipeOperand prepare_transposed(const GemmCall& call, TensorRole role, Tensor x,
                                        const RecipeOperand* prepared) {
  if (prepared != nullptr && !prepared->blocked) {
    x = Tensor();
    return std::move(*transpose_operand(*prepared));
  }
  return prepare_operand_transposed(call, role, x);
}

// A layer's weight (seen as rows x cols) as its forward GEMM's B operand: from the context's weight source when it
// has one (a sharded run), else prepared from weight.value.
inline RecipeOperand weight_operand(const Context& ctx, const GemmCall& call, Parameter& weight, std::int64_t rows,
                                    std::int64_t cols) {
  if (ctx.weights != nullptr) return ctx.weights->forward_operand(call, weight);
  return prepare_operand(call, TensorRole::kWeight, weight.value.reshape({rows, cols}));
}

// Its transpose, the input gradient's B operand.
inline RecipeOperand weight_operand_transposed(const Context& ctx, const GemmCall& call, Parameter& weight,
                                               std::int64_t rows, std::int64_t cols) {
  if (ctx.weights != nullptr) return ctx.weights->backward_operand(call, weight);
  return prepare_transposed(call, TensorRole::kWeight, weight.value.reshape({rows, cols}), nullptr);
}

// dw (the weight matrix's shape) into the weight's gradient: the context's weight source's, or weight.grad +=.
inline void add_weight_gradient(const Context& ctx, Parameter& weight, Tensor dw) {
  if (ctx.weights != nullptr) return ctx.weights->add_gradient(weight, std::move(dw));
  add_to_gradient(weight, dw.span<float>());
}

}  // namespace fp8kit::nn::detail
