// Convolution helpers and pooling: geometry and its errors, im2col/col2im adjointness, im2col GEMMs against a
// direct convolution, max/average pooling against references and finite differences, thread-count independence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/same_bits.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/nn/conv_utils.hpp"
#include "fp8kit/nn/pooling.hpp"

#include "nn_test_util.hpp"

namespace fp8kit::nn {
namespace {

using testing::central_difference;

// Small integers: every sum and product the tests form is exact in float32.
Tensor integer_tensor(Shape shape, std::uint32_t seed) {
  Tensor t = empty(std::move(shape), DType::float32);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(-4, 4);
  for (float& v : t.span<float>()) v = static_cast<float>(dist(rng));
  return t;
}

// Distinct values k/64 (exact in float), shuffled: no ties in any pooling window, gaps far above a 1e-3 step.
Tensor distinct_tensor(Shape shape, std::uint32_t seed) {
  Tensor t = empty(std::move(shape), DType::float32);
  std::vector<int> order(static_cast<std::size_t>(t.numel()));
  std::iota(order.begin(), order.end(), -static_cast<int>(order.size() / 2));
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  for (std::size_t i = 0; i < order.size(); ++i) t.data<float>()[i] = static_cast<float>(order[i]) / 64.0f;
  return t;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += double{a.data<float>()[i]} * b.data<float>()[i];
  return s;
}

// a (M, K) * b (N, K)^T -> (M, N) in float32 with double accumulation (the test's stand-in for the GEMM).
Tensor matmul_nt(const Tensor& a, const Tensor& b) {
  const std::int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  Tensor out = empty({m, n}, DType::float32);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t kk = 0; kk < k; ++kk) s += double{a.data<float>()[i * k + kk]} * b.data<float>()[j * k + kk];
      out.data<float>()[i * n + j] = static_cast<float>(s);
    }
  return out;
}

// a (K, M)^T -> (M, K).
Tensor naive_transpose(const Tensor& a) {
  const std::int64_t r = a.size(0), c = a.size(1);
  Tensor t = empty({c, r}, DType::float32);
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t j = 0; j < c; ++j) t.data<float>()[j * r + i] = a.data<float>()[i * c + j];
  return t;
}

// Direct convolution in double: y[n, o, oy, ox] = sum_{c, ky, kx} x[n, c, iy, ix] w[o, c, ky, kx], zero padding.
std::vector<double> direct_conv(const Tensor& x, const Tensor& w, const ConvGeometry& g) {
  const std::int64_t OC = w.size(0), C = g.channels, H = g.height, W = g.width;
  const Window2d& win = g.window;
  std::vector<double> y(static_cast<std::size_t>(g.batch * OC * g.out_h * g.out_w), 0.0);
  for (std::int64_t n = 0; n < g.batch; ++n)
    for (std::int64_t o = 0; o < OC; ++o)
      for (std::int64_t oy = 0; oy < g.out_h; ++oy)
        for (std::int64_t ox = 0; ox < g.out_w; ++ox) {
          double s = 0;
          for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t ky = 0; ky < win.kernel_h; ++ky)
              for (std::int64_t kx = 0; kx < win.kernel_w; ++kx) {
                const std::int64_t iy = oy * win.stride_h - win.pad_h + ky, ix = ox * win.stride_w - win.pad_w + kx;
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                s += double{x.data<float>()[((n * C + c) * H + iy) * W + ix]} *
                     w.data<float>()[((o * C + c) * win.kernel_h + ky) * win.kernel_w + kx];
              }
          y[((n * OC + o) * g.out_h + oy) * g.out_w + ox] = s;
        }
  return y;
}

struct ConvCase {
  Shape input;
  Window2d window;
};

// 7x7 s2 p3 (a ResNet stem), 3x3 s1 p1, 1x1 (s1 and s2), non-square kernels/strides/paddings, odd sizes, a window
// that leaves input pixels unread (5x5 s3 on 10), and a kernel as large as the padded input.
const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> cases = {
      {{2, 3, 11, 13}, Window2d::square(7, 2, 3)}, {{2, 4, 7, 5}, Window2d::square(3, 1, 1)},
      {{2, 5, 6, 7}, Window2d::square(1)},         {{1, 3, 9, 7}, Window2d::square(1, 2, 0)},
      {{2, 2, 9, 8}, Window2d{3, 5, 2, 1, 1, 2}},  {{1, 2, 10, 10}, Window2d::square(5, 3, 0)},
      {{1, 3, 3, 5}, Window2d{5, 3, 1, 2, 1, 0}},  {{3, 1, 1, 1}, Window2d::square(3, 1, 1)},
  };
  return cases;
}

TEST(ConvGeometry, OutputSizes) {
  const ConvGeometry stem = ConvGeometry::make({8, 3, 224, 224}, Window2d::square(7, 2, 3));
  EXPECT_EQ(stem.out_h, 112);
  EXPECT_EQ(stem.out_w, 112);
  EXPECT_EQ(stem.rows(), 8 * 112 * 112);
  EXPECT_EQ(stem.cols(), 3 * 7 * 7);
  EXPECT_EQ(stem.output_shape(64), (Shape{8, 64, 112, 112}));
  const ConvGeometry same = ConvGeometry::make({1, 4, 5, 7}, Window2d::square(3, 1, 1));
  EXPECT_EQ(same.out_h, 5);
  EXPECT_EQ(same.out_w, 7);
  const ConvGeometry odd = ConvGeometry::make({2, 1, 10, 9}, Window2d{3, 2, 3, 2, 0, 1});
  EXPECT_EQ(odd.out_h, 3);  // (10 - 3) / 3 + 1, floor
  EXPECT_EQ(odd.out_w, 5);  // (9 + 2 - 2) / 2 + 1
  EXPECT_EQ(odd.cols(), 1 * 3 * 2);
  const ConvGeometry whole = ConvGeometry::make({1, 1, 3, 3}, Window2d::square(5, 1, 1));
  EXPECT_EQ(whole.out_h, 1);  // the kernel exactly covers the padded input
  EXPECT_EQ(ConvGeometry::make({0, 2, 4, 4}, Window2d::square(3)).rows(), 0);
}

TEST(ConvGeometry, RejectsBadWindows) {
  auto message = [](const Shape& in, const Window2d& w) -> std::string {
    try {
      ConvGeometry::make(in, w);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message({1, 1, 3, 3}, Window2d::square(7, 1, 1)).find("larger than the padded input 5"), std::string::npos);
  EXPECT_NE(message({1, 1, 8, 2}, Window2d{3, 3, 1, 1, 0, 0}).find("kernel width 3"), std::string::npos);
  EXPECT_NE(message({1, 1, 8, 8}, Window2d::square(3, 0)).find("stride"), std::string::npos);
  EXPECT_NE(message({1, 1, 8, 8}, Window2d{3, 3, 1, -2, 0, 0}).find("stride width"), std::string::npos);
  EXPECT_NE(message({1, 1, 8, 8}, Window2d::square(3, 1, -1)).find("padding"), std::string::npos);
  EXPECT_NE(message({1, 1, 8, 8}, Window2d::square(0)).find("kernel"), std::string::npos);
  EXPECT_NE(message({1, 8, 8}, Window2d::square(3)).find("(N, C, H, W)"), std::string::npos);
  EXPECT_NE(message({1, 0, 8, 8}, Window2d::square(3)).find("C, H, W >= 1"), std::string::npos);
  // A tensor that does not match the geometry.
  const ConvGeometry g = ConvGeometry::make({1, 2, 5, 5}, Window2d::square(3));
  EXPECT_THROW(im2col(Context{}, zeros({1, 2, 5, 6}, DType::float32), g), Error);
  EXPECT_THROW(col2im(Context{}, zeros({9, 17}, DType::float32), g), Error);
  EXPECT_THROW(rows_to_nchw(Context{}, zeros({10, 4}, DType::float32), g), Error);
  EXPECT_THROW(nchw_to_rows(Context{}, zeros({10, 4}, DType::float32)), Error);
}

TEST(Im2col, ColumnOrderIsChannelThenKernelRowThenColumn) {
  // x (1, 2, 3, 3): channel 0 holds 1..9, channel 1 holds 11..19; 2x2 kernel, stride 1, padding 1 -> 4x4 outputs.
  Tensor x = empty({1, 2, 3, 3}, DType::float32);
  for (int i = 0; i < 18; ++i) x.data<float>()[i] = static_cast<float>(i < 9 ? i + 1 : i + 2);
  const ConvGeometry g = ConvGeometry::make(x.shape(), Window2d::square(2, 1, 1));
  const Tensor cols = im2col(Context{}, x, g);
  ASSERT_EQ(cols.shape(), (Shape{16, 8}));
  auto row = [&](std::int64_t r) {
    return std::vector<float>(cols.data<float>() + r * 8, cols.data<float>() + (r + 1) * 8);
  };
  EXPECT_EQ(row(0), (std::vector<float>{0, 0, 0, 1, 0, 0, 0, 11}));     // (oy, ox) = (0, 0): only x[1, 1] is inside
  EXPECT_EQ(row(5), (std::vector<float>{1, 2, 4, 5, 11, 12, 14, 15}));  // (1, 1)
  EXPECT_EQ(row(7), (std::vector<float>{3, 0, 6, 0, 13, 0, 16, 0}));    // (1, 3): the right column is padding
}

TEST(Im2col, Col2imIsItsAdjoint) {
  for (const ConvCase& k : conv_cases()) {
    const ConvGeometry g = ConvGeometry::make(k.input, k.window);
    // Integer values: both inner products are exact, so they must be equal.
    const Tensor x = integer_tensor(g.input_shape(), 1), c = integer_tensor({g.rows(), g.cols()}, 2);
    EXPECT_EQ(dot(col2im(Context{}, c, g), x), dot(c, im2col(Context{}, x, g)));
    // Random values: equal up to the float rounding of col2im's sums.
    const Tensor xr = randn(g.input_shape(), 3, DType::float32), cr = randn({g.rows(), g.cols()}, 4, DType::float32);
    const double lhs = dot(col2im(Context{}, cr, g), xr), rhs = dot(cr, im2col(Context{}, xr, g));
    EXPECT_NEAR(lhs, rhs, 1e-5 * (1.0 + std::fabs(rhs)));
  }
}

TEST(Im2col, GemmMatchesDirectConvolution) {
  for (const ConvCase& k : conv_cases()) {
    const ConvGeometry g = ConvGeometry::make(k.input, k.window);
    const std::int64_t oc = 5;
    const Tensor x = randn(g.input_shape(), 5, DType::float32);
    const Tensor w = randn({oc, g.channels, k.window.kernel_h, k.window.kernel_w}, 6, DType::float32);
    const Tensor rows = matmul_nt(im2col(Context{}, x, g), w.reshape({oc, g.cols()}));  // (N*OH*OW, OC)
    const Tensor y = rows_to_nchw(Context{}, rows, g);
    ASSERT_EQ(y.shape(), g.output_shape(oc));
    const std::vector<double> want = direct_conv(x, w, g);
    for (std::int64_t i = 0; i < y.numel(); ++i) {
      ASSERT_NEAR(y.data<float>()[i], want[i], 1e-5 * (1.0 + std::fabs(want[i]))) << "element " << i;
    }
    EXPECT_TRUE(fp8kit::testing::same_bits(nchw_to_rows(Context{}, y), rows));  // a pure reshuffle and its inverse
  }
}

TEST(Im2col, ConvolutionGradientsMatchFiniteDifferences) {
  // The helpers composed into a convolution: y = rows_to_nchw(im2col(x) W^T); backward dy_rows = nchw_to_rows(dy),
  // dx = col2im(dy_rows W), dW = dy_rows^T im2col(x). The loss L = sum(dy * y) is linear in x and in W, so a
  // central difference has no truncation error: only the float rounding of y (~1e-6 relative) divided by 2e.
  for (const ConvCase& k :
       {ConvCase{{2, 2, 7, 6}, Window2d::square(3, 2, 1)}, ConvCase{{1, 3, 5, 5}, Window2d{2, 3, 1, 2, 0, 1}}}) {
    const ConvGeometry g = ConvGeometry::make(k.input, k.window);
    const std::int64_t oc = 3;
    Tensor x = randn(g.input_shape(), 7, DType::float32);
    Tensor w = randn({oc, g.cols()}, 8, DType::float32);
    const Tensor dy = randn(g.output_shape(oc), 9, DType::float32);
    auto loss = [&] { return dot(dy, rows_to_nchw(Context{}, matmul_nt(im2col(Context{}, x, g), w), g)); };
    const Tensor dy_rows = nchw_to_rows(Context{}, dy);                                               // (N*OH*OW, OC)
    const Tensor dx = col2im(Context{}, matmul_nt(dy_rows, naive_transpose(w)), g);                   // dy_rows W
    const Tensor dw = matmul_nt(naive_transpose(dy_rows), naive_transpose(im2col(Context{}, x, g)));  // dy_rows^T cols
    const float e = 1e-2f;
    for (auto [param, grad] : {std::pair{&x, &dx}, std::pair{&w, &dw}}) {
      float* p = param->data<float>();
      for (std::int64_t i = 0; i < param->numel(); ++i) {
        const double g = grad->data<float>()[i];
        EXPECT_NEAR(central_difference(p + i, e, loss), g, 1e-3 * (1.0 + std::fabs(g)));
      }
    }
  }
}

// Max of each window in double with -inf padding (the definition).
std::vector<double> reference_maxpool(const Tensor& x, const ConvGeometry& g) {
  const Window2d& w = g.window;
  std::vector<double> y;
  for (std::int64_t nc = 0; nc < g.batch * g.channels; ++nc)
    for (std::int64_t oy = 0; oy < g.out_h; ++oy)
      for (std::int64_t ox = 0; ox < g.out_w; ++ox) {
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t ky = 0; ky < w.kernel_h; ++ky)
          for (std::int64_t kx = 0; kx < w.kernel_w; ++kx) {
            const std::int64_t iy = oy * w.stride_h - w.pad_h + ky, ix = ox * w.stride_w - w.pad_w + kx;
            if (iy >= 0 && iy < g.height && ix >= 0 && ix < g.width)
              m = std::max(m, double{x.data<float>()[(nc * g.height + iy) * g.width + ix]});
          }
        y.push_back(m);
      }
  return y;
}

const std::vector<ConvCase>& pool_cases() {
  static const std::vector<ConvCase> cases = {
      {{2, 3, 8, 8}, Window2d::square(2, 2)},    {{2, 2, 7, 9}, Window2d::square(3, 2, 1)},
      {{1, 3, 5, 5}, Window2d::square(3, 1, 1)}, {{2, 2, 9, 6}, Window2d{3, 2, 2, 1, 1, 0}},
      {{1, 1, 1, 1}, Window2d::square(1)},       {{1, 2, 11, 11}, Window2d::square(7, 2, 3)},
  };
  return cases;
}

TEST(MaxPool2d, ForwardMatchesReference) {
  for (const ConvCase& k : pool_cases()) {
    const MaxPool2d pool{k.window};
    const Tensor x = randn(k.input, 10, DType::float32);
    MaxPool2d::Saved saved;
    const Tensor y = pool.forward(Context{}, x, saved);
    const ConvGeometry g = ConvGeometry::make(k.input, k.window);
    ASSERT_EQ(y.shape(), g.output_shape(g.channels));
    const std::vector<double> want = reference_maxpool(x, g);
    for (std::int64_t i = 0; i < y.numel(); ++i) {
      EXPECT_EQ(y.data<float>()[i], want[i]);
      // The saved index points at the maximum, inside the plane.
      const std::int64_t a = saved.argmax.data<std::int64_t>()[i], plane = i / (g.out_h * g.out_w);
      ASSERT_TRUE(a >= 0 && a < g.height * g.width);
      EXPECT_EQ(x.data<float>()[plane * g.height * g.width + a], want[i]);
    }
  }
}

TEST(MaxPool2d, GradientsMatchFiniteDifferences) {
  // Max pooling is piecewise linear; with distinct inputs 1/64 apart a step e = 1e-3 never changes a window's
  // argmax, so the central difference is the routed gradient up to the double rounding of the loss.
  for (const ConvCase& k : pool_cases()) {
    const MaxPool2d pool{k.window};
    Tensor x = distinct_tensor(k.input, 11);
    MaxPool2d::Saved saved;
    const Tensor y = pool.forward(Context{}, x, saved);
    const Tensor dy = randn(y.shape(), 12, DType::float32);
    const Tensor dx = pool.backward(Context{}, dy, saved);
    ASSERT_EQ(dx.shape(), x.shape());
    auto loss = [&] {
      MaxPool2d::Saved s;
      return dot(dy, pool.forward(Context{}, x, s));
    };
    const float e = 1e-3f;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      EXPECT_NEAR(central_difference(x.data<float>() + i, e, loss), dx.data<float>()[i], 1e-5) << "element " << i;
    }
  }
}

TEST(MaxPool2d, OverlappingWindowsAddUp) {
  // One peak in the middle of a 5x5 plane, 3x3 windows with stride 1 and padding 1: 9 windows select it.
  Tensor x = zeros({1, 1, 5, 5}, DType::float32);
  x.data<float>()[12] = 1.0f;
  const MaxPool2d pool{Window2d::square(3, 1, 1)};
  MaxPool2d::Saved saved;
  const Tensor y = pool.forward(Context{}, x, saved);
  const Tensor dx = pool.backward(Context{}, ones(y.shape(), DType::float32), saved);
  EXPECT_EQ(dx.data<float>()[12], 9.0f);
  // Ties go to the first pixel of the window in row-major order.
  Tensor flat = zeros({1, 1, 2, 2}, DType::float32);
  MaxPool2d::Saved s2;
  MaxPool2d{Window2d::square(2, 2)}.forward(Context{}, flat, s2);
  EXPECT_EQ(s2.argmax.data<std::int64_t>()[0], 0);
}

TEST(MaxPool2d, NanPropagates) {
  Tensor x = tensor({1.0, std::nan(""), 3.0, 2.0}, DType::float32).reshape({1, 1, 2, 2});
  MaxPool2d::Saved saved;
  const Tensor y = MaxPool2d{Window2d::square(2, 2)}.forward(Context{}, x, saved);
  EXPECT_TRUE(std::isnan(y.data<float>()[0]));
  EXPECT_EQ(saved.argmax.data<std::int64_t>()[0], 1);
}

TEST(MaxPool2d, RejectsBadArguments) {
  MaxPool2d::Saved saved;
  const Tensor x = zeros({1, 1, 6, 6}, DType::float32);
  EXPECT_THROW(MaxPool2d{Window2d::square(3, 1, 2)}.forward(Context{}, x, saved), Error);  // padding > kernel / 2
  EXPECT_THROW(MaxPool2d{Window2d::square(9, 1, 1)}.forward(Context{}, x, saved), Error);  // larger than input
  EXPECT_THROW(MaxPool2d{Window2d::square(2, 0)}.forward(Context{}, x, saved), Error);
  EXPECT_THROW(MaxPool2d{}.forward(Context{}, zeros({6, 6}, DType::float32), saved), Error);
  EXPECT_THROW(MaxPool2d{}.backward(Context{}, zeros({1, 1, 3, 3}, DType::float32), saved), Error);  // no forward
  {  // a saved argmax outside its plane (a Saved of another layer, or changed): it wrote outside dx
    MaxPool2d::Saved changed;
    const Tensor y = MaxPool2d{}.forward(Context{}, zeros({1, 2, 4, 4}, DType::float32), changed);
    for (const std::int64_t bad : {std::int64_t{17}, std::int64_t{1} << 40, std::int64_t{-1}}) {
      changed.argmax.data<std::int64_t>()[0] = bad;
      EXPECT_THROW(MaxPool2d{}.backward(Context{}, ones(y.shape(), DType::float32), changed), Error) << bad;
    }
  }
  MaxPool2d{}.forward(Context{}, x, saved);
  EXPECT_THROW(MaxPool2d{}.backward(Context{}, zeros({1, 1, 3, 4}, DType::float32), saved), Error);
  EXPECT_NO_THROW(MaxPool2d{}.backward(Context{}, zeros({1, 1, 3, 3}, DType::float32), saved));
}

TEST(GlobalAvgPool2d, ForwardBackwardAndFiniteDifferences) {
  const GlobalAvgPool2d pool;
  Tensor x = randn({2, 3, 5, 7}, 13, DType::float32);
  GlobalAvgPool2d::Saved saved;
  const Tensor y = pool.forward(Context{}, x, saved);
  ASSERT_EQ(y.shape(), (Shape{2, 3}));
  for (std::int64_t nc = 0; nc < 6; ++nc) {
    double s = 0;
    for (std::int64_t p = 0; p < 35; ++p) s += x.data<float>()[nc * 35 + p];
    EXPECT_EQ(y.data<float>()[nc], static_cast<float>(s / 35.0));
  }
  const Tensor dy = randn({2, 3}, 14, DType::float32);
  const Tensor dx = pool.backward(Context{}, dy, saved);
  ASSERT_EQ(dx.shape(), x.shape());
  // Linear in x: the central difference is exact up to the float rounding of the means (~1e-7 / 2e).
  const float e = 1e-2f;
  auto loss = [&] {
    GlobalAvgPool2d::Saved s;
    return dot(dy, pool.forward(Context{}, x, s));
  };
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    EXPECT_NEAR(central_difference(x.data<float>() + i, e, loss), dx.data<float>()[i], 1e-4) << "element " << i;
  }
  EXPECT_THROW(pool.forward(Context{}, zeros({2, 3, 5}, DType::float32), saved), Error);
  EXPECT_THROW(pool.backward(Context{}, zeros({3, 2}, DType::float32), saved), Error);
}

TEST(ConvHelpers, ThreadCountDoesNotChangeResults) {
  const int before = num_threads();
  // Large enough (im2col 1152 x 120, pooling 18432 inputs) for the library to run its loops on several threads.
  const ConvGeometry g = ConvGeometry::make({4, 8, 24, 24}, Window2d{3, 5, 2, 1, 1, 2});
  const Tensor x = randn(g.input_shape(), 15, DType::float32);
  const Tensor c = randn({g.rows(), g.cols()}, 16, DType::float32);
  const MaxPool2d maxpool{Window2d::square(3, 2, 1)};
  std::vector<Tensor> results[2];
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<Tensor>& r = results[threads - 1];
    r.push_back(im2col(Context{}, x, g));
    r.push_back(col2im(Context{}, c, g));
    r.push_back(nchw_to_rows(Context{}, x));
    r.push_back(rows_to_nchw(Context{}, c, g.batch, g.out_h, g.out_w));
    MaxPool2d::Saved ms;
    r.push_back(maxpool.forward(Context{}, x, ms));
    r.push_back(maxpool.backward(Context{}, r.back(), ms));
    r.push_back(ms.argmax);
    GlobalAvgPool2d::Saved as;
    r.push_back(GlobalAvgPool2d{}.forward(Context{}, x, as));
    r.push_back(GlobalAvgPool2d{}.backward(Context{}, r.back(), as));
  }
  set_num_threads(before);
  for (std::size_t i = 0; i < results[0].size(); ++i)
    EXPECT_TRUE(fp8kit::testing::same_bits(results[0][i], results[1][i])) << i;
}

TEST(ConvHelpers, RecordProfilerEvents) {
  Profiler profiler;
  Context ctx;
  ctx.profiler = &profiler;
  const Tensor x = randn({1, 2, 4, 4}, 17, DType::float32);
  const ConvGeometry g = ConvGeometry::make(x.shape(), Window2d::square(2, 2));
  const Tensor cols = im2col(ctx, x, g);
  col2im(ctx, cols, g);
  nchw_to_rows(ctx, rows_to_nchw(ctx, cols, g));
  MaxPool2d::Saved ms;
  const Tensor y = MaxPool2d{}.forward(ctx, x, ms);
  MaxPool2d{}.backward(ctx, y, ms);
  GlobalAvgPool2d::Saved as;
  GlobalAvgPool2d{}.backward(ctx, GlobalAvgPool2d{}.forward(ctx, x, as), as);
  std::vector<std::string> names;
  for (const ProfileEvent& e : profiler.events()) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"im2col", "col2im", "rows_to_nchw", "nchw_to_rows", "maxpool2d.forward",
                                             "maxpool2d.backward", "global_avg_pool2d.forward",
                                             "global_avg_pool2d.backward"}));
}

}  // namespace
}  // namespace fp8kit::nn
