// Tensor::to: conversion between any two dtypes. float32/bfloat16/float16 <-> FP8 run on the bulk SIMD
// kernels (bit-identical to the scalar codec); every other pair goes element by element through
// convert_element.
#include <bit>
#include <cstdint>
#include <cstring>
#include <span>

#include "common/disjoint.hpp"
#include "common/parallel.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/convert/convert.hpp"
#include "fp8kit/convert/cuda_convert.hpp"
#include "fp8kit/tensor/tensor.hpp"
#include "tensor/element.hpp"

namespace fp8kit {
namespace {

// Arrays at least this long are split over threads in the element-wise path.
constexpr std::int64_t kParallelThreshold = detail::kParallelLoopElements;

template <typename T>
constexpr bool kHasBulkKernel = std::same_as<T, float> || std::same_as<T, bfloat16> || std::same_as<T, float16>;

template <typename S, typename D>
void convert_elements(const S* in, D* out, std::int64_t n, Overflow overflow) {
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (n >= kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) out[i] = detail::convert_element<D>(in[i], overflow);
}

// float32 -> bfloat16, the conversion training does most (bf16 GEMM inputs, saved activations): bfloat16::from_float
// written with integer selects only, so the loop vectorizes (the generic loop's NaN branch kept it scalar).
// Bit-identical to from_float: round to nearest even, NaN quieted with its sign and top payload bits.
void convert_elements(const float* in, bfloat16* out, std::int64_t n, Overflow /*overflow*/) {
  auto* dst = reinterpret_cast<std::uint16_t*>(out);  // bfloat16 is a 16-bit standard-layout wrapper
  const bool threaded = n >= kParallelThreshold;
#pragma omp parallel for simd num_threads(::fp8kit::num_threads()) schedule(static) if (parallel : threaded)
  for (std::int64_t i = 0; i < n; ++i) {
    const auto u = std::bit_cast<std::uint32_t>(in[i]);
    const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    const std::uint32_t quiet_nan = (u >> 16) | 0x0040u;
    dst[i] = static_cast<std::uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
  }
}

template <typename S, typename D>
void convert(const void* src, void* dst, std::int64_t count, Overflow overflow) {
  const auto n = static_cast<std::size_t>(count);
  const S* in = static_cast<const S*>(src);
  D* out = static_cast<D*>(dst);
  if constexpr (kHasBulkKernel<S> && detail::Fp8Element<D>) {
    cast_to_fp8(std::span<const S>(in, n), std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(out), n),
                CastOptions{D::format, overflow});
  } else if constexpr (detail::Fp8Element<S> && kHasBulkKernel<D>) {
    cast_from_fp8(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(in), n), S::format,
                  std::span<D>(out, n));
  } else {
    convert_elements(in, out, count, overflow);
  }
}

// Whether converting `dtype` to itself under `overflow` changes values: saturating a format with infinities.
bool saturates_infinities(DType dtype, Overflow overflow) {
  return is_fp8(dtype) && overflow == Overflow::kSaturate && descriptor(*fp8_format(dtype)).has_inf;
}

}  // namespace

void convert(const void* in, DType from, void* out, DType to, std::int64_t n, Overflow overflow) {
  FP8KIT_CHECK(n >= 0, "convert: negative element count ", n);
  if (n == 0) return;
  FP8KIT_CHECK(in != nullptr && out != nullptr, "convert: null ", in == nullptr ? "input" : "output", " for ", n,
               " elements");
  std::int64_t in_bytes = 0, out_bytes = 0;
  FP8KIT_CHECK(!__builtin_mul_overflow(n, static_cast<std::int64_t>(element_size(from)), &in_bytes) &&
                   !__builtin_mul_overflow(n, static_cast<std::int64_t>(element_size(to)), &out_bytes),
               "convert: ", n, " elements are more than memory can hold");
  detail::check_disjoint("convert", "the input", in, static_cast<std::size_t>(in_bytes), out,
                         static_cast<std::size_t>(out_bytes));
  FP8KIT_CHECK(reinterpret_cast<std::uintptr_t>(in) % element_size(from) == 0 &&
                   reinterpret_cast<std::uintptr_t>(out) % element_size(to) == 0,
               "convert: the elements are not aligned to their size (", name(from), " -> ", name(to), ")");
  // The same dtype: a copy, except that saturating takes a format's infinities (e5m2's) to its largest finite value,
  // as from any other source (the element path below does).
  if (from == to && !saturates_infinities(from, overflow)) {
    std::memcpy(out, in, static_cast<std::size_t>(n) * element_size(from));
    return;
  }
  detail::visit_dtype(from, [&](auto src_tag) {
    detail::visit_dtype(to, [&](auto dst_tag) {
      using S = typename decltype(src_tag)::type;
      using D = typename decltype(dst_tag)::type;
      convert<S, D>(in, out, n, overflow);
    });
  });
}

Tensor Tensor::to(DType dtype, Overflow overflow) const {
  // The same dtype is this tensor, except that saturating takes e5m2's infinities to its largest finite value (as
  // convert() does). CUDA converts no FP8 to FP8: on a device that one is refused below, not skipped with the
  // infinities kept.
  if (dtype == dtype_ && !saturates_infinities(dtype, overflow)) return *this;
  if (!device_.is_cpu()) {
    // On a CUDA device: float32 / bfloat16 / float16 <-> FP8 through the CUDA casts (the same scalar codec).
    const bool wide_from = dtype_ == DType::float32 || dtype_ == DType::bfloat16 || dtype_ == DType::float16;
    const bool wide_to = dtype == DType::float32 || dtype == DType::bfloat16 || dtype == DType::float16;
    FP8KIT_CHECK_KIND(
        (wide_from && is_fp8(dtype)) || (is_fp8(dtype_) && wide_to), ErrorKind::kUnsupported,
        "Tensor::to(): ", name(dtype_), " -> ", name(dtype), " on ", to_string(device_),
        " is not supported (CUDA converts float32, bfloat16 and float16 to and from FP8); convert on the ",
        "CPU: to(Device::cpu()) first");
    Tensor out = empty(shape_, dtype, device_);
    const int device = device_.index;
    if (is_fp8(dtype)) {
      const CastOptions options{*fp8_format(dtype), overflow};
      auto* codes = static_cast<std::uint8_t*>(out.data_ptr());
      detail::visit_dtype(dtype_, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (kHasBulkKernel<T>)
          cuda::cast_to_fp8(static_cast<const T*>(data_ptr()), codes, numel_, options, device);
      });
    } else {
      const auto* codes = static_cast<const std::uint8_t*>(data_ptr());
      detail::visit_dtype(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (kHasBulkKernel<T>) {
          cuda::cast_from_fp8(codes, *fp8_format(dtype_), static_cast<T*>(out.data_ptr()), numel_, 1.0f, device);
        }
      });
    }
    return out;
  }
  Tensor out = empty(shape_, dtype, device_);
  convert(raw(), dtype_, out.raw(), dtype, numel_, overflow);
  return out;
}

}  // namespace fp8kit
