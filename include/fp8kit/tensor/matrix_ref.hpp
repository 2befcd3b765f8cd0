// MatrixRef: a 2-D matrix in memory, by reference, with its element type, row stride and device: the one matrix
// view that every matrix-taking function of fp8kit reads (amax, quantize, the GEMMs' float operands, nn).
#pragma once

#include <cstdint>
#include <string_view>

#include "fp8kit/format/half.hpp"
#include "fp8kit/tensor/device.hpp"
#include "fp8kit/tensor/dtype.hpp"

namespace fp8kit {

// Row-major: element (r, c) at data + (r * stride() + c) elements of `dtype`, on `device`. It owns nothing; the
// memory must outlive it. A function takes the dtypes and devices it says and refuses the others with a one-line
// error naming itself (element()).
struct MatrixRef {
  const void* data = nullptr;
  DType dtype = DType::float32;
  std::int64_t rows = 0, cols = 0;
  std::int64_t ld = 0;  // elements from the start of one row to the next (>= cols); 0: cols (contiguous)
  Device device = Device::cpu();

  MatrixRef() = default;
  MatrixRef(const void* data, DType dtype, std::int64_t rows, std::int64_t cols, std::int64_t ld = 0,
            Device device = Device::cpu())
      : data(data), dtype(dtype), rows(rows), cols(cols), ld(ld), device(device) {}
  MatrixRef(const float* data, std::int64_t rows, std::int64_t cols, std::int64_t ld = 0)
      : MatrixRef(data, DType::float32, rows, cols, ld) {}
  MatrixRef(const bfloat16* data, std::int64_t rows, std::int64_t cols, std::int64_t ld = 0)
      : MatrixRef(data, DType::bfloat16, rows, cols, ld) {}

  std::int64_t stride() const { return ld == 0 ? cols : ld; }
  bool contiguous() const { return rows <= 1 || stride() == cols; }
  std::int64_t numel() const { return rows * cols; }

  // The elements as T, checked: throws Error(kInvalidArgument) naming `op` when the dtype is not T's, the memory
  // is not on the CPU, the shape is negative, ld is below cols, or data is null for a non-empty matrix.
  template <typename T>
  const T* element(std::string_view op) const {
    check(op, detail::kDTypeFor<T>);
    return static_cast<const T*>(data);
  }
  // Row r of the elements as T (no checks: call element() once first).
  template <typename T>
  const T* row(std::int64_t r) const {
    return static_cast<const T*>(data) + r * stride();
  }

  // The checks of element(), for a function that takes `expected`.
  void check(std::string_view op, DType expected) const;
};

}  // namespace fp8kit
