// Seeded rand and randn: counter-based (element i depends only on seed and i, through stochastic_bits), so
// results are reproducible for any thread count. The algorithm is fixed; docs/tensor.md states it.
#include <cmath>
#include <cstdint>
#include <numbers>

#include "common/parallel.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/format/codec.hpp"
#include "fp8kit/tensor/tensor.hpp"
#include "tensor/element.hpp"

namespace fp8kit {
namespace {

constexpr std::int64_t kParallelThreshold = detail::kParallelRandomElements;

// 64 random bits for counter pair (2c, 2c + 1).
std::uint64_t bits64(std::uint64_t seed, std::uint64_t c) {
  return (static_cast<std::uint64_t>(stochastic_bits(seed, 2 * c)) << 32) | stochastic_bits(seed, 2 * c + 1);
}

// Significand precision p: k * 2^-p for k < 2^p is exact in the dtype and below 1.
template <typename T>
constexpr int precision_bits() {
  if constexpr (std::same_as<T, double>)
    return 53;
  else if constexpr (std::same_as<T, float>)
    return 24;
  else if constexpr (std::same_as<T, float16>)
    return 11;
  else
    return 8;  // bfloat16
}

void check_random_dtype(const char* what, DType dtype) {
  FP8KIT_CHECK(info(dtype).kind == DTypeKind::kFloat, what, "(): dtype ", name(dtype),
               " is not supported; random tensors are float32, float64, float16 or bfloat16",
               is_fp8(dtype) ? " (for FP8, create in float32 and convert: randn(shape, seed).to(dtype))" : "");
}

// Calls fill(T* out) with the tensor's element type (one of the four floating dtypes).
template <typename Fill>
void with_float_type(Tensor& t, Fill&& fill) {
  detail::visit_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, float16> ||
                  std::same_as<T, bfloat16>) {
      fill(reinterpret_cast<T*>(t.raw()));
    }
  });
}

}  // namespace

Tensor rand(Shape shape, std::uint64_t seed, DType dtype) {
  check_random_dtype("rand", dtype);
  Tensor t = empty(std::move(shape), dtype);
  const std::int64_t n = t.numel();
  with_float_type(t, [&]<typename T>(T* out) {
    constexpr int p = precision_bits<T>();
    const double quantum = std::ldexp(1.0, -p);
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (n >= kParallelThreshold)
    for (std::int64_t i = 0; i < n; ++i) {
      const double u = static_cast<double>(bits64(seed, static_cast<std::uint64_t>(i)) >> (64 - p)) * quantum;
      out[i] = detail::round_from_double<T>(u, Overflow::kNonSaturating);  // exact
    }
  });
  return t;
}

Tensor randn(Shape shape, std::uint64_t seed, DType dtype) {
  check_random_dtype("randn", dtype);
  Tensor t = empty(std::move(shape), dtype);
  const std::int64_t n = t.numel();
  with_float_type(t, [&]<typename T>(T* out) {
    const double quantum = std::ldexp(1.0, -53);
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (n >= kParallelThreshold)
    for (std::int64_t i = 0; i < n; ++i) {
      const auto j = static_cast<std::uint64_t>(i / 2);
      const double u1 = static_cast<double>((bits64(seed, 2 * j) >> 11) + 1) * quantum;  // (0, 1]
      const double u2 = static_cast<double>(bits64(seed, 2 * j + 1) >> 11) * quantum;    // [0, 1)
      const double r = std::sqrt(-2.0 * std::log(u1));
      const double angle = 2.0 * std::numbers::pi * u2;
      const double z = (i % 2 == 0) ? r * std::cos(angle) : r * std::sin(angle);
      out[i] = detail::round_from_double<T>(z, Overflow::kNonSaturating);
    }
  });
  return t;
}

}  // namespace fp8kit
