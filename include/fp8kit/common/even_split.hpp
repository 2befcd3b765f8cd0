// The one way fp8kit splits n items over `count` parts: part `index` gets [n*index/count, n*(index+1)/count), as
// even as whole items allow (a global batch over ranks, row blocks over shards, a reduction's parts).
#pragma once

#include <cstdint>
#include <utility>

#include "fp8kit/common/error.hpp"

namespace fp8kit {

inline std::pair<std::int64_t, std::int64_t> even_split(std::int64_t n, int index, int count) {
  FP8KIT_CHECK(n >= 0 && count >= 1 && index >= 0 && index < count, "even_split: part ", index, " of ", count, " of ",
               n, " items (n >= 0, 0 <= index < count)");
  return {n * index / count, n * (index + 1) / count};
}

}  // namespace fp8kit
