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
  FP8KIT_CHECK(data != nullptr || rows * cols == 0, op, ": null data for a ", rows, "x", cols, " matrix");
}

}  // namespace fp8kit
