// Tensor's shape and storage handling (typed access checks, reshape, clone, element reads) and the factories
// that allocate and fill: empty, zeros, ones, full, tensor, scalar_tensor.
#include "fp8kit/tensor/tensor.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <ostream>

#include "fp8kit/common/error.hpp"
#include "tensor/cuda_backend.hpp"
#include "tensor/element.hpp"
#include "tensor/storage.hpp"

namespace fp8kit {
namespace {

// Element types are the sizes the registry says (float8<F> is one byte, bool one byte, ...).
constexpr bool sizes_match() {
  bool ok = true;
  for (DType d : kAllDTypes) {
    detail::visit_dtype(d, [&](auto tag) {
      using T = typename decltype(tag)::type;
      ok = ok && sizeof(T) == static_cast<std::size_t>(element_size(d)) && dtype_for<T>() == d;
    });
  }
  return ok;
}
static_assert(sizes_match(), "every element type must have its dtype's size");

// The number of elements, checked: no negative dimension, and a byte count that fits comfortably in int64.
std::int64_t checked_numel(const Shape& shape, DType dtype) {
  std::int64_t n = 1;
  bool has_zero = false;
  for (std::int64_t s : shape) {
    FP8KIT_CHECK(s >= 0, "invalid shape ", shape_string(shape), ": dimensions must be >= 0");
    has_zero = has_zero || s == 0;
  }
  if (has_zero) return 0;
  constexpr std::int64_t kLimit = std::int64_t{1} << 60;
  for (std::int64_t s : shape) {
    FP8KIT_CHECK(n <= kLimit / s, "shape ", shape_string(shape), " has too many elements");
    n *= s;
  }
  FP8KIT_CHECK(n <= kLimit / element_size(dtype), "shape ", shape_string(shape), " of ", name(dtype), " is too large");
  return n;
}

// Writes each value of `values` converted to dtype into t (numel == values.size()).
void fill_from_doubles(Tensor& t, std::span<const double> values) {
  detail::visit_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = reinterpret_cast<T*>(t.raw());
    for (std::size_t i = 0; i < values.size(); ++i) {
      out[i] = detail::convert_element<T>(values[i], Overflow::kNonSaturating);
    }
  });
}

}  // namespace

std::string shape_string(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace detail {
void throw_dtype_mismatch(std::string_view accessor, DType requested, DType actual) {
  FP8KIT_THROW(ErrorKind::kInvalidArgument, "Tensor::", accessor, "<T>(): T is the element type of ", name(requested),
               ", but the tensor's dtype is ", name(actual),
               is_fp8(actual) ? " (read FP8 codes as std::uint8_t or float8<F> of the same format)" : "");
}
void throw_not_on_host(std::string_view accessor, const Device& device) {
  FP8KIT_THROW(ErrorKind::kUnsupported, "Tensor::", accessor, "(): the tensor is on ", to_string(device),
               " and this operation runs on the CPU only; copy it with to(Device::cpu()) first");
}
}  // namespace detail

Tensor::Tensor() : shape_{0} {}

std::int64_t Tensor::size(int d) const {
  const int n = dim();
  FP8KIT_CHECK(d >= -n && d < n, "dimension ", d, " out of range for a ", n, "-d tensor");
  return shape_[static_cast<std::size_t>(d < 0 ? d + n : d)];
}

std::byte* Tensor::raw() {
  if (!device_.is_cpu()) detail::throw_not_on_host("raw", device_);
  return storage_ ? storage_->data() : nullptr;
}
const std::byte* Tensor::raw() const {
  if (!device_.is_cpu()) detail::throw_not_on_host("raw", device_);
  return storage_ ? storage_->data() : nullptr;
}
void* Tensor::data_ptr() const noexcept {
  return storage_ ? storage_->data() : nullptr;
}

bool Tensor::shares_storage_with(const Tensor& other) const noexcept {
  return storage_ != nullptr && storage_ == other.storage_;
}

Tensor Tensor::reshape(Shape shape) const {
  int inferred = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      FP8KIT_CHECK(inferred < 0, "reshape to ", shape_string(shape), ": only one dimension can be -1");
      inferred = static_cast<int>(i);
    } else {
      FP8KIT_CHECK(shape[i] >= 0, "reshape to ", shape_string(shape), ": dimensions must be >= 0 or -1");
      FP8KIT_CHECK(!__builtin_mul_overflow(known, shape[i], &known), "reshape of ", shape_string(shape_), " to ",
                   shape_string(shape), ": more elements than memory can hold");
    }
  }
  if (inferred >= 0) {
    FP8KIT_CHECK(known != 0 && numel_ % known == 0, "reshape of ", shape_string(shape_), " to ", shape_string(shape),
                 ": the -1 dimension cannot be inferred");
    shape[static_cast<std::size_t>(inferred)] = numel_ / known;
  }
  FP8KIT_CHECK(checked_numel(shape, dtype_) == numel_, "reshape of ", shape_string(shape_), " (", numel_,
               " elements) to ", shape_string(shape), ": the number of elements must stay the same");
  Tensor out = *this;
  out.shape_ = std::move(shape);
  return out;
}

MatrixRef Tensor::matrix() const noexcept {
  std::int64_t rows = 1, cols = 1;
  if (!shape_.empty()) {
    for (std::size_t i = 0; i + 1 < shape_.size(); ++i) rows *= shape_[i];
    cols = shape_.back();
  }
  return MatrixRef(static_cast<std::byte*>(data_ptr()), dtype_, rows, cols, 0, device_);
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_, device_);
  if (numel_ > 0) detail::copy_bytes(out.data_ptr(), device_, data_ptr(), device_, nbytes());
  return out;
}

Tensor Tensor::to(const Device& device) const {
  if (device == device_) return *this;
  Tensor out = empty(shape_, dtype_, device);
  if (numel_ > 0) detail::copy_bytes(out.data_ptr(), device, data_ptr(), device_, nbytes());
  return out;
}

double Tensor::item_as_double(std::int64_t i) const {
  FP8KIT_CHECK(i >= 0 && i < numel_, "element index ", i, " out of range for ", numel_, " elements");
  return detail::visit_dtype(dtype_, [&](auto tag) -> double {
    using T = typename decltype(tag)::type;
    const T x = reinterpret_cast<const T*>(raw())[i];
    if constexpr (std::integral<T>)
      return static_cast<double>(x);
    else
      return detail::exact_value(x);
  });
}

// ---------------------------------------------------------------- factories

Tensor empty(Shape shape, DType dtype, Device device) {
  check_available(device);
  Tensor t;
  t.numel_ = checked_numel(shape, dtype);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<detail::Storage>(t.nbytes(), device);
  return t;
}

Tensor empty_like(const Tensor& like) {
  return empty(like.shape(), like.dtype(), like.device());
}
Tensor empty_like(const Tensor& like, DType dtype) {
  return empty(like.shape(), dtype, like.device());
}

Tensor zeros(Shape shape, DType dtype, Device device) {
  // All-zero bits, as PyTorch fills them. float8_e8m0fnu has no zero: its code 0x00 is 2^-127, the value a
  // saturating cast of 0 gives (full(shape, 0.0, ...) follows the non-saturating cast and gives NaN).
  Tensor t = empty(std::move(shape), dtype, device);
  if (t.numel() == 0) return t;
  if (device.is_cpu()) {
    std::memset(t.raw(), 0, static_cast<std::size_t>(t.nbytes()));
  } else {
#ifdef FP8KIT_HAVE_CUDA
    detail::cuda_backend::zero(t.data_ptr(), device.index, t.nbytes());
#endif
  }
  return t;
}

Tensor ones(Shape shape, DType dtype, Device device) {
  return full(std::move(shape), 1.0, dtype, device);
}

Tensor full(Shape shape, double value, DType dtype, Device device) {
  if (!device.is_cpu()) {
    check_available(device);
    return full(std::move(shape), value, dtype).to(device);  // filled on the host, copied once
  }
  Tensor t = empty(std::move(shape), dtype, device);
  detail::visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = detail::convert_element<T>(value, Overflow::kNonSaturating);
    T* out = reinterpret_cast<T*>(t.raw());
    std::fill(out, out + t.numel(), v);
  });
  return t;
}

Tensor tensor(std::initializer_list<double> values, DType dtype) {
  return tensor(std::span<const double>(values.begin(), values.size()), Shape{static_cast<std::int64_t>(values.size())},
                dtype);
}

Tensor tensor(std::span<const double> values, DType dtype) {
  return tensor(values, Shape{static_cast<std::int64_t>(values.size())}, dtype);
}

Tensor tensor(std::span<const double> values, Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  FP8KIT_CHECK(t.numel() == static_cast<std::int64_t>(values.size()), "tensor(): ", values.size(),
               " values for a shape of ", t.numel(), " elements ", shape_string(t.shape()));
  fill_from_doubles(t, values);
  return t;
}

Tensor scalar_tensor(double value, DType dtype) {
  return full(Shape{}, value, dtype);
}

}  // namespace fp8kit
