// Pooling layers: 2-d max pooling (kernel, stride, padding; backward routes each gradient to the saved argmax)
// and global average pooling (N, C, H, W) -> (N, C).
#pragma once

#include "fp8kit/nn/context.hpp"
#include "fp8kit/nn/conv_utils.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit::nn {

// x (N, C, H, W) -> y (N, C, OH, OW), y = the maximum of each window (output size as ConvGeometry, floor mode).
// Padding is -infinity (never selected), and must be at most half the kernel (as PyTorch) so that every window
// holds an input pixel. Ties go to the first maximum in row-major window order; a NaN in a window is selected
// (NaN propagates, as PyTorch). Backward adds dy to the selected pixel (overlapping windows add up).
struct MaxPool2d {
  Window2d window = Window2d::square(2, 2);

  struct Saved {
    Shape input_shape;  // (N, C, H, W)
    Tensor argmax;      // (N, C, OH, OW) int64: the selected pixel's index iy * W + ix within its (n, c) plane
  };

  Tensor forward(const Context& ctx, const Tensor& x, Saved& saved) const;
  // dy (N, C, OH, OW) -> dx (N, C, H, W) (a new tensor: the layer has no parameters).
  Tensor backward(const Context& ctx, const Tensor& dy, const Saved& saved) const;
};

// x (N, C, H, W) -> y (N, C): the mean of each (n, c) plane (summed in double, rounded once). Backward spreads
// dy / (H*W) over the plane.
struct GlobalAvgPool2d {
  struct Saved {
    Shape input_shape;  // (N, C, H, W)
  };

  Tensor forward(const Context& ctx, const Tensor& x, Saved& saved) const;
  // dy (N, C) -> dx (N, C, H, W).
  Tensor backward(const Context& ctx, const Tensor& dy, const Saved& saved) const;
};

}  // namespace fp8kit::nn
