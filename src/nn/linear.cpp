// Linear through the recipe GEMM: forward y = x W^T + b; backward dx = dy W and dW += dy^T x, each GEMM's operands
// prepared under the run's recipe (E4M3 inputs and weights, E5M2 gradients under HYBRID, blocks or MX, ...).
#include "fp8kit/nn/linear.hpp"

#include <omp.h>

#include "fp8kit/common/error.hpp"
#include "nn/gemm_layer.hpp"

namespace fp8kit::nn {
namespace {

GemmCall gemm_call(const Context& ctx, Linear& layer, const char* what) {
  return detail::layer_gemm_call(ctx, layer.fp8, "linear." + layer.name() + "." + what);
}

// The layer's name, once its sizes are checked: a layer without inputs or outputs is refused where it is made, not
// in its first GEMM.
const std::string& checked_name(const std::string& name, std::int64_t in_features, std::int64_t out_features) {
  FP8KIT_CHECK(in_features >= 1 && out_features >= 1, "linear ", name,
               ": in_features and out_features must be at least 1, got ", in_features, " and ", out_features);
  return name;
}

}  // namespace

Linear::Linear(std::string name, std::int64_t in_features, std::int64_t out_features, bool with_bias,
               std::uint64_t seed, double init_std, const PrecisionRecipe* recipe)
    : weight(make_parameter(checked_name(name, in_features, out_features) + ".weight", {out_features, in_features},
                            init_std, seed)),
      fp8(name, recipe != nullptr ? *recipe : PrecisionRecipe{}),
      in_features_(in_features),
      out_features_(out_features) {
  weight.gemm_weight = true;
  if (with_bias) bias = make_parameter(name + ".bias", {out_features}, 0.0, seed + 1);
}

Tensor Linear::forward(const Context& ctx, const Tensor& x, Saved& saved) {
  return forward(ctx, Tensor(x), saved);
}

// The operands are prepared (and x^T saved) before the GEMM, so that an input handed over with std::move is freed
// before the output is allocated: the float32 input of an FP8 or bf16 GEMM is dead once quantized or rounded.
Tensor Linear::forward(const Context& ctx, Tensor&& x, Saved& saved) {
  const std::int64_t in = in_features_, out = out_features_;
  FP8KIT_CHECK(x.dim() >= 1 && x.size(-1) == in, "linear ", name(), ": input's last dimension is ",
               x.dim() ? x.size(-1) : 0, ", the layer takes ", in);
  ScopedEvent event(ctx.profiler, "linear." + name() + ".forward");
  Shape shape = x.shape();
  shape.back() = out;
  Tensor x2 = x.reshape({-1, in});
  x = Tensor();
  const GemmCall call = gemm_call(ctx, *this, "forward");
  const RecipeOperand xq = prepare_operand(call, TensorRole::kInput, x2);
  const RecipeOperand wq = detail::weight_operand(ctx, call, weight, out, in);
  // x handed over: freed before x^T is allocated when x^T is xq's exact transpose (under fp32 xq still shares it)
  // (x^T is wgrad's operand: quantized, where its scales need it, under wgrad's name for --log-scales)
  saved.input_t = detail::prepare_transposed(gemm_call(ctx, *this, "wgrad"), TensorRole::kInput, std::move(x2), &xq);
  const Tensor bias_values = bias ? parameter_values(*bias) : Tensor();
  Tensor y = recipe_gemm(call, xq, wq, bias ? bias_values.span<float>() : std::span<const float>{});
  return y.reshape(shape);
}

Tensor Linear::backward(const Context& ctx, const Tensor& dy, Saved& saved) {
  return backward(ctx, Tensor(dy), saved);
}

Tensor Linear::backward(const Context& ctx, Tensor&& dy, Saved& saved) {
  const std::int64_t in = in_features_, out = out_features_;
  FP8KIT_CHECK(dy.dim() >= 1 && dy.size(-1) == out, "linear ", name(), ": gradient's last dimension is ",
               dy.dim() ? dy.size(-1) : 0, ", the layer outputs ", out);
  ScopedEvent event(ctx.profiler, "linear." + name() + ".backward");
  Shape shape = dy.shape();
  shape.back() = in;
  Tensor dy2 = dy.reshape({-1, out});
  dy = Tensor();
  const std::int64_t rows = dy2.size(0);
  // The Saved of this layer's forward (x^T: in x rows), checked before any gradient is added to.
  FP8KIT_CHECK(saved.input_t.cols() == rows && saved.input_t.rows() == in, "linear ", name(), ": backward with ", rows,
               " rows of ", out, " outputs, but the saved forward is ", saved.input_t.rows(), " x ",
               saved.input_t.cols(), " (run forward first, and give backward that forward's Saved)");
  // dx = dy W (A = dy (R, out), B = W^T (in, out) as N x K) and dW = dy^T x (A = dy^T (out, R), B = x^T (in, R) as
  // N x K). dy's operand and the bias gradient (column sums) first; then dy^T's operand, the exact transpose of dy's
  // when its scales allow (dy's float32 storage, when handed over and not shared by the operands, is freed before it
  // is allocated), else dy^T quantized in bands from dy.
  GemmCall dgrad = gemm_call(ctx, *this, "dgrad");
  const RecipeOperand dyq = prepare_operand(dgrad, TensorRole::kGradOutput, dy2);
  if (bias) {
    GradientAccumulator db(*bias);
    float* gb = db.data();
    const float* src = dy2.data<float>();
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < out; ++j) gb[j] += src[r * out + j];
    db.commit();
  }
  GemmCall wgrad = gemm_call(ctx, *this, "wgrad");
  RecipeOperand dyt = detail::prepare_transposed(wgrad, TensorRole::kGradOutput, std::move(dy2), &dyq);
  detail::add_weight_gradient(ctx, weight, recipe_gemm(wgrad, dyt, saved.input_t));
  dyt = RecipeOperand();
  saved = Saved();
  const RecipeOperand wt = detail::weight_operand_transposed(ctx, dgrad, weight, out, in);
  Tensor dx = recipe_gemm(dgrad, dyq, wt);
  return dx.reshape(shape);
}

std::vector<Parameter*> Linear::parameters() {
  std::vector<Parameter*> p = {&weight};
  if (bias) p.push_back(&*bias);
  return p;
}

}  // namespace fp8kit::nn
