// ScaledTensor: a Tensor quantized to FP8 with its dequantization scales, granularity, format, overflow policy,
// original shape and original dtype: everything needed to get it back or to hand it to a GEMM or a checkpoint.
#pragma once

#include <optional>

#include "fp8kit/scaling/quantize.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit {

struct ScaledTensor {
  ScaledMatrix matrix;                    // codes and scales over the 2-D view (last dimension = row)
  Shape shape;                            // the original shape
  DType original_dtype = DType::float32;  // what was quantized (dequantize() returns it by default)

  Format format() const { return matrix.format; }
  // The codes as an FP8 tensor of the original shape (a copy).
  Tensor data() const;
  // The dequantization scales as a float32 tensor of the block grid's shape (grid_rows x grid_cols).
  Tensor scale_inv() const;
};

// Quantizes a float32, bfloat16, float16 or float64 tensor (bfloat16/float16 exactly through float32; float64
// rounded to float32 first). FP8, integer and bool tensors are refused: convert them to a float dtype first.
ScaledTensor quantize(const Tensor& x, const QuantizeOptions& options, QuantDiagnostics* diagnostics = nullptr);
// Back to a tensor of the original shape, in the original dtype unless another float dtype is given.
Tensor dequantize(const ScaledTensor& q, std::optional<DType> dtype = std::nullopt);

}  // namespace fp8kit
