// Precision recipes (one per run: fp32, bf16, fp8-delayed, fp8-current, fp8-block, mxfp8, fp8-o2, fp8-delayed-e4m3),
// the per-layer FP8 scaling state, and the recipe-aware GEMM every Linear and Conv2d calls, with its dispatcher and
// visible fallbacks.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fp8kit/nn/context.hpp"
#include "fp8kit/nn/optim.hpp"
#include "fp8kit/scaling/quantize.hpp"
#include "fp8kit/scaling/recipe.hpp"

namespace fp8kit::nn {

enum class RecipeKind : std::uint8_t {
  kFp32,        // float32 everywhere
  kBf16,        // bfloat16 GEMM/conv inputs, FP32 accumulation and master weights
  kFp8Delayed,  // Transformer Engine HYBRID: E4M3 weights/activations, E5M2 gradients, delayed per-tensor scaling
  kFp8Current,  // the same formats, per-tensor current scaling (each tensor's own amax)
  kFp8Block,    // DeepSeek-V3: E4M3 everywhere, 1x128 activation/gradient blocks, 128x128 weight blocks
  kMxfp8,       // OCP MX: E4M3 everywhere, 32-element blocks with E8M0 scales (RCEIL, as cuBLAS and TE)
  // MS-AMP's O2 level: fp8-delayed's compute, AdamW moments in FP8 with block scales, bfloat16 master weights and
  // gradients with stochastic rounding (its defaults for optimizer_state and master_weights).
  kFp8O2,
  // Transformer Engine's DelayedScaling(fp8_format=Format.E4M3): fp8-delayed with E4M3 gradients too (the same
  // delayed per-tensor scaling; E4M3's 3 mantissa bits for the gradients' precision, E5M2's range given up).
  kFp8DelayedE4M3,
};

// How FP8 recipes compute: real FP8 GEMMs (scaled_mm), or fake quantization (quantize -> dequantize -> FP32 GEMM,
// with a straight-through gradient: the article's autograd function).
enum class Fp8Mode : std::uint8_t { kReal, kFakeQuant };

struct PrecisionRecipe {
  RecipeKind kind = RecipeKind::kFp32;
  Fp8Mode mode = Fp8Mode::kReal;
  // Delayed scaling (Transformer Engine's DelayedScaling defaults are history 1024, max, margin 0; a short
  // history suits short runs and is what fp8kit train uses unless told otherwise).
  int amax_history_length = 16;
  AmaxCompute amax_compute = AmaxCompute::kMax;
  int margin = 0;
  // Dispatcher rules (docs/nn.md): FP8 convolutions only up to this kernel area (cuDNN's FP8 kernels stop at 32,
  // so a 7x7 = 49 convolution falls back); GEMMs with fewer multiply-adds than this fall back to bf16.
  int fp8_conv_max_kernel_area = 32;
  std::int64_t min_fp8_gemm_macs = 0;
  // How AdamW stores its moments and the parameters their values and gradients (optim.hpp): float32 for every
  // recipe but fp8-o2 (FP8 moments, bfloat16 master weights with stochastic rounding), unless set otherwise.
  MomentStorage optimizer_state = MomentStorage::kFloat32;
  MasterWeights master_weights = MasterWeights::kFloat32;

  bool is_fp8() const;
  // "fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block", "mxfp8", "fp8-o2", "fp8-delayed-e4m3" (+ "-fake" in
  // fake-quant mode).
  std::string name() const;
  // Parses the names above (with or without "-fake"), with each kind's optimizer_state and master_weights; nullopt
  // for anything else.
  static std::optional<PrecisionRecipe> parse(std::string_view text);
  // How layers save activations for backward under this recipe: float32 for fp32, bfloat16 otherwise.
  DType saved_dtype() const { return kind == RecipeKind::kFp32 ? DType::float32 : DType::bfloat16; }
  // Whether LayerNorm and GELU save their inputs as E4M3 rows (Context::fp8_activations): fp8-o2's.
  bool fp8_activations() const { return kind == RecipeKind::kFp8O2; }
};

// The three tensors of a GEMM-based layer, each with its own scaling state (Transformer Engine's meta per role).
enum class TensorRole : std::uint8_t { kInput, kWeight, kGradOutput };
std::string_view name(TensorRole role);

// The recipes are rows of one table over the scaling layer's vocabulary (precision.cpp): for an FP8 recipe, the
// format and the granularity each role is quantized with, and whether its per-tensor scales are delayed (amax
// histories) or current. HYBRID (fp8-delayed, fp8-current, fp8-o2): E4M3 input and weight, E5M2 gradients, per
// tensor; fp8-delayed-e4m3: E4M3 for all three, per tensor, delayed;
// fp8-block: E4M3, 1x128 input and gradient blocks, 128x128 weight blocks; mxfp8: E4M3, 1x32 MX blocks (RCEIL).
Format format_of(const PrecisionRecipe& recipe, TensorRole role);
Granularity granularity_of(const PrecisionRecipe& recipe, TensorRole role);
bool delayed_scaling(const PrecisionRecipe& recipe);

// What a quantization of one tensor role looked like this step (for --log-scales and the non-finite guard).
struct ScaleRecord {
  std::string layer;
  std::string op;  // the GEMM call that quantized it (GemmCall::op: "linear.fc1.forward", "....dgrad", "....wgrad")
  TensorRole role = TensorRole::kInput;
  float amax = 0.0f;
  float scale = 1.0f;  // the quantization scale (per-tensor recipes; the first block's otherwise)
  double underflow_fraction = 0.0;
  std::uint64_t saturated = 0;
  bool nonfinite = false;  // NaN or Inf in the tensor
};

// Per-layer FP8 state: one delayed-scaling history per role (unused by the other recipes).
struct Fp8LayerState {
  std::string layer;
  DelayedScaling input, weight, grad_output;
  Fp8LayerState() = default;
  Fp8LayerState(std::string layer_name, const PrecisionRecipe& recipe);
  DelayedScaling& of(TensorRole role);
  // After the optimizer step: every role's history rolls and its scale updates (Transformer Engine's order).
  void update();
  // A skipped step: forget its recorded amaxes (no roll, scales unchanged).
  void discard_step();
};

// Run-wide state the recipe GEMMs report into: the scale log and the first non-finite amax seen this step.
struct StepReport {
  bool log_scales = false;
  std::vector<ScaleRecord> scales;             // filled only when log_scales
  std::optional<ScaleRecord> first_nonfinite;  // set by the first NaN/Inf amax of the step
  void clear() {
    scales.clear();
    first_nonfinite.reset();
  }
};

// Everything a recipe GEMM needs besides its operands.
struct GemmCall {
  const PrecisionRecipe* recipe = nullptr;
  Fp8LayerState* state = nullptr;  // required for FP8 recipes
  StepReport* report = nullptr;    // optional
  std::string op;                  // profiler event name, e.g. "linear.fc1.forward"
  Profiler* profiler = nullptr;
  // Set by a layer whose support rule excludes FP8 (e.g. "kernel area 49 > 32"): the GEMM casts its FP8 operands
  // to bfloat16 (recorded cast events) and runs the bf16 GEMM.
  std::string fallback_reason;
  // Set when the operand is one rank's part of a tensor (a sharded weight): given the part's finite amax, the whole
  // tensor's (a MAX over ranks). Per-tensor current scaling then quantizes the part with the whole tensor's scale.
  std::function<float(float)> agree_amax;
};

// A GEMM operand quantized (or rounded) once under a recipe, reusable by several GEMMs (e.g. a layer input saved in
// FP8 for the weight-gradient GEMM). Not a quantized type of its own: `fp8` is fp8kit's one quantized-tensor type
// (ScaledTensor, what scaled_mm multiplies), set for FP8 recipes in real mode; `values` holds the float32 (fp32
// recipe, or fake-quant: dequantized) or bfloat16 values otherwise.
struct RecipeOperand {
  std::optional<ScaledTensor> fp8;
  Tensor values;
  bool blocked = false;  // FP8 scales per block (real or fake): the transpose must be quantized anew
  // The operand's matrix shape (rows x K), from whichever of the two it holds.
  std::int64_t rows() const { return fp8 ? fp8->rows : values.matrix().rows; }
  std::int64_t cols() const { return fp8 ? fp8->cols : values.matrix().cols; }
  std::int64_t nbytes() const;
};

// Quantizes x (rows x cols, float32; or bfloat16 master weights, widened exactly) as `role` for a GEMM whose reduction
// runs along x's rows (cols = K): FP8 recipes pick the format (E4M3, or E5M2 for gradients under the HYBRID recipes)
// and the granularity (tensor, 1x128 or 128x128 blocks, MX 32) for the role, record amax/scale into the state and the
// report; bf16 rounds; fp32 shares x.
RecipeOperand prepare_operand(const GemmCall& call, TensorRole role, const Tensor& x);
// The operand of x^T: bit for bit prepare_operand(call, role, transpose(x)), but with block scales (fp8-block,
// mxfp8) the transpose is quantized in bands, so no float32 copy of x^T exists (the largest temporary of a
// block-scaled weight gradient otherwise). `transposed` = true is that path (block scales only).
RecipeOperand prepare_operand_transposed(const GemmCall& call, TensorRole role, const Tensor& x);
RecipeOperand prepare_operand(const GemmCall& call, TensorRole role, const Tensor& x, bool transposed);

// out (M x N) = a (M x K) times b^T (b: N x K), FP32 accumulation, + bias: the product a recipe computes for two
// prepared operands (scaled_mm for real FP8, matmul otherwise). The event records the inputs' dtypes and the path.
Tensor recipe_gemm(const GemmCall& call, const RecipeOperand& a, const RecipeOperand& b,
                   std::span<const float> bias = {});

// The transposed operand without quantizing again, where that is exact: float values, or FP8 codes with one scale
// for the whole tensor (blocked scales belong to the other orientation: nullopt, quantize the transpose instead).
std::optional<RecipeOperand> transpose_operand(const RecipeOperand& x);

// The transpose of a float32 (or bfloat16) matrix (rows x cols -> cols x rows), threaded; the GEMM operands of
// gradients.
Tensor transpose(const Tensor& x);

// Where a GEMM layer's weight operands come from and its weight gradient goes (Context::weights): a sharded run's
// (fp8kit/dist/fsdp.hpp) gathers them from every rank's shard. A weight is seen as a matrix of its first dimension's
// rows (Linear (out, in); Conv2d (OC, C*kh*kw)). Without one, the layers prepare weight.value themselves and add to
// weight.grad; a source must give the same operands bit for bit.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The forward GEMM's B operand: prepare_operand(call, TensorRole::kWeight, the weight matrix).
  virtual RecipeOperand forward_operand(const GemmCall& call, Parameter& weight) = 0;
  // The input gradient's B operand, the transpose: prepare_operand_transposed(call, TensorRole::kWeight, matrix).
  virtual RecipeOperand backward_operand(const GemmCall& call, Parameter& weight) = 0;
  // This process's contribution dw (the weight matrix's shape, float32) to the weight's gradient; dw is the
  // source's (it may scale it in place).
  virtual void add_gradient(Parameter& weight, Tensor dw) = 0;
};

}  // namespace fp8kit::nn
