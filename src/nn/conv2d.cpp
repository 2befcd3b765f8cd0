// Conv2d through im2col and the recipe GEMM: forward rows = cols W^T + b; backward dcols = dy W (then col2im) and
// dW += dy^T cols, each GEMM under the run's recipe or, past the FP8 support rule, an explicit recorded fallback.
#include "fp8kit/nn/conv2d.hpp"

#include <cmath>

#include "fp8kit/common/error.hpp"
#include "nn/gemm_layer.hpp"
#include "nn_util.hpp"

namespace fp8kit::nn {
namespace {

using detail::kParallelWork;
using detail::shape_string;

using detail::prepare_transposed;

std::string window_string(const Window2d& w) {
  return std::to_string(w.kernel_h) + "x" + std::to_string(w.kernel_w) + " s" + std::to_string(w.stride_h) + "x" +
         std::to_string(w.stride_w) + " p" + std::to_string(w.pad_h) + "x" + std::to_string(w.pad_w);
}

// The call of one of the layer's GEMMs, with the support rule's fallback reason (empty when FP8 may run).
GemmCall conv_call(const Context& ctx, Conv2d& layer, const char* what) {
  GemmCall call = detail::layer_gemm_call(ctx, layer.fp8, "conv2d." + layer.name() + "." + what);
  call.fallback_reason = fp8_conv_fallback_reason(*call.recipe, layer.window);
  return call;
}

// The weight's shape (OC, C, kh, kw), after checking the channels and the window.
Shape weight_shape(const std::string& name, std::int64_t in_channels, std::int64_t out_channels, const Window2d& w) {
  FP8KIT_CHECK(in_channels >= 1 && out_channels >= 1, "conv2d ", name, ": channels must be at least 1, got ",
               in_channels, " -> ", out_channels);
  FP8KIT_CHECK(w.kernel_h >= 1 && w.kernel_w >= 1 && w.stride_h >= 1 && w.stride_w >= 1 && w.pad_h >= 0 && w.pad_w >= 0,
               "conv2d ", name, ": invalid window ", window_string(w),
               " (kernel and stride must be at least 1, padding at least 0)");
  return {out_channels, in_channels, w.kernel_h, w.kernel_w};
}

// The weights' standard deviation: init_std, or He (Kaiming) normal for ReLU, sqrt(2 / fan_in), where it is <= 0.
double weight_std(const std::string& name, double init_std, std::int64_t in_channels, const Window2d& w) {
  FP8KIT_CHECK(std::isfinite(init_std), "conv2d ", name,
               ": init_std must be finite (0 or less: He initialization), got ", init_std);
  if (init_std > 0) return init_std;
  const double fan_in =
      static_cast<double>(in_channels) * static_cast<double>(w.kernel_h) * static_cast<double>(w.kernel_w);
  return std::sqrt(2.0 / fan_in);
}

}  // namespace

std::string fp8_conv_fallback_reason(const PrecisionRecipe& recipe, const Window2d& window) {
  if (!recipe.is_fp8()) return {};
  std::int64_t area = 0;
  const bool past_int64 = __builtin_mul_overflow(window.kernel_h, window.kernel_w, &area);  // past every limit
  if (!past_int64 && area <= recipe.fp8_conv_max_kernel_area) return {};
  const std::string text =
      past_int64 ? std::to_string(window.kernel_h) + " x " + std::to_string(window.kernel_w) : std::to_string(area);
  return "kernel area " + text + " > " + std::to_string(recipe.fp8_conv_max_kernel_area);
}

Conv2d::Conv2d(std::string name, std::int64_t in_channels, std::int64_t out_channels, Window2d window_, bool with_bias,
               std::uint64_t seed, double init_std, const PrecisionRecipe* recipe)
    : weight(make_parameter(name + ".weight", weight_shape(name, in_channels, out_channels, window_),
                            weight_std(name, init_std, in_channels, window_), seed)),
      window(window_),
      fp8(name, recipe != nullptr ? *recipe : PrecisionRecipe{}),
      in_channels_(in_channels),
      out_channels_(out_channels) {
  weight.gemm_weight = true;
  if (with_bias) bias = make_parameter(name + ".bias", {out_channels}, 0.0, seed + 1);
}

// x (N, C, H, W) -> y (N, OC, OH, OW).
Tensor Conv2d::forward(const Context& ctx, const Tensor& x, Saved& saved) {
  const std::int64_t oc = out_channels();
  FP8KIT_CHECK(x.dim() == 4 && x.size(1) == in_channels(), "conv2d ", name(), ": input must be (N, ", in_channels(),
               ", H, W), got ", shape_string(x.shape()));
  ScopedEvent event(ctx.profiler, "conv2d." + name() + ".forward");
  event.arg("shape", shape_string(x.shape()));
  event.arg("kernel", window_string(window));
  const ConvGeometry g = ConvGeometry::make(x.shape(), window);
  const Tensor cols = im2col(ctx, x, g);  // (N*OH*OW, C*kh*kw)
  const GemmCall call = conv_call(ctx, *this, "forward");
  const RecipeOperand colsq = prepare_operand(call, TensorRole::kInput, cols);
  const RecipeOperand wq = detail::weight_operand(ctx, call, weight, oc, g.cols());
  const Tensor bias_values = bias ? parameter_values(*bias) : Tensor();
  const Tensor rows = recipe_gemm(call, colsq, wq, bias ? bias_values.span<float>() : std::span<const float>{});
  // cols^T (C*kh*kw, N*OH*OW) for wgrad. FP8: the codes transposed (per-tensor scales) or quantized anew (blocks).
  // fp32 and bf16: cols^T rounded directly, the same values as the rounded cols transposed without a float round
  // trip of the layer's largest matrix.
  const GemmCall wgrad = conv_call(ctx, *this, "wgrad");  // whose operand cols^T is (its name in --log-scales)
  saved.cols_t = call.recipe->is_fp8() ? prepare_transposed(wgrad, TensorRole::kInput, cols, &colsq)
                                       : prepare_operand_transposed(wgrad, TensorRole::kInput, cols);
  saved.g = g;
  return rows_to_nchw(ctx, rows, g);
}

// dy (N, OC, OH, OW) -> dx (N, C, H, W).
Tensor Conv2d::backward(const Context& ctx, const Tensor& dy, const Saved& saved, InputGradient input_gradient) {
  const ConvGeometry& g = saved.g;
  const std::int64_t oc = out_channels(), k = g.cols(), rows = g.rows();
  FP8KIT_CHECK(saved.cols_t.rows() == k && saved.cols_t.cols() == rows && g.channels == in_channels(), "conv2d ",
               name(), ": backward without a matching forward (no saved state)");
  FP8KIT_CHECK(dy.dtype() == DType::float32 && dy.shape() == g.output_shape(oc), "conv2d ", name(),
               ": gradient must be float32 ", shape_string(g.output_shape(oc)), ", got ", fp8kit::name(dy.dtype()), " ",
               shape_string(dy.shape()));
  ScopedEvent event(ctx.profiler, "conv2d." + name() + ".backward");
  event.arg("shape", shape_string(dy.shape()));
  event.arg("kernel", window_string(window));
  const Tensor dy_rows = nchw_to_rows(ctx, dy);  // (N*OH*OW, OC)
  // dcols = dy W: A = dy_rows (R, OC), B = W^T (K, OC) as N x K. dy is quantized under the dgrad call even when
  // dx is skipped: its codes are what wgrad transposes, and its amax feeds the same delayed-scaling history.
  const GemmCall dgrad = conv_call(ctx, *this, "dgrad");
  const RecipeOperand dyq = prepare_operand(dgrad, TensorRole::kGradOutput, dy_rows);
  Tensor dcols;
  if (input_gradient == InputGradient::kCompute) {
    dcols = recipe_gemm(dgrad, dyq, detail::weight_operand_transposed(ctx, dgrad, weight, oc, k));  // (R, K)
  }
  // dW = dy^T cols: A = dy_rows^T (OC, R), B = cols^T (K, R) as N x K.
  const GemmCall wgrad = conv_call(ctx, *this, "wgrad");
  const RecipeOperand dyt = prepare_transposed(wgrad, TensorRole::kGradOutput, dy_rows, &dyq);
  detail::add_weight_gradient(ctx, weight, recipe_gemm(wgrad, dyt, saved.cols_t));  // (OC, K)
  if (bias) {
    // db[o] = sum over (n, oy, ox) of dy[n, o, oy, ox], in double, in a fixed order.
    GradientAccumulator db(*bias);
    float* gb = db.data();
    const float* src = dy.data<float>();
    const std::int64_t hw = g.out_h * g.out_w;
    for (std::int64_t o = 0; o < oc; ++o) {
      double sum = 0.0;
      for (std::int64_t n = 0; n < g.batch; ++n) {
        const float* plane = src + (n * oc + o) * hw;
        for (std::int64_t p = 0; p < hw; ++p) sum += plane[p];
      }
      gb[o] += static_cast<float>(sum);
    }
    db.commit();
  }
  return input_gradient == InputGradient::kCompute ? col2im(ctx, dcols, g) : Tensor();
}

std::vector<Parameter*> Conv2d::parameters() {
  std::vector<Parameter*> p = {&weight};
  if (bias) p.push_back(&*bias);
  return p;
}

}  // namespace fp8kit::nn
