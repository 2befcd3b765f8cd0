// The pieces of an im2col convolution: the window geometry (output size, validation), im2col and its adjoint
// col2im, and the reshuffles between NCHW tensors and the (pixels, channels) rows a GEMM produces.
#pragma once

#include <cstdint>

#include "fp8kit/nn/context.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit::nn {

// A 2-d sliding window: kernel size, stride and zero padding per spatial dimension (dilation 1).
struct Window2d {
  std::int64_t kernel_h = 1, kernel_w = 1;
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t pad_h = 0, pad_w = 0;

  // A square kernel k x k with stride s and padding p on both dimensions.
  static Window2d square(std::int64_t kernel, std::int64_t stride = 1, std::int64_t padding = 0) {
    return {kernel, kernel, stride, stride, padding, padding};
  }
};

// A window sliding over an input (N, C, H, W): the output size and the im2col matrix's shape.
//   out_h = (H + 2 pad_h - kernel_h) / stride_h + 1   (floor, as PyTorch's Conv2d and MaxPool2d without ceil_mode)
//   out_w = (W + 2 pad_w - kernel_w) / stride_w + 1
struct ConvGeometry {
  std::int64_t batch = 0, channels = 0, height = 0, width = 0;  // the input (N, C, H, W)
  Window2d window;
  std::int64_t out_h = 0, out_w = 0;

  // Validates and computes the output size. Throws Error(kInvalidArgument) with the numbers when the input is not
  // 4-d (N >= 0, C, H, W >= 1), a kernel size or stride is below 1, a padding is negative, or the kernel is larger
  // than the padded input.
  static ConvGeometry make(const Shape& input, const Window2d& window);

  Shape input_shape() const { return {batch, channels, height, width}; }
  Shape output_shape(std::int64_t out_channels) const { return {batch, out_channels, out_h, out_w}; }
  std::int64_t rows() const { return batch * out_h * out_w; }                         // output pixels N*OH*OW
  std::int64_t cols() const { return channels * window.kernel_h * window.kernel_w; }  // C*kh*kw
};

// x (N, C, H, W) -> cols (N*OH*OW, C*kh*kw), float32. Row (n*OH + oy)*OW + ox holds the window of output pixel
// (oy, ox) of image n; column (c*kh + ky)*kw + kx holds x[n, c, oy*sh - ph + ky, ox*sw - pw + kx], 0 in the
// padding. A weight (OC, C, kh, kw) viewed as (OC, C*kh*kw) has the same column order, so the convolution is
// cols * W^T -> (N*OH*OW, OC). x must have the geometry's input shape. Records "im2col".
Tensor im2col(const Context& ctx, const Tensor& x, const ConvGeometry& g);

// The adjoint of im2col: cols (N*OH*OW, C*kh*kw) -> dx (N, C, H, W), every entry added to the input pixel it was
// read from (padding entries are dropped), so <col2im(c), x> == <c, im2col(x)>. The backward of im2col.
// Deterministic: each (n, c) plane is summed by one thread in a fixed order. Records "col2im".
Tensor col2im(const Context& ctx, const Tensor& cols, const ConvGeometry& g);

// rows (N*H*W, C) -> y (N, C, H, W): the GEMM's (pixels, channels) result as an NCHW tensor. Records
// "rows_to_nchw".
Tensor rows_to_nchw(const Context& ctx, const Tensor& rows, std::int64_t n, std::int64_t h, std::int64_t w);
// rows (N*OH*OW, OC) -> y (N, OC, OH, OW) with the geometry's output size.
Tensor rows_to_nchw(const Context& ctx, const Tensor& rows, const ConvGeometry& g);

// y (N, C, H, W) -> rows (N*H*W, C): the inverse of rows_to_nchw (a gradient dy into the GEMM's layout). Records
// "nchw_to_rows".
Tensor nchw_to_rows(const Context& ctx, const Tensor& y);

}  // namespace fp8kit::nn
