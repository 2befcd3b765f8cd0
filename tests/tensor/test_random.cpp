// Seeded rand and randn: reproducible for a seed, different across seeds, independent of threads and of the
// tensor's size, in range and exact in every floating dtype, with the right mean and standard deviation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "common/same_bits.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit {
namespace {

constexpr DType kRandomDTypes[] = {DType::float32, DType::float64, DType::float16, DType::bfloat16};

struct Moments {
  double mean, stddev;
};
Moments moments(const Tensor& t) {
  double sum = 0.0, sum2 = 0.0;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double v = t.item_as_double(i);
    sum += v;
    sum2 += v * v;
  }
  const double n = static_cast<double>(t.numel());
  const double mean = sum / n;
  return {mean, std::sqrt(sum2 / n - mean * mean)};
}

TEST(Random, ReproducibleForASeedAndDifferentAcrossSeeds) {
  for (DType d : kRandomDTypes) {
    SCOPED_TRACE(std::string(name(d)));
    EXPECT_TRUE(testing::same_bits(rand({1000}, 7, d), rand({1000}, 7, d)));
    EXPECT_TRUE(testing::same_bits(randn({1000}, 7, d), randn({1000}, 7, d)));
    EXPECT_FALSE(testing::same_bits(rand({1000}, 7, d), rand({1000}, 8, d)));
    EXPECT_FALSE(testing::same_bits(randn({1000}, 7, d), randn({1000}, 8, d)));
  }
  EXPECT_EQ(rand({3, 4}, 1).shape(), (Shape{3, 4}));
  EXPECT_EQ(randn({}, 1).numel(), 1);
  EXPECT_EQ(randn({0, 5}, 1).numel(), 0);
}

TEST(Random, IndependentOfThreadsAndSize) {
  const int saved = num_threads();
  set_num_threads(1);
  const Tensor u1 = rand({100000}, 42);
  const Tensor n1 = randn({100000}, 42);
  set_num_threads(2);
  const Tensor u2 = rand({100000}, 42);
  const Tensor n2 = randn({100000}, 42);
  set_num_threads(saved);
  EXPECT_TRUE(testing::same_bits(u1, u2));
  EXPECT_TRUE(testing::same_bits(n1, n2));
  // A prefix equals the smaller tensor with the same seed (odd sizes split a Box-Muller pair).
  const Tensor small = randn({7}, 42);
  EXPECT_EQ(std::memcmp(small.raw(), n1.raw(), 7 * sizeof(float)), 0);
  EXPECT_TRUE(testing::same_bits(rand({10, 10}, 42).reshape({-1}), rand({100}, 42)));
}

TEST(Random, UniformInUnitIntervalAndExactInEveryDType) {
  for (DType d : kRandomDTypes) {
    SCOPED_TRACE(std::string(name(d)));
    const Tensor u = rand({200000}, 3, d);
    double lo = 1.0, hi = 0.0;
    for (std::int64_t i = 0; i < u.numel(); ++i) {
      const double v = u.item_as_double(i);
      ASSERT_GE(v, 0.0);
      ASSERT_LT(v, 1.0);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    const Moments m = moments(u);
    EXPECT_NEAR(m.mean, 0.5, 0.01);
    EXPECT_NEAR(m.stddev, std::sqrt(1.0 / 12.0), 0.01);
    EXPECT_LT(lo, 0.01);
    EXPECT_GT(hi, 0.99);
  }
  // The same draw in float32 and float64 agrees to float32's 24 bits (both take the top bits of one 64-bit word).
  const Tensor a = rand({1000}, 9, DType::float32);
  const Tensor b = rand({1000}, 9, DType::float64);
  for (std::int64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(a.item_as_double(i), std::ldexp(std::floor(std::ldexp(b.item_as_double(i), 24)), -24)) << i;
  }
}

TEST(Random, NormalMomentsInEveryDType) {
  for (DType d : kRandomDTypes) {
    SCOPED_TRACE(std::string(name(d)));
    const Tensor z = randn({200001}, 11, d);
    const Moments m = moments(z);
    EXPECT_NEAR(m.mean, 0.0, 0.01);
    EXPECT_NEAR(m.stddev, 1.0, 0.01);
    std::int64_t beyond2 = 0;
    for (std::int64_t i = 0; i < z.numel(); ++i) beyond2 += std::fabs(z.item_as_double(i)) > 2.0;
    // P(|z| > 2) = 4.55%
    EXPECT_NEAR(static_cast<double>(beyond2) / static_cast<double>(z.numel()), 0.0455, 0.003);
  }
}

TEST(Random, RefusesFp8AndIntegerDTypes) {
  for (DType d : kAllDTypes) {
    if (d == DType::float32 || d == DType::float64 || d == DType::float16 || d == DType::bfloat16) continue;
    SCOPED_TRACE(std::string(name(d)));
    EXPECT_THROW(rand({4}, 1, d), Error);
    try {
      randn({4}, 1, d);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(std::string(name(d))), std::string::npos) << e.what();
      if (is_fp8(d)) EXPECT_NE(std::string(e.what()).find("to("), std::string::npos) << e.what();
    }
  }
  // The recommended route works: create in float32, convert.
  const Tensor q = randn({64}, 5).to(DType::float8_e4m3fn, Overflow::kSaturate);
  EXPECT_EQ(q.dtype(), DType::float8_e4m3fn);
}

}  // namespace
}  // namespace fp8kit
