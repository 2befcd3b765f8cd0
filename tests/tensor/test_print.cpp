// Printing against golden strings in PyTorch's format (torch/_tensor_str.py): fixed, integer and scientific
// modes, nan/inf, 0-d, empty, nesting, summarization, wrapping, suffixes, integer and bool dtypes.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "default_dtype_guard.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit {
namespace {

std::vector<double> iota(int n, double scale = 1.0) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i * scale;
  return v;
}

TEST(Print, TheArticlesExample) {
  EXPECT_EQ(to_string(tensor({1.0, 1.5, 1.25}, DType::float8_e4m3fn)),
            "tensor([1.0000, 1.5000, 1.2500], dtype=float8_e4m3fn)");
  std::ostringstream out;
  out << tensor({1.0, 1.5, 1.25}, DType::float8_e4m3fn);
  EXPECT_EQ(out.str(), "tensor([1.0000, 1.5000, 1.2500], dtype=float8_e4m3fn)");
}

TEST(Print, FixedModeRoundsTheFloat32Value) {
  EXPECT_EQ(to_string(tensor({0.1, 2.5})), "tensor([0.1000, 2.5000])");
  EXPECT_EQ(to_string(tensor({0.1}, DType::float16)), "tensor([0.1000], dtype=float16)");  // 0.0999755859375
  EXPECT_EQ(to_string(tensor({0.3}, DType::float8_e4m3fn)), "tensor([0.3125], dtype=float8_e4m3fn)");
  EXPECT_EQ(to_string(tensor({-1.5, 0.5, 100.25}, DType::bfloat16)),
            "tensor([ -1.5000,   0.5000, 100.0000], dtype=bfloat16)");  // 100.25 -> 100 in bfloat16
  EXPECT_EQ(to_string(tensor({0.0, 0.5})), "tensor([0.0000, 0.5000])");
}

TEST(Print, IntegerMode) {
  EXPECT_EQ(to_string(tensor({1.0, 2.0}, DType::float8_e4m3fn)), "tensor([1., 2.], dtype=float8_e4m3fn)");
  EXPECT_EQ(to_string(tensor({1.0, 2.0, 3.0})), "tensor([1., 2., 3.])");
  EXPECT_EQ(to_string(tensor({-1.0, 2.0, 100.0})), "tensor([ -1.,   2., 100.])");
  EXPECT_EQ(to_string(zeros({3})), "tensor([0., 0., 0.])");
  EXPECT_EQ(to_string(tensor({-0.0, 1.0})), "tensor([-0., 1.])");
  EXPECT_EQ(to_string(tensor({448.0, -448.0}, DType::float8_e4m3fn)), "tensor([ 448., -448.], dtype=float8_e4m3fn)");
  EXPECT_EQ(to_string(tensor({1.0, 2.0, 0.5}, DType::float8_e8m0fnu)),
            "tensor([1.0000, 2.0000, 0.5000], dtype=float8_e8m0fnu)");
}

TEST(Print, ScientificMode) {
  EXPECT_EQ(to_string(tensor({1e-5, 1.0})), "tensor([1.0000e-05, 1.0000e+00])");               // min < 1e-4
  EXPECT_EQ(to_string(tensor({1.0, 10000.0})), "tensor([1.0000e+00, 1.0000e+04])");            // max / min > 1000
  EXPECT_EQ(to_string(tensor({1e9}, DType::float64)), "tensor([1.0000e+09], dtype=float64)");  // max > 1e8
  EXPECT_EQ(to_string(tensor({0.0, 0.001953125, 448.0}, DType::float8_e4m3fn)),
            "tensor([0.0000e+00, 1.9531e-03, 4.4800e+02], dtype=float8_e4m3fn)");
  EXPECT_EQ(to_string(tensor({-1e-5, 123.5})), "tensor([-1.0000e-05,  1.2350e+02])");
  EXPECT_EQ(to_string(tensor({1e-5, 1.0, NAN})), "tensor([1.0000e-05, 1.0000e+00,        nan])");
  EXPECT_EQ(to_string(tensor({1.0, 1000.0})), "tensor([   1., 1000.])");  // ratio exactly 1000: not sci
}

TEST(Print, NanAndInf) {
  EXPECT_EQ(to_string(tensor({NAN, INFINITY, -INFINITY, 1.5})), "tensor([   nan,    inf,   -inf, 1.5000])");
  EXPECT_EQ(to_string(tensor({NAN, 1.0, 2.0})), "tensor([nan, 1., 2.])");
  EXPECT_EQ(to_string(tensor({NAN, INFINITY})), "tensor([nan, inf])");
  EXPECT_EQ(to_string(tensor({1.0, 1000.0}, DType::float8_e4m3fn)), "tensor([1., nan], dtype=float8_e4m3fn)");
  EXPECT_EQ(to_string(tensor({1.0, 1e6}, DType::float8_e5m2)), "tensor([1., inf], dtype=float8_e5m2)");
  // The fnuz NaN decodes with the sign bit set; Python prints it as "nan".
  EXPECT_EQ(to_string(tensor({1.0, 1000.0}, DType::float8_e4m3fnuz)), "tensor([1., nan], dtype=float8_e4m3fnuz)");
  EXPECT_EQ(to_string(tensor({-NAN})), "tensor([nan])");
}

TEST(Print, ZeroDimensional) {
  EXPECT_EQ(to_string(scalar_tensor(1.5, DType::float8_e4m3fn)), "tensor(1.5000, dtype=float8_e4m3fn)");
  EXPECT_EQ(to_string(scalar_tensor(2.0)), "tensor(2.)");
  EXPECT_EQ(to_string(scalar_tensor(1e-5)), "tensor(1.0000e-05)");
  EXPECT_EQ(to_string(scalar_tensor(NAN)), "tensor(nan)");
  EXPECT_EQ(to_string(scalar_tensor(5.0, DType::int64)), "tensor(5)");
  EXPECT_EQ(to_string(scalar_tensor(-5.0, DType::int8)), "tensor(-5, dtype=int8)");
  EXPECT_EQ(to_string(scalar_tensor(1.0, DType::bool_)), "tensor(True)");
}

TEST(Print, Empty) {
  EXPECT_EQ(to_string(tensor({}, DType::float8_e4m3fn)), "tensor([], dtype=float8_e4m3fn)");
  EXPECT_EQ(to_string(tensor({})), "tensor([])");
  EXPECT_EQ(to_string(Tensor()), "tensor([])");
  EXPECT_EQ(to_string(zeros({0, 3})), "tensor([], size=(0, 3))");
  EXPECT_EQ(to_string(zeros({2, 0, 4}, DType::float8_e5m2)), "tensor([], size=(2, 0, 4), dtype=float8_e5m2)");
  // With no elements to show it, even int64 and bool name their dtype.
  EXPECT_EQ(to_string(zeros({0}, DType::int64)), "tensor([], dtype=int64)");
  EXPECT_EQ(to_string(zeros({0}, DType::bool_)), "tensor([], dtype=bool)");
}

TEST(Print, TwoAndThreeDimensional) {
  EXPECT_EQ(to_string(tensor(iota(6, 1.0), {2, 3})),
            "tensor([[0., 1., 2.],\n"
            "        [3., 4., 5.]])");
  EXPECT_EQ(to_string(tensor(std::vector<double>{0.5, 1.5, -2.25, 3.0}, {2, 2}, DType::float8_e4m3fn)),
            "tensor([[ 0.5000,  1.5000],\n"
            "        [-2.2500,  3.0000]], dtype=float8_e4m3fn)");
  EXPECT_EQ(to_string(tensor(iota(8), {2, 2, 2})),
            "tensor([[[0., 1.],\n"
            "         [2., 3.]],\n"
            "\n"
            "        [[4., 5.],\n"
            "         [6., 7.]]])");
  EXPECT_EQ(to_string(tensor(iota(3), {3, 1})),
            "tensor([[0.],\n"
            "        [1.],\n"
            "        [2.]])");
  EXPECT_EQ(to_string(tensor(iota(2), {1, 1, 2})), "tensor([[[0., 1.]]])");
}

TEST(Print, SummarizesAbove1000Elements) {
  // 2000 elements: 3 at each end, " ..." between; the formatter sees only the shown values (sci: 1999 / 1).
  EXPECT_EQ(to_string(tensor(iota(2000), {2000})),
            "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,\n"
            "        1.9990e+03])");
  std::vector<double> v = iota(2000);
  for (double& x : v) x = std::fmod(x, 10.0);
  EXPECT_EQ(to_string(tensor(v, {40, 50}, DType::float8_e4m3fn)),
            "tensor([[0., 1., 2.,  ..., 7., 8., 9.],\n"
            "        [0., 1., 2.,  ..., 7., 8., 9.],\n"
            "        [0., 1., 2.,  ..., 7., 8., 9.],\n"
            "        ...,\n"
            "        [0., 1., 2.,  ..., 7., 8., 9.],\n"
            "        [0., 1., 2.,  ..., 7., 8., 9.],\n"
            "        [0., 1., 2.,  ..., 7., 8., 9.]], dtype=float8_e4m3fn)");
  // A summarized tensor whose short dimension is shown whole.
  EXPECT_EQ(to_string(tensor(std::vector<double>(1002, 2.0), {2, 501}, DType::int32)),
            "tensor([[2, 2, 2,  ..., 2, 2, 2],\n"
            "        [2, 2, 2,  ..., 2, 2, 2]], dtype=int32)");
  // Exactly 1000 elements are printed in full.
  const std::string full = to_string(ones({1000}, DType::int64));
  EXPECT_EQ(full.find("..."), std::string::npos);
  // (80 - 7) / 3 = 24 per line: 41 line breaks, each 8 spaces of indent more than ", ".
  EXPECT_EQ(full.size(), std::string("tensor([])").size() + 1000 + 999 * 2 + 999 / 24 * 8);
}

TEST(Print, WrapsAtTheLineWidth) {
  // width 6 + ", " = 8 per element; (80 - 7) / 8 = 9 per line.
  std::string want = "tensor([";
  for (int i = 0; i < 30; ++i) {
    if (i > 0) want += (i % 9 == 0) ? ",\n        " : ", ";
    want += "1.5000";
  }
  want += "])";
  EXPECT_EQ(to_string(full({30}, 1.5)), want);
  // The suffix moves to its own line when the last line is full.
  EXPECT_EQ(to_string(full({9}, 1.5, DType::float8_e4m3fn)),
            "tensor([1.5000, 1.5000, 1.5000, 1.5000, 1.5000, 1.5000, 1.5000, 1.5000, 1.5000],\n"
            "       dtype=float8_e4m3fn)");
  // PyTorch counts the last line two characters longer than it is, so 7 elements (85 characters in all) wrap
  // and 6 (77) do not.
  EXPECT_EQ(to_string(full({7}, 1.5, DType::float8_e4m3fn)),
            "tensor([1.5000, 1.5000, 1.5000, 1.5000, 1.5000, 1.5000, 1.5000],\n"
            "       dtype=float8_e4m3fn)");
  EXPECT_EQ(to_string(full({6}, 1.5, DType::float8_e4m3fn)),
            "tensor([1.5000, 1.5000, 1.5000, 1.5000, 1.5000, 1.5000], dtype=float8_e4m3fn)");
  // 20 int8 elements would make an 80-character line; PyTorch's count says 82 and wraps; 19 stay.
  EXPECT_EQ(to_string(ones({20}, DType::int8)),
            "tensor([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],\n"
            "       dtype=int8)");
  EXPECT_EQ(to_string(ones({19}, DType::int8)),
            "tensor([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], dtype=int8)");
}

TEST(Print, IntegerAndBoolDTypes) {
  EXPECT_EQ(to_string(tensor({1.0, -20.0, 300.0}, DType::int64)), "tensor([  1, -20, 300])");
  EXPECT_EQ(to_string(tensor({1.0, -20.0, 300.0}, DType::int32)), "tensor([  1, -20, 300], dtype=int32)");
  EXPECT_EQ(to_string(tensor({1.0, 2.0}, DType::uint8)), "tensor([1, 2], dtype=uint8)");
  EXPECT_EQ(to_string(tensor({-128.0, 127.0}, DType::int8)), "tensor([-128,  127], dtype=int8)");
  EXPECT_EQ(to_string(tensor({0.0, 7.0}, DType::int16)), "tensor([0, 7], dtype=int16)");
  EXPECT_EQ(to_string(tensor({1.0, 0.0, 1.0}, DType::bool_)), "tensor([ True, False,  True])");
  EXPECT_EQ(to_string(tensor({1.0, 1.0}, DType::bool_)), "tensor([True, True])");
  EXPECT_EQ(to_string(tensor(std::vector<double>{1, 0, 0, 1}, {2, 2}, DType::bool_)),
            "tensor([[ True, False],\n"
            "        [False,  True]])");
}

TEST(Print, DefaultDTypeHasNoSuffix) {
  DefaultDTypeGuard guard;
  set_default_dtype(DType::float64);
  EXPECT_EQ(to_string(tensor({1.5}, DType::float64)), "tensor([1.5000])");
  EXPECT_EQ(to_string(tensor({1.5}, DType::float32)), "tensor([1.5000], dtype=float32)");
  EXPECT_EQ(to_string(tensor({}, DType::float32)), "tensor([], dtype=float32)");
  set_default_dtype(DType::bfloat16);
  EXPECT_EQ(to_string(tensor({1.5})), "tensor([1.5000])");
  EXPECT_EQ(to_string(tensor({1.5}, DType::float8_e4m3fn)), "tensor([1.5000], dtype=float8_e4m3fn)");
}

TEST(Print, Options) {
  PrintOptions o;
  o.precision = 2;
  EXPECT_EQ(to_string(tensor({1.0, 1.5, 1.25}), o), "tensor([1.00, 1.50, 1.25])");
  o.sci_mode = true;
  EXPECT_EQ(to_string(tensor({1.0, 1.5}), o), "tensor([1.00e+00, 1.50e+00])");
  PrintOptions s;
  s.threshold = 5;
  s.edgeitems = 1;
  EXPECT_EQ(to_string(tensor(iota(6)), s), "tensor([0.,  ..., 5.])");
  PrintOptions narrow;
  narrow.linewidth = 20;
  EXPECT_EQ(to_string(tensor({1.0, 2.0, 3.0, 4.0, 5.0}), narrow),
            "tensor([1., 2., 3.,\n"
            "        4., 5.])");
}

}  // namespace
}  // namespace fp8kit
