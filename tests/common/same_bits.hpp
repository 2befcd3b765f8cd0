// Bit-for-bit equality of two tensors, the comparison the tests share: the same dtype, shape and bytes. A tensor on
// a CUDA device is copied to the host first.
#pragma once

#include <cstring>

#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit::testing {

inline bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ha = a.device().is_cpu() ? a : a.to(Device::cpu());
  const Tensor hb = b.device().is_cpu() ? b : b.to(Device::cpu());
  return ha.nbytes() == hb.nbytes() &&
         (ha.nbytes() == 0 || std::memcmp(ha.raw(), hb.raw(), static_cast<std::size_t>(ha.nbytes())) == 0);
}

}  // namespace fp8kit::testing
