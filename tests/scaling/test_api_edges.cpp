// The scaling layer's checks of hand-built inputs (an audit under ASan/UBSan): a ScaledTensor whose rows x cols
// wraps past int64 or is negative, an epsilon no scale can come from, and a delayed-scaling blob whose settings are
// out of range (a malformed blob is kParse, as the header says).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/ops/scaled_mm.hpp"
#include "fp8kit/scaling/quantize.hpp"
#include "fp8kit/scaling/recipe.hpp"
#include "fp8kit/scaling/scale.hpp"

namespace fp8kit {
namespace {

ScaledTensor hand_built(std::int64_t rows, std::int64_t cols, Granularity g) {
  ScaledTensor q;
  q.rows = rows;
  q.cols = cols;
  q.granularity = g;
  q.scale_inv.assign(1, 1.0f);
  return q;
}

TEST(ScalingApiEdges, ShapesPastInt64OrNegativeAreRefused) {
  const ScaledTensor huge = hand_built(4, std::int64_t{1} << 62, Granularity::tensor());
  EXPECT_THROW((void)scaled_mm(huge, huge), Error);  // wrapped to 0 codes and segfaulted
  std::vector<float> out;
  EXPECT_THROW(dequantize(huge, out), Error);
  EXPECT_THROW((void)huge.checked_numel("test"), Error);
  ScaledTensor negative = hand_built(-2, -3, Granularity::tensor());
  negative.data.assign(6, 0x38);
  std::vector<float> six(6, -7.0f);
  EXPECT_THROW(dequantize(negative, six), Error);  // returned, writing nothing
  EXPECT_EQ(six[0], -7.0f);
  EXPECT_THROW((void)quantize(MatrixRef(nullptr, DType::float32, 4, std::int64_t{1} << 62), {}), Error);
}

TEST(ScalingApiEdges, AnEpsilonNoScaleComesFromIsRefused) {
  const std::vector<float> x(8, 1.0f);
  for (float epsilon : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), -1.0f}) {
    QuantizeOptions options;
    options.scale.epsilon = epsilon;  // Inf made every code 0
    EXPECT_THROW((void)quantize(MatrixRef(x.data(), 2, 4), options), Error) << epsilon;
    EXPECT_THROW((void)compute_scale(1.0f, Format::e4m3fn, options.scale), Error) << epsilon;
  }
  QuantizeOptions torchao;
  torchao.scale.epsilon = 1e-12f;
  EXPECT_NO_THROW((void)quantize(MatrixRef(x.data(), 2, 4), torchao));
}

TEST(ScalingApiEdges, ABlobWithSettingsOutOfRangeIsAParseError) {
  DelayedScalingConfig config;
  config.history_length = 1;
  std::vector<std::uint8_t> blob = DelayedScaling(config).serialize();
  blob[20] = 200;  // the margin's low byte: 200 is past -127 .. 127
  try {
    (void)DelayedScaling::deserialize(blob);
    FAIL() << "a margin of 200 was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kParse) << e.what();
  }
}

}  // namespace
}  // namespace fp8kit
