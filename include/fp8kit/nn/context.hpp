// What every layer's forward and backward receive besides tensors: how to store activations saved for
// backward, the profiler, and the shared conventions of the nn layer (parameters, gradient accumulation).
#pragma once

#include <string>

#include "fp8kit/common/profiler.hpp"
#include "fp8kit/tensor/dtype.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit::nn {

struct PrecisionRecipe;
struct StepReport;
class WeightSource;

// Conventions of every layer in fp8kit::nn:
//  - Inputs, outputs and gradients are float32 tensors, row-major; shapes are in comments: `x (R, C) -> y (R, C)`.
//    A layer never modifies its inputs in place (saved activations may share their storage); the rvalue overloads
//    documented as in place (GELU's) write only over a tensor that nothing else holds.
//  - forward(ctx, x, ..., Saved& saved) -> y fills `saved` with what backward needs; backward(ctx, dy, saved) -> dx
//    consumes it. Saved activations are stored in ctx.saved_dtype (float32, or bfloat16 to halve their memory;
//    FP8 recipes store GEMM inputs in FP8 themselves) and are released when `saved` is destroyed.
//  - Parameter gradients ACCUMULATE (+=) in backward; the optimizer's zero_grad() resets them.
//  - Every forward and backward records one ProfileEvent (ScopedEvent) named "<layer>.forward" / "<layer>.backward"
//    when ctx.profiler is set.
struct Context {
  DType saved_dtype = DType::float32;  // float32 or bfloat16
  Profiler* profiler = nullptr;
  const PrecisionRecipe* recipe = nullptr;  // GEMM-based layers (Linear, Conv2d): fp32 when null
  StepReport* report = nullptr;             // optional: scales and non-finite amaxes of this step
  // Where Linear and Conv2d get their weights' GEMM operands and send their weight gradients: null, the layer's own
  // weight.value and weight.grad; a sharded run (FSDP) gathers the operands from every rank's shard and
  // reduce-scatters the gradients (precision.hpp).
  WeightSource* weights = nullptr;
};

// A trainable parameter: the FP32 master value and its gradient, same shape.
struct Parameter {
  std::string name;
  Tensor value;  // float32
  Tensor grad;   // float32, zeros at creation
  // The weight of a Linear or Conv2d: read only as GEMM operands, through Context::weights when one is set (a sharded
  // run then holds no full value or gradient of it between uses).
  bool gemm_weight = false;
};

// A float32 parameter of `shape` initialized from normal(0, stddev) with a seed (stddev 0: zeros; use fill for ones).
Parameter make_parameter(std::string name, Shape shape, double stddev, std::uint64_t seed, double fill = 0.0);

// Saves a float32 activation in ctx.saved_dtype (float32: shares x's storage, since layers never modify their
// inputs in place), and reads it back as float32.
Tensor save_activation(const Context& ctx, const Tensor& x);
Tensor load_activation(const Tensor& saved);

}  // namespace fp8kit::nn
