// Helpers the scaling tests share.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <string>

#include "fp8kit/scaling/amax.hpp"

namespace fp8kit::testing {

// Two amax results alike: the amax's bits and both counts.
inline void expect_same(const AmaxResult& got, const AmaxResult& want, const std::string& what) {
  EXPECT_EQ(std::bit_cast<std::uint32_t>(got.amax), std::bit_cast<std::uint32_t>(want.amax)) << what;
  EXPECT_EQ(got.nan_count, want.nan_count) << what;
  EXPECT_EQ(got.inf_count, want.inf_count) << what;
}

}  // namespace fp8kit::testing
