// The fast scaled_mm (packed GEMM and GEMV paths) and the weight-only fp8_weight_mm, once per ISA level (dispatch
// capped at the level; levels this CPU cannot run are skipped, naming what it lacks): every kernel against its own
// contract (bit-identical to the references, or within mm_error_bound of an FP64 reference) for every scale
// granularity pair, both B layouts, every supported format pair, bias, bfloat16 output and odd shapes; exactness
// where the sums are exact; NaN / Inf codes, subnormal codes and subnormal outputs; thread counts; the refused
// combinations.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/isa_levels.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/format/half.hpp"
#include "fp8kit/ops/scaled_mm.hpp"
#include "ops/cpu/mm_kernels.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <omp.h>
#include <xmmintrin.h>
#define FP8KIT_TEST_MXCSR 1
#endif

namespace fp8kit {
namespace {

using Kind = Granularity::Kind;

// The largest M the dispatcher sends to the GEMV path at the level in force: left operands exact in bfloat16 (FP8
// codes, bfloat16 activations) go as far as the level's gemv_max_m, float32 activations to kGemvMaxM.
std::int64_t gemv_max_m(bool left_exact_in_bf16 = true) {
  return left_exact_in_bf16 ? mm_kernels().gemv_max_m : kGemvMaxM;
}

constexpr double kU = 0x1p-24;  // the unit roundoff of FP32

struct FormatPair {
  Format a, b;
};
// The pairs scaled_mm accepts (e5m2 x e5m2 is refused).
constexpr FormatPair kFormatPairs[] = {{Format::e4m3fn, Format::e4m3fn},
                                       {Format::e4m3fn, Format::e5m2},
                                       {Format::e5m2, Format::e4m3fn},
                                       {Format::e4m3fnuz, Format::e4m3fnuz},
                                       {Format::e5m2fnuz, Format::e4m3fnuz}};
constexpr Format kWeightFormats[] = {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz};

struct GranularityPair {
  Granularity a, b;
};

// Every supported pair for a B layout: A per tensor, per row, 1 x 128 and 1 x 64 blocks; B per tensor, per output
// channel (row of N x K, col of K x N) and blocks whose K extent matches A's blocks (128 x 128; with 1 x 64, K blocks
// of 64).
std::vector<GranularityPair> granularity_pairs(BLayout layout) {
  const bool nk = layout == BLayout::kNK;
  const Granularity per_channel = nk ? Granularity::row() : Granularity::column();
  const Granularity b128 = Granularity::block(128, 128);
  const Granularity b64 = nk ? Granularity::block(128, 64) : Granularity::block(64, 128);
  std::vector<GranularityPair> pairs;
  for (const Granularity& a : {Granularity::tensor(), Granularity::row(), Granularity::block(1, 128)})
    for (const Granularity& b : {Granularity::tensor(), per_channel, b128}) pairs.push_back({a, b});
  for (const Granularity& b : {Granularity::tensor(), per_channel, b64})
    pairs.push_back({Granularity::block(1, 64), b});
  return pairs;
}

std::string describe(const ScaledTensor& a, const ScaledTensor& b, BLayout layout) {
  std::ostringstream s;
  s << "A " << a.rows << "x" << a.cols << " " << name(a.format) << " " << a.granularity.name() << ", B "
    << (layout == BLayout::kNK ? "NxK " : "KxN ") << b.rows << "x" << b.cols << " " << name(b.format) << " "
    << b.granularity.name();
  return s.str();
}

// Normal values whose magnitude changes along rows and along K, so that per-row and block scales differ.
std::vector<float> random_values(std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      v[static_cast<std::size_t>(r * cols + c)] =
          normal(rng) * static_cast<float>(1 + r % 5) * std::ldexp(1.0f, static_cast<int>((c / 64) % 3) - 1);
  return v;
}

ScaledTensor random_quantized(std::int64_t rows, std::int64_t cols, std::uint32_t seed, Format f, Granularity g) {
  const auto v = random_values(rows, cols, seed);
  return quantize(MatrixRef{v.data(), rows, cols}, {f, Overflow::kSaturate, g, {}});
}

// A ScaledTensor built from codes, with random power-of-two scales 2^lo .. 2^hi times 2^offset.
ScaledTensor from_codes(Format f, Granularity g, std::int64_t rows, std::int64_t cols, std::vector<std::uint8_t> codes,
                        std::uint32_t seed, int lo = -2, int hi = 2, int offset = 0) {
  ScaledTensor s;
  s.format = f;
  s.overflow = Overflow::kSaturate;
  s.granularity = g;
  s.rows = rows;
  s.cols = cols;
  s.data.assign(codes.begin(), codes.end());
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> e(lo, hi);
  s.scale_inv.resize(static_cast<std::size_t>(s.grid_rows() * s.grid_cols()));
  for (float& x : s.scale_inv) x = std::ldexp(1.0f, e(rng) + offset);
  return s;
}

// The code of an exact value (+0 for zero).
std::uint8_t code_of(Format f, float v) {
  for (int c = 0; c < 256; ++c) {
    const float d = decode_to_float(f, static_cast<std::uint8_t>(c));
    if (d == v && std::signbit(d) == std::signbit(v)) return static_cast<std::uint8_t>(c);
  }
  ADD_FAILURE() << v << " is not a value of " << name(f);
  return 0;
}

// Codes of random integers in [-8, 8] (exact in every FP8 format).
std::vector<std::uint8_t> integer_codes(Format f, std::int64_t count, std::uint32_t seed) {
  std::uint8_t table[17];
  for (int v = -8; v <= 8; ++v) table[v + 8] = code_of(f, static_cast<float>(v));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, 16);
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(count));
  for (auto& c : codes) c = table[pick(rng)];
  return codes;
}

// Codes of +-2^p, p in [-2, 2].
std::vector<std::uint8_t> power_of_two_codes(Format f, std::int64_t count, std::uint32_t seed) {
  std::uint8_t table[2][5];
  for (int p = -2; p <= 2; ++p) {
    table[0][p + 2] = code_of(f, std::ldexp(1.0f, p));
    table[1][p + 2] = code_of(f, -std::ldexp(1.0f, p));
  }
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> p(0, 4), sign(0, 1);
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(count));
  for (auto& c : codes) c = table[sign(rng)][p(rng)];
  return codes;
}

// Codes whose exponent field is 0 (subnormals, half of them), 1 or 2 (the smallest normals), with random signs:
// every product with a power of two is a multiple of one small unit and sums stay far below 2^24 units (exact).
std::vector<std::uint8_t> subnormal_codes(Format f, std::int64_t count, std::uint32_t seed) {
  const int mant_bits = (f == Format::e4m3fn || f == Format::e4m3fnuz) ? 3 : 2;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> exponent(0, 3), mantissa(0, (1 << mant_bits) - 1), sign(0, 1);
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(count));
  for (auto& c : codes) {
    const int e = std::max(0, exponent(rng) - 1);  // 0 with probability 1/2
    int m = mantissa(rng);
    if (e == 0 && m == 0) m = 1;
    c = static_cast<std::uint8_t>((sign(rng) << 7) | (e << mant_bits) | m);
  }
  return codes;
}

// Each value decoded exactly and multiplied by its scale, in FP64.
std::vector<double> dequantize64(const ScaledTensor& s) {
  std::vector<double> v(s.data.size());
  for (std::int64_t r = 0; r < s.rows; ++r)
    for (std::int64_t c = 0; c < s.cols; ++c) {
      const float scale =
          s.scale_inv[static_cast<std::size_t>((r / s.block_rows()) * s.grid_cols() + c / s.block_cols())];
      const std::size_t o = static_cast<std::size_t>(r * s.cols + c);
      v[o] = static_cast<double>(decode_to_float(s.format, s.data[o])) * scale;
    }
  return v;
}

// FP64 value of a x b^T (+ bias) and sum_k |a b| per output: a is m x k, b n x k (both already scaled).
struct Exact {
  std::int64_t m = 0, n = 0, k = 0;
  std::vector<double> value, abs_sum;
};

Exact exact_product(const std::vector<double>& a, const std::vector<double>& b, std::int64_t m, std::int64_t n,
                    std::int64_t k, std::span<const float> bias = {}) {
  Exact e{m, n, k, std::vector<double>(static_cast<std::size_t>(m * n)),
          std::vector<double>(static_cast<std::size_t>(m * n))};
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0, abs_s = 0;
      for (std::int64_t kk = 0; kk < k; ++kk) {
        const double p = a[static_cast<std::size_t>(i * k + kk)] * b[static_cast<std::size_t>(j * k + kk)];
        s += p;
        abs_s += std::fabs(p);
      }
      if (!bias.empty()) s += bias[static_cast<std::size_t>(j)];
      e.value[static_cast<std::size_t>(i * n + j)] = s;
      e.abs_sum[static_cast<std::size_t>(i * n + j)] = abs_s;
    }
  return e;
}

std::vector<double> transpose64(const std::vector<double>& x, std::int64_t rows, std::int64_t cols) {
  std::vector<double> t(x.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      t[static_cast<std::size_t>(j * rows + i)] = x[static_cast<std::size_t>(i * cols + j)];
  return t;
}

Exact exact_scaled_mm(const ScaledTensor& a, const ScaledTensor& b, BLayout layout, std::span<const float> bias = {}) {
  const bool nk = layout == BLayout::kNK;
  const std::int64_t n = nk ? b.rows : b.cols;
  auto db = dequantize64(b);
  if (!nk) db = transpose64(db, b.rows, b.cols);
  return exact_product(dequantize64(a), db, a.rows, n, a.cols, bias);
}

// Activations as the fast path sees them: float32 values, or bfloat16 storage of the same values rounded.
struct Activations {
  std::int64_t rows = 0, cols = 0;
  DType dtype = DType::float32;
  std::vector<float> f32;
  std::vector<bfloat16> bf16;
  MatrixRef view() const {
    return {dtype == DType::float32 ? static_cast<const void*>(f32.data()) : static_cast<const void*>(bf16.data()),
            dtype, rows, cols};
  }
  std::vector<double> values64() const {
    std::vector<double> v(static_cast<std::size_t>(rows * cols));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = dtype == DType::float32 ? f32[i] : bf16[i].to_float();
    return v;
  }
};

Activations make_activations(std::vector<float> values, std::int64_t rows, std::int64_t cols, DType dtype) {
  Activations x{rows, cols, dtype, std::move(values), {}};
  if (dtype == DType::bfloat16) {
    for (float v : x.f32) x.bf16.push_back(bfloat16::from_float(v));
    x.f32.clear();
  }
  return x;
}

Exact exact_weight_mm(const Activations& x, const ScaledTensor& w, std::span<const float> bias = {}) {
  return exact_product(x.values64(), dequantize64(w), x.rows, w.rows, x.cols, bias);
}

std::string hex(float v) {
  std::ostringstream s;
  s << std::hexfloat << v;
  return s.str();
}

// Bit for bit (any NaN matches any NaN: the payload is not part of the contract).
::testing::AssertionResult same_bits(std::span<const float> got, std::span<const float> want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i]))
      return ::testing::AssertionFailure() << "element " << i << ": " << hex(got[i]) << " vs " << hex(want[i]);
  }
  return ::testing::AssertionSuccess();
}

// Bit-equal to the FP64 value (which must then be a float): for inputs whose sums are exact.
::testing::AssertionResult exact(std::span<const float> got, const Exact& want) {
  if (static_cast<std::int64_t>(got.size()) != want.m * want.n)
    return ::testing::AssertionFailure() << "size " << got.size();
  for (std::size_t o = 0; o < got.size(); ++o) {
    const double w = want.value[o];
    if (static_cast<double>(static_cast<float>(w)) != w)
      return ::testing::AssertionFailure() << "test bug: " << w << " at " << o << " is not a float";
    if (std::bit_cast<std::uint32_t>(got[o]) != std::bit_cast<std::uint32_t>(static_cast<float>(w)))
      return ::testing::AssertionFailure() << "element " << o << " (" << o / want.n << "," << o % want.n
                                           << "): " << hex(got[o]) << " vs exact " << hex(static_cast<float>(w));
  }
  return ::testing::AssertionSuccess();
}

// The kFp32Bound contract (mm_error_bound, whose derivation is in scaled_mm.hpp and docs/gemm.md) against the FP64
// value, without its subnormal-flush term (no test data here makes a product or a sum subnormal in bfloat16
// kernels, so the check is the stricter one); for a bfloat16 output also the rounding to bfloat16:
// + 2^-8 * (|ref64| + that bound). NaN where ref64 is NaN, Inf equal.
::testing::AssertionResult within_bound(std::span<const float> got, const Exact& want, bool bf16_out = false) {
  if (static_cast<std::int64_t>(got.size()) != want.m * want.n)
    return ::testing::AssertionFailure() << "size " << got.size();
  for (std::size_t o = 0; o < got.size(); ++o) {
    const double w = want.value[o], g = got[o];
    if (std::isnan(w) || std::isnan(g)) {
      if (std::isnan(w) && std::isnan(g)) continue;
      return ::testing::AssertionFailure() << "element " << o << ": " << g << " vs " << w;
    }
    if (std::isinf(w) || std::isinf(g)) {
      if (w == g) continue;
      return ::testing::AssertionFailure() << "element " << o << ": " << g << " vs " << w;
    }
    double bound = mm_error_bound(want.k, want.abs_sum[o], std::fabs(w), 0.0);
    if (bf16_out) {
      bound += 0x1p-8 * (std::fabs(w) + bound);
      if (bfloat16::from_float(got[o]).to_float() != got[o])
        return ::testing::AssertionFailure() << "element " << o << " = " << hex(got[o]) << " is not a bfloat16";
    }
    if (!(std::fabs(g - w) <= bound))
      return ::testing::AssertionFailure() << "element " << o << " (" << o / want.n << "," << o % want.n << "): " << g
                                           << " vs " << w << ", |error| " << std::fabs(g - w) << " > bound " << bound;
  }
  return ::testing::AssertionSuccess();
}

float finite_amax(std::span<const float> v) {
  float amax = 0;
  for (float x : v)
    if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
  return amax;
}

std::vector<float> random_bias(std::int64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = normal(rng);
  return v;
}

// set_num_threads for a scope, restoring the previous count.
class ThreadCount {
 public:
  explicit ThreadCount(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(saved_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int saved_;
};

// The fast product checked against its kernel's contract: the reference bit for bit (amax too), or within the FP32
// bound of the FP64 value; with the path the dispatcher must take (the GEMM, but for M up to the level's GEMV limit
// with B as N x K: the AVX512-BF16 level runs M <= 16 there).
void expect_gemm_contract(const ScaledTensor& a, const ScaledTensor& b, const ScaledMmOptions& options) {
  const ScaledMmResult got = scaled_mm(a, b, options);
  const std::string what = describe(a, b, options.b_layout) + (options.bias.empty() ? "" : " +bias") +
                           (options.out_dtype == DType::bfloat16 ? " bf16" : "") + " [" +
                           std::string(got.dispatch.kernel) + "]";
  const bool gemv = options.b_layout == BLayout::kNK && got.m <= gemv_max_m();
  EXPECT_EQ(got.path, gemv ? MmPath::kGemv : MmPath::kGemm) << what;
  if (got.dispatch.contract == KernelContract::kBitIdentical) {
    const ScaledMmResult want = scaled_mm_reference(a, b, options);
    EXPECT_EQ(got.m, want.m) << what;
    EXPECT_EQ(got.n, want.n) << what;
    EXPECT_TRUE(same_bits(got.out, want.out)) << what;
    EXPECT_EQ(std::bit_cast<std::uint32_t>(got.amax), std::bit_cast<std::uint32_t>(want.amax))
        << what << ": " << got.amax << " vs " << want.amax;
  } else {
    EXPECT_TRUE(within_bound(got.out, exact_scaled_mm(a, b, options.b_layout, options.bias),
                             options.out_dtype == DType::bfloat16))
        << what;
    EXPECT_EQ(got.amax, finite_amax(got.out)) << what;
  }
}

// Every test below runs once per ISA level, with dispatch capped there.
class MmLevel : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    FP8KIT_SKIP_UNLESS_RUNS(GetParam());
    cap_.emplace(GetParam());
  }
  void TearDown() override { cap_.reset(); }

 private:
  std::optional<testing::ScopedIsa> cap_;
};
class ScaledMmFast : public MmLevel {};
class WeightMm : public MmLevel {};
INSTANTIATE_TEST_SUITE_P(Levels, ScaledMmFast, ::testing::ValuesIn(kAllIsas), testing::isa_param_name);
INSTANTIATE_TEST_SUITE_P(Levels, WeightMm, ::testing::ValuesIn(kAllIsas), testing::isa_param_name);

// ---------------------------------------------------------------- scaled_mm, GEMM path

TEST_P(ScaledMmFast, PathNames) {
  const std::string_view names[] = {name(MmPath::kReference), name(MmPath::kGemm), name(MmPath::kGemv)};
  for (auto n : names) EXPECT_FALSE(n.empty());
  EXPECT_NE(names[0], names[1]);
  EXPECT_NE(names[0], names[2]);
  EXPECT_NE(names[1], names[2]);
}

TEST_P(ScaledMmFast, GemmContractEveryGranularityFormatAndLayout) {
  const std::int64_t m = 17, k = 300, n = 45;
  std::uint32_t seed = 100;
  for (BLayout layout : {BLayout::kNK, BLayout::kKN}) {
    for (const GranularityPair& g : granularity_pairs(layout)) {
      for (const FormatPair& f : kFormatPairs) {
        const ScaledTensor a = random_quantized(m, k, ++seed, f.a, g.a);
        const ScaledTensor b = layout == BLayout::kNK ? random_quantized(n, k, ++seed, f.b, g.b)
                                                      : random_quantized(k, n, ++seed, f.b, g.b);
        expect_gemm_contract(a, b, {layout});
      }
    }
  }
}

TEST_P(ScaledMmFast, GemmContractOddAndTinyShapes) {
  // M, N from {1, 3, 17, 129} and K from {1, 3, 17, 129, 300}: edge micro-tiles (6 x 16) and partial K blocks.
  // M <= 4 only takes the GEMM path with B given K x N.
  const std::int64_t sizes[] = {1, 3, 17, 129};
  const std::int64_t ks[] = {1, 3, 17, 129, 300};
  std::uint32_t seed = 1000;
  std::size_t case_index = 0;
  for (BLayout layout : {BLayout::kNK, BLayout::kKN}) {
    const auto pairs = granularity_pairs(layout);
    for (std::int64_t m : sizes) {
      if (m <= gemv_max_m() && layout == BLayout::kNK) continue;  // the GEMV path: tested below
      for (std::int64_t n : sizes)
        for (std::int64_t k : ks) {
          if (m == 129 && n == 129 && k > 129) continue;  // keep the reference's time short
          const GranularityPair& g = pairs[case_index % pairs.size()];
          const FormatPair& f = kFormatPairs[case_index % std::size(kFormatPairs)];
          ++case_index;
          const ScaledTensor a = random_quantized(m, k, ++seed, f.a, g.a);
          const ScaledTensor b = layout == BLayout::kNK ? random_quantized(n, k, ++seed, f.b, g.b)
                                                        : random_quantized(k, n, ++seed, f.b, g.b);
          expect_gemm_contract(a, b, {layout});
        }
    }
  }
}

TEST_P(ScaledMmFast, GemmContractLargeManyPanels) {
  // Several cache panels along M, N and K (the K panels are a few hundred deep), with K = 520 not a multiple of 128.
  const std::int64_t m = 200, n = 300, k = 520;
  const std::vector<float> bias = random_bias(n, 7);
  const ScaledTensor a_blk = random_quantized(m, k, 1, Format::e4m3fn, Granularity::block(1, 128));
  const ScaledTensor a_row = random_quantized(m, k, 2, Format::e4m3fn, Granularity::row());
  const ScaledTensor b_nk = random_quantized(n, k, 3, Format::e4m3fn, Granularity::block(128, 128));
  const ScaledTensor b_kn = random_quantized(k, n, 4, Format::e5m2, Granularity::block(128, 128));
  const ScaledTensor b_nk_row = random_quantized(n, k, 5, Format::e4m3fn, Granularity::row());
  const ScaledTensor b_kn_col = random_quantized(k, n, 6, Format::e4m3fn, Granularity::column());
  expect_gemm_contract(a_blk, b_nk, {BLayout::kNK});
  expect_gemm_contract(a_blk, b_kn, {BLayout::kKN, DType::bfloat16, bias});
  expect_gemm_contract(a_row, b_nk_row, {BLayout::kNK, DType::float32, bias});
  expect_gemm_contract(a_row, b_kn_col, {BLayout::kKN});
}

TEST_P(ScaledMmFast, GemmBiasAndBfloat16Output) {
  std::uint32_t seed = 2000;
  for (BLayout layout : {BLayout::kNK, BLayout::kKN}) {
    const auto pairs = granularity_pairs(layout);
    for (std::size_t p = 0; p < pairs.size(); p += 2) {
      for (auto [m, n, k] : {std::tuple{7, 33, 129}, std::tuple{13, 16, 300}}) {
        const FormatPair& f = kFormatPairs[seed % std::size(kFormatPairs)];
        const ScaledTensor a = random_quantized(m, k, ++seed, f.a, pairs[p].a);
        const ScaledTensor b = layout == BLayout::kNK ? random_quantized(n, k, ++seed, f.b, pairs[p].b)
                                                      : random_quantized(k, n, ++seed, f.b, pairs[p].b);
        const std::vector<float> bias = random_bias(n, ++seed);
        expect_gemm_contract(a, b, {layout, DType::float32, bias});
        expect_gemm_contract(a, b, {layout, DType::bfloat16, {}});
        expect_gemm_contract(a, b, {layout, DType::bfloat16, bias});
      }
    }
  }
}

// The activation order of the GEMVs that decode a whole load of codes in place (lane_chunk 64 and 32): within each
// K block, every whole chunk holds x[c + 4i + b] at c + L b + i (L = chunk / 4), the rest of the block in order;
// every value lands once. K blocks of 96 and 200 leave partial chunks, K = 203 a partial block.
TEST(GemvLaneOrder, ChunksOfEachKBlockArePermutedAndTheRestKept) {
  const std::int64_t m = 2, k = 203;
  std::vector<float> x(static_cast<std::size_t>(m * k));
  for (std::size_t t = 0; t < x.size(); ++t) x[t] = static_cast<float>(t);
  for (const int chunk : {32, 64}) {
    for (const std::int64_t kblock : {std::int64_t{32}, std::int64_t{96}, std::int64_t{200}, k}) {
      std::vector<float> out(x.size(), -1.0f);
      mm_detail::to_gemv_lane_order(x.data(), m, k, kblock, chunk, out.data());
      const std::int64_t lanes = chunk / 4;
      const auto at = [k](std::int64_t i, std::int64_t c) { return static_cast<std::size_t>(i * k + c); };
      for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t k0 = 0; k0 < k; k0 += kblock) {
          const std::int64_t k1 = std::min(k, k0 + kblock);
          std::int64_t c = k0;
          for (; c + chunk <= k1; c += chunk)
            for (std::int64_t b = 0; b < 4; ++b)
              for (std::int64_t l = 0; l < lanes; ++l)
                EXPECT_EQ(out[at(i, c + lanes * b + l)], x[at(i, c + 4 * l + b)])
                    << "chunk " << chunk << " kblock " << kblock;
          for (; c < k1; ++c) EXPECT_EQ(out[at(i, c)], x[at(i, c)]) << "chunk " << chunk << " kblock " << kblock;
        }
      }
      std::vector<float> sorted = out;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(sorted, x) << "chunk " << chunk << " kblock " << kblock;
    }
  }
}

// The float32 GEMVs of the AVX-512 levels, driven directly as gemv() drives them: the level tables name the table
// decode (kAvx512VbmiGemv) where the CPU has VBMI, so on such a CPU the shift decode (kAvx512Gemv, the kernel of
// AVX-512 CPUs without VBMI) runs nowhere else in the suite. Both against the exact sums in double within
// mm_error_bound: every weight format, M 1-4, K blocks whole and of 128 and 32 (partial chunks, partial steps), weight
// row counts that leave a tail of single rows; the shift decode with the activations rebiased and not, both in its
// lane order; then one NaN code: the shift decode declines the rows (the driver recomputes them), the table decode
// multiplies it (NaN in that row only).
TEST(Avx512FloatGemv, BothDecodesWithinTheBoundDrivenDirectly) {
  FP8KIT_SKIP_UNLESS_RUNS(Isa::kAvx512);
  const bool vbmi = cpu_features().avx512vbmi;
  if (!vbmi) std::printf("[ note ] no avx512vbmi: the table-decode GEMV skipped, the shift decode run\n");
  const std::int64_t n = 11;
  std::uint32_t seed = 30000;
  for (Format f : kWeightFormats) {
    const mm_detail::DecodeTable& values = mm_detail::decode_table(f);
    const mm_detail::RegisterDecodeRule rule = mm_detail::register_decode_rule(f);
    for (std::int64_t m = 1; m <= mm_detail::kGemvRows; ++m)
      for (const std::int64_t k : {std::int64_t{64}, std::int64_t{200}, std::int64_t{1000}})
        for (const std::int64_t kblock : {k, std::int64_t{128}, std::int64_t{32}}) {
          const std::int64_t kbs = (k + kblock - 1) / kblock;
          const std::string what = std::string(name(f)) + " m " + std::to_string(m) + " k " + std::to_string(k) +
                                   " kblock " + std::to_string(kblock);
          std::mt19937 rng(++seed);
          std::vector<std::uint8_t> w(static_cast<std::size_t>(n * k));
          for (auto& c : w) {
            c = static_cast<std::uint8_t>(rng());
            if ((c & rule.special_mask) == rule.special_value) c = 0x01;  // the smallest subnormal instead
          }
          const std::vector<float> x = random_values(m, k, ++seed);
          std::vector<float> sa_data(static_cast<std::size_t>(m * kbs)), sb_data(static_cast<std::size_t>(n * kbs));
          for (auto* v : {&sa_data, &sb_data})
            for (float& s : *v)
              s = std::ldexp(1.0f + static_cast<float>(rng() % 64) / 64.0f, static_cast<int>(rng() % 9) - 4);
          const mm_detail::ScaleIndex sa{sa_data.data(), 1, kbs, 1}, sb{sb_data.data(), 1, kbs, 1};
          // The exact results and the bound.
          std::vector<double> exact(static_cast<std::size_t>(m * n)), bound(exact.size());
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
              double sum = 0, abs_sum = 0, max_scale = 0;
              for (std::int64_t kb = 0; kb < kbs; ++kb) {
                const double s = static_cast<double>(sa.at(i, kb)) * sb.at(j, kb);
                max_scale = std::max(max_scale, std::abs(s));
                for (std::int64_t t = kb * kblock; t < std::min(k, (kb + 1) * kblock); ++t) {
                  const double product = static_cast<double>(x[static_cast<std::size_t>(i * k + t)]) *
                                         values[w[static_cast<std::size_t>(j * k + t)]] * s;
                  sum += product;
                  abs_sum += std::abs(product);
                }
              }
              exact[static_cast<std::size_t>(i * n + j)] = sum;
              bound[static_cast<std::size_t>(i * n + j)] = mm_error_bound(k, abs_sum, std::abs(sum), max_scale);
            }
          const auto check = [&](const std::vector<float>& out, const std::string& kernel) {
            for (std::size_t t = 0; t < out.size(); ++t)
              EXPECT_LE(std::abs(out[t] - exact[t]), bound[t]) << kernel << " " << what << " output " << t;
          };
          // The shift decode, rebiased and not, its activations in lane order.
          std::vector<float> rebiased(x.size()), lanes(x.size()), out(exact.size());
          mm_detail::GemvInput in{nullptr, k};
          ASSERT_TRUE(mm_detail::rebias_gemv_input(x, f, false, rebiased.data(), in.sum_scale)) << what;
          mm_detail::to_gemv_lane_order(rebiased.data(), m, k, kblock, 64, lanes.data());
          in.rebiased = lanes.data();
          ASSERT_TRUE(mm_detail::kAvx512Gemv.run(f, m, 0, n, k, kblock, in, w.data(), sa, sb, out.data(), n)) << what;
          check(out, "shift decode, rebiased");
          std::vector<float> x_lanes(x.size());
          mm_detail::to_gemv_lane_order(x.data(), m, k, kblock, 64, x_lanes.data());
          const mm_detail::GemvInput plain_lanes{x_lanes.data(), k};
          ASSERT_TRUE(mm_detail::kAvx512Gemv.run(f, m, 0, n, k, kblock, plain_lanes, w.data(), sa, sb, out.data(), n));
          check(out, "shift decode");
          // The table decode, its activations in k order.
          const mm_detail::GemvInput plain{x.data(), k};
          if (vbmi) {
            ASSERT_TRUE(mm_detail::kAvx512VbmiGemv.run(f, m, 0, n, k, kblock, plain, w.data(), sa, sb, out.data(), n));
            check(out, "table decode");
          }
          // A NaN code in weight row 5.
          const std::uint8_t nan_code = f == Format::e4m3fn ? 0x7F : f == Format::e5m2 ? 0x7E : 0x80;
          w[static_cast<std::size_t>(5 * k + k / 2)] = nan_code;
          EXPECT_FALSE(mm_detail::kAvx512Gemv.run(f, m, 0, n, k, kblock, plain_lanes, w.data(), sa, sb, out.data(), n))
              << what;
          if (vbmi) {
            ASSERT_TRUE(mm_detail::kAvx512VbmiGemv.run(f, m, 0, n, k, kblock, plain, w.data(), sa, sb, out.data(), n));
            for (std::int64_t i = 0; i < m; ++i)
              for (std::int64_t j = 0; j < n; ++j)
                EXPECT_EQ(std::isnan(out[static_cast<std::size_t>(i * n + j)]), j == 5) << what << " " << i << "," << j;
          }
        }
  }
}

// The bfloat16 activations of the GEMVs that read x_bf16: FP8 rows decoded straight to bfloat16 by the level's
// conversion kernels, bfloat16 rows copied, and a K-strided operand narrowed from its float32 rows: in every case the
// bits of bfloat16::from_float of the exact float32 values (all 256 codes of each format, rows with padding).
TEST_P(ScaledMmFast, GemvBfloat16RowsAreTheExactRowsNarrowed) {
  const std::int64_t m = 3, k = 300, ld = 310;
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(m * ld));
  for (std::size_t t = 0; t < codes.size(); ++t) codes[t] = static_cast<std::uint8_t>(t * 7 + 3);
  std::vector<bfloat16> wide(codes.size());
  for (std::size_t t = 0; t < wide.size(); ++t)
    wide[t] = bfloat16::from_float(std::ldexp(static_cast<float>(t % 255) - 127.0f, static_cast<int>(t % 41) - 20));
  const auto check = [&](const mm_detail::Operand& a, const std::string& what) {
    std::vector<float> x(static_cast<std::size_t>(m * k));
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t kk = 0; kk < k; ++kk) x[static_cast<std::size_t>(i * k + kk)] = a.at(i, kk);
    std::vector<bfloat16> got(x.size(), bfloat16::from_bits(0x5555));
    mm_detail::left_rows_bf16(a, m, k, x.data(), got.data());
    std::size_t mismatches = 0;
    for (std::size_t t = 0; t < x.size(); ++t) {
      const bfloat16 want = bfloat16::from_float(x[t]);
      const bool same = std::isnan(x[t]) ? std::isnan(got[t].to_float()) : got[t].bits == want.bits;
      mismatches += same ? 0 : 1;
    }
    EXPECT_EQ(mismatches, 0u) << what;
  };
  for (const Format f : {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz}) {
    mm_detail::Operand a;
    a.codes = codes.data();
    a.format = f;
    a.rows = m;
    a.k = k;
    a.ld = ld;
    check(a, std::string(name(f)));
    a.k_contiguous = false;  // element (r, kk) at kk * ld + r: read through x
    a.ld = m;
    check(a, std::string(name(f)) + " K-strided");
  }
  mm_detail::Operand b;
  b.bf16 = wide.data();
  b.rows = m;
  b.k = k;
  b.ld = ld;
  check(b, "bfloat16");
  mm_detail::Operand f32;
  f32.f32 = reinterpret_cast<const float*>(wide.data());
  EXPECT_THROW(mm_detail::left_rows_bf16(f32, 1, 1, nullptr, nullptr), Error);
}

// Each level dispatches its own table's kernels (or the nearest level's below it) and says so.
TEST_P(ScaledMmFast, DispatchReportsTheLevelsKernels) {
  const ScaledTensor a = random_quantized(40, 96, 1, Format::e4m3fn, Granularity::tensor());
  const ScaledTensor b = random_quantized(50, 96, 2, Format::e4m3fn, Granularity::tensor());
  const ScaledTensor a1 = random_quantized(1, 96, 3, Format::e4m3fn, Granularity::tensor());
  const MmKernels kernels = mm_kernels();
  EXPECT_EQ(kernels.isa, GetParam());           // every level has a matrix-multiply table of its own
  const ScaledMmResult gemm = scaled_mm(a, b);  // M = 40: the small-M kernel where the level has one
  EXPECT_EQ(gemm.dispatch.isa, GetParam());
  EXPECT_EQ(gemm.dispatch.contract, kernels.gemm_contract);
  EXPECT_EQ(gemm.dispatch.kernel, kernels.gemm_small_m.empty() ? kernels.gemm : kernels.gemm_small_m);
  const ScaledTensor a200 = random_quantized(200, 96, 8, Format::e4m3fn, Granularity::tensor());
  EXPECT_EQ(scaled_mm(a200, b).dispatch.kernel, kernels.gemm);
  const ScaledMmResult gemv = scaled_mm(a1, b);
  EXPECT_EQ(gemv.dispatch.path, MmPath::kGemv);
  EXPECT_EQ(gemv.dispatch.kernel, kernels.gemv);
  EXPECT_EQ(gemv.dispatch.contract, kernels.gemv_contract);
  // float32 operands always run the FP32 FMA kernels, bit-identical to the reference.
  const std::vector<float> x = random_values(40, 96, 4), w = random_values(50, 96, 5);
  std::vector<float> out(40 * 50), ref(out.size());
  matmul({x.data(), DType::float32, 40, 96}, {w.data(), DType::float32, 50, 96}, BLayout::kNK, out);
  matmul_reference({x.data(), DType::float32, 40, 96}, {w.data(), DType::float32, 50, 96}, BLayout::kNK, ref);
  EXPECT_TRUE(same_bits(out, ref)) << kernels.gemm_f32;
  std::printf("%s: gemm %s (%s), gemv %s, float32 gemm %s, float32 gemv %s\n", std::string(name(GetParam())).c_str(),
              std::string(kernels.gemm).c_str(), std::string(name(kernels.gemm_contract)).c_str(),
              std::string(kernels.gemv).c_str(), std::string(kernels.gemm_f32).c_str(),
              std::string(kernels.gemv_f32).c_str());
}

// Small and mid M with weights N x K: the kernels' weights-left paths (the fused weight stream up to M = 64, the
// streamed panels up to 128, the ordinary orientation above) and both sides of each level's GEMV limit (16 or 24),
// unblocked and blocked scales, N and K off every tile and panel size.
TEST_P(ScaledMmFast, SmallAndMidMKeepTheirContract) {
  std::uint32_t seed = 12000;
  for (std::int64_t m : {5, 16, 17, 24, 25, 33, 64, 65, 128, 129})
    for (auto [n, k] : {std::tuple{45, 301}, std::tuple{260, 100}})
      for (const GranularityPair& g : {GranularityPair{Granularity::tensor(), Granularity::tensor()},
                                       GranularityPair{Granularity::row(), Granularity::row()},
                                       GranularityPair{Granularity::block(1, 128), Granularity::block(128, 128)}}) {
        const ScaledTensor a = random_quantized(m, k, ++seed, Format::e4m3fn, g.a);
        ++seed;  // (apart: an argument that reads seed beside one that increments it is unsequenced)
        const ScaledTensor b = random_quantized(n, k, seed, seed % 2 ? Format::e5m2 : Format::e4m3fn, g.b);
        const std::vector<float> bias = random_bias(n, ++seed);
        expect_gemm_contract(a, b, {BLayout::kNK, seed % 3 == 0 ? DType::bfloat16 : DType::float32, bias});
      }
}

// K = 0: every output is the bias (or 0), whatever the buffer held before, on every path (a weights-left path once
// wrote its stale scratch block here).
TEST_P(ScaledMmFast, EmptyKWritesTheBias) {
  for (std::int64_t m : {1, 4, 5, 40, 100, 200})
    for (std::int64_t n : {3, 27})
      for (const Granularity& g : {Granularity::tensor(), Granularity::row()}) {
        ScaledTensor a, b;
        a.format = Format::e4m3fn;
        b.format = Format::e5m2;
        a.rows = m;
        b.rows = n;
        a.granularity = b.granularity = g;
        a.scale_inv.resize(static_cast<std::size_t>(a.grid_rows() * a.grid_cols()), 2.0f);
        b.scale_inv.resize(static_cast<std::size_t>(b.grid_rows() * b.grid_cols()), 2.0f);
        a.data.reserve(64);  // capacity without elements: a non-null pointer to no codes
        b.data.reserve(64);
        const std::vector<float> bias = random_bias(n, 5);
        // A product with K > 0 first, so that the kernels' per-thread scratch holds nonzero sums.
        // (block scales: the weights-left kernels' general path, not the fused stream)
        (void)scaled_mm(random_quantized(m, 64, 6, Format::e4m3fn, Granularity::block(1, 32)),
                        random_quantized(n, 64, 7, Format::e4m3fn, Granularity::block(32, 32)));
        std::vector<float> out(static_cast<std::size_t>(m * n), 12345.0f);
        MmDispatch dispatch;
        scaled_mm_into(a, b, out, {BLayout::kNK, DType::float32, bias}, &dispatch);
        for (std::int64_t i = 0; i < m * n; ++i)
          ASSERT_EQ(out[static_cast<std::size_t>(i)], bias[static_cast<std::size_t>(i % n)])
              << m << "x" << n << " " << g.name() << " [" << dispatch.kernel << "] at " << i;
        const std::vector<bfloat16> x(1);
        std::fill(out.begin(), out.end(), 12345.0f);
        fp8_weight_mm({x.data(), DType::bfloat16, m, 0}, b, out, bias, &dispatch);
        for (std::int64_t i = 0; i < m * n; ++i)
          ASSERT_EQ(out[static_cast<std::size_t>(i)], bias[static_cast<std::size_t>(i % n)])
              << "weight-only " << m << "x" << n << " [" << dispatch.kernel << "] at " << i;
      }
}

TEST_P(ScaledMmFast, IntoMatchesScaledMmAndOverwritesTheBuffer) {
  for (auto [m, layout] : {std::tuple{3, BLayout::kNK}, std::tuple{3, BLayout::kKN}, std::tuple{9, BLayout::kNK}}) {
    const std::int64_t n = 21, k = 200;
    const ScaledTensor a = random_quantized(m, k, 11, Format::e4m3fn, Granularity::row());
    const ScaledTensor b = layout == BLayout::kNK ? random_quantized(n, k, 12, Format::e4m3fn, Granularity::row())
                                                  : random_quantized(k, n, 12, Format::e4m3fn, Granularity::column());
    const std::vector<float> bias = random_bias(n, 13);
    const ScaledMmOptions options{layout, DType::bfloat16, bias};
    const ScaledMmResult r = scaled_mm(a, b, options);
    std::vector<float> out(static_cast<std::size_t>(m * n), std::nanf(""));
    MmDispatch dispatch;
    const float amax = scaled_mm_into(a, b, out, options, &dispatch);
    EXPECT_EQ(dispatch.path, r.path);
    EXPECT_EQ(dispatch.path, m <= gemv_max_m() && layout == BLayout::kNK ? MmPath::kGemv : MmPath::kGemm);
    EXPECT_TRUE(same_bits(out, r.out));
    EXPECT_EQ(amax, r.amax);
    EXPECT_EQ(amax, finite_amax(out));
    for (float v : out) EXPECT_FALSE(std::isnan(v));
    std::vector<float> again(out.size(), -1.0f);
    EXPECT_EQ(scaled_mm_into(a, b, again, options), amax);  // no path pointer
    EXPECT_TRUE(same_bits(again, out));
  }
}

// ---------------------------------------------------------------- scaled_mm, GEMV path

TEST_P(ScaledMmFast, GemvWithinFp32BoundEveryGranularityAndFormat) {
  const std::int64_t m = 4, n = 45, k = 300;
  std::uint32_t seed = 3000;
  for (const GranularityPair& g : granularity_pairs(BLayout::kNK))
    for (const FormatPair& f : kFormatPairs) {
      const ScaledTensor a = random_quantized(m, k, ++seed, f.a, g.a);
      const ScaledTensor b = random_quantized(n, k, ++seed, f.b, g.b);
      const ScaledMmResult r = scaled_mm(a, b);
      EXPECT_EQ(r.path, MmPath::kGemv) << describe(a, b, BLayout::kNK);
      EXPECT_EQ(r.m, m);
      EXPECT_EQ(r.n, n);
      EXPECT_TRUE(within_bound(r.out, exact_scaled_mm(a, b, BLayout::kNK))) << describe(a, b, BLayout::kNK);
      EXPECT_EQ(r.amax, finite_amax(r.out)) << describe(a, b, BLayout::kNK);
    }
}

TEST_P(ScaledMmFast, GemvWithinFp32BoundOddShapesBiasAndBfloat16) {
  const std::int64_t ns[] = {1, 3, 17, 129};
  const std::int64_t ks[] = {1, 3, 17, 129, 300};
  const auto pairs = granularity_pairs(BLayout::kNK);
  std::uint32_t seed = 4000;
  std::size_t case_index = 0;
  for (std::int64_t m = 1; m <= gemv_max_m(); ++m)
    for (std::int64_t n : ns)
      for (std::int64_t k : ks) {
        const GranularityPair& g = pairs[case_index % pairs.size()];
        const FormatPair& f = kFormatPairs[case_index % std::size(kFormatPairs)];
        const bool with_bias = case_index % 2 == 1, bf16 = case_index % 3 == 2;
        ++case_index;
        const ScaledTensor a = random_quantized(m, k, ++seed, f.a, g.a);
        const ScaledTensor b = random_quantized(n, k, ++seed, f.b, g.b);
        const std::vector<float> bias = with_bias ? random_bias(n, ++seed) : std::vector<float>{};
        const ScaledMmOptions options{BLayout::kNK, bf16 ? DType::bfloat16 : DType::float32, bias};
        const ScaledMmResult r = scaled_mm(a, b, options);
        const std::string what = describe(a, b, BLayout::kNK) + (with_bias ? " +bias" : "") + (bf16 ? " bf16" : "");
        EXPECT_EQ(r.path, MmPath::kGemv) << what;
        EXPECT_TRUE(within_bound(r.out, exact_scaled_mm(a, b, BLayout::kNK, bias), bf16)) << what;
        EXPECT_EQ(r.amax, finite_amax(r.out)) << what;
      }
}

TEST_P(ScaledMmFast, IntegerInputsExactOnBothPaths) {
  // Integers in [-8, 8] (exact in every format) with power-of-two scales 2^-2 .. 2^2: every partial sum is a
  // multiple of 2^-4 below 2^24 of them, so FP32 sums are exact in any order and both paths equal FP64 bit for bit.
  std::uint32_t seed = 5000;
  for (BLayout layout : {BLayout::kNK, BLayout::kKN})
    for (const GranularityPair& g : granularity_pairs(layout))
      for (const FormatPair& f : kFormatPairs)
        for (std::int64_t m : {3, 9}) {
          const std::int64_t n = 19, k = 300;
          seed += 6;
          const ScaledTensor a = from_codes(f.a, g.a, m, k, integer_codes(f.a, m * k, seed + 1), seed + 2);
          const ScaledTensor b = layout == BLayout::kNK
                                     ? from_codes(f.b, g.b, n, k, integer_codes(f.b, n * k, seed + 3), seed + 4)
                                     : from_codes(f.b, g.b, k, n, integer_codes(f.b, k * n, seed + 5), seed + 6);
          const ScaledMmResult r = scaled_mm(a, b, {layout});
          const std::string what = describe(a, b, layout);
          EXPECT_EQ(r.path, m <= gemv_max_m() && layout == BLayout::kNK ? MmPath::kGemv : MmPath::kGemm) << what;
          EXPECT_TRUE(exact(r.out, exact_scaled_mm(a, b, layout))) << what;
          EXPECT_EQ(r.amax, finite_amax(r.out)) << what;
        }
}

// ---------------------------------------------------------------- subnormals

TEST_P(ScaledMmFast, SubnormalWeightCodesExactOnBothPaths) {
  // B holds subnormal codes (e4m3fn 0x01..0x07, 0x81..0x87 and the e5m2 / fnuz equivalents) and the smallest
  // normals, A holds +-2^p (p in [-2, 2]), scales are 2^-1 .. 2^1: the sums are exact (see subnormal_codes).
  std::uint32_t seed = 6000;
  for (const FormatPair& f : kFormatPairs)
    for (BLayout layout : {BLayout::kNK, BLayout::kKN})
      for (const GranularityPair& g : granularity_pairs(layout))
        for (std::int64_t m : {2, 7}) {
          const std::int64_t n = 23, k = 300;
          seed += 6;
          const ScaledTensor a = from_codes(f.a, g.a, m, k, power_of_two_codes(f.a, m * k, seed + 1), seed + 2, -1, 1);
          const ScaledTensor b =
              layout == BLayout::kNK
                  ? from_codes(f.b, g.b, n, k, subnormal_codes(f.b, n * k, seed + 3), seed + 4, -1, 1)
                  : from_codes(f.b, g.b, k, n, subnormal_codes(f.b, k * n, seed + 5), seed + 6, -1, 1);
          const ScaledMmResult r = scaled_mm(a, b, {layout});
          const std::string what = describe(a, b, layout);
          EXPECT_EQ(r.path, m <= gemv_max_m() && layout == BLayout::kNK ? MmPath::kGemv : MmPath::kGemm) << what;
          EXPECT_TRUE(exact(r.out, exact_scaled_mm(a, b, layout))) << what;
        }
  // And the codes themselves: all of e4m3fn's subnormals, each against 1.0.
  for (std::int64_t m : {1, 8}) {
    std::vector<std::uint8_t> w;
    for (int c = 0x01; c <= 0x07; ++c) w.push_back(static_cast<std::uint8_t>(c));
    for (int c = 0x81; c <= 0x87; ++c) w.push_back(static_cast<std::uint8_t>(c));
    const std::int64_t n = static_cast<std::int64_t>(w.size()), k = 1;
    const ScaledTensor a = from_codes(Format::e4m3fn, Granularity::tensor(), m, k,
                                      std::vector<std::uint8_t>(static_cast<std::size_t>(m), 0x38), 1, 0, 0);  // 1.0
    const ScaledTensor b = from_codes(Format::e4m3fn, Granularity::tensor(), n, k, w, 1, 0, 0);
    const ScaledMmResult r = scaled_mm(a, b);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        const float want = (j < 7 ? 1.0f : -1.0f) * static_cast<float>(j % 7 + 1) * 0x1p-9f;
        EXPECT_EQ(r.out[static_cast<std::size_t>(i * n + j)], want) << "m " << m << " code " << int{w[j]};
      }
  }
}

TEST_P(ScaledMmFast, SubnormalFloat32OutputsExactOnBothPaths) {
  // Scales near 2^-70 on both sides: the outputs (multiples of 2^-142, most below 2^-126) are FP32 subnormals,
  // exact in IEEE arithmetic; flushing denormals to zero would break them.
  std::uint32_t seed = 6500;
  for (BLayout layout : {BLayout::kNK, BLayout::kKN})
    for (const GranularityPair& g : granularity_pairs(layout))
      for (std::int64_t m : {3, 8}) {
        const std::int64_t n = 18, k = 140;
        seed += 6;
        const ScaledTensor a =
            from_codes(Format::e4m3fn, g.a, m, k, integer_codes(Format::e4m3fn, m * k, seed + 1), seed + 2, -1, 1, -70);
        const ScaledTensor b = layout == BLayout::kNK
                                   ? from_codes(Format::e4m3fn, g.b, n, k,
                                                integer_codes(Format::e4m3fn, n * k, seed + 3), seed + 4, -1, 1, -70)
                                   : from_codes(Format::e4m3fn, g.b, k, n,
                                                integer_codes(Format::e4m3fn, k * n, seed + 5), seed + 6, -1, 1, -70);
        const ScaledMmResult r = scaled_mm(a, b, {layout});
        const Exact want = exact_scaled_mm(a, b, layout);
        const std::string what = describe(a, b, layout);
        EXPECT_TRUE(exact(r.out, want)) << what;
        std::size_t subnormals = 0;
        for (double v : want.value) subnormals += v != 0 && std::fabs(v) < 0x1p-126;
        EXPECT_GT(subnormals, want.value.size() / 2) << "test bug: " << what;
      }
}

#ifdef FP8KIT_TEST_MXCSR
// The calling thread in flush-to-zero and denormals-are-zero mode (as -ffast-math programs start), restored after.
class DenormalsAreZero {
 public:
  DenormalsAreZero() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }  // FTZ | DAZ
  ~DenormalsAreZero() { _mm_setcsr(saved_); }
  DenormalsAreZero(const DenormalsAreZero&) = delete;
  DenormalsAreZero& operator=(const DenormalsAreZero&) = delete;

 private:
  unsigned saved_;
};

TEST_P(ScaledMmFast, SubnormalCodesExactWithDenormalsAreZero) {
  // FP8 subnormals are normal floats: a caller's DAZ / FTZ mode must not change the results of either path (a
  // decode that builds an FP32 subnormal first would be flushed). Sizes include a GEMV large enough for threads.
  struct Case {
    std::int64_t m, n, k;
    BLayout layout;
  };
  std::uint32_t seed = 6600;
  for (const FormatPair& f : {kFormatPairs[0], kFormatPairs[1], kFormatPairs[3], kFormatPairs[4]})
    for (const Case& c : {Case{2, 37, 300, BLayout::kNK}, Case{7, 37, 300, BLayout::kNK},
                          Case{2, 37, 300, BLayout::kKN}, Case{3, 4096, 260, BLayout::kNK}})
      for (bool subnormal_a : {false, true}) {
        const Granularity ga = Granularity::block(1, 128), gb = Granularity::block(128, 128);
        const std::int64_t brows = c.layout == BLayout::kNK ? c.n : c.k, bcols = c.layout == BLayout::kNK ? c.k : c.n;
        seed += 6;
        const ScaledTensor a = from_codes(
            f.a, ga, c.m, c.k,
            subnormal_a ? subnormal_codes(f.a, c.m * c.k, seed + 1) : power_of_two_codes(f.a, c.m * c.k, seed + 2),
            seed + 3, -1, 1);
        const ScaledTensor b = from_codes(f.b, gb, brows, bcols,
                                          subnormal_a ? power_of_two_codes(f.b, brows * bcols, seed + 4)
                                                      : subnormal_codes(f.b, brows * bcols, seed + 5),
                                          seed + 6, -1, 1);
        const Exact want = exact_scaled_mm(a, b, c.layout);
        ScaledMmResult r;
        {
          DenormalsAreZero daz;
          r = scaled_mm(a, b, {c.layout});
        }
        const std::string what = describe(a, b, c.layout) + (subnormal_a ? " (subnormals in A)" : "");
        EXPECT_EQ(r.path, c.m <= gemv_max_m() && c.layout == BLayout::kNK ? MmPath::kGemv : MmPath::kGemm) << what;
        EXPECT_TRUE(exact(r.out, want)) << what;
      }
  for (Format f : kWeightFormats)
    for (std::int64_t m : {3, 6}) {
      const std::int64_t n = 29, k = 300;
      std::mt19937 rng(++seed);
      std::uniform_int_distribution<int> p(-2, 2), sign(0, 1);
      std::vector<float> xv(static_cast<std::size_t>(m * k));
      for (float& v : xv) v = (sign(rng) ? -1.0f : 1.0f) * std::ldexp(1.0f, p(rng));
      const Activations x = make_activations(xv, m, k, DType::float32);
      seed += 2;
      const ScaledTensor w =
          from_codes(f, Granularity::block(128, 128), n, k, subnormal_codes(f, n * k, seed + 1), seed + 2, -1, 1);
      std::vector<float> out(static_cast<std::size_t>(m * n));
      MmDispatch dispatch;
      {
        DenormalsAreZero daz;
        fp8_weight_mm(x.view(), w, out, {}, &dispatch);
      }
      EXPECT_EQ(dispatch.path, m <= gemv_max_m(false) ? MmPath::kGemv : MmPath::kGemm);
      EXPECT_TRUE(exact(out, exact_weight_mm(x, w))) << name(f) << " m " << m;
    }
}

TEST_P(WeightMm, GemvExactForLargeAndTinyActivations) {
  // Activations far outside FP8's range (2^-60 .. 2^26): the GEMV may only fold the weights' exponent bias into the
  // activations when that stays exact, and falls back to rebiasing each weight otherwise. Powers of two times
  // power-of-two weights: every product and sum is exact, so the result must equal FP64's.
  std::uint32_t seed = 9100;
  for (Format f : kWeightFormats)
    for (int lo_exp : {-60, 20}) {
      const std::int64_t m = 2, n = 37, k = 200;
      std::mt19937 rng(++seed);
      std::uniform_int_distribution<int> p(lo_exp, lo_exp + 6), sign(0, 1);
      std::vector<float> xv(static_cast<std::size_t>(m * k));
      for (float& v : xv) v = (sign(rng) ? -1.0f : 1.0f) * std::ldexp(1.0f, p(rng));
      const Activations x = make_activations(xv, m, k, DType::float32);
      const ScaledTensor w = from_codes(f, Granularity::row(), n, k, power_of_two_codes(f, n * k, seed + 1), seed + 2);
      std::vector<float> out(static_cast<std::size_t>(m * n));
      MmDispatch dispatch;
      fp8_weight_mm(x.view(), w, out, {}, &dispatch);
      EXPECT_EQ(dispatch.path, MmPath::kGemv);
      EXPECT_TRUE(exact(out, exact_weight_mm(x, w))) << name(f) << " activations from 2^" << lo_exp;
    }
}

TEST_P(WeightMm, DenormalsAreZeroOnWorkerThreadsOnly) {
  // DAZ set on OpenMP's worker threads but not on the caller's: every thread checks its own mode, so the rows the
  // workers compute are still exact.
  const int before = num_threads();
  set_num_threads(2);
  const std::int64_t m = 2, n = 4096, k = 512;
  std::vector<float> xv(static_cast<std::size_t>(m * k), 0.5f);
  const Activations x = make_activations(xv, m, k, DType::float32);
  const ScaledTensor w =
      from_codes(Format::e4m3fn, Granularity::row(), n, k, subnormal_codes(Format::e4m3fn, n * k, 77), 78, -1, 1);
  std::vector<float> out(static_cast<std::size_t>(m * n));
#pragma omp parallel num_threads(2)
  {
    if (omp_get_thread_num() != 0) _mm_setcsr(_mm_getcsr() | 0x8040u);
  }
  MmDispatch dispatch;
  fp8_weight_mm(x.view(), w, out, {}, &dispatch);
#pragma omp parallel num_threads(2)
  { _mm_setcsr(_mm_getcsr() & ~0x8040u); }
  set_num_threads(before);
  EXPECT_EQ(dispatch.path, MmPath::kGemv);
  EXPECT_TRUE(exact(out, exact_weight_mm(x, w)));
}
// The table-decode float32 GEMV under a caller's denormals-are-zero: its weights are normal floats (FP8 subnormal
// codes included), so it runs instead of declining to the scalar kernel, and gives the bits it gives without DAZ
// (activations +-2^-2..2^2, subnormal weight codes: every product and sum a normal float).
TEST(Avx512FloatGemv, TableDecodeRunsUnderDenormalsAreZero) {
  FP8KIT_SKIP_UNLESS_RUNS(Isa::kAvx512, true);
  const std::int64_t m = 3, n = 21, k = 300;
  std::uint32_t seed = 31000;
  for (Format f : kWeightFormats) {
    std::mt19937 rng(++seed);
    std::uniform_int_distribution<int> p(-2, 2), sign(0, 1);
    std::vector<float> x(static_cast<std::size_t>(m * k));
    for (float& v : x) v = (sign(rng) ? -1.0f : 1.0f) * std::ldexp(1.0f, p(rng));
    const std::vector<std::uint8_t> w = subnormal_codes(f, n * k, ++seed);
    const std::vector<float> ones(static_cast<std::size_t>(n), 1.0f);
    const mm_detail::ScaleIndex sa{ones.data(), 1, 0, 0}, sb{ones.data(), 1, 1, 0};
    const mm_detail::GemvInput in{x.data(), k};
    std::vector<float> plain(static_cast<std::size_t>(m * n)), with_daz(plain.size(), std::nanf(""));
    ASSERT_TRUE(mm_detail::kAvx512VbmiGemv.run(f, m, 0, n, k, k, in, w.data(), sa, sb, plain.data(), n));
    bool ran = false;
    {
      DenormalsAreZero daz;
      ran = mm_detail::kAvx512VbmiGemv.run(f, m, 0, n, k, k, in, w.data(), sa, sb, with_daz.data(), n);
    }
    EXPECT_TRUE(ran) << name(f);
    EXPECT_EQ(0, std::memcmp(plain.data(), with_daz.data(), plain.size() * sizeof(float))) << name(f);
  }
}
#endif

TEST_P(WeightMm, SubnormalWeightCodesExactOnBothPaths) {
  std::uint32_t seed = 6700;
  for (Format f : kWeightFormats)
    for (const Granularity& g : {Granularity::tensor(), Granularity::row(), Granularity::block(128, 128)})
      for (DType dtype : {DType::float32, DType::bfloat16})
        for (std::int64_t m : {1, 4, 6}) {
          const std::int64_t n = 21, k = 300;
          std::mt19937 rng(++seed);
          std::uniform_int_distribution<int> p(-2, 2), sign(0, 1);
          std::vector<float> xv(static_cast<std::size_t>(m * k));
          for (float& v : xv) v = (sign(rng) ? -1.0f : 1.0f) * std::ldexp(1.0f, p(rng));
          const Activations x = make_activations(xv, m, k, dtype);
          seed += 2;
          const ScaledTensor w = from_codes(f, g, n, k, subnormal_codes(f, n * k, seed + 1), seed + 2, -1, 1);
          std::vector<float> out(static_cast<std::size_t>(m * n), std::nanf(""));
          MmDispatch dispatch;
          fp8_weight_mm(x.view(), w, out, {}, &dispatch);
          EXPECT_EQ(dispatch.path, m <= gemv_max_m(dtype == DType::bfloat16) ? MmPath::kGemv : MmPath::kGemm);
          EXPECT_TRUE(exact(out, exact_weight_mm(x, w)))
              << name(f) << " " << g.name() << " " << name(dtype) << " m " << m;
        }
}

// ---------------------------------------------------------------- NaN and Inf codes

struct SpecialCodeCase {
  Format a, b;
  std::uint8_t special;  // placed in B
};
constexpr SpecialCodeCase kSpecialCodes[] = {
    {Format::e4m3fn, Format::e4m3fn, 0x7F},    {Format::e4m3fn, Format::e4m3fn, 0xFF},
    {Format::e4m3fn, Format::e5m2, 0x7E},      {Format::e4m3fn, Format::e5m2, 0x7C},
    {Format::e4m3fn, Format::e5m2, 0xFC},      {Format::e4m3fnuz, Format::e4m3fnuz, 0x80},
    {Format::e4m3fnuz, Format::e5m2fnuz, 0x80}};

TEST_P(ScaledMmFast, NanAndInfCodesPropagateOnBothPaths) {
  // Integer data (exact sums), one special code in B's columns 5 and 33 (33 lies in another GEMV column range and
  // another micro-tile), at K positions in different K blocks. A[1][k] is 0 at the special code of column 33, so
  // Inf there gives NaN (0 * Inf) in row 1 only. Row 2 of A has a NaN code in the M = 5 / GEMV cases too.
  std::uint32_t seed = 7000;
  const std::int64_t n = 40, k = 300;
  for (const SpecialCodeCase& c : kSpecialCodes)
    for (BLayout layout : {BLayout::kNK, BLayout::kKN})
      for (std::int64_t m : {3, 9}) {
        for (const Granularity& gb : {Granularity::tensor(), Granularity::block(128, 128)}) {
          seed += 6;
          ScaledTensor a = from_codes(c.a, Granularity::row(), m, k, integer_codes(c.a, m * k, seed + 1), seed + 2);
          ScaledTensor b = layout == BLayout::kNK
                               ? from_codes(c.b, gb, n, k, integer_codes(c.b, n * k, seed + 3), seed + 4)
                               : from_codes(c.b, gb, k, n, integer_codes(c.b, k * n, seed + 5), seed + 6);
          auto b_at = [&](std::int64_t kk, std::int64_t j) -> std::uint8_t& {
            return b.data[static_cast<std::size_t>(layout == BLayout::kNK ? j * k + kk : kk * n + j)];
          };
          b_at(7, 5) = c.special;
          b_at(290, 33) = c.special;
          for (std::int64_t i = 0; i < m; ++i)  // nonzero elsewhere in columns 7 and 290 of A
            for (std::int64_t kk : {7, 290})
              if (decode_to_float(c.a, a.data[static_cast<std::size_t>(i * k + kk)]) == 0.0f)
                a.data[static_cast<std::size_t>(i * k + kk)] = code_of(c.a, 1.0f);
          a.data[static_cast<std::size_t>(1 * k + 290)] = code_of(c.a, 0.0f);
          const bool a_nan = c.b == Format::e4m3fn;  // some cases also carry a NaN in A's row 2
          if (a_nan) a.data[static_cast<std::size_t>(2 * k + 150)] = c.a == Format::e4m3fn ? 0x7F : 0x80;

          const std::string what = describe(a, b, layout) + " special code " + std::to_string(c.special);
          const ScaledMmResult ref = scaled_mm_reference(a, b, {layout});
          const ScaledMmResult r = scaled_mm(a, b, {layout});
          const bool gemv = m <= gemv_max_m() && layout == BLayout::kNK;
          EXPECT_EQ(r.path, gemv ? MmPath::kGemv : MmPath::kGemm) << what;
          const bool is_inf = std::isinf(decode_to_float(c.b, c.special));
          const Exact want = exact_scaled_mm(a, b, layout);
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
              const std::size_t o = static_cast<std::size_t>(i * n + j);
              const float got = r.out[o];
              if ((a_nan && i == 2) || ((j == 5 || j == 33) && !is_inf) || (is_inf && j == 33 && i == 1)) {
                ASSERT_TRUE(std::isnan(ref.out[o])) << "reference " << what;
                EXPECT_TRUE(std::isnan(got)) << what << " at " << i << "," << j << ": " << got;
              } else if (j == 5 || j == 33) {
                ASSERT_TRUE(std::isinf(ref.out[o])) << "reference " << what;
                EXPECT_EQ(got, ref.out[o]) << what << " at " << i << "," << j;
              } else {
                // Exact sums: the other columns are those of FP64 on both paths.
                EXPECT_EQ(got, want.value[o]) << what << " at " << i << "," << j;
              }
            }
          if (r.dispatch.contract == KernelContract::kBitIdentical) {
            EXPECT_TRUE(same_bits(r.out, ref.out)) << what;
          }
          EXPECT_EQ(r.amax, ref.amax) << what;
          EXPECT_EQ(r.amax, finite_amax(r.out)) << what;
        }
      }
}

TEST_P(WeightMm, NanAndInfCodesPropagateOnBothPaths) {
  std::uint32_t seed = 7500;
  const std::int64_t n = 40, k = 300;
  for (const SpecialCodeCase& c : kSpecialCodes)
    for (std::int64_t m : {2, 7})
      for (const Granularity& g : {Granularity::row(), Granularity::block(128, 128)}) {
        std::mt19937 rng(++seed);
        std::uniform_int_distribution<int> small(1, 8), sign(0, 1);
        std::vector<float> xv(static_cast<std::size_t>(m * k));
        for (float& v : xv) v = static_cast<float>((sign(rng) ? -1 : 1) * small(rng));
        xv[static_cast<std::size_t>(1 * k + 290)] = 0.0f;  // 0 * Inf = NaN in row 1, column 33
        const Activations x = make_activations(xv, m, k, DType::float32);
        seed += 2;
        ScaledTensor w = from_codes(c.b, g, n, k, integer_codes(c.b, n * k, seed + 1), seed + 2);
        w.data[static_cast<std::size_t>(5 * k + 7)] = c.special;
        w.data[static_cast<std::size_t>(33 * k + 290)] = c.special;
        std::vector<float> out(static_cast<std::size_t>(m * n)), ref(out.size());
        MmDispatch dispatch;
        fp8_weight_mm(x.view(), w, out, {}, &dispatch);
        fp8_weight_mm_reference(x.view(), w, ref);
        const std::string what =
            std::string(name(c.b)) + " " + g.name() + " m " + std::to_string(m) + " code " + std::to_string(c.special);
        EXPECT_EQ(dispatch.path, m <= gemv_max_m(false) ? MmPath::kGemv : MmPath::kGemm) << what;
        const bool is_inf = std::isinf(decode_to_float(c.b, c.special));
        const Exact want = exact_weight_mm(x, w);
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < n; ++j) {
            const std::size_t o = static_cast<std::size_t>(i * n + j);
            if (((j == 5 || j == 33) && !is_inf) || (is_inf && j == 33 && i == 1)) {
              ASSERT_TRUE(std::isnan(ref[o])) << "reference " << what;
              EXPECT_TRUE(std::isnan(out[o])) << what << " at " << i << "," << j << ": " << out[o];
            } else if (j == 5 || j == 33) {
              ASSERT_TRUE(std::isinf(ref[o])) << "reference " << what;
              EXPECT_EQ(out[o], ref[o]) << what << " at " << i << "," << j;
            } else {
              EXPECT_EQ(out[o], want.value[o]) << what << " at " << i << "," << j;
            }
          }
        if (dispatch.contract == KernelContract::kBitIdentical) {
          EXPECT_TRUE(same_bits(out, ref)) << what;
        }
      }
}

TEST_P(WeightMm, NonFiniteActivationsPropagateOnTheGemv) {
  // An Inf or NaN activation keeps the GEMV from folding the weights' exponent bias into the activations (that
  // test runs over every activation); the rows it reaches must be Inf or NaN as the reference's, the others exact.
  const std::int64_t m = 3, n = 24, k = 160;
  for (Format f : kWeightFormats) {
    std::mt19937 rng(8800 + static_cast<int>(f));
    std::uniform_int_distribution<int> small(1, 8), sign(0, 1);
    std::vector<float> xv(static_cast<std::size_t>(m * k));
    for (float& v : xv) v = static_cast<float>((sign(rng) ? -1 : 1) * small(rng));
    xv[static_cast<std::size_t>(0 * k + 17)] = std::numeric_limits<float>::infinity();
    xv[static_cast<std::size_t>(2 * k + 150)] = std::numeric_limits<float>::quiet_NaN();
    const Activations x = make_activations(xv, m, k, DType::float32);
    const ScaledTensor w = from_codes(f, Granularity::row(), n, k, integer_codes(f, n * k, 8801), 8802);
    std::vector<float> out(static_cast<std::size_t>(m * n)), ref(out.size());
    MmDispatch dispatch;
    fp8_weight_mm(x.view(), w, out, {}, &dispatch);
    fp8_weight_mm_reference(x.view(), w, ref);
    EXPECT_EQ(dispatch.path, MmPath::kGemv);
    for (std::size_t o = 0; o < out.size(); ++o) {
      if (std::isnan(ref[o])) {
        EXPECT_TRUE(std::isnan(out[o])) << name(f) << " at " << o;
      } else {
        EXPECT_TRUE(std::isinf(ref[o]) || o / n == 1) << "the reference, at " << o;
        EXPECT_EQ(out[o], ref[o]) << name(f) << " at " << o;
      }
    }
  }
}

// ---------------------------------------------------------------- threads

TEST_P(ScaledMmFast, ThreadCountDoesNotChangeResults) {
  struct Case {
    std::int64_t m, n, k;
    BLayout layout;
  };
  for (const Case& c :
       {Case{200, 300, 520, BLayout::kNK}, Case{150, 257, 300, BLayout::kKN}, Case{4, 2048, 512, BLayout::kNK},
        Case{1, 4099, 300, BLayout::kNK}, Case{40, 2050, 300, BLayout::kNK}, Case{100, 1030, 300, BLayout::kNK}})
    for (bool blocked : {true, false}) {
      const Granularity ga = blocked ? Granularity::block(1, 128) : Granularity::tensor();
      const Granularity gb = blocked ? Granularity::block(128, 128) : Granularity::tensor();
      const ScaledTensor a = random_quantized(c.m, c.k, 1, Format::e4m3fn, ga);
      const ScaledTensor b = c.layout == BLayout::kNK ? random_quantized(c.n, c.k, 2, Format::e4m3fn, gb)
                                                      : random_quantized(c.k, c.n, 2, Format::e4m3fn, gb);
      const std::vector<float> bias = random_bias(c.n, 3);
      const ScaledMmOptions options{c.layout, DType::float32, bias};
      const int before = num_threads();
      ScaledMmResult one, two;
      {
        ThreadCount t(1);
        one = scaled_mm(a, b, options);
      }
      {
        ThreadCount t(2);
        two = scaled_mm(a, b, options);
      }
      EXPECT_EQ(num_threads(), before);
      const std::string what = describe(a, b, c.layout);
      EXPECT_EQ(one.path, c.m <= gemv_max_m() && c.layout == BLayout::kNK ? MmPath::kGemv : MmPath::kGemm) << what;
      EXPECT_EQ(two.path, one.path) << what;
      EXPECT_TRUE(same_bits(two.out, one.out)) << what;
      EXPECT_EQ(two.amax, one.amax) << what;
      if (one.dispatch.contract == KernelContract::kBitIdentical) {
        EXPECT_TRUE(same_bits(one.out, scaled_mm_reference(a, b, options).out)) << what;
      } else {
        EXPECT_TRUE(within_bound(one.out, exact_scaled_mm(a, b, c.layout, bias))) << what;
      }
    }
}

TEST_P(WeightMm, ThreadCountDoesNotChangeResults) {
  for (auto [m, n, k] :
       {std::tuple{150, 300, 520}, std::tuple{3, 4099, 300}, std::tuple{40, 2050, 300}, std::tuple{100, 1030, 300}}) {
    const Activations x = make_activations(random_values(m, k, 1), m, k, DType::bfloat16);
    const ScaledTensor w = random_quantized(n, k, 2, Format::e4m3fn, Granularity::block(128, 128));
    const std::vector<float> bias = random_bias(n, 3);
    std::vector<float> one(static_cast<std::size_t>(m * n)), two(one.size());
    MmDispatch p1, p2;
    {
      ThreadCount t(1);
      fp8_weight_mm(x.view(), w, one, bias, &p1);
    }
    {
      ThreadCount t(2);
      fp8_weight_mm(x.view(), w, two, bias, &p2);
    }
    EXPECT_EQ(p1.path, m <= gemv_max_m(true) ? MmPath::kGemv : MmPath::kGemm);
    EXPECT_EQ(p2.path, p1.path);
    EXPECT_EQ(p2.kernel, p1.kernel);
    EXPECT_TRUE(same_bits(two, one)) << m << "x" << n << "x" << k;
  }
}

// ---------------------------------------------------------------- fp8_weight_mm

TEST_P(WeightMm, GemmKeepsItsContract) {
  // Odd shapes: K not a multiple of 8, 32 or 128; float32 and bfloat16 activations; the three weight granularities.
  // float32 activations always run a bit-identical FMA kernel; bfloat16 ones the level's bfloat16 kernel if any.
  const std::int64_t ns[] = {1, 3, 17, 129};
  const std::int64_t ks[] = {1, 3, 17, 129, 300};
  const Granularity grans[] = {Granularity::tensor(), Granularity::row(), Granularity::block(128, 128)};
  std::uint32_t seed = 8000;
  std::size_t case_index = 0;
  for (std::int64_t m : {5, 17})
    for (std::int64_t n : ns)
      for (std::int64_t k : ks)
        for (const Granularity& g : grans)
          for (DType dtype : {DType::float32, DType::bfloat16}) {
            const Format f = kWeightFormats[case_index % std::size(kWeightFormats)];
            const bool with_bias = case_index % 3 == 0;
            ++case_index;
            const Activations x = make_activations(random_values(m, k, ++seed), m, k, dtype);
            const ScaledTensor w = random_quantized(n, k, ++seed, f, g);
            const std::vector<float> bias = with_bias ? random_bias(n, ++seed) : std::vector<float>{};
            std::vector<float> out(static_cast<std::size_t>(m * n), std::nanf("")), ref(out.size(), std::nanf(""));
            MmDispatch dispatch;
            fp8_weight_mm(x.view(), w, out, bias, &dispatch);
            fp8_weight_mm_reference(x.view(), w, ref, bias);
            const std::string what = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " " +
                                     std::string(name(f)) + " " + g.name() + " " + std::string(name(dtype)) +
                                     (with_bias ? " +bias" : "");
            EXPECT_EQ(dispatch.path, m <= gemv_max_m(dtype == DType::bfloat16) ? MmPath::kGemv : MmPath::kGemm) << what;
            if (dtype == DType::float32) EXPECT_EQ(dispatch.contract, KernelContract::kBitIdentical) << what;
            if (dispatch.contract == KernelContract::kBitIdentical) {
              EXPECT_TRUE(same_bits(out, ref)) << what << " [" << dispatch.kernel << "]";
            } else {
              EXPECT_TRUE(within_bound(out, exact_weight_mm(x, w, bias))) << what << " [" << dispatch.kernel << "]";
            }
            for (float v : ref) ASSERT_FALSE(std::isnan(v)) << "reference left the buffer unwritten: " << what;
          }
  // And the reference itself within the FP32 bound of FP64 (it is the specification of both paths).
  const Activations x = make_activations(random_values(6, 300, 1), 6, 300, DType::bfloat16);
  const ScaledTensor w = random_quantized(33, 300, 2, Format::e4m3fn, Granularity::block(128, 128));
  std::vector<float> ref(6 * 33);
  fp8_weight_mm_reference(x.view(), w, ref);
  EXPECT_TRUE(within_bound(ref, exact_weight_mm(x, w)));
}

TEST_P(WeightMm, GemmKeepsItsContractLargeManyPanels) {
  const std::int64_t m = 200, n = 300, k = 520;
  const std::vector<float> bias = random_bias(n, 5);
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    const Activations x = make_activations(random_values(m, k, 1), m, k, dtype);
    const ScaledTensor w = random_quantized(
        n, k, 2, Format::e4m3fn, dtype == DType::float32 ? Granularity::block(128, 128) : Granularity::row());
    std::vector<float> out(static_cast<std::size_t>(m * n)), ref(out.size());
    MmDispatch dispatch;
    fp8_weight_mm(x.view(), w, out, bias, &dispatch);
    fp8_weight_mm_reference(x.view(), w, ref, bias);
    EXPECT_EQ(dispatch.path, MmPath::kGemm);
    if (dispatch.contract == KernelContract::kBitIdentical) {
      EXPECT_TRUE(same_bits(out, ref)) << name(dtype) << " [" << dispatch.kernel << "]";
    } else {
      EXPECT_TRUE(within_bound(out, exact_weight_mm(x, w, bias))) << name(dtype) << " [" << dispatch.kernel << "]";
    }
  }
}

// bfloat16 activations below 2^-126 against weights near 448: vdpbf16ps and AMX read them as zero, dropping products
// up to 2^-126 * 448 each, 448 times the flush term of a bound without the operand's size (which this broke: about
// 2^-113 lost against 2^-116.8). Within mm_error_bound with max_operand = the largest |weight|, on both paths.
TEST_P(WeightMm, SubnormalBfloat16ActivationsWithinTheFlushTerm) {
  const std::int64_t n = 8, k = 300;
  std::vector<float> weights(static_cast<std::size_t>(n * k));
  for (std::size_t i = 0; i < weights.size(); ++i)
    weights[i] = (i % 3 == 0 ? -1.0f : 1.0f) * (448.0f - (i % 5) * 16.0f);
  const ScaledTensor w = quantize(MatrixRef{weights.data(), n, k}, {});  // per tensor: scale 1
  ASSERT_EQ(w.scale_inv[0], 1.0f);
  for (const std::int64_t m : {std::int64_t{2}, std::int64_t{40}}) {
    std::vector<float> values(static_cast<std::size_t>(m * k));
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = std::ldexp(i % 2 ? 1.5f : -1.0f, -127 - int(i % 4));
    const Activations x = make_activations(values, m, k, DType::bfloat16);
    std::vector<float> out(static_cast<std::size_t>(m * n));
    MmDispatch dispatch;
    fp8_weight_mm(x.view(), w, out, {}, &dispatch);
    const Exact want = exact_weight_mm(x, w);
    for (std::size_t o = 0; o < out.size(); ++o) {
      const double bound = mm_error_bound(k, want.abs_sum[o], std::fabs(want.value[o]), 1.0, 448.0);
      EXPECT_LE(std::fabs(out[o] - want.value[o]), bound) << "M " << m << ", element " << o << ": " << out[o] << " vs "
                                                          << want.value[o] << " [" << dispatch.kernel << "]";
    }
  }
}

// Every M the GEMV path takes at the level (bfloat16 activations beyond kGemvMaxM where the level groups the rows;
// float32 ones beyond it take the GEMM, within the same bound).
TEST_P(WeightMm, GemvWithinFp32Bound) {
  const std::int64_t ns[] = {1, 3, 17, 129};
  const std::int64_t ks[] = {1, 3, 17, 129, 300};
  const Granularity grans[] = {Granularity::tensor(), Granularity::row(), Granularity::block(128, 128)};
  std::uint32_t seed = 9000;
  std::size_t case_index = 0;
  for (std::int64_t m = 1; m <= gemv_max_m(); ++m)
    for (std::int64_t n : ns)
      for (std::int64_t k : ks)
        for (DType dtype : {DType::float32, DType::bfloat16}) {
          const Granularity& g = grans[case_index % std::size(grans)];
          const Format f = kWeightFormats[case_index % std::size(kWeightFormats)];
          const bool with_bias = case_index % 2 == 0;
          ++case_index;
          const Activations x = make_activations(random_values(m, k, ++seed), m, k, dtype);
          const ScaledTensor w = random_quantized(n, k, ++seed, f, g);
          const std::vector<float> bias = with_bias ? random_bias(n, ++seed) : std::vector<float>{};
          std::vector<float> out(static_cast<std::size_t>(m * n), std::nanf(""));
          MmDispatch dispatch;
          fp8_weight_mm(x.view(), w, out, bias, &dispatch);
          const std::string what = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " " +
                                   std::string(name(f)) + " " + g.name() + " " + std::string(name(dtype));
          EXPECT_EQ(dispatch.path, m <= gemv_max_m(dtype == DType::bfloat16) ? MmPath::kGemv : MmPath::kGemm) << what;
          EXPECT_TRUE(within_bound(out, exact_weight_mm(x, w, bias))) << what;
        }
}

TEST_P(WeightMm, IntegerInputsExactOnBothPaths) {
  std::uint32_t seed = 9500;
  for (Format f : kWeightFormats)
    for (const Granularity& g : {Granularity::tensor(), Granularity::row(), Granularity::block(128, 128)})
      for (DType dtype : {DType::float32, DType::bfloat16})
        for (std::int64_t m : {1, 3, 4, 5, 13}) {
          const std::int64_t n = 35, k = 300;
          std::mt19937 rng(++seed);
          std::uniform_int_distribution<int> small(-8, 8);
          std::vector<float> xv(static_cast<std::size_t>(m * k));
          for (float& v : xv) v = static_cast<float>(small(rng));
          const Activations x = make_activations(xv, m, k, dtype);
          seed += 2;
          const ScaledTensor w = from_codes(f, g, n, k, integer_codes(f, n * k, seed + 1), seed + 2);
          std::vector<float> out(static_cast<std::size_t>(m * n));
          MmDispatch dispatch;
          fp8_weight_mm(x.view(), w, out, {}, &dispatch);
          EXPECT_EQ(dispatch.path, m <= gemv_max_m(dtype == DType::bfloat16) ? MmPath::kGemv : MmPath::kGemm);
          EXPECT_TRUE(exact(out, exact_weight_mm(x, w)))
              << name(f) << " " << g.name() << " " << name(dtype) << " m " << m;
        }
}

// ---------------------------------------------------------------- refusals

// The call throws fp8kit::Error whose message contains every one of `parts`.
::testing::AssertionResult throws_error(const std::function<void()>& call, std::initializer_list<std::string> parts) {
  try {
    call();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& p : parts)
      if (message.find(p) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << message << "\" does not mention \"" << p << "\"";
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw something else: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

TEST_P(ScaledMmFast, GemvScalesTheBlockSumNotItsLanes) {
  // Lanes of +-896 * 2^120 overflow FP32 when scaled one by one, their sum (0) does not: the GEMV scales each K
  // block's sum, as the reference does, and gets 0 rather than NaN.
  const std::int64_t k = 16;
  std::vector<std::uint8_t> b_codes;
  for (int rep = 0; rep < 2; ++rep) {
    for (int t = 0; t < 4; ++t) b_codes.push_back(0x7E);  // +448
    for (int t = 0; t < 4; ++t) b_codes.push_back(0xFE);  // -448
  }
  ScaledTensor a = from_codes(Format::e4m3fn, Granularity::tensor(), 1, k, std::vector<std::uint8_t>(k, 0x38), 1);
  a.scale_inv = {std::ldexp(1.0f, 120)};
  ScaledTensor b = from_codes(Format::e4m3fn, Granularity::tensor(), 1, k, b_codes, 2);
  b.scale_inv = {1.0f};
  const ScaledMmResult r = scaled_mm(a, b);
  EXPECT_EQ(r.path, MmPath::kGemv);
  EXPECT_EQ(r.out[0], 0.0f);
  EXPECT_EQ(scaled_mm_reference(a, b).out[0], 0.0f);
}

TEST_P(ScaledMmFast, RefusesWhatDoesNotFit) {
  for (std::int64_t m : {2, 8}) {  // both paths check
    auto q = [&](std::int64_t rows, std::int64_t cols, Format f, Granularity g) {
      const auto v = random_values(rows, cols, 8);
      return quantize(MatrixRef{v.data(), rows, cols}, {f, Overflow::kSaturate, g, {}});
    };
    const ScaledTensor a = q(m, 256, Format::e4m3fn, Granularity::tensor());
    const ScaledTensor a5 = q(m, 256, Format::e5m2, Granularity::tensor());
    const ScaledTensor a5z = q(m, 256, Format::e5m2fnuz, Granularity::tensor());
    const ScaledTensor b = q(6, 256, Format::e4m3fn, Granularity::tensor());
    const ScaledTensor b5 = q(6, 256, Format::e5m2, Granularity::tensor());
    EXPECT_TRUE(throws_error([&] { scaled_mm(a5, b5); }, {"e5m2"}));
    EXPECT_TRUE(throws_error([&] { scaled_mm(a5z, b5); }, {"e5m2"}));
    EXPECT_NO_THROW(scaled_mm(a, b5));
    const ScaledTensor b128 = q(6, 128, Format::e4m3fn, Granularity::tensor());
    EXPECT_TRUE(throws_error([&] { scaled_mm(a, b128); }, {"256", "128"}));             // K 256 vs 128
    EXPECT_TRUE(throws_error([&] { scaled_mm(a, b, {BLayout::kKN}); }, {"256", "6"}));  // B is 6 x 256, not K x N
    const ScaledTensor col = q(m, 256, Format::e4m3fn, Granularity::column());
    EXPECT_TRUE(throws_error([&] { scaled_mm(col, b); }, {"col"}));  // A per column
    EXPECT_TRUE(throws_error([&] { scaled_mm(a, q(6, 256, Format::e4m3fn, Granularity::column())); }, {"col"}));
    // MX operands: the fast entry decides as the reference does (refused, or the same product).
    const ScaledTensor mx = q(m, 256, Format::e4m3fn, Granularity::mx());
    const ScaledTensor b_mx = q(6, 256, Format::e4m3fn, Granularity::mx());
    for (const ScaledTensor* bb : {&b, &b_mx}) {
      bool reference_refuses = false;
      try {
        scaled_mm_reference(mx, *bb);
      } catch (const Error&) {
        reference_refuses = true;
      }
      if (reference_refuses) {
        EXPECT_THROW(scaled_mm(mx, *bb), Error) << bb->granularity.name();
      } else if (m > gemv_max_m()) {
        expect_gemm_contract(mx, *bb, {});
      } else {
        EXPECT_TRUE(within_bound(scaled_mm(mx, *bb).out, exact_scaled_mm(mx, *bb, BLayout::kNK)))
            << bb->granularity.name();
      }
    }
    const ScaledTensor a64 = q(m, 256, Format::e4m3fn, Granularity::block(1, 64));
    const ScaledTensor blk = q(6, 256, Format::e4m3fn, Granularity::block(128, 128));
    EXPECT_TRUE(throws_error([&] { scaled_mm(a64, blk); }, {"64", "128"}));  // K blocks differ
    EXPECT_TRUE(throws_error([&] { scaled_mm(a, b, {BLayout::kNK, DType::float16}); }, {"float16"}));
    const std::vector<float> bias(5);
    EXPECT_TRUE(throws_error([&] { scaled_mm(a, b, {BLayout::kNK, DType::float32, bias}); }, {"bias"}));
    std::vector<float> out(static_cast<std::size_t>(m * 6 + 1));
    EXPECT_TRUE(throws_error([&] { scaled_mm_into(a, b, out); }, {"out"}));
    out.resize(static_cast<std::size_t>(m * 6 - 1));
    EXPECT_TRUE(throws_error([&] { scaled_mm_into(a, b, out); }, {"out"}));
    out.resize(static_cast<std::size_t>(m * 6));
    EXPECT_NO_THROW(scaled_mm_into(a, b, out));
    EXPECT_TRUE(throws_error([&] { scaled_mm_into(a5, b5, out); }, {"e5m2"}));
    EXPECT_TRUE(throws_error([&] { scaled_mm_into(a, b, out, {BLayout::kNK, DType::float32, bias}); }, {"bias"}));
  }
}

TEST_P(WeightMm, RefusesWhatDoesNotFit) {
  for (std::int64_t m : {2, 8}) {
    const std::int64_t n = 6, k = 256;
    const auto xv = random_values(m, k, 1);
    const Activations x = make_activations(xv, m, k, DType::float32);
    const auto wv = random_values(n, k, 2);
    const ScaledTensor w =
        quantize(MatrixRef{wv.data(), n, k}, {Format::e4m3fn, Overflow::kSaturate, Granularity::row(), {}});
    std::vector<float> out(static_cast<std::size_t>(m * n));
    EXPECT_NO_THROW(fp8_weight_mm(x.view(), w, out));
    // activations of another dtype
    std::vector<float16> h(xv.size());
    for (std::size_t i = 0; i < xv.size(); ++i) h[i] = float16::from_float(xv[i]);
    EXPECT_TRUE(throws_error([&] { fp8_weight_mm({h.data(), DType::float16, m, k}, w, out); }, {"float16"}));
    EXPECT_TRUE(throws_error([&] { fp8_weight_mm_reference({h.data(), DType::float16, m, k}, w, out); }, {"float16"}));
    // weights with per-column scales
    const ScaledTensor wcol =
        quantize(MatrixRef{wv.data(), n, k}, {Format::e4m3fn, Overflow::kSaturate, Granularity::column(), {}});
    EXPECT_TRUE(throws_error([&] { fp8_weight_mm(x.view(), wcol, out); }, {"col"}));
    EXPECT_TRUE(throws_error([&] { fp8_weight_mm_reference(x.view(), wcol, out); }, {"col"}));
    // K mismatch
    const auto wv2 = random_values(n, 128, 3);
    const ScaledTensor w128 = quantize(MatrixRef{wv2.data(), n, 128}, {});
    EXPECT_TRUE(throws_error([&] { fp8_weight_mm(x.view(), w128, out); }, {"256", "128"}));
    EXPECT_TRUE(throws_error([&] { fp8_weight_mm_reference(x.view(), w128, out); }, {"256", "128"}));
    // output size
    std::vector<float> small(static_cast<std::size_t>(m * n - 1)), big(static_cast<std::size_t>(m * n + 3));
    EXPECT_TRUE(throws_error([&] { fp8_weight_mm(x.view(), w, small); }, {"out"}));
    EXPECT_TRUE(throws_error([&] { fp8_weight_mm(x.view(), w, big); }, {"out"}));
    EXPECT_TRUE(throws_error([&] { fp8_weight_mm_reference(x.view(), w, small); }, {"out"}));
    // bias length
    const std::vector<float> bias(static_cast<std::size_t>(n + 1));
    EXPECT_TRUE(throws_error([&] { fp8_weight_mm(x.view(), w, out, bias); }, {"bias"}));
    EXPECT_TRUE(throws_error([&] { fp8_weight_mm_reference(x.view(), w, out, bias); }, {"bias"}));
  }
}

}  // namespace
}  // namespace fp8kit
