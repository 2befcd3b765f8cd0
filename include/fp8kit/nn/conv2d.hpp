// Conv2d: a 2-d convolution (any kernel, stride, padding) as im2col + the run's recipe GEMM, with its two backward
// GEMMs, and the dispatcher's support rule that sends large-kernel FP8 convolutions down an explicit fallback.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fp8kit/nn/context.hpp"
#include "fp8kit/nn/conv_utils.hpp"
#include "fp8kit/nn/precision.hpp"

namespace fp8kit::nn {

// The support rule of FP8 convolution: empty when `recipe` may run a convolution with `window` in FP8, else why
// not. Only FP8 recipes have a rule: kernel_h * kernel_w must be at most recipe.fp8_conv_max_kernel_area (default
// 32, cuDNN's FP8 limit), so a 7x7 stem gives "kernel area 49 > 32".
std::string fp8_conv_fallback_reason(const PrecisionRecipe& recipe, const Window2d& window);

// y = conv(x, W) + b, as PyTorch's Conv2d (cross-correlation, zero padding, dilation 1, groups 1):
//   y[n, o, oy, ox] = b[o] + sum_{c, ky, kx} W[o, c, ky, kx] * x[n, c, oy*sh - ph + ky, ox*sw - pw + kx]
// computed as cols = im2col(x) (N*OH*OW, C*kh*kw), rows = cols W^T (N*OH*OW, OC) through the recipe GEMM (W viewed
// as (OC, C*kh*kw)), y = rows_to_nchw(rows). Backward, with dy_rows = nchw_to_rows(dy) (N*OH*OW, OC):
//   dgrad: dcols = dy_rows W (N*OH*OW, C*kh*kw), dx = col2im(dcols)
//   wgrad: dW += dy_rows^T cols (OC, C*kh*kw);  db += column sums of dy_rows
// Each GEMM takes its operands as Linear does (inputs and weights E4M3, gradients E5M2 under the HYBRID recipes;
// blocks or MX under fp8-block and mxfp8). When fp8_conv_fallback_reason() is not empty all three GEMMs fall back:
// the FP8 operands are cast to bfloat16 (recorded cast events) and multiplied in bf16 with FP32 accumulation, and
// the GEMM events carry path "fallback" and the reason.
// Profiler events: "conv2d.<name>.forward" / ".backward" (the layer, args shape and kernel) and the GEMMs
// "conv2d.<name>.forward" / ".dgrad" / ".wgrad" (category "gemm", args dtypes, shape, path, reason), plus im2col,
// col2im, rows_to_nchw, nchw_to_rows and the quantize / cast events.
struct Conv2d {
  Parameter weight;               // (OC, C, kh, kw), normal(0, init_std)
  std::optional<Parameter> bias;  // (OC), zeros
  Window2d window;
  Fp8LayerState fp8;  // per-role delayed-scaling state (used by fp8-delayed); fp8.layer is the layer's name

  // init_std <= 0 (the default) is He (Kaiming) normal initialization for ReLU: sqrt(2 / (C*kh*kw)). Parameters
  // are named "<name>.weight" and "<name>.bias".
  Conv2d(std::string name, std::int64_t in_channels, std::int64_t out_channels, Window2d window, bool with_bias,
         std::uint64_t seed, double init_std = 0.0, const PrecisionRecipe* recipe = nullptr);

  // What backward needs: cols^T prepared as the weight-gradient GEMM's right operand (C*kh*kw, N*OH*OW) — in FP8
  // for FP8 recipes in real mode (one byte per element), bfloat16 for bf16, float32 for fp32 and fake-quant — and
  // the geometry.
  struct Saved {
    RecipeOperand cols_t;
    ConvGeometry g;
  };

  // x (N, C, H, W) -> y (N, OC, OH, OW), OH = (H + 2 ph - kh) / sh + 1 (floor), likewise OW.
  Tensor forward(const Context& ctx, const Tensor& x, Saved& saved);
  // Whether backward computes dx: a network's first layer (its input is data, as PyTorch's input without
  // requires_grad) skips the dgrad GEMM and col2im, the largest temporaries of a CNN stem.
  enum class InputGradient : bool { kSkip = false, kCompute = true };
  // dy (N, OC, OH, OW) -> dx (N, C, H, W); accumulates weight.grad and bias.grad. With InputGradient::kSkip it
  // returns an empty Tensor; the gradient's quantization (scales, delayed-scaling amaxes) is the same either way.
  Tensor backward(const Context& ctx, const Tensor& dy, const Saved& saved,
                  InputGradient input_gradient = InputGradient::kCompute);

  std::vector<Parameter*> parameters();
  const std::string& name() const { return fp8.layer; }
  std::int64_t in_channels() const { return in_channels_; }
  std::int64_t out_channels() const { return out_channels_; }

 private:
  std::int64_t in_channels_, out_channels_;  // weight's shape, also while a sharded run holds no full value
};

}  // namespace fp8kit::nn
