// The optimizer of fp8kit::nn: AdamW (decoupled weight decay, bias correction) updating the master weights of
// Parameters (float32, or bfloat16 with stochastic rounding or a Kahan compensation buffer) from moments stored in
// float32, bfloat16 or FP8 with block scales, in one fused pass; and the gradient utilities around a step
// (zero_grad, the non-finite check).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "fp8kit/common/profiler.hpp"
#include "fp8kit/nn/context.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit::nn {

// Which parameters weight decay applies to.
enum class DecayPolicy {
  kAll,           // every parameter (PyTorch's AdamW on one parameter group)
  kMatricesOnly,  // parameters of 2 or more dimensions: weights and embeddings, not biases or norm gains (GPT-2)
};

// How AdamW stores its moments m and v between steps (the arithmetic is float32 in every case).
enum class MomentStorage : std::uint8_t {
  kFloat32,   // torch.optim.AdamW's: 8 bytes per parameter
  kBfloat16,  // m and v in bfloat16, rounded to nearest even: 4 bytes
  // 2 bytes and 1/16: m as E4M3 codes and sqrt(v) as E4M3 codes, each with one float32 scale per block of
  // kMomentBlock consecutive elements (the block's amax maps to 448), re-quantized with seeded stochastic rounding
  // in the pass that updates them. sqrt(v), not v: v = g^2 spans twice the binades of g, and E4M3's 2^17.8 range per
  // block flushes every element whose RMS gradient is below 1/480 of its block's largest to v = 0, and its update to
  // m / eps; the square root has the dynamic range of m. Stochastic, not nearest: with 3 mantissa bits a decay of
  // 2.5% per step (sqrt(v) at beta2 0.95) is below half a step, so nearest rounding never lets sqrt(v) decay.
  // docs/nn.md has the measurements behind both choices.
  kFp8,
};
// Consecutive elements (of the flattened parameter) sharing one FP8 moment scale.
inline constexpr std::int64_t kMomentBlock = 128;

// How a parameter's value is kept between steps (the update is computed in float32 in every case).
enum class MasterWeights : std::uint8_t {
  kFloat32,         // float32 values and gradients
  kBf16Stochastic,  // bfloat16 values and gradients; each update rounded stochastically (unbiased), seeded
  kBf16Kahan,       // bfloat16 values and gradients, plus a bfloat16 compensation buffer (Kahan summation)
};

// "fp32" / "bf16" / "fp8", and "fp32" / "bf16-sr" / "bf16-kahan"; parse: nullopt for anything else.
std::string_view name(MomentStorage storage);
std::string_view name(MasterWeights master);
std::optional<MomentStorage> parse_moment_storage(std::string_view text);
std::optional<MasterWeights> parse_master_weights(std::string_view text);
// The dtype of a parameter's value and gradient under a master-weights mode.
DType master_dtype(MasterWeights master);

// Hyperparameters in double, as PyTorch keeps them in Python floats: 1 - beta is formed in double and rounded once
// to float (1 - 0.999f in float would be 0.00099998713).
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  DecayPolicy decay = DecayPolicy::kAll;
  MomentStorage moments = MomentStorage::kFloat32;
  MasterWeights master = MasterWeights::kFloat32;
  // Stochastic rounding (bf16-sr master weights, FP8 moments): element i of parameter `name` at its step t draws its
  // bits from a counter-based hash of (rounding_seed, name, t, i), so a run is reproducible for any thread count and
  // a resumed one continues the same stream (the state is the seed and the step counts, both in a training
  // checkpoint).
  std::uint64_t rounding_seed = 0;
};

// AdamW (Loshchilov & Hutter), as torch.optim.AdamW: per parameter with its own step count t,
//   p <- p - lr * weight_decay * p                      (decoupled: the decay never enters m or v)
//   m <- beta1 m + (1 - beta1) g,   v <- beta2 v + (1 - beta2) g^2
//   p <- p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// The moments are created (zero) at a parameter's first step and keyed by its name, so parameters may be recreated
// or reordered between steps; names must be unique. Elementwise math is float32 (bias corrections in double), one
// pass per parameter that reads the stored moments, updates them and the value and stores them again (per block of
// kMomentBlock for FP8 moments), spread over threads for large parameters; results do not depend on the thread count.
// With float32 moments and master weights the step is torch.optim.AdamW's formula with each product rounded on its
// own: within one float32 ulp of torch's per step (torch's CPU kernels fuse with FMA), not its bits.
class AdamW {
 public:
  struct State {
    Tensor m;                 // the parameter's shape: float32, bfloat16, or (kFp8) e4m3fn codes of m / m_scale
    Tensor v;                 // the same for v; kFp8: e4m3fn codes of sqrt(v) / v_scale
    Tensor m_scale, v_scale;  // kFp8 only: float32 dequantization scales, one per block of kMomentBlock elements
    Tensor compensation;      // kBf16Kahan only: bfloat16, the parameter's shape (what rounding the value lost)
    std::int64_t step = 0;
  };

  explicit AdamW(AdamWOptions options = {});

  // One update of every parameter from its gradient (gradients are not cleared). Values and gradients must have the
  // dtype of options().master (master_dtype); a part of a parameter starts at a multiple of part_alignment(). Records
  // "adamw.step" (category "optimizer") on the profiler when given.
  void step(std::span<Parameter* const> params, Profiler* profiler = nullptr);
  // Sets every gradient to zero (float32 or bfloat16).
  static void zero_grad(std::span<Parameter* const> params);

  // Where a part of a parameter (Parameter::first_element) may start for its update to be the whole one's bit for
  // bit: on a multiple of kMomentBlock under FP8 moments (whole scale blocks), of 4 under bf16-sr master weights
  // (four elements share one random draw), anywhere (1) otherwise. step() refuses a part that does not.
  std::int64_t part_alignment() const;

  // The options may change between steps (a learning-rate schedule sets lr).
  AdamWOptions& options() { return options_; }
  const AdamWOptions& options() const { return options_; }
  // The moments by parameter name (for checkpoints: saved and restored as they are; their allocations count as
  // MemoryCategory::kOptimizerState).
  std::map<std::string, State>& state() { return state_; }
  const std::map<std::string, State>& state() const { return state_; }

 private:
  // Refuses a state that the options in force do not store (step() checks every parameter's before any update).
  void check_state(const Parameter& p, const State& s) const;

  AdamWOptions options_;
  std::map<std::string, State> state_;
};

// The name of the first parameter (in order) whose gradient (float32 or bfloat16) holds a NaN or an Inf; empty when
// all are finite.
std::string first_nonfinite_grad(std::span<Parameter* const> params);

}  // namespace fp8kit::nn
