// Internal helpers the nn layers share: the threshold under which a loop stays on the calling thread, and shapes
// printed for error messages and profiler arguments.
#pragma once

#include <string>

#include "fp8kit/tensor.hpp"

namespace fp8kit::nn::detail {

// Below this many multiply-adds or element visits a parallel region costs more than it saves (and an oversubscribed
// machine makes waiting threads expensive): smaller calls run on the calling thread. The result is the same either way.
inline constexpr double kParallelWork = 16384;

// "(2, 3, 4)"
inline std::string shape_string(const Shape& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

}  // namespace fp8kit::nn::detail
