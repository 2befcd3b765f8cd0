// The scale formula's table (amax 0, tiny, normal, Inf, NaN; margin; epsilon; power of two) and amax over spans
// and blocks against a plain reference, with NaN and Inf counted.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <climits>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/isa_levels.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/scaling/amax.hpp"
#include "fp8kit/scaling/scale.hpp"
#include "scaling/cpu/amax_kernels.hpp"
#include "scaling/scaling_test_util.hpp"

namespace fp8kit {
namespace {

using testing::expect_same;

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(Scale, Table) {
  for (Format f : {Format::e4m3fn, Format::e5m2}) {
    const float fp8_max = static_cast<float>(max_finite(f));
    SCOPED_TRACE(std::string(name(f)));
    EXPECT_EQ(compute_scale(0.0f, f, {}, 2.5f), 2.5f);  // nothing to scale: previous scale
    EXPECT_EQ(compute_scale(kInf, f, {}, 2.5f), 2.5f);  // non-finite: previous scale
    EXPECT_EQ(compute_scale(-kInf, f, {}, 2.5f), 2.5f);
    EXPECT_EQ(compute_scale(kNaN, f, {}, 2.5f), 2.5f);
    EXPECT_EQ(compute_scale(1e-40f, f, {}, 2.5f), FLT_MAX);  // the scale overflows float: FLT_MAX
    // A margin that takes it below float's normal range: FLT_MIN, whose inverse is finite.
    for (const int margin : {160, 200, 100000, INT_MAX}) {
      EXPECT_EQ(compute_scale(1.0f, f, ScaleOptions{margin}), FLT_MIN) << margin;
      EXPECT_TRUE(std::isfinite(dequantization_scale(compute_scale(1.0f, f, ScaleOptions{margin}))));
    }
    // And a negative one beyond float's range: FLT_MAX, INT_MIN included (its negation is not an int).
    for (const int margin : {-300, -100000, INT_MIN}) {
      EXPECT_EQ(compute_scale(1.0f, f, ScaleOptions{margin}), FLT_MAX) << margin;
      EXPECT_EQ(compute_scale(FLT_MAX, f, ScaleOptions{margin}), FLT_MAX) << margin;
    }
    EXPECT_EQ(compute_scale(FLT_MAX, f), fp8_max / FLT_MAX);             // normal: no margin gets there alone
    EXPECT_EQ(compute_scale(3.5f, f), fp8_max / 3.5f);                   // 448 / 3.5 = 128
    EXPECT_EQ(compute_scale(3.5f, f, ScaleOptions{1}), fp8_max / 7.0f);  // margin 1 halves it
    EXPECT_EQ(compute_scale(3.5f, f, ScaleOptions{-2}), fp8_max / 3.5f * 4.0f);
    EXPECT_EQ(compute_scale(0.0f, f, ScaleOptions{0, 1e-12f}), static_cast<float>(fp8_max / double{1e-12f}));
    EXPECT_EQ(compute_scale(3.0f, f, ScaleOptions{0, 0.0f, ScaleRounding::kPowerOfTwoDown}),
              std::exp2(std::floor(std::log2(fp8_max / 3.0f))));
    EXPECT_EQ(compute_scale(-3.5f, f), fp8_max / 3.5f);  // the magnitude counts
  }
  EXPECT_EQ(compute_scale(3.5f, Format::e4m3fn), 128.0f);
  EXPECT_EQ(compute_scale(3.5f, Format::e5m2), 16384.0f);
  EXPECT_EQ(dequantization_scale(128.0f), 1.0f / 128.0f);
}

TEST(Scale, RoundedOnceLikeFloatDivision) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> log_amax(-20.0f, 20.0f);
  for (int i = 0; i < 100000; ++i) {
    const float amax = std::exp2(log_amax(rng));
    ASSERT_EQ(compute_scale(amax, Format::e4m3fn), 448.0f / amax) << amax;
  }
}

AmaxResult reference_amax(const float* x, std::size_t n) {
  AmaxResult r;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) {
      ++r.nan_count;
    } else if (std::isinf(x[i])) {
      ++r.inf_count;
    } else {
      r.amax = std::max(r.amax, std::fabs(x[i]));
    }
  }
  return r;
}

std::vector<float> test_data(std::size_t n, std::uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  if (specials && n > 10) {
    x[n / 3] = kNaN;
    x[n / 2] = -kInf;
    x[n - 1] = kInf;
    x[1] = -1e30f;  // finite and huge: it is the amax
  }
  return x;
}

TEST(Amax, SpanAgainstReference) {
  for (std::size_t n : {0, 1, 3, 7, 31, 32, 33, 127, 129, 1000, 4099}) {
    for (bool specials : {false, true}) {
      const auto x = test_data(n, static_cast<std::uint32_t>(n), specials);
      const AmaxResult want = reference_amax(x.data(), n);
      const AmaxResult got = amax(x);
      EXPECT_EQ(got.amax, want.amax) << n;
      EXPECT_EQ(got.nan_count, want.nan_count) << n;
      EXPECT_EQ(got.inf_count, want.inf_count) << n;
    }
  }
}

// Each SIMD amax table (one test instance per level, skipped where this CPU cannot run it) against the scalar
// loops: spans at odd lengths and offsets, and segments (per row, 1x128, MX) with partial tails.
class AmaxKernel : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    FP8KIT_SKIP_UNLESS_RUNS(GetParam());
    table_ = scaling_detail::amax_tables().written_for(GetParam());
    ASSERT_NE(table_, nullptr) << name(GetParam()) << " should have amax kernels of its own";
    // The contract every amax table must declare, and the one the tests below check: the scalar loops' bits.
    ASSERT_EQ(table_->contract, KernelContract::kBitIdentical) << table_->name;
  }
  const scaling_detail::AmaxTable* table_ = nullptr;
};
INSTANTIATE_TEST_SUITE_P(Levels, AmaxKernel, ::testing::Values(Isa::kAvx2, Isa::kAvx512), testing::isa_param_name);

TEST_P(AmaxKernel, SpansMatchScalar) {
  for (std::size_t n : {0, 1, 3, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129, 1000, 4099}) {
    for (bool specials : {false, true}) {
      const auto x = test_data(n, static_cast<std::uint32_t>(n), specials);
      for (std::size_t offset : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
        if (offset > n) continue;
        AmaxResult simd, scalar;
        simd.amax = scalar.amax = 0.25f;  // the kernels accumulate into what is there
        table_->amax(x.data() + offset, n - offset, simd);
        scaling_detail::amax_scalar(x.data() + offset, n - offset, scalar);
        expect_same(simd, scalar, std::string(table_->name) + " n " + std::to_string(n));
      }
    }
  }
}

TEST_P(AmaxKernel, SegmentsMatchScalar) {
  for (std::size_t segment : {16, 32, 48, 64, 128, 4096, 7}) {
    for (std::size_t n : {0, 16, 100, 128, 1000, 4099, 8192}) {
      for (bool specials : {false, true}) {
        const auto x = test_data(n, static_cast<std::uint32_t>(n + segment), specials);
        const std::size_t count = (n + segment - 1) / segment;
        std::vector<float> got(count, -1.0f), want(count, -2.0f);
        AmaxResult simd, scalar;
        table_->amax_segments(x.data(), n, segment, got.data(), simd);
        scaling_detail::amax_segments_scalar(x.data(), n, segment, want.data(), scalar);
        const std::string what =
            std::string(table_->name) + " segment " + std::to_string(segment) + " n " + std::to_string(n);
        expect_same(simd, scalar, what);
        for (std::size_t k = 0; k < count; ++k) EXPECT_EQ(got[k], want[k]) << what << " segment " << k;
      }
    }
  }
}

TEST(Amax, LargeAndThreaded) {
  const std::size_t n = (std::size_t{1} << 20) + 5;
  auto x = test_data(n, 11, true);
  const AmaxResult want = reference_amax(x.data(), n);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    const AmaxResult got = amax(x);
    EXPECT_EQ(got.amax, want.amax);
    EXPECT_EQ(got.nan_count, want.nan_count);
    EXPECT_EQ(got.inf_count, want.inf_count);
  }
  std::vector<float> zeros(1000, 0.0f);
  EXPECT_EQ(amax(zeros).amax, 0.0f);
  std::vector<float> all_nan(100, kNaN);
  const AmaxResult nan_result = amax(all_nan);
  EXPECT_EQ(nan_result.amax, 0.0f);
  EXPECT_EQ(nan_result.nan_count, 100u);
  EXPECT_TRUE(nan_result.has_nonfinite());
}

TEST(Amax, BlocksAgainstReference) {
  struct Case {
    std::int64_t rows, cols, br, bc;
  };
  const Case cases[] = {{1, 1, 1, 1},   {3, 7, 1, 7},    {3, 7, 3, 1}, {17, 129, 1, 128}, {130, 300, 128, 128},
                        {5, 64, 2, 32}, {64, 33, 1, 32}, {4, 5, 4, 5}, {0, 8, 1, 8},      {200, 200, 200, 200}};
  for (const Case& c : cases) {
    const auto x = test_data(static_cast<std::size_t>(c.rows * c.cols), 5, c.rows * c.cols > 20);
    const std::int64_t gr = ceil_div(c.rows, c.br), gc = ceil_div(c.cols, c.bc);
    std::vector<float> got(static_cast<std::size_t>(gr * gc), -1.0f);
    AmaxResult total;
    amax_blocks(MatrixRef{x.data(), c.rows, c.cols}, c.br, c.bc, got, &total);
    for (std::int64_t i = 0; i < gr; ++i) {
      for (std::int64_t j = 0; j < gc; ++j) {
        float want = 0.0f;
        for (std::int64_t r = i * c.br; r < std::min(c.rows, (i + 1) * c.br); ++r) {
          for (std::int64_t k = j * c.bc; k < std::min(c.cols, (j + 1) * c.bc); ++k) {
            const float v = x[static_cast<std::size_t>(r * c.cols + k)];
            if (std::isfinite(v)) want = std::max(want, std::fabs(v));
          }
        }
        EXPECT_EQ(got[static_cast<std::size_t>(i * gc + j)], want)
            << c.rows << "x" << c.cols << " block " << i << "," << j;
      }
    }
    const AmaxResult all = reference_amax(x.data(), x.size());
    EXPECT_EQ(total.amax, all.amax);
    EXPECT_EQ(total.nan_count, all.nan_count);
    EXPECT_EQ(total.inf_count, all.inf_count);
  }
  std::vector<float> x(6), out(1);
  EXPECT_THROW(amax_blocks(MatrixRef{x.data(), 2, 3}, 1, 1, out), Error);  // needs 6 entries
  EXPECT_THROW(amax_blocks(MatrixRef{x.data(), 2, 3}, 0, 1, out), Error);
}

}  // namespace
}  // namespace fp8kit
