// Tensor: an owning, contiguous, row-major array with a dtype, a shape and a device; its factories,
// conversions between dtypes (FP8 included, through the exact codecs) and printing in PyTorch's style.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fp8kit/format/codec.hpp"
#include "fp8kit/tensor/device.hpp"
#include "fp8kit/tensor/dtype.hpp"
#include "fp8kit/tensor/matrix_ref.hpp"

namespace fp8kit {

// Sizes of the dimensions, outermost first. {} is a 0-d tensor (one element); a 0 anywhere means no elements.
using Shape = std::vector<std::int64_t>;

// "[2, 3, 4]" ("[]" for a 0-d shape): the one way fp8kit writes a shape, in messages and output.
std::string shape_string(std::span<const std::int64_t> shape);

namespace detail {
class Storage;
[[noreturn]] void throw_dtype_mismatch(std::string_view accessor, DType requested, DType actual);
[[noreturn]] void throw_not_on_host(std::string_view accessor, const Device& device);
}  // namespace detail

class Tensor {
 public:
  // An empty 1-d float32 tensor (shape {0}) on the CPU. It holds no storage.
  Tensor();

  const Shape& shape() const noexcept { return shape_; }
  // The size of one dimension; negative `dim` counts from the end (-1 is the last).
  std::int64_t size(int dim) const;
  int dim() const noexcept { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const noexcept { return numel_; }
  std::int64_t nbytes() const noexcept { return numel_ * element_size(dtype_); }
  DType dtype() const noexcept { return dtype_; }
  Device device() const noexcept { return device_; }

  // Typed access to the elements, checked against the dtype: T must be the dtype's C++ type (float for
  // float32, bfloat16, float16, std::int64_t for int64, bool for bool_, ...). FP8 codes are read as
  // std::uint8_t or as float8<F> of the tensor's format. A mismatch throws Error(kInvalidArgument) naming
  // both dtypes. An empty tensor may return nullptr. Host code only: a tensor on a CUDA device throws
  // Error(kUnsupported) (copy it with to(Device::cpu()); device code takes data_ptr()).
  template <ElementType T>
  T* data() {
    check_access<T>("data");
    return reinterpret_cast<T*>(raw());
  }
  template <ElementType T>
  const T* data() const {
    check_access<T>("data");
    return reinterpret_cast<const T*>(raw());
  }
  template <ElementType T>
  std::span<T> span() {
    check_access<T>("span");
    return {reinterpret_cast<T*>(raw()), static_cast<std::size_t>(numel_)};
  }
  template <ElementType T>
  std::span<const T> span() const {
    check_access<T>("span");
    return {reinterpret_cast<const T*>(raw()), static_cast<std::size_t>(numel_)};
  }
  // The first byte of the elements (64-byte aligned); nullptr for an empty tensor. Host code only, as data().
  std::byte* raw();
  const std::byte* raw() const;
  // The first byte on the tensor's device, unchecked (a device pointer for a CUDA tensor: for kernels and copies).
  void* data_ptr() const noexcept;
  // Whether both tensors view the same storage (copies, reshapes and same-dtype to() do).
  bool shares_storage_with(const Tensor& other) const noexcept;
  // Whether this tensor is the only one viewing its storage (an operation may then write over it).
  bool storage_is_unique() const noexcept { return storage_ != nullptr && storage_.use_count() == 1; }

  // The same elements with another shape of the same numel, sharing storage. One dimension may be -1: it is
  // inferred from the others.
  Tensor reshape(Shape shape) const;
  // The tensor as a matrix with its last dimension as the row (contiguous, its dtype and device): cols = the last
  // dimension, rows = numel / cols (rows 1 for 0-d and 1-d tensors, cols 1 for a 0-d one).
  MatrixRef matrix() const noexcept;
  // A deep copy: new storage, same dtype, shape and values.
  Tensor clone() const;

  // Conversion to another dtype, element by element, each value rounded once from its exact value.
  // float <-> FP8: the exact codecs (cast_to_fp8 / cast_from_fp8 for float32, bfloat16 and float16; encode
  // on the exact double for float64, and for FP8 -> FP8, which decodes exactly and encodes once).
  // `overflow` only matters for an FP8 target: kNonSaturating (the default) is PyTorch eager .to(), +-Inf
  // for e5m2 and NaN for the formats without Inf; kSaturate clamps to the largest finite value (Transformer
  // Engine, torchao).
  // float <-> float: round to nearest even once (float64 -> float16/bfloat16 not through float32).
  // float -> integer: truncation toward zero (as torch); NaN becomes 0, out-of-range values the type's
  // minimum or maximum (C++ leaves them undefined; fp8kit defines them).
  // integer -> float: round to nearest even once; integer -> integer: C++ conversion (modulo 2^bits).
  // anything -> bool: nonzero is true (NaN is true); bool -> anything: 0 or 1.
  // Converting to the tensor's own dtype shares storage, as PyTorch returns self (clone() copies); saturating e5m2 to
  // e5m2 on the CPU is the exception, a copy with its infinities taken to +-57344 (what kSaturate gives from any
  // other dtype).
  // On a CUDA device: float32, bfloat16 and float16 to and from FP8 (the same codec, on the device); every other
  // pair throws Error(kUnsupported) (convert on the CPU).
  Tensor to(DType dtype, Overflow overflow = Overflow::kNonSaturating) const;

  // The same elements on another device (a copy; the tensor itself when it is already there, as PyTorch's .to()).
  Tensor to(const Device& device) const;

  // The value of one element (row-major flat index), exactly for every dtype but int64 beyond 2^53 (rounded
  // to nearest even). For tests and printing, not for loops.
  double item_as_double(std::int64_t flat_index) const;

 private:
  friend Tensor empty(Shape shape, DType dtype, Device device);

  template <ElementType T>
  void check_access(std::string_view accessor) const {
    if (!device_.is_cpu()) detail::throw_not_on_host(accessor, device_);
    if (!accepts<T>(dtype_)) detail::throw_dtype_mismatch(accessor, dtype_for<T>(), dtype_);
  }

  std::shared_ptr<detail::Storage> storage_;
  Shape shape_;
  std::int64_t numel_ = 0;
  DType dtype_ = DType::float32;
  Device device_;
};

// Tensor::to's conversion on elements the caller holds: n elements of dtype `from` at `in` into dtype `to` at `out`
// (CPU memory, each aligned to its element size, apart from each other, not null; else Error(kInvalidArgument)),
// converted exactly as to() converts them. For writers that own the destination (a checkpoint writer's buffer).
void convert(const void* in, DType from, void* out, DType to, std::int64_t n,
             Overflow overflow = Overflow::kNonSaturating);

// ---------------------------------------------------------------- factories
// A dtype argument left out means default_dtype() (float32 unless set_default_dtype changed it). Storage is
// allocated on `device` (check_available: a device this build or machine does not have throws Error(kUnsupported)).

// Uninitialized elements.
Tensor empty(Shape shape, DType dtype = default_dtype(), Device device = Device::cpu());
// Same shape and device as `like`, uninitialized; `dtype` defaults to like's dtype.
Tensor empty_like(const Tensor& like);
Tensor empty_like(const Tensor& like, DType dtype);
Tensor zeros(Shape shape, DType dtype = default_dtype(), Device device = Device::cpu());
Tensor ones(Shape shape, DType dtype = default_dtype(), Device device = Device::cpu());
// Every element is `value` converted to dtype as to() converts a float64 (FP8: non-saturating, so 1000.0 in
// float8_e4m3fn is NaN).
Tensor full(Shape shape, double value, DType dtype = default_dtype(), Device device = Device::cpu());

// A 1-d tensor of the values, each converted to dtype as to() converts a float64 with its default policy
// (PyTorch's torch.tensor(values, dtype=...): non-saturating for FP8). tensor({1.0, 1.5, 1.25},
// DType::float8_e4m3fn).
Tensor tensor(std::initializer_list<double> values, DType dtype = default_dtype());
// A 1-d tensor of the values.
Tensor tensor(std::span<const double> values, DType dtype = default_dtype());
// The values in row-major order with a shape whose numel is values.size().
Tensor tensor(std::span<const double> values, Shape shape, DType dtype = default_dtype());
// A 0-d tensor.
Tensor scalar_tensor(double value, DType dtype = default_dtype());

// Seeded random tensors of a floating, non-FP8 dtype (for FP8, create in float32 and convert with to()).
// Counter-based: element i depends only on (seed, i), so the result does not depend on threads and a prefix
// of a larger tensor equals a smaller tensor with the same seed. Algorithm (fixed; see docs/tensor.md):
//   rand:  64 bits from stochastic_bits(seed, 2i) (high) and stochastic_bits(seed, 2i+1) (low); their top p bits
//          k give k * 2^-p, with p the dtype's significand precision (float32 24, float64 53, float16 11,
//          bfloat16 8): uniform on [0, 1), never 1, exact in the dtype.
//   randn: Box-Muller on element pairs (2j, 2j+1): u1 = (k1 + 1) * 2^-53 from counters (4j, 4j+1), u2 = k2 *
//   2^-53
//          from (4j+2, 4j+3); r = sqrt(-2 ln u1); element 2j is r cos(2 pi u2), element 2j+1 is r sin(2 pi
//          u2), computed in double and rounded once to the dtype.
Tensor rand(Shape shape, std::uint64_t seed, DType dtype = default_dtype());
Tensor randn(Shape shape, std::uint64_t seed, DType dtype = default_dtype());

// ---------------------------------------------------------------- printing
// PyTorch's printing options (torch.set_printoptions), passed explicitly instead of set globally.
struct PrintOptions {
  int precision = 4;              // digits after the decimal point (0 to 1074: enough for any double exactly)
  std::int64_t threshold = 1000;  // summarize tensors with more elements than this
  int edgeitems = 3;              // elements kept at each end of a summarized dimension (>= 1)
  int linewidth = 80;             // characters per line before wrapping
  std::optional<bool> sci_mode;   // force scientific notation on or off; by default chosen from the values
};

// As PyTorch's repr: "tensor([1.0000, 1.5000, 1.2500], dtype=float8_e4m3fn)". float16, bfloat16 and FP8
// values are printed as their float32 values; integer mode ("1.", "2."), fixed ("1.5000") or scientific
// ("1.0000e-05") from the nonzero finite values; nan, inf, -inf; right-aligned columns; summarization with
// "..."; wrapping at the line width; no dtype suffix for the default dtype, int64 and bool (dtype names
// without "torch.").
std::string to_string(const Tensor& t, const PrintOptions& options = {});
std::ostream& operator<<(std::ostream& out, const Tensor& t);

}  // namespace fp8kit
