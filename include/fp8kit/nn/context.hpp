// What every layer's forward and backward receive besides tensors: how to store activations saved for
// backward, the profiler, and the shared conventions of the nn layer (parameters, gradient accumulation).
#pragma once

#include <span>
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
  // Saves the inputs of LayerNorm (its normalized input) and GELU as E4M3 codes with one float32 scale per row
  // (save_activation_rows), the other saved activations staying in saved_dtype: FP8 storage of the non-linear
  // layers' activations (COAT, Xi et al. 2024), which fp8-o2 uses. Off: those are saved in saved_dtype too.
  bool fp8_activations = false;
  // Where Linear and Conv2d get their weights' GEMM operands and send their weight gradients: null, the layer's own
  // weight.value and weight.grad; a sharded run (FSDP) gathers the operands from every rank's shard and
  // reduce-scatters the gradients (precision.hpp).
  WeightSource* weights = nullptr;
};

// A trainable parameter: the master value and its gradient, same shape and dtype: float32, or bfloat16 under
// bfloat16 master weights (optim.hpp's MasterWeights; the trainer converts the model's parameters with
// set_master_dtype). Layers read values through parameter_values() and add gradients through add_to_gradient() or a
// GradientAccumulator, which serve either dtype.
struct Parameter {
  std::string name;
  Tensor value;  // float32 or bfloat16
  Tensor grad;   // the value's dtype and shape, zeros at creation; empty once released (release_gradients)
  // The weight of a Linear or Conv2d: read only as GEMM operands, through Context::weights when one is set (a sharded
  // run then holds no full value or gradient of it between uses).
  bool gemm_weight = false;
  // A part of a larger parameter (an FSDP shard): the position of this value's first element among the flattened
  // elements of the whole one, which has the same name. AdamW indexes its stochastic rounding and its FP8 moment
  // blocks by that position, so that the parts' updates are the whole parameter's update, bit for bit.
  std::int64_t first_element = 0;
};

// A float32 parameter of `shape` initialized from normal(0, stddev) with a seed (stddev 0: zeros; use fill for ones).
// The value counts as MemoryCategory::kParameters, the gradient as kGradients.
Parameter make_parameter(std::string name, Shape shape, double stddev, std::uint64_t seed, double fill = 0.0);
// Converts a parameter's value (rounded to nearest even) and gradient (zeroed) to float32 or bfloat16.
void set_master_dtype(Parameter& p, DType dtype);

// The parameter's value as float32: the value itself, or a float32 copy of a bfloat16 one (exact).
Tensor parameter_values(const Parameter& p);
// p.grad, first allocated (zeros of the value's shape and dtype, counted as MemoryCategory::kGradients) when it was
// released.
Tensor& gradient(Parameter& p);
// Releases the gradients (PyTorch's zero_grad(set_to_none=True)): the trainer does between steps, so no gradient is
// held while the next forward saves its activations, and a backward allocates each gradient when it first adds to
// it. Accumulating into fresh zeros gives the bits of accumulating into zeroed memory.
void release_gradients(std::span<Parameter* const> params);
// Gives every parameter its gradient (zeros where no layer added one), as the optimizer and the reductions read them.
void ensure_gradients(std::span<Parameter* const> params);
// p.grad += delta (float32, p's element count): in float32, or rounded to nearest even into a bfloat16 gradient.
void add_to_gradient(Parameter& p, std::span<const float> delta);

// For a layer that sums into a parameter's gradient in its own loops: a float32 gradient to add to, which is p.grad
// itself (float32) or a zeroed float32 buffer whose sum commit() adds into a bfloat16 p.grad (add_to_gradient).
class GradientAccumulator {
 public:
  explicit GradientAccumulator(Parameter& p);
  Tensor& tensor() { return sum_; }  // float32, p's shape
  float* data() { return sum_.data<float>(); }
  void commit();

 private:
  Parameter& p_;
  Tensor sum_;
  bool direct_;
};

// Saves a float32 activation in ctx.saved_dtype (float32: shares x's storage, since layers never modify their
// inputs in place), and reads it back as float32.
Tensor save_activation(const Context& ctx, const Tensor& x);
Tensor load_activation(const Tensor& saved);

// An activation (..., C) saved for backward as save_activation saves it, or (ctx.fp8_activations) as E4M3 codes
// with one dequantization scale per row of C elements: the row's amax maps to 448, so every row keeps E4M3's
// relative precision (2^-4) whatever its magnitude; rows of zeros keep scale 1. Half the bytes of bfloat16.
struct SavedActivation {
  Tensor values;         // float32, bfloat16 or float8_e4m3fn codes, the activation's shape
  Tensor row_scale_inv;  // float8_e4m3fn only: float32, one per row (values.numel() / C of them)
  const Shape& shape() const { return values.shape(); }
  std::int64_t numel() const { return values.numel(); }
  DType dtype() const { return values.dtype(); }
  std::int64_t nbytes() const { return values.nbytes() + row_scale_inv.nbytes(); }
};
SavedActivation save_activation_rows(const Context& ctx, const Tensor& x);
// The saved activation as float32 (shares a float32 one).
Tensor load_activation(const SavedActivation& saved);

}  // namespace fp8kit::nn
