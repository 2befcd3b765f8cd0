// quantize and dequantize on a CUDA device (a build with the CUDA backend): quantize.hpp's scaled quantization of a
// matrix at every granularity (per tensor, row, column, any block shape such as 1 x 128 and 128 x 128, and MX with
// E8M0 scales, FLOOR and RCEIL) on device tensors, with the CPU's codes and scales bit for bit: the same amax (the
// largest finite |x| of each block), the same scale formula (scaling/scale_inline.hpp) and the same codec
// (format/codec_inline.hpp). Nothing waits for the device: the per-tensor scale is computed on the device too.
// A build without the CUDA backend throws Error(kUnsupported).
#pragma once

#include "fp8kit/scaling/quantize.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit::cuda {

// A ScaledTensor whose codes and scales live on a device, as tensors: what cuda::scaled_mm multiplies
// (codes and scale_inv are its a / scale_a).
struct QuantizedTensor {
  Format format = Format::e4m3fn;
  Overflow overflow = Overflow::kSaturate;
  Granularity granularity;
  Tensor codes;       // rows x cols, the format's FP8 dtype
  Tensor scale_inv;   // grid_rows x grid_cols float32 dequantization scales, row-major over the block grid
  Tensor scale_e8m0;  // MX only: the same scales as E8M0 codes (uint8), else empty
  DType original_dtype = DType::float32;

  std::int64_t rows() const { return codes.size(0); }
  std::int64_t cols() const { return codes.size(1); }
  // A copy on the host, as quantize() would have returned it (to compare, to save).
  ScaledTensor to_host() const;
};

// x: float32, bfloat16 or float16 on a CUDA device, viewed as a matrix (its last dimension the row). The options of
// quantize(): format, overflow, granularity, scale (margin, epsilon, power-of-two rounding). Queued on the current
// stream (cuda_stream.hpp); returns without waiting.
QuantizedTensor quantize(const Tensor& x, const QuantizeOptions& options);

// decode(code) * scale_inv of its block, as dequantize() computes it, into a new rows x cols tensor of `dtype`
// (float32, or bfloat16 / float16 rounded once from that float32) on the codes' device.
Tensor dequantize(const QuantizedTensor& q, DType dtype = DType::float32);

}  // namespace fp8kit::cuda
