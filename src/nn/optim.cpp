// AdamW over the FP32 master weights: per-parameter moments keyed by name, one elementwise pass per parameter;
// zero_grad and the NaN/Inf scan of gradients.
#include "fp8kit/nn/optim.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "common/parallel.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"

namespace fp8kit::nn {
namespace {

bool go_parallel(std::int64_t elements) {
  return fp8kit::detail::worth_threads(elements, fp8kit::detail::kParallelMathElements);
}

void check_parameter(const Parameter& p) {
  FP8KIT_CHECK(p.value.dtype() == DType::float32 && p.grad.dtype() == DType::float32, "adamw: parameter '", p.name,
               "' must hold float32 value and gradient");
  FP8KIT_CHECK(p.value.shape() == p.grad.shape(), "adamw: parameter '", p.name,
               "' has a gradient of another shape than its value");
}

}  // namespace

AdamW::AdamW(AdamWOptions options) : options_(options) {
  FP8KIT_CHECK(options.lr >= 0.0, "adamw: lr must be >= 0, got ", options.lr);
  FP8KIT_CHECK(options.beta1 >= 0.0 && options.beta1 < 1.0, "adamw: beta1 must be in [0, 1), got ", options.beta1);
  FP8KIT_CHECK(options.beta2 >= 0.0 && options.beta2 < 1.0, "adamw: beta2 must be in [0, 1), got ", options.beta2);
  FP8KIT_CHECK(options.eps >= 0.0, "adamw: eps must be >= 0, got ", options.eps);
  FP8KIT_CHECK(options.weight_decay >= 0.0, "adamw: weight_decay must be >= 0, got ", options.weight_decay);
}

void AdamW::step(std::span<Parameter* const> params, Profiler* profiler) {
  ScopedEvent event(profiler, "adamw.step", "optimizer");
  std::set<std::string> seen;
  for (const Parameter* p : params) {
    FP8KIT_CHECK(p != nullptr, "adamw: null parameter");
    check_parameter(*p);
    FP8KIT_CHECK(seen.insert(p->name).second, "adamw: two parameters are named '", p->name, "'");
    const auto it = state_.find(p->name);
    FP8KIT_CHECK(it == state_.end() || it->second.m.shape() == p->value.shape(), "adamw: parameter '", p->name,
                 "' changed shape since its optimizer state was created");
  }
  // Everything is checked before anything is updated: a refused step changes nothing.
  const AdamWOptions& o = options_;
  for (Parameter* p : params) {
    auto [it, created] = state_.try_emplace(p->name);
    State& s = it->second;
    if (created) {
      s.m = zeros(p->value.shape(), DType::float32);
      s.v = zeros(p->value.shape(), DType::float32);
    }
    ++s.step;
    const double t = static_cast<double>(s.step);
    const double correction1 = 1.0 - std::pow(o.beta1, t);
    const double correction2 = 1.0 - std::pow(o.beta2, t);
    const float step_size = static_cast<float>(o.lr / correction1);
    const float sqrt_c2 = static_cast<float>(std::sqrt(correction2));
    const bool decays = o.decay == DecayPolicy::kAll || p->value.dim() >= 2;
    const float keep = static_cast<float>(decays ? 1.0 - o.lr * o.weight_decay : 1.0);
    const float b1 = static_cast<float>(o.beta1), one_minus_b1 = static_cast<float>(1.0 - o.beta1);
    const float b2 = static_cast<float>(o.beta2), one_minus_b2 = static_cast<float>(1.0 - o.beta2);
    const float eps = static_cast<float>(o.eps);

    float* w = p->value.data<float>();
    const float* g = p->grad.data<float>();
    float* m = s.m.data<float>();
    float* v = s.v.data<float>();
    const std::int64_t n = p->value.numel();
#pragma omp parallel for schedule(static) if (go_parallel(n))
    for (std::int64_t i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + one_minus_b1 * g[i];
      v[i] = b2 * v[i] + one_minus_b2 * g[i] * g[i];
      const float denom = std::sqrt(v[i]) / sqrt_c2 + eps;  // torch's order of operations
      w[i] = w[i] * keep - step_size * (m[i] / denom);
    }
  }
}

void AdamW::zero_grad(std::span<Parameter* const> params) {
  for (Parameter* p : params) {
    FP8KIT_CHECK(p != nullptr, "zero_grad: null parameter");
    std::span<float> g = p->grad.span<float>();
    std::fill(g.begin(), g.end(), 0.0f);
  }
}

std::string first_nonfinite_grad(std::span<Parameter* const> params) {
  for (const Parameter* p : params) {
    FP8KIT_CHECK(p != nullptr, "first_nonfinite_grad: null parameter");
    const float* g = p->grad.data<float>();
    const std::int64_t n = p->grad.numel();
    bool bad = false;
#pragma omp parallel for schedule(static) reduction(|| : bad) if (go_parallel(n))
    for (std::int64_t i = 0; i < n; ++i) bad = bad || !std::isfinite(g[i]);
    if (bad) return p->name;
  }
  return {};
}

}  // namespace fp8kit::nn
