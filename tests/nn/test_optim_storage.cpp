// AdamW's low-precision storage: FP8 and bfloat16 moments against float32 AdamW (per step, and over a run),
// bfloat16 master weights with stochastic rounding (unbiased, reproducible, seeded) or Kahan compensation, the
// memory categories of the new buffers, and refusals.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "expect_error.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/format/codec.hpp"
#include "fp8kit/format/half.hpp"
#include "fp8kit/nn/optim.hpp"
#include "fp8kit/tensor/memory.hpp"

namespace fp8kit::nn {
namespace {

constexpr std::int64_t kChunkForTests = 32 * kMomentBlock;  // AdamW's unit of work (optim.cpp)

// A parameter of n elements from normal(0, 0.02), float32 or converted to a master dtype.
Parameter random_parameter(const std::string& name, std::int64_t n, std::uint64_t seed,
                           MasterWeights master = MasterWeights::kFloat32) {
  Parameter p = make_parameter(name, {n}, 0.02, seed);
  set_master_dtype(p, master_dtype(master));
  return p;
}

// Gradients with a wide dynamic range inside every block (magnitudes over 2^-12 .. 2^0 of a common scale).
void set_random_grad(Parameter& p, std::uint64_t seed) {
  const Tensor g = randn(p.grad.shape(), seed, DType::float32);
  const float* src = g.data<float>();
  std::vector<float> values(static_cast<std::size_t>(p.grad.numel()));
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = src[i] * 1e-3f * std::ldexp(1.0f, -static_cast<int>((i * 7 + seed) % 13));
  }
  std::memset(p.grad.raw(), 0, static_cast<std::size_t>(p.grad.nbytes()));
  add_to_gradient(p, values);
}

std::vector<float> floats(const Tensor& t) {
  const Tensor f = t.to(DType::float32);
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}

// FP8 moments dequantized: codes times their block's scale (v: the square of the decoded sqrt(v)).
std::vector<float> dequantized(const Tensor& codes, const Tensor& scale_inv, bool square) {
  std::vector<float> out(static_cast<std::size_t>(codes.numel()));
  const std::uint8_t* c = codes.data<std::uint8_t>();
  for (std::size_t i = 0; i < out.size(); ++i) {
    const float x = decode_to_float(Format::e4m3fn, c[i]) * scale_inv.data<float>()[i / kMomentBlock];
    out[i] = square ? x * x : x;
  }
  return out;
}

// One step from the same state: FP8 moments dequantized into a float32 AdamW, which takes the same gradient. The
// FP8 step's stored moments are the float32 step's, re-quantized with stochastic rounding: each one of the two E4M3
// neighbours of its value at its block's scale, so within one step (2^-3 relative for normal codes, 2^-9 / scale
// below them; sqrt(v) likewise). The new values agree exactly (both updated in float32 from the same moments).
TEST(AdamWStorage, Fp8MomentsAreTheFloat32StepRequantizedPerBlock) {
  const std::int64_t n = 3 * kMomentBlock + 17;  // a partial last block
  const AdamWOptions options{.lr = 1e-2, .beta2 = 0.95, .moments = MomentStorage::kFp8};
  Parameter p8 = random_parameter("w", n, 1);
  AdamW fp8(options);
  Parameter* p8s[] = {&p8};
  for (int step = 0; step < 12; ++step) {
    // The float32 twin: the same value and the FP8 state as float32.
    Parameter p32 = random_parameter("w", n, 1);
    std::memcpy(p32.value.raw(), p8.value.raw(), static_cast<std::size_t>(p8.value.nbytes()));
    AdamW fp32({.lr = 1e-2, .beta2 = 0.95});
    if (step > 0) {
      const AdamW::State& s8 = fp8.state().at("w");
      AdamW::State s;
      s.m = zeros({n}, DType::float32);
      s.v = zeros({n}, DType::float32);
      const std::vector<float> m = dequantized(s8.m, s8.m_scale, false), v = dequantized(s8.v, s8.v_scale, true);
      std::copy(m.begin(), m.end(), s.m.data<float>());
      std::copy(v.begin(), v.end(), s.v.data<float>());
      s.step = s8.step;
      fp32.state()["w"] = s;
    }
    set_random_grad(p8, 100 + static_cast<std::uint64_t>(step));
    set_random_grad(p32, 100 + static_cast<std::uint64_t>(step));
    fp8.step(p8s);
    Parameter* p32s[] = {&p32};
    fp32.step(p32s);
    EXPECT_EQ(floats(p8.value), floats(p32.value)) << "step " << step;
    const AdamW::State& s8 = fp8.state().at("w");
    const AdamW::State& s32 = fp32.state().at("w");
    ASSERT_EQ(s8.m.dtype(), DType::float8_e4m3fn);
    ASSERT_EQ(s8.m_scale.numel(), 4);
    const std::vector<float> m8 = dequantized(s8.m, s8.m_scale, false), v8 = dequantized(s8.v, s8.v_scale, true);
    const std::vector<float> m32 = floats(s32.m), v32 = floats(s32.v);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      const float m_floor = std::ldexp(1.0f, -9) * s8.m_scale.data<float>()[i / kMomentBlock];
      EXPECT_LE(std::fabs(m8[k] - m32[k]), std::max(std::ldexp(std::fabs(m32[k]), -3), m_floor) * 1.0001f)
          << "m, step " << step << " element " << i;
      const float r32 = std::sqrt(v32[k]), r8 = std::sqrt(v8[k]);
      const float r_floor = std::ldexp(1.0f, -9) * s8.v_scale.data<float>()[i / kMomentBlock];
      EXPECT_LE(std::fabs(r8 - r32), std::max(std::ldexp(r32, -3), r_floor) * 1.0001f)
          << "sqrt(v), step " << step << " element " << i;
    }
  }
}

// Over a run, the weights of FP8 and bfloat16 moments stay close to float32 AdamW's: after 200 steps on the same
// gradients (a 2^12 range of magnitudes inside every block), the update w - w0 within 1% (bf16) and 6% (FP8) of
// float32's, relative L2. Measured: 0.54% and 4.2%; storing v itself in E4M3 instead of sqrt(v) gives 447% (small
// elements' v flushed to 0), sqrt(v) with nearest rounding 8.4%.
TEST(AdamWStorage, LowPrecisionMomentsTrackFloat32OverARun) {
  const std::int64_t n = 2048;
  for (const MomentStorage storage : {MomentStorage::kBfloat16, MomentStorage::kFp8}) {
    Parameter p32 = random_parameter("w", n, 3), pq = random_parameter("w", n, 3);
    const std::vector<float> w0 = floats(p32.value);
    AdamW a32({.lr = 1e-3, .beta2 = 0.95}), aq({.lr = 1e-3, .beta2 = 0.95, .moments = storage});
    Parameter* ps32[] = {&p32};
    Parameter* psq[] = {&pq};
    for (int step = 0; step < 200; ++step) {
      // A fixed direction plus noise: the moments have a signal to keep.
      set_random_grad(p32, 7 + static_cast<std::uint64_t>(step) % 5);
      set_random_grad(pq, 7 + static_cast<std::uint64_t>(step) % 5);
      a32.step(ps32);
      aq.step(psq);
    }
    const std::vector<float> w32 = floats(p32.value), wq = floats(pq.value);
    double diff = 0, norm = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      diff += std::pow(static_cast<double>(wq[k]) - w32[k], 2);
      norm += std::pow(static_cast<double>(w32[k]) - w0[k], 2);
    }
    EXPECT_LT(std::sqrt(diff / norm), storage == MomentStorage::kFp8 ? 0.06 : 0.01) << name(storage);
  }
}

// Stochastic rounding to bfloat16: the mean of many draws is the input (within 4 standard errors), each draw is one
// of the two neighbours, and the bits are exact at the ends (a representable value, Inf, NaN).
TEST(StochasticRounding, Bfloat16IsUnbiasedAndPicksANeighbour) {
  for (const float x : {1.0f + 0.3f * std::ldexp(1.0f, -7), -3.14159f, 1e-30f, 65504.123f}) {
    const float lo = std::bit_cast<float>(std::bit_cast<std::uint32_t>(x) & 0xFFFF0000u);
    const float hi_bf = bfloat16{static_cast<std::uint16_t>((std::bit_cast<std::uint32_t>(lo) >> 16) + 1)}.to_float();
    const int draws = 200000;
    double sum = 0;
    for (int i = 0; i < draws; ++i) {
      const auto r = static_cast<std::uint16_t>(stochastic_bits(42, static_cast<std::uint64_t>(i)) >> 16);
      const float y = bfloat16::from_float_stochastic(x, r).to_float();
      ASSERT_TRUE(y == lo || y == hi_bf) << x << " -> " << y;
      sum += y;
    }
    const double p = (static_cast<double>(x) - lo) / (static_cast<double>(hi_bf) - lo);
    const double standard_error = std::fabs(hi_bf - lo) * std::sqrt(p * (1 - p) / draws);
    EXPECT_NEAR(sum / draws, x, 4 * standard_error + 1e-12 * std::fabs(x)) << x;
  }
  EXPECT_EQ(bfloat16::from_float_stochastic(1.5f, 0xFFFF).to_float(), 1.5f);  // representable: never moves
  EXPECT_TRUE(std::isinf(bfloat16::from_float_stochastic(INFINITY, 0xFFFF).to_float()));
  EXPECT_TRUE(std::isnan(bfloat16::from_float_stochastic(NAN, 0).to_float()));
}

// Updates below half a bfloat16 step: rounding to nearest loses all of them, stochastic rounding keeps them on
// average, Kahan compensation keeps them to within a step. 1000 steps of lr * 1 on a weight of 1 (a constant
// gradient of -1 and no decay: each update is +lr = 1e-4, a 40th of bfloat16's step 2^-7 at 1).
TEST(MasterWeights, Bfloat16KeepsUpdatesBelowItsResolution) {
  const int steps = 1000;
  const double expected = 1.0 + steps * 1e-4;
  std::map<MasterWeights, double> mean;
  for (const MasterWeights master : {MasterWeights::kBf16Stochastic, MasterWeights::kBf16Kahan}) {
    Parameter p = make_parameter("w", {4096}, 0.0, 0, 1.0);
    set_master_dtype(p, DType::bfloat16);
    EXPECT_EQ(p.value.dtype(), DType::bfloat16);
    EXPECT_EQ(p.grad.dtype(), DType::bfloat16);
    // Adam's step is lr * m_hat / sqrt(v_hat) = lr for a constant gradient.
    AdamW opt({.lr = 1e-4, .weight_decay = 0.0, .master = master, .rounding_seed = 9});
    Parameter* ps[] = {&p};
    for (int s = 0; s < steps; ++s) {
      AdamW::zero_grad(ps);
      std::vector<float> g(4096, -1.0f);
      add_to_gradient(p, g);
      opt.step(ps);
    }
    const std::vector<float> w = floats(p.value);
    double sum = 0;
    for (float x : w) sum += x;
    mean[master] = sum / static_cast<double>(w.size());
    if (master == MasterWeights::kBf16Kahan) {
      for (float x : w) EXPECT_NEAR(x, expected, std::ldexp(1.0, -7)) << "kahan";
    }
  }
  // Stochastic rounding: each weight's walk is unbiased; the mean over 4096 is within a tenth of a bfloat16 step.
  EXPECT_NEAR(mean[MasterWeights::kBf16Stochastic], expected, 0.1 * std::ldexp(1.0, -7));
  // Nearest rounding would have stayed at 1 (each 1e-4 step is below half of 2^-7).
  EXPECT_EQ(bfloat16::from_float(1.0f + 1e-4f).to_float(), 1.0f);
}

// Seeded: the same seed gives the same bits, another seed other bits; thread count changes nothing.
TEST(MasterWeights, StochasticRoundingIsReproducible) {
  auto run = [](std::uint64_t seed, int threads) {
    const int before = num_threads();
    set_num_threads(threads);
    Parameter p = random_parameter("w", 70000, 5, MasterWeights::kBf16Stochastic);
    AdamW opt(
        {.lr = 1e-3, .moments = MomentStorage::kFp8, .master = MasterWeights::kBf16Stochastic, .rounding_seed = seed});
    Parameter* ps[] = {&p};
    for (int s = 0; s < 3; ++s) {
      set_random_grad(p, 50 + static_cast<std::uint64_t>(s));
      opt.step(ps);
    }
    set_num_threads(before);
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(p.value.numel()));
    std::memcpy(bits.data(), p.value.raw(), bits.size() * 2);
    return bits;
  };
  const auto a = run(1, 1);
  EXPECT_EQ(a, run(1, 2));
  EXPECT_NE(a, run(2, 1));
}

// A parameter stepped in parts (an FSDP shard's rows: Parameter::first_element) ends bit for bit where the whole does:
// the FP8 moment blocks and the random draws follow the whole's positions. The part sizes are not multiples of a
// block (the last block of each part is partial only at the end of the whole); a part that starts inside a block is
// refused, the refusal naming the parameter and the alignment.
TEST(AdamWStorage, PartsOfAParameterStepAsTheWhole) {
  const std::int64_t n = 70000, cut = 3 * kChunkForTests + 5 * kMomentBlock;  // parts [0, cut), [cut, n)
  for (const AdamWOptions& o :
       {AdamWOptions{.moments = MomentStorage::kFp8, .master = MasterWeights::kBf16Stochastic, .rounding_seed = 3},
        AdamWOptions{.moments = MomentStorage::kBfloat16, .master = MasterWeights::kBf16Kahan}}) {
    SCOPED_TRACE(std::string(name(o.moments)) + " " + std::string(name(o.master)));
    Parameter whole = random_parameter("w", n, 9, o.master);
    Parameter parts[2];
    for (int k = 0; k < 2; ++k) {
      const std::int64_t begin = k == 0 ? 0 : cut, end = k == 0 ? cut : n;
      parts[k] = random_parameter("w", end - begin, 1, o.master);
      std::memcpy(parts[k].value.raw(), whole.value.raw() + begin * 2, static_cast<std::size_t>((end - begin) * 2));
      parts[k].first_element = begin;
    }
    AdamW one(o), first(o), second(o);
    Parameter* ws[] = {&whole};
    Parameter* p0[] = {&parts[0]};
    Parameter* p1[] = {&parts[1]};
    for (int step = 0; step < 3; ++step) {
      set_random_grad(whole, 70 + static_cast<std::uint64_t>(step));
      std::memcpy(parts[0].grad.raw(), whole.grad.raw(), static_cast<std::size_t>(cut * 2));
      std::memcpy(parts[1].grad.raw(), whole.grad.raw() + cut * 2, static_cast<std::size_t>((n - cut) * 2));
      one.step(ws);
      first.step(p0);
      second.step(p1);
    }
    EXPECT_EQ(std::memcmp(parts[0].value.raw(), whole.value.raw(), static_cast<std::size_t>(cut * 2)), 0);
    EXPECT_EQ(std::memcmp(parts[1].value.raw(), whole.value.raw() + cut * 2, static_cast<std::size_t>((n - cut) * 2)),
              0);
    const AdamW::State& w = one.state().at("w");
    const AdamW::State& b = second.state().at("w");
    EXPECT_EQ(
        std::memcmp(b.m.raw(), w.m.raw() + cut * element_size(w.m.dtype()), static_cast<std::size_t>(b.m.nbytes())), 0);
    EXPECT_EQ(
        std::memcmp(b.v.raw(), w.v.raw() + cut * element_size(w.v.dtype()), static_cast<std::size_t>(b.v.nbytes())), 0);
    if (o.moments == MomentStorage::kFp8) {
      EXPECT_EQ(std::memcmp(b.v_scale.raw(), w.v_scale.raw() + cut / kMomentBlock * 4,
                            static_cast<std::size_t>(b.v_scale.nbytes())),
                0);
    }
  }
  Parameter inside = random_parameter("x", 256, 2, MasterWeights::kBf16Stochastic);
  inside.first_element = 64;
  AdamW fp8({.moments = MomentStorage::kFp8, .master = MasterWeights::kBf16Stochastic});
  EXPECT_EQ(fp8.part_alignment(), kMomentBlock);
  Parameter* ps[] = {&inside};
  fp8kit::testing::expect_error([&] { fp8.step(ps); }, ErrorKind::kInvalidArgument, {"'x'", "multiples of 128"},
                                "a part starting inside a moment block");
  EXPECT_EQ(AdamW({.master = MasterWeights::kBf16Stochastic}).part_alignment(), 4);
  EXPECT_EQ(AdamW().part_alignment(), 1);
}

// The moments and compensation count as optimizer state, the bfloat16 values and gradients as parameters and
// gradients, with the bytes their storage allocates (64-byte padding).
TEST(AdamWStorage, BuffersCountInTheirMemoryCategories) {
  auto padded = [](std::int64_t bytes) { return (bytes + 63) / 64 * 64; };
  const std::int64_t n = 1000;  // 8 blocks, the last partial
  const MemoryStats before = memory_stats();
  {
    Parameter p = random_parameter("w", n, 2, MasterWeights::kBf16Kahan);
    const MemoryStats made = memory_stats();
    const auto delta = [&](const MemoryStats& now, MemoryCategory c) {
      return now.current_by_category[static_cast<std::size_t>(c)] -
             before.current_by_category[static_cast<std::size_t>(c)];
    };
    EXPECT_EQ(delta(made, MemoryCategory::kParameters), padded(2 * n));
    EXPECT_EQ(delta(made, MemoryCategory::kGradients), padded(2 * n));
    AdamW opt({.moments = MomentStorage::kFp8, .master = MasterWeights::kBf16Kahan});
    Parameter* ps[] = {&p};
    opt.step(ps);
    const MemoryStats stepped = memory_stats();
    // m and sqrt(v) codes, their 8 scales each, the bfloat16 compensation.
    EXPECT_EQ(delta(stepped, MemoryCategory::kOptimizerState), 2 * padded(n) + 2 * padded(8 * 4) + padded(2 * n));
    std::int64_t sum = 0;
    for (std::int64_t c : stepped.current_by_category) sum += c;
    EXPECT_EQ(sum, stepped.current_bytes);
  }
  EXPECT_EQ(memory_stats().current_bytes, before.current_bytes);
}

TEST(AdamWStorage, RefusesValuesOfAnotherDtypeAndParsesNames) {
  Parameter p = random_parameter("w", 8, 1);  // float32
  AdamW opt({.master = MasterWeights::kBf16Stochastic});
  Parameter* ps[] = {&p};
  fp8kit::testing::expect_error([&] { opt.step(ps); }, ErrorKind::kInvalidArgument, {"'w'", "bfloat16"},
                                "a float32 parameter under bf16 master weights");
  EXPECT_EQ(parse_moment_storage("fp8"), MomentStorage::kFp8);
  EXPECT_EQ(parse_moment_storage("int8"), std::nullopt);
  EXPECT_EQ(parse_master_weights("bf16-kahan"), MasterWeights::kBf16Kahan);
  EXPECT_EQ(parse_master_weights("fp16"), std::nullopt);
  EXPECT_EQ(name(MasterWeights::kBf16Stochastic), "bf16-sr");
}

}  // namespace
}  // namespace fp8kit::nn
