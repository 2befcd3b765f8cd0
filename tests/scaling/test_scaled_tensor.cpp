// ScaledTensor: quantize and dequantize Tensors of any shape and float dtype, keeping the original dtype and shape.
#include <gtest/gtest.h>

#include <cmath>

#include "fp8kit/common/error.hpp"
#include "fp8kit/scaling/scaled_tensor.hpp"

namespace fp8kit {
namespace {

TEST(ScaledTensor, RoundTripKeepsShapeAndDtype) {
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float16, DType::float64}) {
    const Tensor x = randn(Shape{3, 5, 64}, 42, DType::float32).to(dtype);
    for (const Granularity& g :
         {Granularity::tensor(), Granularity::row(), Granularity::block(2, 32), Granularity::mx()}) {
      QuantDiagnostics d;
      const ScaledTensor q = quantize(x, QuantizeOptions{Format::e4m3fn, Overflow::kSaturate, g, ScaleOptions{}}, &d);
      EXPECT_EQ(q.shape(), x.shape());
      EXPECT_EQ(q.original_dtype, dtype);
      EXPECT_EQ(q.rows, 15);
      EXPECT_EQ(q.cols, 64);
      EXPECT_EQ(q.codes().dtype(), DType::float8_e4m3fn);
      EXPECT_EQ(q.codes().shape(), x.shape());
      EXPECT_EQ(q.scales().numel(), static_cast<std::int64_t>(q.scale_inv.size()));
      const Tensor back = dequantize(q);
      EXPECT_EQ(back.dtype(), dtype);
      EXPECT_EQ(back.shape(), x.shape());
      // The same values as dequantizing the matrix in float32 and converting once.
      std::vector<float> want(static_cast<std::size_t>(x.numel()));
      dequantize(q, want);
      const Tensor want_t = tensor(std::vector<double>(want.begin(), want.end()), x.shape(), DType::float32).to(dtype);
      for (std::int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(back.item_as_double(i), want_t.item_as_double(i)) << i;
      ASSERT_TRUE(d.sqnr_db.has_value());
      EXPECT_GT(*d.sqnr_db, 25.0) << name(dtype) << " " << g.name();
    }
  }
}

TEST(ScaledTensor, RefusesNonFloatInputs) {
  const Tensor q8 = tensor({1.0, 2.0}, DType::float8_e4m3fn);
  EXPECT_THROW(quantize(q8, QuantizeOptions{}), Error);
  EXPECT_THROW(quantize(zeros(Shape{4}, DType::int32), QuantizeOptions{}), Error);
  const ScaledTensor q = quantize(ones(Shape{4}, DType::float32), QuantizeOptions{});
  EXPECT_THROW(dequantize(q, DType::float8_e5m2), Error);
  EXPECT_EQ(dequantize(q, DType::float64).dtype(), DType::float64);
}

TEST(ScaledTensor, ScalarAndEmpty) {
  const ScaledTensor s = quantize(scalar_tensor(3.0, DType::float32), QuantizeOptions{});
  EXPECT_EQ(dequantize(s).item_as_double(0), 3.0);
  EXPECT_EQ(s.shape(), Shape{});  // a 0-d tensor stays 0-d
  const ScaledTensor e = quantize(zeros(Shape{0, 8}, DType::float32), QuantizeOptions{});
  EXPECT_EQ(dequantize(e).numel(), 0);
  // With diagnostics (what fp8kit analyze asks for): an empty matrix has no block; its scale is amax 0's, 1.
  for (const DType dtype : {DType::float32, DType::bfloat16}) {
    QuantDiagnostics d;
    const ScaledTensor ed = quantize(zeros(Shape{0, 8}, dtype).matrix(), QuantizeOptions{}, &d);
    EXPECT_EQ(d.scale, std::optional<float>(1.0f)) << name(dtype);
    EXPECT_TRUE(d.exact);
    EXPECT_EQ(d.count, 0u);
  }
}

// The one type for matrices and tensors: a matrix quantized has the matrix's shape and float32 as its origin, and
// quantize_into over a tensor's ScaledTensor forgets that tensor's shape.
TEST(ScaledTensor, MatricesAndTensorsAreOneType) {
  const std::vector<float> v(6, 1.5f);
  ScaledTensor q = quantize(MatrixRef(v.data(), 2, 3), QuantizeOptions{});
  EXPECT_EQ(q.shape(), (Shape{2, 3}));
  EXPECT_EQ(q.original_dtype, DType::float32);
  EXPECT_EQ(q.codes().shape(), (Shape{2, 3}));
  q = quantize(ones(Shape{3, 1, 2}, DType::bfloat16), QuantizeOptions{});
  EXPECT_EQ(q.shape(), (Shape{3, 1, 2}));
  EXPECT_EQ(dequantize(q).dtype(), DType::bfloat16);
  quantize_into(MatrixRef(v.data(), 3, 2), QuantizeOptions{}, q);
  EXPECT_EQ(q.shape(), (Shape{3, 2}));
  EXPECT_EQ(q.original_dtype, DType::float32);
  q.data.pop_back();  // a damaged one is refused, not read past its end
  EXPECT_THROW(q.codes(), Error);
}

}  // namespace
}  // namespace fp8kit
