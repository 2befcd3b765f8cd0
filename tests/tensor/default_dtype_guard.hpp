// Test helper: restores the process-wide default dtype when a test that changes it ends, pass or fail.
// Header-only; included by the tensor tests that call set_default_dtype.
#pragma once

#include "fp8kit/tensor/dtype.hpp"

namespace fp8kit {

class DefaultDTypeGuard {
 public:
  DefaultDTypeGuard() : saved_(default_dtype()) {}
  ~DefaultDTypeGuard() { set_default_dtype(saved_); }
  DefaultDTypeGuard(const DefaultDTypeGuard&) = delete;
  DefaultDTypeGuard& operator=(const DefaultDTypeGuard&) = delete;

 private:
  DType saved_;
};

}  // namespace fp8kit
