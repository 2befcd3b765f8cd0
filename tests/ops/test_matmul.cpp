// The float GEMM the fp32 and bf16 training recipes use: bit-identical to its reference (one FMA per product in
// increasing k), exact on integers, both layouts, bfloat16 operands, odd shapes, and its refusals.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/format/half.hpp"
#include "fp8kit/ops/scaled_mm.hpp"
#include "fp8kit/scaling/quantize.hpp"

namespace fp8kit {
namespace {

std::vector<float> values(std::int64_t count, std::uint32_t seed, bool integers) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(-5, 5);
  std::vector<float> v(static_cast<std::size_t>(count));
  for (float& x : v) x = integers ? static_cast<float>(small(rng)) : normal(rng);
  return v;
}

TEST(Matmul, BitIdenticalToReferenceBothLayoutsAndDtypes) {
  for (auto [m, n, k] :
       {std::tuple{1, 1, 1}, std::tuple{3, 17, 129}, std::tuple{17, 3, 300}, std::tuple{97, 130, 515}}) {
    for (BLayout layout : {BLayout::kNK, BLayout::kKN}) {
      for (DType dtype : {DType::float32, DType::bfloat16}) {
        const auto av = values(m * k, 1, false), bv = values(n * k, 2, false), bias = values(n, 3, false);
        std::vector<bfloat16> ab(av.size()), bb(bv.size());
        for (std::size_t i = 0; i < av.size(); ++i) ab[i] = bfloat16::from_float(av[i]);
        for (std::size_t i = 0; i < bv.size(); ++i) bb[i] = bfloat16::from_float(bv[i]);
        const bool bf = dtype == DType::bfloat16;
        const MatrixRef a{bf ? static_cast<const void*>(ab.data()) : av.data(), dtype, m, k};
        const MatrixRef b{bf ? static_cast<const void*>(bb.data()) : bv.data(), dtype, layout == BLayout::kNK ? n : k,
                          layout == BLayout::kNK ? k : n};
        std::vector<float> fast(static_cast<std::size_t>(m * n)), ref(fast.size());
        matmul(a, b, layout, fast, bias);
        matmul_reference(a, b, layout, ref, bias);
        ASSERT_EQ(std::memcmp(fast.data(), ref.data(), fast.size() * sizeof(float)), 0)
            << m << "x" << n << "x" << k << (layout == BLayout::kNK ? " NK " : " KN ") << name(dtype);
      }
    }
  }
}

// Operands whose rows lie further apart than their length (slices of wider matrices) give the contiguous copies'
// results, bit for bit, in both B layouts; and fp8_weight_mm's activations likewise.
TEST(Matmul, StridedOperandsMatchContiguousCopies) {
  const std::int64_t m = 37, n = 29, k = 150, pad = 13;
  const auto aw = values(m * (k + pad), 6, false), bw = values(n * (k + pad), 7, false);
  std::vector<float> ap(static_cast<std::size_t>(m * k)), bp(static_cast<std::size_t>(n * k));
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t kk = 0; kk < k; ++kk) ap[i * k + kk] = aw[i * (k + pad) + kk];
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t kk = 0; kk < k; ++kk) bp[j * k + kk] = bw[j * (k + pad) + kk];
  // B as K x N with rows n + pad apart
  std::vector<float> bkn_wide(static_cast<std::size_t>(k * (n + pad))), bkn(static_cast<std::size_t>(k * n));
  for (std::int64_t kk = 0; kk < k; ++kk)
    for (std::int64_t j = 0; j < n; ++j) bkn_wide[kk * (n + pad) + j] = bkn[kk * n + j] = bp[j * k + kk];
  std::vector<float> want(static_cast<std::size_t>(m * n)), got(want.size());
  matmul(MatrixRef(ap.data(), m, k), MatrixRef(bp.data(), n, k), BLayout::kNK, want);
  matmul(MatrixRef(aw.data(), m, k, k + pad), MatrixRef(bw.data(), n, k, k + pad), BLayout::kNK, got);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
  matmul(MatrixRef(aw.data(), m, k, k + pad), MatrixRef(bkn_wide.data(), k, n, n + pad), BLayout::kKN, got);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
  matmul_reference(MatrixRef(aw.data(), m, k, k + pad), MatrixRef(bkn_wide.data(), k, n, n + pad), BLayout::kKN, got);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
  const ScaledTensor w = quantize(MatrixRef(bp.data(), n, k), {});
  for (std::int64_t rows : {std::int64_t{2}, m}) {  // the GEMV path and the GEMM path
    std::vector<float> a(static_cast<std::size_t>(rows * n)), b(a.size());
    fp8_weight_mm(MatrixRef(ap.data(), rows, k), w, a);
    fp8_weight_mm(MatrixRef(aw.data(), rows, k, k + pad), w, b);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << rows;
  }
  EXPECT_THROW(matmul(MatrixRef(aw.data(), m, k, k - 1), MatrixRef(bp.data(), n, k), BLayout::kNK, got), Error);
}

TEST(Matmul, IntegersExact) {
  const std::int64_t m = 9, n = 21, k = 700;
  const auto av = values(m * k, 4, true), bv = values(n * k, 5, true);
  std::vector<float> out(static_cast<std::size_t>(m * n));
  matmul({av.data(), DType::float32, m, k}, {bv.data(), DType::float32, n, k}, BLayout::kNK, out);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t kk = 0; kk < k; ++kk) s += double{av[i * k + kk]} * bv[j * k + kk];
      ASSERT_EQ(out[i * n + j], s);
    }
}

TEST(Matmul, Refusals) {
  std::vector<float> a(12), b(12), out(9);
  EXPECT_THROW(matmul({a.data(), DType::float32, 3, 4}, {b.data(), DType::float32, 4, 3}, BLayout::kNK, out), Error);
  EXPECT_THROW(matmul({a.data(), DType::float16, 3, 4}, {b.data(), DType::float32, 3, 4}, BLayout::kNK, out), Error);
  std::vector<float> small(4);
  EXPECT_THROW(matmul({a.data(), DType::float32, 3, 4}, {b.data(), DType::float32, 3, 4}, BLayout::kNK, small), Error);
  EXPECT_NO_THROW(matmul({a.data(), DType::float32, 3, 4}, {b.data(), DType::float32, 3, 4}, BLayout::kNK, out));
}

}  // namespace
}  // namespace fp8kit
