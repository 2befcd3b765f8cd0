// ScaledTensor buffers count in memory_stats() like Tensor storages: FP8 data saved for backward is measured.
#include <gtest/gtest.h>

#include <vector>

#include "fp8kit/scaling/quantize.hpp"
#include "fp8kit/tensor/memory.hpp"

namespace fp8kit {
namespace {

TEST(QuantizeMemory, ScaledTensorBuffersAreCounted) {
  std::vector<float> x(256 * 512, 1.5f);
  const std::int64_t before = memory_stats().current_bytes;
  {
    const ScaledTensor q =
        quantize(MatrixRef{x.data(), 256, 512}, {Format::e4m3fn, Overflow::kSaturate, Granularity::block(1, 128), {}});
    const std::int64_t held = memory_stats().current_bytes - before;
    // the codes (one byte each) and 256 x 4 float scales, no more than the vectors' capacities
    EXPECT_GE(held, 256 * 512 + 256 * 4 * 4);
    EXPECT_LE(held, static_cast<std::int64_t>(q.data.capacity() + q.scale_inv.capacity() * 4 + 64));
  }
  EXPECT_EQ(memory_stats().current_bytes, before);
}

}  // namespace
}  // namespace fp8kit
