// Helpers the nn tests share: seeded random float32 tensors and the central finite difference used to check
// gradients.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit::nn::testing {

// normal(offset, stddev) float32 values, seeded.
inline Tensor random(Shape shape, std::uint64_t seed, double stddev = 1.0, double offset = 0.0) {
  Tensor t = randn(std::move(shape), seed, DType::float32);
  for (float& v : t.span<float>()) v = static_cast<float>(v * stddev + offset);
  return t;
}

// The central difference (L(x+) - L(x-)) / (x+ - x-) of `loss` in the element *x, with x+- = x +- e rounded to
// float: dividing by the step float actually took, not 2e, keeps that rounding (~2^-24 |x| / e) out of the result.
template <typename Loss>
double central_difference(float* x, float e, Loss&& loss) {
  const float x0 = *x, up_x = x0 + e, down_x = x0 - e;
  *x = up_x;
  const double up = loss();
  *x = down_x;
  const double down = loss();
  *x = x0;
  return (up - down) / (double{up_x} - double{down_x});
}

// sqrt(sum (got - want)^2 / sum want^2): the error relative to the reference's norm.
inline double rel_error(const Tensor& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  const auto g = got.span<float>();
  EXPECT_EQ(g.size(), want.size());
  for (std::size_t i = 0; i < want.size() && i < g.size(); ++i) {
    num += (g[i] - want[i]) * (g[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// A layer's outputs and gradients in double, from its definition, and what one forward and backward gave.
struct Expected {
  std::vector<double> y, dx, dw, db;
};
struct RunResult {
  Tensor y, dx, dw, db;
  std::int64_t saved_bytes = 0;  // what the forward saved for the backward
};

}  // namespace fp8kit::nn::testing
