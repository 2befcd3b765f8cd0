// ScaledTensor's tensor copies, and the Tensor-level quantize/dequantize on top of the matrix quantizer.
#include "fp8kit/scaling/scaled_tensor.hpp"

#include <cstring>

#include "common/no_cuda.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/scaling/cuda_quantize.hpp"
#include "scaling/cuda/dequantize.hpp"

namespace fp8kit {

namespace {
std::int64_t checked_matrix_numel(std::int64_t rows, std::int64_t cols, std::string_view op) {
  std::int64_t n = 0;
  FP8KIT_CHECK(rows >= 0 && cols >= 0, op, ": negative shape ", rows, "x", cols);
  FP8KIT_CHECK(!__builtin_mul_overflow(rows, cols, &n), op, ": a ", rows, "x", cols,
               " matrix has more elements than memory can hold");
  return n;
}
}  // namespace

std::int64_t ScaledTensor::checked_numel(std::string_view op) const {
  return checked_matrix_numel(rows, cols, op);
}

std::int64_t ScaledTensorRef::checked_numel(std::string_view op) const {
  return checked_matrix_numel(rows, cols, op);
}

Tensor ScaledTensor::codes() const {
  Tensor t = empty(shape(), dtype_of(format));
  FP8KIT_CHECK(static_cast<std::size_t>(t.numel()) == data.size(), "ScaledTensor::codes: ", data.size(),
               " codes for the shape ", shape_string(shape()),
               " (data must hold rows x cols codes: make it with quantize)");
  if (!data.empty()) std::memcpy(t.raw(), data.data(), data.size());
  return t;
}

Tensor ScaledTensor::scales() const {
  Tensor t = empty(Shape{grid_rows(), grid_cols()}, DType::float32);
  FP8KIT_CHECK(static_cast<std::size_t>(t.numel()) == scale_inv.size(), "ScaledTensor::scales: ", scale_inv.size(),
               " scales for a ", grid_rows(), "x", grid_cols(),
               " block grid (scale_inv must hold one per block: make it with quantize)");
  if (!scale_inv.empty()) std::memcpy(t.raw(), scale_inv.data(), scale_inv.size() * sizeof(float));
  return t;
}

ScaledTensor quantize(const Tensor& x, const QuantizeOptions& options, QuantDiagnostics* diagnostics) {
  FP8KIT_CHECK(is_floating(x.dtype()) && !is_fp8(x.dtype()), "quantize: the input is ", name(x.dtype()),
               "; quantize a float32, bfloat16, float16 or float64 tensor (convert with .to(float32) first)");
  // float32, bfloat16 and float16 as they are (quantize widens 16-bit rows a chunk at a time); float64 rounded to
  // float32 first.
  const Tensor in = x.dtype() == DType::float64 ? x.to(DType::float32) : x;
  const MatrixRef v = x.matrix();
  ScaledTensor q;
  const MatrixRef view{in.raw(), in.dtype(), x.numel() == 0 ? 0 : v.rows, x.numel() == 0 ? 0 : v.cols};
  quantize_into(view, options, q, diagnostics);
  q.original_shape = x.shape();
  q.original_dtype = x.dtype();
  return q;
}

Tensor dequantize(const ScaledTensor& q, std::optional<DType> dtype) {
  const DType target = dtype.value_or(q.original_dtype);
  FP8KIT_CHECK(is_floating(target) && !is_fp8(target), "dequantize: the target dtype is ", name(target),
               "; dequantize to float32, bfloat16, float16 or float64");
  Tensor out = empty(q.shape(), DType::float32);
  dequantize(q, out.span<float>());
  return out.to(target);
}

}  // namespace fp8kit

#ifndef FP8KIT_HAVE_CUDA
// The CPU-only build's device quantization (cuda_quantize.hpp): there is no device to run it on.
namespace fp8kit::cuda {
ScaledTensor QuantizedTensor::to_host() const {
  detail::throw_no_cuda_backend("QuantizedTensor::to_host");
}
QuantizedTensor quantize(const Tensor&, const QuantizeOptions&) {
  detail::throw_no_cuda_backend("quantize");
}
Tensor dequantize(const QuantizedTensor&, DType) {
  detail::throw_no_cuda_backend("dequantize");
}
}  // namespace fp8kit::cuda
namespace fp8kit::cuda_detail {
Tensor dequantize_with(const cuda::QuantizedTensor&, DType, DequantizeKernel) {
  detail::throw_no_cuda_backend("dequantize");
}
}  // namespace fp8kit::cuda_detail
#endif
