// LayerNorm, GELU, ReLU, Embedding, residual add and cross-entropy: plain float32 loops over rows, spread over
// OpenMP threads when large, with every cross-row reduction in a fixed order so results never depend on threads.
#include "fp8kit/nn/layers.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <string_view>
#include <vector>

#include "common/parallel.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/format/codec.hpp"
#include "nn_util.hpp"

namespace fp8kit::nn {
namespace {

// Parameter-gradient reductions over rows are split by column into chunks this wide: each chunk sums its rows in
// order (one thread per chunk), so the summation order of every element is fixed.
constexpr std::int64_t kColumnChunk = 32;

bool go_parallel(std::int64_t elements) {
  return fp8kit::detail::worth_threads(elements, fp8kit::detail::kParallelMathElements);
}

void check_float32(const Tensor& t, std::string_view layer, std::string_view what) {
  FP8KIT_CHECK(t.dtype() == DType::float32, layer, ": ", what, " must be float32, got ", name(t.dtype()));
}

void check_same_shape(const Tensor& t, const Shape& expected, std::string_view layer, std::string_view what) {
  FP8KIT_CHECK(t.shape() == expected, layer, ": ", what, " has shape ", shape_string(t.shape()), ", expected ",
               shape_string(expected));
}

// Checks that ids are int64 in [0, limit), naming the first offending one.
void check_ids(const Tensor& ids, std::int64_t limit, std::string_view layer, std::string_view what) {
  FP8KIT_CHECK(ids.dtype() == DType::int64, layer, ": ", what, " must be int64, got ", name(ids.dtype()));
  const std::span<const std::int64_t> v = ids.span<std::int64_t>();
  for (std::size_t i = 0; i < v.size(); ++i) {
    FP8KIT_CHECK(v[i] >= 0 && v[i] < limit, layer, ": ", what, " ", v[i], " at position ", i, " is outside [0, ", limit,
                 ")");
  }
}

Shape with_last(Shape shape, std::int64_t last) {
  shape.push_back(last);
  return shape;
}

// grad[ids[n], :] += dy[n, :] for n in order, in parallel over column chunks (deterministic with repeated ids).
void scatter_add_rows(Tensor& grad, const Tensor& ids, const Tensor& dy, const char* layer) {
  const std::int64_t channels = grad.size(-1);
  FP8KIT_CHECK(ids.dtype() == DType::int64, layer,
               ".backward: no saved ids (run forward first, and give backward that forward's Saved)");
  const std::int64_t n_rows = ids.numel();
  const std::int64_t* id = ids.data<std::int64_t>();
  // The saved ids index this layer's rows: a Saved of a larger table would write past the gradient.
  const std::int64_t table_rows = grad.size(0);
  for (std::int64_t n = 0; n < n_rows; ++n) {
    FP8KIT_CHECK(id[n] >= 0 && id[n] < table_rows, layer, ".backward: saved id ", id[n], " is outside this table's ",
                 table_rows, " rows (a Saved of another layer?)");
  }
  const float* g = dy.data<float>();
  float* out = grad.data<float>();
  const std::int64_t chunks = (channels + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for num_threads(::fp8kit::num_threads()) \
    schedule(static) if (go_parallel(n_rows * channels) && chunks > 1)
  for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
    const std::int64_t c0 = chunk * kColumnChunk, c1 = std::min(channels, c0 + kColumnChunk);
    for (std::int64_t n = 0; n < n_rows; ++n) {
      float* dst = out + id[n] * channels;
      const float* src = g + n * channels;
      for (std::int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

// log(sum exp(row)) with the maximum subtracted, the sum in double.
double row_logsumexp(const float* row, std::int64_t n) {
  float max = -INFINITY;
  for (std::int64_t i = 0; i < n; ++i) max = std::max(max, row[i]);
  if (std::isinf(max)) return max;  // all -inf (or a +inf): nothing finite to normalize by
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(row[i] - max));
  return static_cast<double>(max) + std::log(sum);
}

}  // namespace

// ---------------------------------------------------------------- LayerNorm

LayerNorm::LayerNorm(std::string name, std::int64_t channels)
    : weight(make_parameter(name + ".weight", {channels}, 0.0, 0, 1.0)),
      bias(make_parameter(name + ".bias", {channels}, 0.0, 0, 0.0)) {
  FP8KIT_CHECK(channels > 0, "layernorm: channels must be positive, got ", channels);
}

std::vector<Parameter*> LayerNorm::parameters() {
  return {&weight, &bias};
}

Tensor LayerNorm::forward(const Context& ctx, const Tensor& x, Saved& saved) const {
  ScopedEvent event(ctx.profiler, "layernorm.forward");
  const std::int64_t channels = weight.value.numel();
  check_float32(x, "layernorm", "x");
  FP8KIT_CHECK(x.dim() >= 1 && x.size(-1) == channels, "layernorm: x has shape ", shape_string(x.shape()),
               ", expected (..., ", channels, ")");
  FP8KIT_CHECK(eps >= 0.0f && std::isfinite(eps), "layernorm: eps must be finite and >= 0, got ", eps);
  const std::int64_t rows = x.matrix().rows;
  Tensor y = empty(x.shape(), DType::float32);
  Tensor x_hat = empty(x.shape(), DType::float32);
  Tensor rstd = empty({rows}, DType::float32);
  const float* in = x.data<float>();
  const Tensor wv = parameter_values(weight), bv = parameter_values(bias);
  const float* w = wv.data<float>();
  const float* b = bv.data<float>();
  float* out = y.data<float>();
  float* xh = x_hat.data<float>();
  float* rs = rstd.data<float>();
  const double inv_c = 1.0 / static_cast<double>(channels);
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (go_parallel(rows * channels))
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * channels;
    double sum = 0.0;
    for (std::int64_t c = 0; c < channels; ++c) sum += row[c];
    const double mean = sum * inv_c;
    double squares = 0.0;
    for (std::int64_t c = 0; c < channels; ++c) {
      const double d = row[c] - mean;
      squares += d * d;
    }
    const double r_std = 1.0 / std::sqrt(squares * inv_c + static_cast<double>(eps));
    rs[r] = static_cast<float>(r_std);
    for (std::int64_t c = 0; c < channels; ++c) {
      const float n = static_cast<float>((row[c] - mean) * r_std);
      xh[r * channels + c] = n;
      out[r * channels + c] = n * w[c] + b[c];
    }
  }
  saved.x_hat = save_activation_rows(ctx, x_hat);
  saved.rstd = std::move(rstd);
  return y;
}

// With g = dy * weight: dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)), the row means in double.
Tensor LayerNorm::backward(const Context& ctx, const Tensor& dy, const Saved& saved) {
  ScopedEvent event(ctx.profiler, "layernorm.backward");
  const std::int64_t channels = weight.value.numel();
  check_float32(dy, "layernorm", "dy");
  // A Saved of this layer's forward: C channels per row, one rstd per row (one of another layer read past them).
  const Shape& saved_shape = saved.x_hat.shape();
  FP8KIT_CHECK(!saved_shape.empty() && saved_shape.back() == channels && saved.rstd.dtype() == DType::float32 &&
                   saved.rstd.numel() * channels == saved.x_hat.numel(),
               "layernorm.backward: no saved forward of ", channels,
               " channels (run forward first, and give backward that forward's Saved)");
  check_same_shape(dy, saved.x_hat.shape(), "layernorm", "dy");
  const Tensor x_hat = load_activation(saved.x_hat);
  const std::int64_t rows = x_hat.matrix().rows;
  Tensor dx = empty(dy.shape(), DType::float32);
  const float* g = dy.data<float>();
  const float* xh = x_hat.data<float>();
  const float* rs = saved.rstd.data<float>();
  const Tensor wv = parameter_values(weight);
  const float* w = wv.data<float>();
  float* out = dx.data<float>();
  const double inv_c = 1.0 / static_cast<double>(channels);
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (go_parallel(rows * channels))
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* gr = g + r * channels;
    const float* xr = xh + r * channels;
    double sum_g = 0.0, sum_gx = 0.0;
    for (std::int64_t c = 0; c < channels; ++c) {
      const double gw = static_cast<double>(gr[c]) * w[c];
      sum_g += gw;
      sum_gx += gw * xr[c];
    }
    const float mean_g = static_cast<float>(sum_g * inv_c);
    const float mean_gx = static_cast<float>(sum_gx * inv_c);
    for (std::int64_t c = 0; c < channels; ++c) {
      out[r * channels + c] = rs[r] * (gr[c] * w[c] - mean_g - xr[c] * mean_gx);
    }
  }
  // Parameter gradients: sums over rows, per column chunk in row order, in double.
  GradientAccumulator dw_sum(weight), db_sum(bias);
  float* dw = dw_sum.data();
  float* db = db_sum.data();
  const std::int64_t chunks = (channels + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for num_threads(::fp8kit::num_threads()) \
    schedule(static) if (go_parallel(rows * channels) && chunks > 1)
  for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
    const std::int64_t c0 = chunk * kColumnChunk, c1 = std::min(channels, c0 + kColumnChunk);
    double acc_w[kColumnChunk] = {}, acc_b[kColumnChunk] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* gr = g + r * channels;
      const float* xr = xh + r * channels;
      for (std::int64_t c = c0; c < c1; ++c) {
        acc_w[c - c0] += static_cast<double>(gr[c]) * xr[c];
        acc_b[c - c0] += gr[c];
      }
    }
    for (std::int64_t c = c0; c < c1; ++c) {
      dw[c] += static_cast<float>(acc_w[c - c0]);
      db[c] += static_cast<float>(acc_b[c - c0]);
    }
  }
  dw_sum.commit();
  db_sum.commit();
  return dx;
}

// ---------------------------------------------------------------- GELU

namespace {
constexpr float kGeluScale = static_cast<float>(0.7978845608028654);  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;
// Beyond this |x| tanh is exactly +-1 in float, so the derivative is exactly 1 or 0 (and x^3 may overflow).
constexpr float kGeluSaturated = 10.0f;
}  // namespace

// 0.5 (1 + tanh(z)) is the logistic sigmoid of 2z, which exp_approx evaluates without libm (so the loops vectorize):
//   gelu(x) = x s,  s = 1 / (1 + e^(-2z)),  z = sqrt(2/pi) (x + 0.044715 x^3);
//   dgelu/dx = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2)   (as 1 - tanh(z)^2 = 4 s (1 - s)).
// Beyond |x| = 10 tanh is +-1 in float: gelu is x or -0 and its derivative exactly 1 or 0 (selected, so the loops
// still vectorize; x is clamped to +-10 inside, where x^3 cannot overflow).
namespace {
inline float gelu_sigmoid(float v) {
  return 1.0f / (1.0f + detail::exp_approx(-2.0f * kGeluScale * (v + kGeluCubic * v * v * v)));
}
inline float clamp_saturated(float v) {  // selects on values: std::min/max return references and stop the vectorizer
  const float lower = v < -kGeluSaturated ? -kGeluSaturated : v;
  return lower > kGeluSaturated ? kGeluSaturated : lower;
}
inline float gelu_value(float v) {
  const float y = v * gelu_sigmoid(clamp_saturated(v));
  return v < -kGeluSaturated ? -0.0f : (v > kGeluSaturated ? v : y);
}
inline float gelu_derivative(float v) {
  const float c = clamp_saturated(v);
  const float s = gelu_sigmoid(c);
  const float d = s + 2.0f * c * s * (1.0f - s) * kGeluScale * (1.0f + 3.0f * kGeluCubic * c * c);
  return v < -kGeluSaturated ? 0.0f : (v > kGeluSaturated ? 1.0f : d);
}
}  // namespace

Tensor Gelu::forward(const Context& ctx, const Tensor& x, Saved& saved) {
  return forward(ctx, Tensor(x), saved);
}

// The input is saved first; y is then written over x's storage when nothing else holds it any more — under bf16
// and FP8 recipes, whose saved copy is a bfloat16 tensor, the float32 input is dead once saved (under fp32 the saved
// tensor shares it, so y gets its own buffer).
Tensor Gelu::forward(const Context& ctx, Tensor&& x, Saved& saved) {
  ScopedEvent event(ctx.profiler, "gelu.forward");
  check_float32(x, "gelu", "x");
  saved.x = save_activation_rows(ctx, x);
  Tensor y = x.storage_is_unique() ? x : empty(x.shape(), DType::float32);
  const float* in = x.data<float>();
  float* out = y.data<float>();
  const std::int64_t n = x.numel();
#pragma omp parallel for simd num_threads(::fp8kit::num_threads()) schedule(static) if (parallel : go_parallel(n))
  for (std::int64_t i = 0; i < n; ++i) out[i] = gelu_value(in[i]);
  return y;
}

Tensor Gelu::backward(const Context& ctx, const Tensor& dy, const Saved& saved) {
  return backward(ctx, Tensor(dy), saved);
}

// dx = dy * dgelu/dx(x), written over dy's storage when nothing else holds it (a gradient handed over with
// std::move): the gradient of the MLP's widest activation then needs no second buffer.

Tensor Gelu::backward(const Context& ctx, Tensor&& dy, const Saved& saved) {
  ScopedEvent event(ctx.profiler, "gelu.backward");
  check_float32(dy, "gelu", "dy");
  check_same_shape(dy, saved.x.shape(), "gelu", "dy");
  Tensor dx = dy.storage_is_unique() ? dy : empty(dy.shape(), DType::float32);
  const float* g = dy.data<float>();
  float* out = dx.data<float>();
  const std::int64_t n = saved.x.numel();
  // Reads the saved input in its own dtype (a bfloat16 input is widened per element, not copied to a float32
  // tensor: that copy would be the largest temporary of a transformer block's backward).
  if (saved.x.dtype() == DType::float8_e4m3fn) {
    // E4M3 codes with a scale per row: each code's value from a 256-entry table, times its row's scale (no float32
    // copy of the input; the row loop vectorizes with the table as a gather).
    static const std::array<float, 256> table = [] {
      std::array<float, 256> t{};
      for (int c = 0; c < 256; ++c) {
        t[static_cast<std::size_t>(c)] = decode_to_float(Format::e4m3fn, static_cast<std::uint8_t>(c));
      }
      return t;
    }();
    const float* values = table.data();
    const std::uint8_t* in = saved.x.values.data<std::uint8_t>();
    const float* scale_inv = saved.x.row_scale_inv.data<float>();
    const std::int64_t cols = saved.x.values.size(-1), rows = n / cols;
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (go_parallel(n))
    for (std::int64_t r = 0; r < rows; ++r) {
      const float s = scale_inv[r];
      const std::uint8_t* code = in + r * cols;
      const float* gr = g + r * cols;
      float* o = out + r * cols;
#pragma omp simd
      for (std::int64_t c = 0; c < cols; ++c) o[c] = gr[c] * gelu_derivative(values[code[c]] * s);
    }
  } else if (saved.x.dtype() == DType::bfloat16) {
    const bfloat16* in = saved.x.values.data<bfloat16>();
#pragma omp parallel for simd num_threads(::fp8kit::num_threads()) schedule(static) if (parallel : go_parallel(n))
    for (std::int64_t i = 0; i < n; ++i) {
      out[i] = g[i] * gelu_derivative(std::bit_cast<float>(static_cast<std::uint32_t>(in[i].bits) << 16));
    }
  } else {
    const float* in = saved.x.values.data<float>();
#pragma omp parallel for simd num_threads(::fp8kit::num_threads()) schedule(static) if (parallel : go_parallel(n))
    for (std::int64_t i = 0; i < n; ++i) out[i] = g[i] * gelu_derivative(in[i]);
  }
  return dx;
}

// ---------------------------------------------------------------- ReLU

Tensor Relu::forward(const Context& ctx, const Tensor& x, Saved& saved) {
  ScopedEvent event(ctx.profiler, "relu.forward");
  check_float32(x, "relu", "x");
  Tensor y = empty(x.shape(), DType::float32);
  Tensor positive = empty(x.shape(), DType::bool_);
  const float* in = x.data<float>();
  float* out = y.data<float>();
  bool* mask = positive.data<bool>();
  const std::int64_t n = x.numel();
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (go_parallel(n))
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = in[i];
    mask[i] = v > 0.0f;
    out[i] = (v > 0.0f || std::isnan(v)) ? v : 0.0f;  // NaN propagates, as in PyTorch
  }
  saved.positive = std::move(positive);
  return y;
}

Tensor Relu::backward(const Context& ctx, const Tensor& dy, const Saved& saved) {
  ScopedEvent event(ctx.profiler, "relu.backward");
  check_float32(dy, "relu", "dy");
  FP8KIT_CHECK(saved.positive.dtype() == DType::bool_,
               "relu.backward: no saved forward (run forward first, and give "
               "backward that forward's Saved)");
  check_same_shape(dy, saved.positive.shape(), "relu", "dy");
  Tensor dx = empty(dy.shape(), DType::float32);
  const bool* mask = saved.positive.data<bool>();
  const float* g = dy.data<float>();
  float* out = dx.data<float>();
  const std::int64_t n = dy.numel();
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (go_parallel(n))
  for (std::int64_t i = 0; i < n; ++i) out[i] = mask[i] ? g[i] : 0.0f;
  return dx;
}

// ---------------------------------------------------------------- Embedding

Embedding::Embedding(std::string name, std::int64_t num_embeddings, std::int64_t channels, double stddev,
                     std::uint64_t seed)
    : weight(make_parameter(name + ".weight", {num_embeddings, channels}, stddev, seed)) {
  FP8KIT_CHECK(num_embeddings > 0 && channels > 0, "embedding: needs a positive table size, got (", num_embeddings,
               ", ", channels, ")");
}

std::vector<Parameter*> Embedding::parameters() {
  return {&weight};
}

Tensor Embedding::forward(const Context& ctx, const Tensor& ids, Saved& saved) const {
  ScopedEvent event(ctx.profiler, "embedding.forward");
  const std::int64_t channels = weight.value.size(1);
  check_ids(ids, weight.value.size(0), "embedding", "id");
  Tensor y = empty(with_last(ids.shape(), channels), DType::float32);
  const std::int64_t* id = ids.data<std::int64_t>();
  const Tensor table_values = parameter_values(weight);
  const float* table = table_values.data<float>();
  float* out = y.data<float>();
  const std::int64_t n = ids.numel();
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (go_parallel(n * channels))
  for (std::int64_t i = 0; i < n; ++i) {
    std::memcpy(out + i * channels, table + id[i] * channels, static_cast<std::size_t>(channels) * sizeof(float));
  }
  saved.ids = ids;
  return y;
}

void Embedding::backward(const Context& ctx, const Tensor& dy, const Saved& saved) {
  ScopedEvent event(ctx.profiler, "embedding.backward");
  check_float32(dy, "embedding", "dy");
  FP8KIT_CHECK(saved.ids.dtype() == DType::int64,
               "embedding.backward: no saved ids (run forward first, and give backward that "
               "forward's Saved)");
  check_same_shape(dy, with_last(saved.ids.shape(), weight.value.size(1)), "embedding", "dy");
  GradientAccumulator dw(weight);
  scatter_add_rows(dw.tensor(), saved.ids, dy, "embedding");
  dw.commit();
}

// ---------------------------------------------------------------- TokenPositionEmbedding

TokenPositionEmbedding::TokenPositionEmbedding(std::string name, std::int64_t vocab_size, std::int64_t max_positions,
                                               std::int64_t channels, double stddev, std::uint64_t seed)
    : wte(name + ".wte", vocab_size, channels, stddev, seed),
      wpe(name + ".wpe", max_positions, channels, stddev, seed + 1) {}

std::vector<Parameter*> TokenPositionEmbedding::parameters() {
  return {&wte.weight, &wpe.weight};
}

Tensor TokenPositionEmbedding::forward(const Context& ctx, const Tensor& tokens, Saved& saved) const {
  ScopedEvent event(ctx.profiler, "token_position_embedding.forward");
  const std::int64_t channels = wte.weight.value.size(1);
  FP8KIT_CHECK(tokens.dim() == 2, "token_position_embedding: tokens must be (B, T), got ",
               shape_string(tokens.shape()));
  const std::int64_t batch = tokens.size(0), steps = tokens.size(1);
  FP8KIT_CHECK(steps <= wpe.weight.value.size(0), "token_position_embedding: sequence length ", steps, " exceeds the ",
               wpe.weight.value.size(0), " positions");
  check_ids(tokens, wte.weight.value.size(0), "token_position_embedding", "token");
  Tensor y = empty({batch, steps, channels}, DType::float32);
  const std::int64_t* id = tokens.data<std::int64_t>();
  const Tensor te_values = parameter_values(wte.weight), pe_values = parameter_values(wpe.weight);
  const float* te = te_values.data<float>();
  const float* pe = pe_values.data<float>();
  float* out = y.data<float>();
  const std::int64_t n = batch * steps;
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (go_parallel(n * channels))
  for (std::int64_t i = 0; i < n; ++i) {
    const float* a = te + id[i] * channels;
    const float* p = pe + (i % steps) * channels;
    float* o = out + i * channels;
    for (std::int64_t c = 0; c < channels; ++c) o[c] = a[c] + p[c];
  }
  saved.tokens = tokens;
  return y;
}

void TokenPositionEmbedding::backward(const Context& ctx, const Tensor& dy, const Saved& saved) {
  ScopedEvent event(ctx.profiler, "token_position_embedding.backward");
  const std::int64_t channels = wte.weight.value.size(1);
  check_float32(dy, "token_position_embedding", "dy");
  FP8KIT_CHECK(saved.tokens.dtype() == DType::int64 && saved.tokens.dim() == 2 &&
                   saved.tokens.size(1) <= wpe.weight.value.size(0),
               "token_position_embedding.backward: no saved tokens of at most ", wpe.weight.value.size(0),
               " positions (run forward first, and give backward that forward's Saved)");
  check_same_shape(dy, with_last(saved.tokens.shape(), channels), "token_position_embedding", "dy");
  GradientAccumulator dte(wte.weight), dpe(wpe.weight);
  scatter_add_rows(dte.tensor(), saved.tokens, dy, "token_position_embedding");
  dte.commit();
  // wpe.grad[t] += sum_b dy[b, t]: one thread per position, batches in order.
  const std::int64_t batch = saved.tokens.size(0), steps = saved.tokens.size(1);
  const float* g = dy.data<float>();
  float* out = dpe.data();
#pragma omp parallel for num_threads(::fp8kit::num_threads()) \
    schedule(static) if (go_parallel(batch * steps * channels))
  for (std::int64_t t = 0; t < steps; ++t) {
    float* o = out + t * channels;
    for (std::int64_t b = 0; b < batch; ++b) {
      const float* src = g + (b * steps + t) * channels;
      for (std::int64_t c = 0; c < channels; ++c) o[c] += src[c];
    }
  }
  dpe.commit();
}

// ---------------------------------------------------------------- residual add

Tensor ResidualAdd::forward(const Context& ctx, const Tensor& a, const Tensor& b, Saved& saved) {
  ScopedEvent event(ctx.profiler, "residual.forward");
  check_float32(a, "residual", "a");
  check_float32(b, "residual", "b");
  check_same_shape(b, a.shape(), "residual", "b");
  Tensor y = empty(a.shape(), DType::float32);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* out = y.data<float>();
  const std::int64_t n = a.numel();
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (go_parallel(n))
  for (std::int64_t i = 0; i < n; ++i) out[i] = pa[i] + pb[i];
  saved.shape = a.shape();
  return y;
}

ResidualAdd::Grads ResidualAdd::backward(const Context& ctx, const Tensor& dy, const Saved& saved) {
  ScopedEvent event(ctx.profiler, "residual.backward");
  check_float32(dy, "residual", "dy");
  check_same_shape(dy, saved.shape, "residual", "dy");
  return {dy, dy};
}

// ---------------------------------------------------------------- cross-entropy

float CrossEntropy::forward(const Context& ctx, const Tensor& logits, const Tensor& targets, Saved& saved) {
  ScopedEvent event(ctx.profiler, "cross_entropy.forward");
  check_float32(logits, "cross_entropy", "logits");
  FP8KIT_CHECK(logits.dim() >= 1 && logits.size(-1) > 0, "cross_entropy: logits must be (..., V) with V > 0, got ",
               shape_string(logits.shape()));
  const Shape leading(logits.shape().begin(), logits.shape().end() - 1);
  check_same_shape(targets, leading, "cross_entropy", "targets");
  const std::int64_t vocab = logits.size(-1);
  const std::int64_t rows = logits.matrix().rows;
  FP8KIT_CHECK(rows > 0, "cross_entropy: no rows to average over");
  check_ids(targets, vocab, "cross_entropy", "target");

  saved.logits = save_activation(ctx, logits);
  const Tensor stored = load_activation(saved.logits);  // logits itself for float32
  const bool rounded = !stored.shares_storage_with(logits);
  Tensor lse = empty({rows}, DType::float32);
  std::vector<double> losses(static_cast<std::size_t>(rows));
  const float* in = logits.data<float>();
  const float* kept = stored.data<float>();
  const std::int64_t* target = targets.data<std::int64_t>();
  float* lse_out = lse.data<float>();
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (go_parallel(rows * vocab))
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * vocab;
    const double l = row_logsumexp(row, vocab);
    losses[static_cast<std::size_t>(r)] = l - static_cast<double>(row[target[r]]);
    lse_out[r] = static_cast<float>(rounded ? row_logsumexp(kept + r * vocab, vocab) : l);
  }
  double total = 0.0;
  for (const double l : losses) total += l;  // in row order: thread-count independent
  saved.logsumexp = std::move(lse);
  saved.targets = targets;
  return static_cast<float>(total / static_cast<double>(rows));
}

namespace {

// dlogits = dloss / R * (softmax(logits) - onehot(target)) into `dlogits`, which may be `logits` itself: each row's
// target logit is read before the row is overwritten.
void cross_entropy_gradient(const Context& ctx, float dloss, const Tensor& logits, const CrossEntropy::Saved& saved,
                            Tensor& dlogits) {
  ScopedEvent event(ctx.profiler, "cross_entropy.backward");
  const std::int64_t vocab = logits.size(-1);
  const std::int64_t rows = logits.matrix().rows;
  FP8KIT_CHECK(saved.targets.dtype() == DType::int64 && saved.targets.numel() == rows &&
                   saved.logsumexp.dtype() == DType::float32 && saved.logsumexp.numel() == rows,
               "cross_entropy.backward: no saved forward (run forward first, and give backward that forward's Saved "
               "once: the rvalue overload takes it)");
  const float scale = static_cast<float>(static_cast<double>(dloss) / static_cast<double>(rows));
  const float* in = logits.data<float>();
  const float* lse = saved.logsumexp.data<float>();
  const std::int64_t* target = saved.targets.data<std::int64_t>();
  float* out = dlogits.data<float>();
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (go_parallel(rows * vocab))
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * vocab;
    float* o = out + r * vocab;
    const float at_target = row[target[r]];
    for (std::int64_t v = 0; v < vocab; ++v) o[v] = std::exp(row[v] - lse[r]) * scale;
    o[target[r]] = (std::exp(at_target - lse[r]) - 1.0f) * scale;
  }
}

}  // namespace

Tensor CrossEntropy::backward(const Context& ctx, float dloss, const Saved& saved) {
  const Tensor logits = load_activation(saved.logits);
  Tensor dlogits = empty(logits.shape(), DType::float32);
  cross_entropy_gradient(ctx, dloss, logits, saved, dlogits);
  return dlogits;
}

Tensor CrossEntropy::backward(const Context& ctx, float dloss, Saved&& saved) {
  Saved held = std::move(saved);
  saved = Saved();
  if (held.logits.dtype() != DType::float32 || !held.logits.storage_is_unique()) {
    return backward(ctx, dloss, static_cast<const Saved&>(held));
  }
  Tensor dlogits = std::move(held.logits);
  cross_entropy_gradient(ctx, dloss, dlogits, held, dlogits);
  return dlogits;
}

}  // namespace fp8kit::nn
