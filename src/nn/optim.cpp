// AdamW over the master weights: per-parameter moments keyed by name (float32, bfloat16 or FP8 with block scales),
// one fused pass per parameter in chunks of whole moment blocks; zero_grad and the NaN/Inf scan of gradients.
#include "fp8kit/nn/optim.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "common/fingerprint.hpp"
#include "common/parallel.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/convert/convert.hpp"
#include "fp8kit/format/codec.hpp"
#include "fp8kit/scaling/amax.hpp"
#include "fp8kit/scaling/scale.hpp"
#include "fp8kit/tensor/memory.hpp"

namespace fp8kit::nn {
namespace {

// Elements per unit of work: whole moment blocks, small enough for the chunk's float32 buffers to stay in L1/L2.
constexpr std::int64_t kChunk = 32 * kMomentBlock;
static_assert(kChunk % kMomentBlock == 0 && kChunk % 4 == 0);

bool go_parallel(std::int64_t elements) {
  return fp8kit::detail::worth_threads(elements, fp8kit::detail::kParallelMathElements);
}

void check_parameter(const Parameter& p, MasterWeights master) {
  const DType dtype = master_dtype(master);
  FP8KIT_CHECK(p.value.dtype() == dtype && p.grad.dtype() == dtype, "adamw: parameter '", p.name, "' holds ",
               name(p.value.dtype()), " value and ", name(p.grad.dtype()), " gradient; master weights ", name(master),
               " need ", name(dtype), " for both");
  FP8KIT_CHECK(p.value.shape() == p.grad.shape(), "adamw: parameter '", p.name,
               "' has a gradient of another shape than its value");
}

// n float32 values from a float32 or bfloat16 tensor's elements [first, first + n).
void widen(const Tensor& t, std::int64_t first, std::int64_t n, float* out) {
  if (t.dtype() == DType::float32) {
    std::copy_n(t.data<float>() + first, n, out);
    return;
  }
  const bfloat16* in = t.data<bfloat16>() + first;
  for (std::int64_t i = 0; i < n; ++i) out[i] = in[i].to_float();
}

void narrow_nearest(const float* in, std::int64_t n, Tensor& t, std::int64_t first) {
  if (t.dtype() == DType::float32) {
    std::copy_n(in, n, t.data<float>() + first);
    return;
  }
  bfloat16* out = t.data<bfloat16>() + first;
  for (std::int64_t i = 0; i < n; ++i) out[i] = bfloat16::from_float(in[i]);
}

// The per-step constants of one parameter's update.
struct StepConstants {
  float step_size, sqrt_c2, keep, b1, one_minus_b1, b2, one_minus_b2, eps;
};

// The FP8 moments of one chunk: decode (codes times their block's scale), and encode with new scales.
void decode_blocks(const Tensor& codes, const Tensor& scales, std::int64_t first, std::int64_t n, float* out) {
  const std::int64_t b0 = first / kMomentBlock, blocks = ceil_div(n, kMomentBlock);
  decode_segments(std::span<const std::uint8_t>(codes.data<std::uint8_t>() + first, static_cast<std::size_t>(n)),
                  Format::e4m3fn, std::span<float>(out, static_cast<std::size_t>(n)), kMomentBlock,
                  std::span<const float>(scales.data<float>() + b0, static_cast<std::size_t>(blocks)));
}

// Each block's amax maps to E4M3's 448 (compute_scale: an all-zero block keeps scale 1, its codes are 0), and each
// element rounds stochastically: the element at position i of the whole parameter draws stochastic_bits(seed, i)
// (`position`: that of element `first` of this tensor).
void encode_blocks(const float* in, std::int64_t first, std::int64_t position, std::int64_t n, std::uint64_t seed,
                   Tensor& codes, Tensor& scales) {
  const std::int64_t b0 = first / kMomentBlock, blocks = ceil_div(n, kMomentBlock);
  float* scale_inv = scales.data<float>() + b0;
  std::uint8_t* out = codes.data<std::uint8_t>() + first;
  std::array<float, kChunk / kMomentBlock> amaxes{};
  amax_blocks(MatrixRef{in, 1, n}, 1, kMomentBlock, std::span<float>(amaxes.data(), static_cast<std::size_t>(blocks)));
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t e0 = b * kMomentBlock, len = std::min(n, e0 + kMomentBlock) - e0;
    const float quant = compute_scale(amaxes[static_cast<std::size_t>(b)], Format::e4m3fn);
    scale_inv[b] = 1.0f / quant;
    const CastOptions options{Format::e4m3fn,
                              Overflow::kSaturate,
                              Rounding::kStochastic,
                              quant,
                              seed,
                              static_cast<std::uint64_t>(position + e0)};
    cast_to_fp8(std::span<const float>(in + e0, static_cast<std::size_t>(len)),
                std::span<std::uint8_t>(out + e0, static_cast<std::size_t>(len)), options);
  }
}

// The random stream of a parameter's stochastic rounding at one of its steps (bf16-sr values; the FP8 moments draw
// from two streams derived from it).
std::uint64_t rounding_stream(std::uint64_t seed, const std::string& name, std::int64_t step) {
  detail::Fingerprint h;  // FNV-1a 64 of the name
  h.add(name);
  return splitmix64_finalize(splitmix64_finalize(seed ^ h.value()) + static_cast<std::uint64_t>(step));
}

AdamW::State make_state(const Parameter& p, const AdamWOptions& o);

}  // namespace

std::string_view name(MomentStorage storage) {
  switch (storage) {
    case MomentStorage::kFloat32:
      return "fp32";
    case MomentStorage::kBfloat16:
      return "bf16";
    case MomentStorage::kFp8:
      return "fp8";
  }
  return "?";
}

std::string_view name(MasterWeights master) {
  switch (master) {
    case MasterWeights::kFloat32:
      return "fp32";
    case MasterWeights::kBf16Stochastic:
      return "bf16-sr";
    case MasterWeights::kBf16Kahan:
      return "bf16-kahan";
  }
  return "?";
}

std::optional<MomentStorage> parse_moment_storage(std::string_view text) {
  for (MomentStorage s : {MomentStorage::kFloat32, MomentStorage::kBfloat16, MomentStorage::kFp8}) {
    if (name(s) == text) return s;
  }
  return std::nullopt;
}

std::optional<MasterWeights> parse_master_weights(std::string_view text) {
  for (MasterWeights m : {MasterWeights::kFloat32, MasterWeights::kBf16Stochastic, MasterWeights::kBf16Kahan}) {
    if (name(m) == text) return m;
  }
  return std::nullopt;
}

DType master_dtype(MasterWeights master) {
  return master == MasterWeights::kFloat32 ? DType::float32 : DType::bfloat16;
}

namespace {

// The options every step uses (checked at construction and again by each step: options() can change them). The
// update runs in float32: lr and weight_decay must be finite there, and eps positive (with eps 0, an element whose
// gradient and moments are 0 divides 0 by 0).
void check_options(const AdamWOptions& o) {
  constexpr double kFloatMax = std::numeric_limits<float>::max();
  FP8KIT_CHECK(o.lr >= 0.0 && o.lr <= kFloatMax, "adamw: lr must be finite and >= 0, got ", o.lr);
  FP8KIT_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0, "adamw: beta1 must be in [0, 1), got ", o.beta1);
  FP8KIT_CHECK(o.beta2 >= 0.0 && o.beta2 < 1.0, "adamw: beta2 must be in [0, 1), got ", o.beta2);
  FP8KIT_CHECK(static_cast<float>(o.eps) > 0.0f && o.eps <= kFloatMax,
               "adamw: eps must be positive and finite in float32 (at least about 1.4e-45), got ", o.eps);
  FP8KIT_CHECK(o.weight_decay >= 0.0 && o.lr * o.weight_decay <= kFloatMax,
               "adamw: weight_decay must be finite and >= 0, got ", o.weight_decay);
  FP8KIT_CHECK(static_cast<unsigned>(o.moments) <= static_cast<unsigned>(MomentStorage::kFp8) &&
                   static_cast<unsigned>(o.master) <= static_cast<unsigned>(MasterWeights::kBf16Kahan),
               "adamw: unknown moment storage or master weights (", static_cast<unsigned>(o.moments), ", ",
               static_cast<unsigned>(o.master), ")");
}

}  // namespace

AdamW::AdamW(AdamWOptions options) : options_(options) {
  check_options(options_);
}

namespace {

AdamW::State make_state(const Parameter& p, const AdamWOptions& o) {
  MemoryCategoryScope category(MemoryCategory::kOptimizerState);
  AdamW::State s;
  const Shape& shape = p.value.shape();
  switch (o.moments) {
    case MomentStorage::kFloat32:
    case MomentStorage::kBfloat16: {
      const DType dtype = o.moments == MomentStorage::kFloat32 ? DType::float32 : DType::bfloat16;
      s.m = zeros(shape, dtype);
      s.v = zeros(shape, dtype);
      break;
    }
    case MomentStorage::kFp8: {
      const std::int64_t blocks = ceil_div(p.value.numel(), kMomentBlock);
      s.m = zeros(shape, DType::float8_e4m3fn);
      s.v = zeros(shape, DType::float8_e4m3fn);
      s.m_scale = full({blocks}, 1.0, DType::float32);
      s.v_scale = full({blocks}, 1.0, DType::float32);
      break;
    }
  }
  if (o.master == MasterWeights::kBf16Kahan) s.compensation = zeros(shape, DType::bfloat16);
  return s;
}

// One chunk [first, first + n) of a parameter: read the moments, value and gradient as float32, update them, store
// them back in their storage. Random draws follow the elements' positions in the whole parameter.
void update_chunk(const AdamWOptions& o, const StepConstants& k, std::uint64_t stream, Parameter& p, AdamW::State& s,
                  std::int64_t first, std::int64_t n) {
  alignas(64) float g[kChunk], w[kChunk], m[kChunk], v[kChunk];
  const std::int64_t position = p.first_element + first;
  widen(p.grad, first, n, g);
  widen(p.value, first, n, w);
  if (o.moments == MomentStorage::kFp8) {
    decode_blocks(s.m, s.m_scale, first, n, m);
    decode_blocks(s.v, s.v_scale, first, n, v);
    for (std::int64_t i = 0; i < n; ++i) v[i] *= v[i];  // stored: sqrt(v)
  } else {
    widen(s.m, first, n, m);
    widen(s.v, first, n, v);
  }
  // The update (torch's order of operations); w becomes the new value in float32.
  for (std::int64_t i = 0; i < n; ++i) {
    m[i] = k.b1 * m[i] + k.one_minus_b1 * g[i];
    v[i] = k.b2 * v[i] + k.one_minus_b2 * g[i] * g[i];
    const float denom = std::sqrt(v[i]) / k.sqrt_c2 + k.eps;
    const float old = w[i];
    w[i] = w[i] * k.keep - k.step_size * (m[i] / denom);
    g[i] = old;  // kept for the Kahan compensation below
  }
  switch (o.master) {
    case MasterWeights::kFloat32:
      std::copy_n(w, n, p.value.data<float>() + first);
      break;
    case MasterWeights::kBf16Stochastic: {
      // 16 random bits per element, four elements per 64-bit draw: the element at position e takes bits 16 (e % 4)
      // of splitmix64(stream + e / 4) (chunks and parts start at multiples of 4, so any split draws the same bits).
      bfloat16* out = p.value.data<bfloat16>() + first;
      for (std::int64_t i = 0; i < n; i += 4) {
        const std::uint64_t draw = splitmix64_finalize(stream + static_cast<std::uint64_t>((position + i) / 4));
        for (std::int64_t j = i; j < std::min(n, i + 4); ++j) {
          const auto bits = static_cast<std::uint16_t>(draw >> (16 * (j - i)));
          out[j] = bfloat16::from_float_stochastic(w[j], bits);
        }
      }
      break;
    }
    case MasterWeights::kBf16Kahan: {
      // Kahan summation of the updates into a bfloat16 value: c carries what the last rounding lost.
      bfloat16* out = p.value.data<bfloat16>() + first;
      bfloat16* comp = s.compensation.data<bfloat16>() + first;
      for (std::int64_t i = 0; i < n; ++i) {
        const float old = g[i];
        const float y = (w[i] - old) + comp[i].to_float();
        const bfloat16 t = bfloat16::from_float(old + y);
        comp[i] = bfloat16::from_float(y - (t.to_float() - old));
        out[i] = t;
      }
      break;
    }
  }
  if (o.moments == MomentStorage::kFp8) {
    for (std::int64_t i = 0; i < n; ++i) v[i] = std::sqrt(v[i]);
    encode_blocks(m, first, position, n, splitmix64_finalize(stream + 1), s.m, s.m_scale);
    encode_blocks(v, first, position, n, splitmix64_finalize(stream + 2), s.v, s.v_scale);
  } else {
    narrow_nearest(m, n, s.m, first);
    narrow_nearest(v, n, s.v, first);
  }
}

}  // namespace

std::int64_t AdamW::part_alignment() const {
  if (options_.moments == MomentStorage::kFp8) return kMomentBlock;
  return options_.master == MasterWeights::kBf16Stochastic ? 4 : 1;
}

// A parameter's state as the options in force store it: the moments' dtype, the FP8 moments' scale blocks, the
// Kahan buffer. A state made under other options (options() changed, or a checkpoint of another recipe) is refused
// before any update; the kernels would read it as the wrong type.
void AdamW::check_state(const Parameter& p, const State& s) const {
  const MomentStorage moments = options_.moments;
  const DType want = moments == MomentStorage::kFloat32    ? DType::float32
                     : moments == MomentStorage::kBfloat16 ? DType::bfloat16
                                                           : DType::float8_e4m3fn;
  const std::int64_t blocks = ceil_div(p.value.numel(), kMomentBlock);
  const bool kahan = options_.master == MasterWeights::kBf16Kahan;
  FP8KIT_CHECK(
      s.m.dtype() == want && s.v.dtype() == want && s.v.shape() == p.value.shape() &&
          (moments != MomentStorage::kFp8 || (s.m_scale.dtype() == DType::float32 && s.m_scale.numel() == blocks &&
                                              s.v_scale.dtype() == DType::float32 && s.v_scale.numel() == blocks)) &&
          (!kahan || (s.compensation.dtype() == DType::bfloat16 && s.compensation.shape() == p.value.shape())),
      "adamw: parameter '", p.name, "' has optimizer state of ", name(s.m.dtype()), " moments, not the ", name(moments),
      " moments", kahan ? " and Kahan buffer" : "",
      " the options store: the options changed after its first step, or a checkpoint of another recipe was "
      "loaded (start a new AdamW, or load the state its options match)");
}

void AdamW::step(std::span<Parameter* const> params, Profiler* profiler) {
  ScopedEvent event(profiler, "adamw.step", "optimizer");
  check_options(options_);
  std::set<std::string> seen;
  const std::int64_t alignment = part_alignment();
  for (const Parameter* p : params) {
    FP8KIT_CHECK(p != nullptr, "adamw: null parameter");
    check_parameter(*p, options_.master);
    FP8KIT_CHECK(p->first_element >= 0 && (p->first_element % alignment == 0 || p->value.numel() == 0),
                 "adamw: parameter '", p->name, "' is a part starting at element ", p->first_element, "; under ",
                 name(options_.moments), " moments and ", name(options_.master),
                 " master weights parts start at multiples of ", alignment);
    FP8KIT_CHECK(seen.insert(p->name).second, "adamw: two parameters are named '", p->name, "'");
    const auto it = state_.find(p->name);
    FP8KIT_CHECK(it == state_.end() || it->second.m.shape() == p->value.shape(), "adamw: parameter '", p->name,
                 "' changed shape since its optimizer state was created");
    if (it != state_.end()) check_state(*p, it->second);
  }
  // Everything is checked before anything is updated: a refused step changes nothing.
  const AdamWOptions& o = options_;
  for (Parameter* p : params) {
    auto it = state_.find(p->name);
    if (it == state_.end()) it = state_.emplace(p->name, make_state(*p, o)).first;
    State& s = it->second;
    ++s.step;
    const double t = static_cast<double>(s.step);
    const double correction1 = 1.0 - std::pow(o.beta1, t);
    const double correction2 = 1.0 - std::pow(o.beta2, t);
    const bool decays = o.decay == DecayPolicy::kAll || p->value.dim() >= 2;
    const StepConstants k{static_cast<float>(o.lr / correction1),
                          static_cast<float>(std::sqrt(correction2)),
                          static_cast<float>(decays ? 1.0 - o.lr * o.weight_decay : 1.0),
                          static_cast<float>(o.beta1),
                          static_cast<float>(1.0 - o.beta1),
                          static_cast<float>(o.beta2),
                          static_cast<float>(1.0 - o.beta2),
                          static_cast<float>(o.eps)};
    const std::uint64_t stream = rounding_stream(o.rounding_seed, p->name, s.step);
    const std::int64_t n = p->value.numel(), chunks = ceil_div(n, kChunk);
    detail::RegionErrors errors;  // a chunk's checks and its FP8 moments' kernels can throw
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (go_parallel(n) && chunks > 1)
    for (std::int64_t c = 0; c < chunks; ++c) {
      errors.guard([&] {
        const std::int64_t first = c * kChunk;
        update_chunk(o, k, stream, *p, s, first, std::min(kChunk, n - first));
      });
    }
    errors.rethrow();
  }
}

void AdamW::zero_grad(std::span<Parameter* const> params) {
  for (Parameter* p : params) {
    FP8KIT_CHECK(p != nullptr, "zero_grad: null parameter");
    if (p->grad.nbytes() > 0) std::memset(p->grad.raw(), 0, static_cast<std::size_t>(p->grad.nbytes()));
  }
}

std::string first_nonfinite_grad(std::span<Parameter* const> params) {
  for (const Parameter* p : params) {
    FP8KIT_CHECK(p != nullptr, "first_nonfinite_grad: null parameter");
    const std::int64_t n = p->grad.numel();
    bool bad = false;
    if (p->grad.dtype() == DType::bfloat16) {
      const bfloat16* g = p->grad.data<bfloat16>();
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) reduction(|| : bad) if (go_parallel(n))
      for (std::int64_t i = 0; i < n; ++i) bad = bad || (g[i].bits & 0x7F80u) == 0x7F80u;
    } else {
      const float* g = p->grad.data<float>();
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) reduction(|| : bad) if (go_parallel(n))
      for (std::int64_t i = 0; i < n; ++i) bad = bad || !std::isfinite(g[i]);
    }
    if (bad) return p->name;
  }
  return {};
}

}  // namespace fp8kit::nn
