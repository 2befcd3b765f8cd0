// Element-level conversion between any two dtypes, each value rounded once from its exact value, and the one
// place that maps a runtime DType to its C++ element type (visit_dtype).
#pragma once

#include <bit>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "fp8kit/format/codec.hpp"
#include "fp8kit/format/float8.hpp"
#include "fp8kit/format/half.hpp"
#include "fp8kit/tensor/dtype.hpp"

namespace fp8kit::detail {

// Calls f(std::type_identity<T>{}) with T the C++ element type of d (float8<F> for FP8 dtypes).
template <typename F>
constexpr decltype(auto) visit_dtype(DType d, F&& f) {
  switch (d) {
    case DType::float32:
      return f(std::type_identity<float>{});
    case DType::float64:
      return f(std::type_identity<double>{});
    case DType::float16:
      return f(std::type_identity<float16>{});
    case DType::bfloat16:
      return f(std::type_identity<bfloat16>{});
    case DType::float8_e4m3fn:
      return f(std::type_identity<float8_e4m3fn>{});
    case DType::float8_e5m2:
      return f(std::type_identity<float8_e5m2>{});
    case DType::float8_e4m3fnuz:
      return f(std::type_identity<float8_e4m3fnuz>{});
    case DType::float8_e5m2fnuz:
      return f(std::type_identity<float8_e5m2fnuz>{});
    case DType::float8_e8m0fnu:
      return f(std::type_identity<float8_e8m0fnu>{});
    case DType::int8:
      return f(std::type_identity<std::int8_t>{});
    case DType::uint8:
      return f(std::type_identity<std::uint8_t>{});
    case DType::int16:
      return f(std::type_identity<std::int16_t>{});
    case DType::int32:
      return f(std::type_identity<std::int32_t>{});
    case DType::int64:
      return f(std::type_identity<std::int64_t>{});
    case DType::bool_:
      return f(std::type_identity<bool>{});
  }
  return f(std::type_identity<float>{});  // unreachable for a valid DType
}

template <typename T>
concept IntegerElement = std::integral<T>;  // bool included
template <typename T>
concept FloatElement = !IntegerElement<T>;  // float, double, float16, bfloat16, float8<F>
template <typename T>
concept Fp8Element = FloatElement<T> && requires {
  T::format;
};
template <typename T>
concept HalfElement = std::same_as<T, float16> || std::same_as<T, bfloat16>;

// The exact value of a floating element (every float32, float16, bfloat16 and FP8 value is a double).
template <FloatElement T>
double exact_value(T x) {
  if constexpr (std::same_as<T, double>)
    return x;
  else if constexpr (std::same_as<T, float>)
    return x;
  else if constexpr (HalfElement<T>)
    return x.to_float();
  else
    return x.to_double();
}

// Round to float32 with round-to-odd: exact values stay, others become whichever neighbour has an odd last
// bit. A second rounding, to nearest even, to a format of p <= (24 - 2) / 2 = 11 significand bits (float16,
// bfloat16) then equals rounding the original once (Boldo and Melquiond), so double -> float16 does not
// suffer double rounding.
inline float round_to_odd_float(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);  // truncate (inf -> max)
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) | 1u);
}

// An integer as a double with round-to-odd (exact below 2^53), for a second rounding to at most 25
// significand bits (round-to-odd to 53 then to 24 bits is round-to-odd to 24 bits, so float16 and bfloat16
// work too).
inline double round_to_odd_double(std::int64_t x) {
  const std::uint64_t u = x < 0 ? 0 - static_cast<std::uint64_t>(x) : static_cast<std::uint64_t>(x);
  if (u < (std::uint64_t{1} << 53)) return static_cast<double>(x);
  const int drop = (64 - std::countl_zero(u)) - 53;
  std::uint64_t kept = u >> drop;
  if ((u & ((std::uint64_t{1} << drop) - 1)) != 0) kept |= 1;
  const double m = std::ldexp(static_cast<double>(kept), drop);
  return x < 0 ? -m : m;
}

// A double (exact, or round-to-odd with at least two bits to spare) rounded once to a floating element type.
template <FloatElement T>
T round_from_double(double v, Overflow overflow) {
  if constexpr (std::same_as<T, double>)
    return v;
  else if constexpr (std::same_as<T, float>)
    return static_cast<float>(v);
  else if constexpr (HalfElement<T>)
    return T::from_float(round_to_odd_float(v));
  else
    return T::from_bits(encode(v, EncodeSpec{T::format, overflow}));
}

// Truncation toward zero; NaN -> 0, out of range -> the type's minimum or maximum.
template <std::integral I>
I truncate_to_integer(double v) {
  if (std::isnan(v)) return 0;
  const double t = std::trunc(v);
  constexpr double lo = static_cast<double>(std::numeric_limits<I>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<I>::max());
  if (t <= lo) return std::numeric_limits<I>::min();
  if (t >= hi) return std::numeric_limits<I>::max();  // hi may round up (int64: 2^63): >= keeps it in range
  return static_cast<I>(t);
}

// One element from S to D (see Tensor::to for the rules).
template <typename D, typename S>
D convert_element(S x, Overflow overflow) {
  if constexpr (std::same_as<D, bool>) {
    if constexpr (IntegerElement<S>)
      return x != 0;
    else
      return exact_value(x) != 0.0;  // NaN != 0 is true
  } else if constexpr (IntegerElement<S> && IntegerElement<D>) {
    return static_cast<D>(x);
  } else if constexpr (IntegerElement<S>) {
    if constexpr (std::same_as<D, float> || std::same_as<D, double>)
      return static_cast<D>(x);  // one rounding
    else
      return round_from_double<D>(round_to_odd_double(static_cast<std::int64_t>(x)), overflow);
  } else if constexpr (IntegerElement<D>) {
    return truncate_to_integer<D>(exact_value(x));
  } else {
    return round_from_double<D>(exact_value(x), overflow);
  }
}

}  // namespace fp8kit::detail
