// Tensor element types: the DType registry (size, PyTorch name, kind, FP8 format) and the process-wide
// default dtype, which only a floating type with arithmetic of its own (never FP8) may be.
#pragma once

#include <array>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string_view>

#include "fp8kit/format/float8.hpp"
#include "fp8kit/format/format.hpp"
#include "fp8kit/format/half.hpp"

namespace fp8kit {

// Every element type a Tensor can hold. Named as PyTorch names them (torch.float8_e4m3fn -> float8_e4m3fn);
// `bool_` carries numpy's underscore because `bool` is a keyword (its name() is "bool").
enum class DType : std::uint8_t {
  float32,
  float64,
  float16,
  bfloat16,
  float8_e4m3fn,
  float8_e5m2,
  float8_e4m3fnuz,
  float8_e5m2fnuz,
  float8_e8m0fnu,
  int8,
  uint8,
  int16,
  int32,
  int64,
  bool_,
};

enum class DTypeKind : std::uint8_t {
  kFloat,  // IEEE-style floating types with arithmetic: float32, float64, float16, bfloat16
  kFp8,    // 8-bit storage formats: codes decoded through a Format descriptor
  kInt,    // signed and unsigned integers
  kBool,
};

// One row of the registry; everything else about a dtype is derived from it.
struct DTypeInfo {
  DType dtype;
  std::string_view name;        // as PyTorch prints it, without "torch."
  std::string_view short_name;  // fp8kit's spelling: "f32", "bf16", "e4m3fn", "i64", "bool"
  int size;                     // bytes per element
  DTypeKind kind;
  Format format;  // kFp8 only (ignored otherwise)
};

inline constexpr std::array<DTypeInfo, 15> kDTypeInfos = {{
    {DType::float32, "float32", "f32", 4, DTypeKind::kFloat, Format::e4m3fn},
    {DType::float64, "float64", "f64", 8, DTypeKind::kFloat, Format::e4m3fn},
    {DType::float16, "float16", "f16", 2, DTypeKind::kFloat, Format::e4m3fn},
    {DType::bfloat16, "bfloat16", "bf16", 2, DTypeKind::kFloat, Format::e4m3fn},
    {DType::float8_e4m3fn, "float8_e4m3fn", "e4m3fn", 1, DTypeKind::kFp8, Format::e4m3fn},
    {DType::float8_e5m2, "float8_e5m2", "e5m2", 1, DTypeKind::kFp8, Format::e5m2},
    {DType::float8_e4m3fnuz, "float8_e4m3fnuz", "e4m3fnuz", 1, DTypeKind::kFp8, Format::e4m3fnuz},
    {DType::float8_e5m2fnuz, "float8_e5m2fnuz", "e5m2fnuz", 1, DTypeKind::kFp8, Format::e5m2fnuz},
    {DType::float8_e8m0fnu, "float8_e8m0fnu", "e8m0fnu", 1, DTypeKind::kFp8, Format::e8m0fnu},
    {DType::int8, "int8", "i8", 1, DTypeKind::kInt, Format::e4m3fn},
    {DType::uint8, "uint8", "u8", 1, DTypeKind::kInt, Format::e4m3fn},
    {DType::int16, "int16", "i16", 2, DTypeKind::kInt, Format::e4m3fn},
    {DType::int32, "int32", "i32", 4, DTypeKind::kInt, Format::e4m3fn},
    {DType::int64, "int64", "i64", 8, DTypeKind::kInt, Format::e4m3fn},
    {DType::bool_, "bool", "bool", 1, DTypeKind::kBool, Format::e4m3fn},
}};

// All dtypes in registry order, for tests and listings that loop over them.
inline constexpr std::array<DType, kDTypeInfos.size()> kAllDTypes = [] {
  std::array<DType, kDTypeInfos.size()> all{};
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = kDTypeInfos[i].dtype;
  return all;
}();

constexpr const DTypeInfo& info(DType d) {
  return kDTypeInfos[static_cast<int>(d)];
}
constexpr int element_size(DType d) {
  return info(d).size;
}
// "float32", "float8_e4m3fn", "bfloat16", "int64", "bool": what PyTorch prints after "torch.".
constexpr std::string_view name(DType d) {
  return info(d).name;
}
constexpr bool is_floating(DType d) {
  return info(d).kind == DTypeKind::kFloat || info(d).kind == DTypeKind::kFp8;
}
constexpr bool is_fp8(DType d) {
  return info(d).kind == DTypeKind::kFp8;
}
constexpr bool is_integral(DType d) {
  return info(d).kind == DTypeKind::kInt;
}

// The FP8 format of an FP8 dtype; nothing for every other dtype.
constexpr std::optional<Format> fp8_format(DType d) {
  if (!is_fp8(d)) return std::nullopt;
  return info(d).format;
}
// The dtype holding codes of a format: dtype_of(Format::e4m3fn) == DType::float8_e4m3fn.
constexpr DType dtype_of(Format f) {
  for (const DTypeInfo& i : kDTypeInfos) {
    if (i.kind == DTypeKind::kFp8 && i.format == f) return i.dtype;
  }
  return DType::float32;  // unreachable: every format has a dtype (checked below)
}

// Accepts PyTorch's names with or without "torch." ("float32", "torch.bfloat16", "float8_e4m3fn", "bool"),
// PyTorch's aliases (float, double, half, short, int, long), fp8kit's short names (f32, f64, f16, bf16,
// e4m3fn, e5m2, ..., i8, u8, i16, i32, i64). Case-sensitive.
std::optional<DType> parse_dtype(std::string_view text);

// The C++ type whose values a dtype's elements are. FP8 codes are std::uint8_t (or float8<F>, which also says
// the format); bool_ is bool.
template <typename T>
concept ElementType = std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, float16> ||
    std::same_as<T, bfloat16> || std::same_as<T, std::int8_t> || std::same_as<T, std::uint8_t> ||
    std::same_as<T, std::int16_t> || std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t> ||
    std::same_as<T, bool> || std::same_as<T, float8_e4m3fn> || std::same_as<T, float8_e5m2> ||
    std::same_as<T, float8_e4m3fnuz> || std::same_as<T, float8_e5m2fnuz> || std::same_as<T, float8_e8m0fnu>;

// The dtype a C++ element type stands for (std::uint8_t: uint8; it is also accepted for every FP8 dtype).
namespace detail {
template <typename T>
inline constexpr DType kDTypeFor = dtype_of(T::format);  // float8<F>
template <>
inline constexpr DType kDTypeFor<float> = DType::float32;
template <>
inline constexpr DType kDTypeFor<double> = DType::float64;
template <>
inline constexpr DType kDTypeFor<float16> = DType::float16;
template <>
inline constexpr DType kDTypeFor<bfloat16> = DType::bfloat16;
template <>
inline constexpr DType kDTypeFor<std::int8_t> = DType::int8;
template <>
inline constexpr DType kDTypeFor<std::uint8_t> = DType::uint8;
template <>
inline constexpr DType kDTypeFor<std::int16_t> = DType::int16;
template <>
inline constexpr DType kDTypeFor<std::int32_t> = DType::int32;
template <>
inline constexpr DType kDTypeFor<std::int64_t> = DType::int64;
template <>
inline constexpr DType kDTypeFor<bool> = DType::bool_;
}  // namespace detail

template <ElementType T>
constexpr DType dtype_for() {
  return detail::kDTypeFor<T>;
}

// Whether data<T>() may view elements of dtype d: T's own dtype, or std::uint8_t for any FP8 dtype (raw codes).
template <ElementType T>
constexpr bool accepts(DType d) {
  return d == dtype_for<T>() || (std::same_as<T, std::uint8_t> && is_fp8(d));
}

// ---------------------------------------------------------------- the default dtype
// What factories without an explicit dtype create (float32 at start-up), and which dtype printing leaves
// unnamed. Process-wide and thread-safe, like torch.set_default_dtype.

// Accepts float32, float64, float16 and bfloat16. Throws Error(kInvalidArgument) for every FP8 dtype, with an
// explanation (FP8 has no arithmetic of its own and too little range and precision to hold values created
// without a scale: create tensors in float32 or bfloat16 and convert or quantize explicitly), and for integer
// and bool dtypes (the default is a floating type, as in PyTorch).
void set_default_dtype(DType d);
DType default_dtype();

namespace detail {
constexpr bool registry_is_consistent() {
  for (std::size_t i = 0; i < kDTypeInfos.size(); ++i) {
    if (static_cast<std::size_t>(kDTypeInfos[i].dtype) != i) return false;
  }
  for (Format f : kAllFormats) {
    if (info(dtype_of(f)).format != f || !is_fp8(dtype_of(f))) return false;
  }
  return true;
}
static_assert(registry_is_consistent(), "kDTypeInfos must be in enum order with one dtype per FP8 format");
}  // namespace detail

}  // namespace fp8kit
