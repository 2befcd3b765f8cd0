// The nn layer's shared pieces: parameter creation and the storage of activations saved for backward.
#include "fp8kit/nn/context.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/convert/convert.hpp"
#include "fp8kit/scaling/amax.hpp"
#include "fp8kit/scaling/scale.hpp"
#include "fp8kit/tensor/memory.hpp"

namespace fp8kit::nn {

Parameter make_parameter(std::string name, Shape shape, double stddev, std::uint64_t seed, double fill) {
  // NaN or a negative stddev gave zeros, Inf infinite weights, a NaN fill NaN ones: never what was meant.
  FP8KIT_CHECK(stddev >= 0.0 && std::isfinite(stddev) && std::isfinite(fill), "parameter '", name,
               "': the initial stddev must be finite and >= 0 and the fill finite, got ", stddev, " and ", fill);
  Parameter p;
  p.name = std::move(name);
  {
    MemoryCategoryScope category(MemoryCategory::kParameters);
    if (stddev > 0.0) {
      p.value = randn(shape, seed, DType::float32);
      for (float& v : p.value.span<float>()) v = static_cast<float>(v * stddev);
    } else {
      p.value = full(shape, fill, DType::float32);
    }
  }
  MemoryCategoryScope category(MemoryCategory::kGradients);
  p.grad = zeros(std::move(shape), DType::float32);
  return p;
}

void set_master_dtype(Parameter& p, DType dtype) {
  FP8KIT_CHECK(dtype == DType::float32 || dtype == DType::bfloat16, "parameter '", p.name,
               "': master weights are float32 or bfloat16, not ", name(dtype));
  if (p.value.dtype() == dtype) return;
  {
    MemoryCategoryScope category(MemoryCategory::kParameters);
    p.value = p.value.to(dtype);
  }
  MemoryCategoryScope category(MemoryCategory::kGradients);
  p.grad = zeros(p.value.shape(), dtype);
}

Tensor parameter_values(const Parameter& p) {
  return p.value.to(DType::float32);  // float32: shares the value
}

Tensor& gradient(Parameter& p) {
  if (p.grad.shape() != p.value.shape() || p.grad.dtype() != p.value.dtype()) {
    MemoryCategoryScope category(MemoryCategory::kGradients);
    p.grad = zeros(p.value.shape(), p.value.dtype());
  }
  return p.grad;
}

void release_gradients(std::span<Parameter* const> params) {
  for (Parameter* p : params) p->grad = Tensor();
}

void ensure_gradients(std::span<Parameter* const> params) {
  for (Parameter* p : params) gradient(*p);
}

void add_to_gradient(Parameter& p, std::span<const float> delta) {
  gradient(p);
  FP8KIT_CHECK(static_cast<std::int64_t>(delta.size()) == p.grad.numel(), "parameter '", p.name, "': a gradient of ",
               delta.size(), " elements for ", p.grad.numel());
  const std::int64_t n = p.grad.numel();
  if (p.grad.dtype() == DType::float32) {
    float* g = p.grad.data<float>();
    for (std::int64_t i = 0; i < n; ++i) g[i] += delta[static_cast<std::size_t>(i)];
    return;
  }
  bfloat16* g = p.grad.data<bfloat16>();
  for (std::int64_t i = 0; i < n; ++i) {
    g[i] = bfloat16::from_float(g[i].to_float() + delta[static_cast<std::size_t>(i)]);
  }
}

GradientAccumulator::GradientAccumulator(Parameter& p) : p_(p), direct_(gradient(p).dtype() == DType::float32) {
  sum_ = direct_ ? p.grad : zeros(p.grad.shape(), DType::float32);
}

void GradientAccumulator::commit() {
  if (!direct_) add_to_gradient(p_, sum_.span<float>());
}

Tensor save_activation(const Context& ctx, const Tensor& x) {
  FP8KIT_CHECK(ctx.saved_dtype == DType::float32 || ctx.saved_dtype == DType::bfloat16,
               "nn: activations are saved as float32 or bfloat16, not ", name(ctx.saved_dtype));
  return x.to(ctx.saved_dtype);  // float32: shares x (layers never modify their inputs in place)
}

Tensor load_activation(const Tensor& saved) {
  return saved.to(DType::float32);
}

namespace {

const SegmentEncoder& e4m3_rows_encoder() {
  static const SegmentEncoder encoder(Format::e4m3fn, Overflow::kSaturate);
  return encoder;
}

}  // namespace

SavedActivation save_activation_rows(const Context& ctx, const Tensor& x) {
  SavedActivation saved;
  if (!ctx.fp8_activations) {
    saved.values = save_activation(ctx, x);
    return saved;
  }
  FP8KIT_CHECK(x.dtype() == DType::float32 && x.dim() >= 1 && x.size(-1) > 0,
               "nn: FP8 saved activations are float32 (..., C) tensors, got ", name(x.dtype()), " ",
               shape_string(x.shape()));
  const std::int64_t cols = x.size(-1), rows = x.numel() / cols;
  saved.values = empty(x.shape(), DType::float8_e4m3fn);
  saved.row_scale_inv = empty({rows}, DType::float32);
  std::vector<float> quant(static_cast<std::size_t>(rows));
  amax_blocks(x.matrix(), 1, cols, quant);
  float* scale_inv = saved.row_scale_inv.data<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    quant[static_cast<std::size_t>(r)] = compute_scale(quant[static_cast<std::size_t>(r)], Format::e4m3fn);
    scale_inv[r] = 1.0f / quant[static_cast<std::size_t>(r)];
  }
  e4m3_rows_encoder().encode_segments(x.span<float>(), saved.values.span<std::uint8_t>(),
                                      static_cast<std::size_t>(cols), quant);
  return saved;
}

Tensor load_activation(const SavedActivation& saved) {
  if (saved.values.dtype() != DType::float8_e4m3fn) return load_activation(saved.values);
  Tensor out = empty(saved.values.shape(), DType::float32);
  decode_segments(saved.values.span<std::uint8_t>(), Format::e4m3fn, out.span<float>(),
                  static_cast<std::size_t>(saved.values.size(-1)), saved.row_scale_inv.span<float>());
  return out;
}

}  // namespace fp8kit::nn
