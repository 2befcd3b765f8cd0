// The checks of MatrixRef (fp8kit/tensor/matrix_ref.hpp): one line naming the operation and what does not fit.
#include "fp8kit/tensor/matrix_ref.hpp"

#include "fp8kit/common/error.hpp"

namespace fp8kit {

void MatrixRef::check(std::string_view op, DType expected) const {
  FP8KIT_CHECK(rows >= 0 && cols >= 0, op, ": negative shape ", rows, "x", cols);
  FP8KIT_CHECK(dtype == expected, op, ": the matrix is ", name(dtype), ", it takes ", name(expected),
               " (convert it first)");
  FP8KIT_CHECK(device.is_cpu(), op, ": the matrix is on ", to_string(device),
               "; this operation runs on the CPU only (copy it to the host first)");
  FP8KIT_CHECK(ld == 0 || ld >= cols, op, ": row stride ", ld, " is below the ", cols,
               " columns (give the distance between row starts, or 0 for contiguous rows)");
  // No matrix whose elements (or whose last row's end) lie past int64 can be in memory; the products below and every
  // kernel's index arithmetic would wrap.
  std::int64_t elements = 0, span = 0, bytes = 0;
  FP8KIT_CHECK(!__builtin_mul_overflow(rows, cols, &elements) &&
                   (rows == 0 || !__builtin_mul_overflow(rows - 1, stride(), &span)) &&
                   !__builtin_add_overflow(span, cols, &span) &&
                   !__builtin_mul_overflow(span, static_cast<std::int64_t>(element_size(dtype)), &bytes),
               op, ": a ", rows, "x", cols, " matrix (row stride ", stride(),
               ") has more elements than memory can hold");
  FP8KIT_CHECK(data != nullptr || elements == 0, op, ": null data for a ", rows, "x", cols, " matrix");
}

}  // namespace fp8kit
