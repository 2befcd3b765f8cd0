// Precision recipes: names, the per-role formats and granularities, operand preparation (quantize / round / share)
// with the scaling state and the scale log, and the recipe GEMM with its dispatcher (FP8, or an explicit fallback).
#include "fp8kit/nn/precision.hpp"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "fp8kit/common/error.hpp"
#include "fp8kit/convert/convert.hpp"
#include "fp8kit/ops/scaled_mm.hpp"
#include "fp8kit/scaling/amax.hpp"
#include "fp8kit/scaling/scale.hpp"
#include "nn_util.hpp"

namespace fp8kit::nn {

namespace {

constexpr std::string_view kFakeSuffix = "-fake";

// Roles in the order of TensorRole, for the per-role columns of the recipe table.
constexpr std::size_t kRoles = 3;

// A recipe kind as a row over the scaling vocabulary: its name and, for each role (input, weight, grad_output), the
// FP8 format and the granularity of its scales (over an operand whose rows are reduced along their columns, cols =
// K); delayed: the per-tensor scales come from amax histories. The non-FP8 kinds leave the columns unused.
struct RecipeRow {
  RecipeKind kind;
  std::string_view name;
  bool fp8;
  bool delayed;
  std::array<Format, kRoles> format;
  std::array<Granularity, kRoles> granularity;
};
// The HYBRID recipes (Transformer Engine): E4M3 forward, E5M2 gradients; DeepSeek-V3 and MX: E4M3 everywhere.
const RecipeRow kRecipes[] = {
    {RecipeKind::kFp32, "fp32", false, false, {}, {}},
    {RecipeKind::kBf16, "bf16", false, false, {}, {}},
    {RecipeKind::kFp8Delayed,
     "fp8-delayed",
     true,
     true,
     {Format::e4m3fn, Format::e4m3fn, Format::e5m2},
     {Granularity::tensor(), Granularity::tensor(), Granularity::tensor()}},
    {RecipeKind::kFp8Current,
     "fp8-current",
     true,
     false,
     {Format::e4m3fn, Format::e4m3fn, Format::e5m2},
     {Granularity::tensor(), Granularity::tensor(), Granularity::tensor()}},
    {RecipeKind::kFp8Block,
     "fp8-block",
     true,
     false,
     {Format::e4m3fn, Format::e4m3fn, Format::e4m3fn},
     {Granularity::block(1, 128), Granularity::block(128, 128), Granularity::block(1, 128)}},
    {RecipeKind::kMxfp8,
     "mxfp8",
     true,
     false,
     {Format::e4m3fn, Format::e4m3fn, Format::e4m3fn},
     {Granularity::mx(MxScaleMode::kRceil), Granularity::mx(MxScaleMode::kRceil),
      Granularity::mx(MxScaleMode::kRceil)}},
    {RecipeKind::kFp8O2,
     "fp8-o2",
     true,
     true,
     {Format::e4m3fn, Format::e4m3fn, Format::e5m2},
     {Granularity::tensor(), Granularity::tensor(), Granularity::tensor()}},
    {RecipeKind::kFp8DelayedE4M3,
     "fp8-delayed-e4m3",
     true,
     true,
     {Format::e4m3fn, Format::e4m3fn, Format::e4m3fn},
     {Granularity::tensor(), Granularity::tensor(), Granularity::tensor()}},
};

const RecipeRow& row_of(RecipeKind kind) {
  const auto i = static_cast<std::size_t>(kind);
  FP8KIT_CHECK(i < std::size(kRecipes), "precision recipe: kind ", i, " is not a RecipeKind (0 to ",
               std::size(kRecipes) - 1, ")");
  return kRecipes[i];
}

// x as a float32 matrix, checked.
MatrixRef matrix_of(const Tensor& x) {
  const MatrixRef m = x.matrix();
  m.element<float>("prepare_operand");
  return m;
}

// quantize(transpose(x)) without the float32 transpose: x^T in bands of whole blocks (about 64 of its rows), each
// band transposed into a small buffer and quantized on its own. Blocks never straddle bands, so codes and scales are
// bit for bit those of quantizing the whole transpose. Diagnostics: the fields the step report reads (amax and the
// counts) are summed over the bands; the error statistics are left unset.
ScaledTensor quantize_transposed(const MatrixRef& x, const QuantizeOptions& options, QuantDiagnostics* diagnostics) {
  ScaledTensor out;
  out.format = options.format;
  out.overflow = options.overflow;
  out.granularity = options.granularity;
  out.rows = x.cols;
  out.cols = x.rows;
  const std::int64_t rows = out.rows, cols = out.cols, block_rows = out.block_rows();
  const std::int64_t band = block_rows * std::max<std::int64_t>(1, 64 / block_rows);
  const std::int64_t grid_cols = out.grid_cols();
  out.data.resize(static_cast<std::size_t>(rows * cols));
  out.scale_inv.resize(static_cast<std::size_t>(out.grid_rows() * grid_cols));
  const bool mx = options.granularity.kind == Granularity::Kind::kMx;
  if (mx) out.scale_e8m0.resize(out.scale_inv.size());
  std::vector<float> buffer;
  ScaledTensor q;
  for (std::int64_t b0 = 0; b0 < rows; b0 += band) {
    const std::int64_t n = std::min(band, rows - b0);
    buffer.resize(static_cast<std::size_t>(n * cols));
    detail::transpose_into(x.row<float>(0) + b0, x.stride(), buffer.data(), x.rows, n);  // columns b0 .. b0+n of x
    QuantDiagnostics d;
    quantize_into(MatrixRef{buffer.data(), n, cols}, options, q, diagnostics ? &d : nullptr);
    std::copy(q.data.begin(), q.data.end(), out.data.begin() + b0 * cols);
    const std::int64_t first = (b0 / block_rows) * grid_cols;
    std::copy(q.scale_inv.begin(), q.scale_inv.end(), out.scale_inv.begin() + first);
    if (mx) std::copy(q.scale_e8m0.begin(), q.scale_e8m0.end(), out.scale_e8m0.begin() + first);
    if (diagnostics) {
      diagnostics->amax = std::max(diagnostics->amax, d.amax);
      diagnostics->count += d.count;
      diagnostics->nonzero_finite += d.nonzero_finite;
      diagnostics->underflow_count += d.underflow_count;
      diagnostics->saturated_count += d.saturated_count;
      diagnostics->nonfinite_count += d.nonfinite_count;
    }
  }
  return out;
}

// Records a role's amax/scale into the report (always checks for non-finite values; the rest when logging).
void report_scale(const GemmCall& call, TensorRole role, float amax, float scale, bool nonfinite,
                  const QuantDiagnostics* diag) {
  if (call.report == nullptr) return;
  ScaleRecord rec;
  rec.layer = call.state != nullptr ? call.state->layer : call.op;
  rec.op = call.op;
  rec.role = role;
  rec.amax = amax;
  rec.scale = scale;
  rec.nonfinite = nonfinite;
  if (diag != nullptr) {
    rec.underflow_fraction = diag->underflow_fraction();
    rec.saturated = diag->saturated_count;
  }
  if (nonfinite && !call.report->first_nonfinite) call.report->first_nonfinite = rec;
  if (call.report->log_scales) call.report->scales.push_back(std::move(rec));
}

Tensor dequantized(const ScaledTensor& q) {
  Tensor t = empty({q.rows, q.cols}, DType::float32);
  dequantize(q, t.span<float>());
  return t;
}

std::string dtype_name(const RecipeOperand& x) {
  if (x.fp8) return std::string(fp8kit::name(x.fp8->format));
  return std::string(fp8kit::name(x.values.dtype()));
}

// The operand as float values for a non-FP8 GEMM: its values, or (fallback) its FP8 codes dequantized and rounded
// to bfloat16 — the explicit cast a fallback makes, recorded as its own event.
Tensor float_values(const GemmCall& call, const RecipeOperand& x) {
  if (!x.fp8) return x.values;
  ScopedEvent cast(call.profiler, "cast " + std::string(fp8kit::name(x.fp8->format)) + "->bfloat16", "cast");
  cast.arg("reason", "fallback of " + call.op);
  return dequantized(*x.fp8).to(DType::bfloat16);
}

MatrixRef view_of(const Tensor& t, std::int64_t rows, std::int64_t cols) {
  return MatrixRef{t.raw(), t.dtype(), rows, cols};
}

}  // namespace

bool PrecisionRecipe::is_fp8() const {
  return row_of(kind).fp8;
}

std::string PrecisionRecipe::name() const {
  return std::string(row_of(kind).name) + (is_fp8() && mode == Fp8Mode::kFakeQuant ? "-fake" : "");
}

Format format_of(const PrecisionRecipe& r, TensorRole role) {
  return row_of(r.kind).format[static_cast<std::size_t>(role)];
}

Granularity granularity_of(const PrecisionRecipe& r, TensorRole role) {
  return row_of(r.kind).granularity[static_cast<std::size_t>(role)];
}

bool delayed_scaling(const PrecisionRecipe& r) {
  return row_of(r.kind).delayed;
}

std::optional<PrecisionRecipe> PrecisionRecipe::parse(std::string_view text) {
  PrecisionRecipe recipe;
  if (text.size() > kFakeSuffix.size() && text.substr(text.size() - kFakeSuffix.size()) == kFakeSuffix) {
    recipe.mode = Fp8Mode::kFakeQuant;
    text.remove_suffix(kFakeSuffix.size());
  }
  for (const RecipeRow& r : kRecipes) {
    if (r.name == text) {
      recipe.kind = r.kind;
      if (r.kind == RecipeKind::kFp8O2) {
        recipe.optimizer_state = MomentStorage::kFp8;
        recipe.master_weights = MasterWeights::kBf16Stochastic;
      }
      if (recipe.mode == Fp8Mode::kFakeQuant && !recipe.is_fp8()) return std::nullopt;
      return recipe;
    }
  }
  return std::nullopt;
}

std::string_view name(TensorRole role) {
  switch (role) {
    case TensorRole::kInput:
      return "input";
    case TensorRole::kWeight:
      return "weight";
    case TensorRole::kGradOutput:
      return "grad_output";
  }
  return "?";
}

Fp8LayerState::Fp8LayerState(std::string layer_name, const PrecisionRecipe& recipe) : layer(std::move(layer_name)) {
  for (TensorRole role : {TensorRole::kInput, TensorRole::kWeight, TensorRole::kGradOutput}) {
    DelayedScalingConfig config;
    config.format = format_of(recipe, role);
    config.history_length = recipe.amax_history_length;
    config.algorithm = recipe.amax_compute;
    config.margin = recipe.margin;
    of(role) = DelayedScaling(config);
  }
}

DelayedScaling& Fp8LayerState::of(TensorRole role) {
  switch (role) {
    case TensorRole::kInput:
      return input;
    case TensorRole::kWeight:
      return weight;
    default:
      return grad_output;
  }
}

void Fp8LayerState::update() {
  input.update();
  weight.update();
  grad_output.update();
}

void Fp8LayerState::discard_step() {
  input.discard_step();
  weight.discard_step();
  grad_output.discard_step();
}

std::int64_t RecipeOperand::nbytes() const {
  if (fp8) {
    return static_cast<std::int64_t>(fp8->data.size() + fp8->scale_inv.size() * sizeof(float) + fp8->scale_e8m0.size());
  }
  return values.nbytes();
}

namespace {

// The scales a recipe quantizes a role with lie in blocks (fp8-block, mxfp8), not one per tensor.
bool blocked_scales(const PrecisionRecipe& r, TensorRole role) {
  return r.is_fp8() && !delayed_scaling(r) && granularity_of(r, role).kind != Granularity::Kind::kTensor;
}

}  // namespace

RecipeOperand prepare_operand_transposed(const GemmCall& call, TensorRole role, const Tensor& x) {
  FP8KIT_CHECK(call.recipe != nullptr, "prepare_operand: no recipe");
  if (!blocked_scales(*call.recipe, role)) return prepare_operand(call, role, transpose(x));
  return prepare_operand(call, role, x.to(DType::float32), true);
}

RecipeOperand prepare_operand(const GemmCall& call, TensorRole role, const Tensor& x) {
  return prepare_operand(call, role, x, false);
}

RecipeOperand prepare_operand(const GemmCall& call, TensorRole role, const Tensor& x_in, bool transposed) {
  FP8KIT_CHECK(call.recipe != nullptr, "prepare_operand: no recipe");
  FP8KIT_CHECK(x_in.dtype() == DType::float32 || x_in.dtype() == DType::bfloat16,
               "prepare_operand: operands are float32 (or bfloat16 master weights), not ", fp8kit::name(x_in.dtype()));
  const PrecisionRecipe& r = *call.recipe;
  if (r.kind == RecipeKind::kBf16 && x_in.dtype() == DType::bfloat16 && !transposed) {
    RecipeOperand out;
    out.values = x_in;  // already the bf16 GEMM's operand
    return out;
  }
  const Tensor x = x_in.to(DType::float32);  // bfloat16 master weights: exact, a temporary
  FP8KIT_CHECK(!transposed || blocked_scales(r, role), "prepare_operand: the transposed path is for block scales");
  RecipeOperand out;
  if (r.kind == RecipeKind::kFp32) {
    out.values = x;
    return out;
  }
  if (r.kind == RecipeKind::kBf16) {
    out.values = x.to(DType::bfloat16);
    return out;
  }
  ScopedEvent event(call.profiler, "quantize " + std::string(name(role)), "cast");
  const Format format = format_of(r, role);
  event.arg("to", std::string(fp8kit::name(format)));
  const MatrixRef m = matrix_of(x);
  const bool log = call.report != nullptr && call.report->log_scales;
  QuantDiagnostics diag;
  ScaledTensor q;
  float amax_value = 0.0f, scale = 1.0f;
  bool nonfinite = false;
  if (delayed_scaling(r)) {
    FP8KIT_CHECK(call.state != nullptr, "prepare_operand: delayed scaling needs the layer's state (", call.op, ")");
    const AmaxResult a = amax(std::span<const float>(m.row<float>(0), static_cast<std::size_t>(m.numel())));
    DelayedScaling& s = call.state->of(role);
    amax_value = a.amax;
    nonfinite = a.has_nonfinite();
    // Until the history holds an amax, this step's own (current scaling for the first step; the whole tensor's
    // when this is a part of it, agreed by every rank holding a part, as they all reach this point together):
    // Transformer Engine's initial scale 1 flushed up to 60% of a CNN's E5M2 gradients to zero (docs/nn.md).
    if (s.calibrated()) {
      scale = s.scale();
    } else {
      const float first = call.agree_amax ? call.agree_amax(a.amax) : a.amax;
      scale = nonfinite ? s.scale() : compute_scale(first, format, ScaleOptions{s.config().margin}, s.scale());
    }
    s.record(nonfinite ? std::numeric_limits<float>::quiet_NaN() : a.amax);
    // With --log-scales, the loss this scale caused, measured on the codes just written as quantize() measures it.
    q = quantize_with_scale(m, format, scale, Overflow::kSaturate, log ? &diag : nullptr);
  } else if (call.agree_amax && granularity_of(r, role).kind == Granularity::Kind::kTensor) {
    // A part of a tensor: the scale of the whole one's finite amax, as quantize() takes it for a whole tensor.
    const AmaxResult a = amax(std::span<const float>(m.row<float>(0), static_cast<std::size_t>(m.numel())));
    amax_value = call.agree_amax(a.amax);
    nonfinite = a.has_nonfinite();
    scale = compute_scale(amax_value, format, ScaleOptions{r.margin, 0.0f, {}});
    q = quantize_with_scale(m, format, scale, Overflow::kSaturate, log ? &diag : nullptr);
  } else {
    const QuantizeOptions options{format, Overflow::kSaturate, granularity_of(r, role), {r.margin, 0.0f, {}}};
    q = transposed ? quantize_transposed(m, options, log ? &diag : nullptr)
                   : quantize(m, options, log ? &diag : nullptr);
    if (!log) {
      const AmaxResult a = amax(std::span<const float>(m.row<float>(0), static_cast<std::size_t>(m.numel())));
      amax_value = a.amax;
      nonfinite = a.has_nonfinite();
    } else {
      amax_value = diag.amax;
      nonfinite = diag.nonfinite_count != 0;
    }
    scale = q.scale_inv.empty() ? 1.0f : 1.0f / q.scale_inv[0];
  }
  report_scale(call, role, amax_value, scale, nonfinite, log ? &diag : nullptr);
  out.blocked = q.granularity.kind != Granularity::Kind::kTensor;
  if (r.mode == Fp8Mode::kFakeQuant) {
    out.values = dequantized(q);  // quantize -> dequantize: the straight-through fake quantization
  } else {
    out.fp8 = std::move(q);
  }
  return out;
}

Tensor recipe_gemm(const GemmCall& call, const RecipeOperand& a, const RecipeOperand& b, std::span<const float> bias) {
  FP8KIT_CHECK(call.recipe != nullptr, "recipe_gemm (", call.op, "): the call has no recipe");
  FP8KIT_CHECK(a.cols() == b.cols(), "recipe_gemm (", call.op, "): A is ", a.rows(), "x", a.cols(), ", B is ", b.rows(),
               "x", b.cols(), " (N x K): K differs");
  ScopedEvent event(call.profiler, call.op, "gemm");
  event.arg("dtypes", dtype_name(a) + "," + dtype_name(b));
  event.arg("shape", std::to_string(a.rows()) + "x" + std::to_string(b.rows()) + "x" + std::to_string(a.cols()));
  Tensor out = empty({a.rows(), b.rows()}, DType::float32);
  const double macs = static_cast<double>(a.rows()) * static_cast<double>(b.rows()) * static_cast<double>(a.cols());
  std::string fallback = call.fallback_reason;
  if (fallback.empty() && a.fp8 && b.fp8 && macs < static_cast<double>(call.recipe->min_fp8_gemm_macs)) {
    fallback = "GEMM of " + std::to_string(static_cast<std::int64_t>(macs)) + " multiply-adds < " +
               std::to_string(call.recipe->min_fp8_gemm_macs);
  }
  if (a.fp8 && b.fp8 && fallback.empty()) {
    event.arg("path", "fp8");
    scaled_mm_into(*a.fp8, *b.fp8, out.span<float>(), ScaledMmOptions{BLayout::kNK, DType::float32, bias});
    return out;
  }
  if (a.fp8 || b.fp8) {
    event.arg("path", "fallback");
    event.arg("reason", fallback);
  } else {
    event.arg("path", call.recipe->is_fp8() ? "fake-quant" : std::string(call.recipe->name()));
  }
  const Tensor av = float_values(call, a), bv = float_values(call, b);
  matmul(view_of(av, a.rows(), a.cols()), view_of(bv, b.rows(), b.cols()), BLayout::kNK, out.span<float>(), bias);
  return out;
}

std::optional<RecipeOperand> transpose_operand(const RecipeOperand& x) {
  if (x.blocked) return std::nullopt;
  RecipeOperand t;
  const std::int64_t rows = x.rows(), cols = x.cols();
  if (!x.fp8) {
    t.values = empty({cols, rows}, x.values.dtype());
    if (x.values.dtype() == DType::float32) {
      detail::transpose_into(x.values.data<float>(), cols, t.values.data<float>(), rows, cols);
    } else {  // bfloat16: the 16-bit patterns move as they are
      detail::transpose_into(x.values.data<bfloat16>(), cols, t.values.data<bfloat16>(), rows, cols);
    }
    return t;
  }
  ScaledTensor q;
  q.format = x.fp8->format;
  q.overflow = x.fp8->overflow;
  q.granularity = x.fp8->granularity;
  q.rows = cols;
  q.cols = rows;
  q.scale_inv = x.fp8->scale_inv;
  q.data.resize(x.fp8->data.size());
  detail::transpose_into(x.fp8->data.data(), cols, q.data.data(), rows, cols);
  t.fp8 = std::move(q);
  return t;
}

Tensor transpose(const Tensor& x) {
  const MatrixRef v = x.matrix();
  Tensor t = empty({v.cols, v.rows}, x.dtype());
  if (x.dtype() == DType::bfloat16) {  // bfloat16 master weights: the 16-bit patterns move as they are
    detail::transpose_into(x.data<bfloat16>(), v.cols, t.data<bfloat16>(), v.rows, v.cols);
  } else {
    detail::transpose_into(x.data<float>(), v.cols, t.data<float>(), v.rows, v.cols);
  }
  return t;
}

}  // namespace fp8kit::nn
