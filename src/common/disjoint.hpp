// Internal, for every layer: outputs never share memory with their inputs. The bulk kernels read a vector ahead of
// what they write, an output wider than its input overwrites elements not yet read, and parallel chunks of one
// array run in any order: a result computed in place would depend on all three, so it is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fp8kit/common/error.hpp"

namespace fp8kit::detail {

// Error(kInvalidArgument) naming `op` and `what` when the byte ranges [in, in + in_bytes) and [out, out + out_bytes)
// overlap (empty ranges never do).
inline void check_disjoint(std::string_view op, std::string_view what, const void* in, std::size_t in_bytes,
                           const void* out, std::size_t out_bytes) {
  const auto in_begin = reinterpret_cast<std::uintptr_t>(in), out_begin = reinterpret_cast<std::uintptr_t>(out);
  FP8KIT_CHECK(in_bytes == 0 || out_bytes == 0 || in_begin + in_bytes <= out_begin || out_begin + out_bytes <= in_begin,
               op, ": the output shares memory with ", what, "; write it to a separate buffer");
}

}  // namespace fp8kit::detail
