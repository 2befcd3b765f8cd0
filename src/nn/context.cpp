// The nn layer's shared pieces: parameter creation and the storage of activations saved for backward.
#include "fp8kit/nn/context.hpp"

#include "fp8kit/common/error.hpp"

namespace fp8kit::nn {

Parameter make_parameter(std::string name, Shape shape, double stddev, std::uint64_t seed, double fill) {
  Parameter p;
  p.name = std::move(name);
  if (stddev > 0.0) {
    p.value = randn(shape, seed, DType::float32);
    for (float& v : p.value.span<float>()) v = static_cast<float>(v * stddev);
  } else {
    p.value = full(shape, fill, DType::float32);
  }
  p.grad = zeros(std::move(shape), DType::float32);
  return p;
}

Tensor save_activation(const Context& ctx, const Tensor& x) {
  FP8KIT_CHECK(ctx.saved_dtype == DType::float32 || ctx.saved_dtype == DType::bfloat16,
               "nn: activations are saved as float32 or bfloat16, not ", name(ctx.saved_dtype));
  return x.to(ctx.saved_dtype);  // float32: shares x (layers never modify their inputs in place)
}

Tensor load_activation(const Tensor& saved) {
  return saved.to(DType::float32);
}

}  // namespace fp8kit::nn
