// The optimizer of fp8kit::nn: AdamW (decoupled weight decay, bias correction) updating the FP32 master weights
// of Parameters from FP32 moments, and the gradient utilities around a step (zero_grad, the non-finite check).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>

#include "fp8kit/common/profiler.hpp"
#include "fp8kit/nn/context.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit::nn {

// Which parameters weight decay applies to.
enum class DecayPolicy {
  kAll,           // every parameter (PyTorch's AdamW on one parameter group)
  kMatricesOnly,  // parameters of 2 or more dimensions: weights and embeddings, not biases or norm gains (GPT-2)
};

// Hyperparameters in double, as PyTorch keeps them in Python floats: 1 - beta is formed in double and rounded once
// to float (1 - 0.999f in float would be 0.00099998713).
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  DecayPolicy decay = DecayPolicy::kAll;
};

// AdamW (Loshchilov & Hutter), as torch.optim.AdamW: per parameter with its own step count t,
//   p <- p - lr * weight_decay * p                      (decoupled: the decay never enters m or v)
//   m <- beta1 m + (1 - beta1) g,   v <- beta2 v + (1 - beta2) g^2
//   p <- p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// The moments m and v are float32 tensors of the parameter's shape, created (zero) at a parameter's first step
// and keyed by its name, so parameters may be recreated or reordered between steps; names must be unique.
// Elementwise math is float32 (bias corrections in double), spread over threads for large parameters; each
// element is independent, so results do not depend on the thread count.
class AdamW {
 public:
  struct State {
    Tensor m;  // float32, the parameter's shape
    Tensor v;  // float32, the parameter's shape
    std::int64_t step = 0;
  };

  explicit AdamW(AdamWOptions options = {});

  // One update of every parameter from its gradient (gradients are not cleared). Records "adamw.step"
  // (category "optimizer") on the profiler when given.
  void step(std::span<Parameter* const> params, Profiler* profiler = nullptr);
  // Sets every gradient to zero.
  static void zero_grad(std::span<Parameter* const> params);

  // The options may change between steps (a learning-rate schedule sets lr).
  AdamWOptions& options() { return options_; }
  const AdamWOptions& options() const { return options_; }
  // The moments by parameter name (for checkpoints: saved and restored as they are).
  std::map<std::string, State>& state() { return state_; }
  const std::map<std::string, State>& state() const { return state_; }

 private:
  AdamWOptions options_;
  std::map<std::string, State> state_;
};

// The name of the first parameter (in order) whose gradient holds a NaN or an Inf; empty when all are finite.
std::string first_nonfinite_grad(std::span<Parameter* const> params);

}  // namespace fp8kit::nn
