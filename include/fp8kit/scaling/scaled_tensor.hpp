// Tensor-level quantize and dequantize: a Tensor of any shape and float dtype into the ScaledTensor of its 2-D view
// (quantize.hpp), keeping the original shape and dtype, and back.
#pragma once

#include <optional>

#include "fp8kit/scaling/quantize.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit {

// Quantizes a float32, bfloat16, float16 or float64 tensor (bfloat16/float16 exactly through float32; float64
// rounded to float32 first). FP8, integer and bool tensors are refused: convert them to a float dtype first.
ScaledTensor quantize(const Tensor& x, const QuantizeOptions& options, QuantDiagnostics* diagnostics = nullptr);
// Back to a tensor of the original shape, in the original dtype unless another float dtype is given.
Tensor dequantize(const ScaledTensor& q, std::optional<DType> dtype = std::nullopt);

}  // namespace fp8kit
