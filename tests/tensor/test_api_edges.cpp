// The tensor layer's checks at the edges of what memory can hold, found by an audit under ASan/UBSan: products of
// dimensions past int64 wrapped inside the checks themselves (a 4 x 2^62 matrix passed as 0 elements), conversions
// ran in place over their own input, and print options without an upper bound ran out of memory.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/ops/scaled_mm.hpp"
#include "fp8kit/tensor/matrix_ref.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit {
namespace {

constexpr std::int64_t kHuge = std::int64_t{1} << 62;

TEST(ApiEdges, MatricesPastInt64AreRefusedNotWrapped) {
  const MatrixRef wide(nullptr, DType::float32, 4, kHuge);
  EXPECT_THROW(wide.check("test", DType::float32), Error);
  float x = 0.0f;
  const MatrixRef strided(&x, DType::float32, 4, 1, kHuge);  // its last row starts past int64
  EXPECT_THROW(strided.check("test", DType::float32), Error);
  std::vector<float> a(4, 1.0f), out(4, 0.0f);
  // matmul's overlap test computed the operand's extent from the stride and wrapped
  EXPECT_THROW(matmul(MatrixRef(a.data(), DType::float32, 2, 2, std::int64_t{1} << 62), MatrixRef(a.data(), 2, 2),
                      BLayout::kNK, out),
               Error);
}

TEST(ApiEdges, ReshapePastInt64IsRefused) {
  EXPECT_THROW((void)zeros({0}).reshape({std::int64_t{1} << 33, std::int64_t{1} << 31, 4}), Error);
}

TEST(ApiEdges, ConversionsRefuseAnOutputThatIsTheirInput) {
  std::vector<float> buffer(64, 1.5f);
  // float32 -> float64 over its own input: 63 of 64 results were wrong, with nothing said
  EXPECT_THROW(convert(buffer.data(), DType::float32, buffer.data(), DType::float64, 16), Error);
  EXPECT_THROW(convert(buffer.data() + 1, DType::float32, buffer.data(), DType::bfloat16, 8), Error);
  EXPECT_THROW(convert(nullptr, DType::float32, buffer.data(), DType::float16, 4), Error);  // null: UBSan's load
  std::vector<float> out(16);
  convert(buffer.data(), DType::float32, out.data(), DType::float32, 16);  // apart: fine
  EXPECT_EQ(out[15], 1.5f);
}

TEST(ApiEdges, PrintOptionsHaveBounds) {
  const Tensor t = full({2000}, 1.0, DType::float32);
  PrintOptions huge_precision;
  huge_precision.precision = 1 << 30;  // took 6.7 GB in 20 s
  EXPECT_THROW((void)to_string(t, huge_precision), Error);
  PrintOptions huge_edge;
  huge_edge.edgeitems = 2147483647;  // 2 * edgeitems overflowed int
  EXPECT_NO_THROW((void)to_string(t, huge_edge));
  PrintOptions exact;
  exact.precision = 1074;
  EXPECT_NO_THROW((void)to_string(full({1}, 1.0, DType::float32), exact));
}

}  // namespace
}  // namespace fp8kit
