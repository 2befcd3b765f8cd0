// Tensor::to against the scalar codecs: every float dtype to every FP8 dtype under both overflow policies,
// every FP8 code back, FP8 to FP8, single rounding for float64 and int64 sources, integers and bool.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/format/codec.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit {
namespace {

constexpr DType kFloatDTypes[] = {DType::float32, DType::float64, DType::float16, DType::bfloat16};
constexpr Overflow kPolicies[] = {Overflow::kNonSaturating, Overflow::kSaturate};

std::string trace(DType from, DType to, Overflow o) {
  return std::string(name(from)) + " -> " + std::string(name(to)) +
         (o == Overflow::kSaturate ? " saturating" : " non-saturating");
}

// Doubles over every magnitude, with specials and FP8 boundary values.
std::vector<double> test_values(std::size_t n) {
  std::vector<double> v = {0.0,      -0.0,      1.0,      -1.5,     449.0,   465.0,   464.0, 448.0,
                           240.0,    248.0,     57344.0,  61440.0,  1e6,     -1e6,    0.1,   1e-10,
                           0x1p-9,   0x1p-10,   0x1p-127, 0x1p-128, 0x1p127, 3e38,    1e300, 464.0 + 0x1p-30,
                           INFINITY, -INFINITY, NAN,      -NAN,     0x1p-17, 0x1p-16, 1.75,  -0x1p-7};
  std::mt19937_64 rng(1234);
  while (v.size() < n) {
    const std::uint64_t r = rng();
    const double mant = 1.0 + static_cast<double>(r >> 12) * 0x1p-52;
    const int exp = static_cast<int>((r >> 4) % 80) - 40;
    v.push_back(((r & 1) ? -1.0 : 1.0) * std::ldexp(mant, exp));
  }
  return v;
}

// The scalar codec on the source element in its own type.
std::uint8_t reference_encode(const Tensor& src, std::int64_t i, const EncodeSpec& spec) {
  switch (src.dtype()) {
    case DType::float32:
      return encode(src.data<float>()[i], spec);
    case DType::float64:
      return encode(src.data<double>()[i], spec);
    case DType::float16:
      return encode(src.data<float16>()[i], spec);
    case DType::bfloat16:
      return encode(src.data<bfloat16>()[i], spec);
    default:
      ADD_FAILURE() << "not a float dtype";
      return 0;
  }
}

TEST(Cast, EveryFloatDTypeToEveryFp8DTypeMatchesTheCodec) {
  const std::vector<double> values = test_values(5000);
  const Tensor f64 = tensor(values, {static_cast<std::int64_t>(values.size())}, DType::float64);
  for (DType from : kFloatDTypes) {
    const Tensor src = f64.to(from);
    for (Format f : kAllFormats) {
      for (Overflow o : kPolicies) {
        SCOPED_TRACE(trace(from, dtype_of(f), o));
        const Tensor out = src.to(dtype_of(f), o);
        ASSERT_EQ(out.dtype(), dtype_of(f));
        ASSERT_EQ(out.shape(), src.shape());
        const std::uint8_t* codes = out.data<std::uint8_t>();
        int mismatches = 0;
        for (std::int64_t i = 0; i < out.numel() && mismatches < 5; ++i) {
          const std::uint8_t want = reference_encode(src, i, EncodeSpec{f, o});
          if (codes[i] != want) {
            ++mismatches;
            ADD_FAILURE() << "element " << i << " value " << src.item_as_double(i) << ": got " << int(codes[i])
                          << " want " << int(want);
          }
        }
      }
    }
  }
}

TEST(Cast, OverflowPolicies) {
  // float32 449 -> 448; 465 -> NaN non-saturating, 448 saturating.
  const Tensor x = tensor({449.0, 465.0, -465.0, 1e30});
  const Tensor ns = x.to(DType::float8_e4m3fn);  // default: non-saturating, like PyTorch eager .to()
  const Tensor sat = x.to(DType::float8_e4m3fn, Overflow::kSaturate);
  EXPECT_EQ(ns.item_as_double(0), 448.0);
  EXPECT_TRUE(std::isnan(ns.item_as_double(1)));
  EXPECT_TRUE(std::isnan(ns.item_as_double(2)));
  EXPECT_EQ(sat.item_as_double(0), 448.0);
  EXPECT_EQ(sat.item_as_double(1), 448.0);
  EXPECT_EQ(sat.item_as_double(2), -448.0);
  EXPECT_EQ(sat.item_as_double(3), 448.0);
  // e5m2 has Inf: non-saturating overflow is Inf.
  const Tensor e5 = tensor({61440.0, 1e6}).to(DType::float8_e5m2);
  EXPECT_EQ(e5.item_as_double(0), INFINITY);
  EXPECT_EQ(tensor({1e6}).to(DType::float8_e5m2, Overflow::kSaturate).item_as_double(0), 57344.0);
}

// convert() between the same FP8 dtype saturating takes e5m2's infinities to its largest finite value, as from any
// other source (it was a copy, keeping them); non-saturating, and for the formats without infinities, a copy.
TEST(Cast, SaturatingToTheSameFp8FormatSaturatesItsInfinities) {
  const std::uint8_t e5m2[] = {0x7C, 0xFC, 0x3C, 0x7F};  // +Inf, -Inf, 1, NaN
  std::uint8_t out[4] = {};
  convert(e5m2, DType::float8_e5m2, out, DType::float8_e5m2, 4, Overflow::kSaturate);
  EXPECT_EQ(out[0], 0x7B);  // 57344
  EXPECT_EQ(out[1], 0xFB);  // -57344
  EXPECT_EQ(out[2], 0x3C);
  EXPECT_TRUE((out[3] & 0x7C) == 0x7C && (out[3] & 0x03) != 0);  // NaN stays NaN
  convert(e5m2, DType::float8_e5m2, out, DType::float8_e5m2, 4, Overflow::kNonSaturating);
  EXPECT_EQ(std::memcmp(out, e5m2, 4), 0);
  // Tensor::to: the same, and a copy only then (another policy, or another format without Inf, shares storage).
  const Tensor inf = tensor({INFINITY, -INFINITY}).to(DType::float8_e5m2);
  const Tensor saturated = inf.to(DType::float8_e5m2, Overflow::kSaturate);
  EXPECT_EQ(saturated.item_as_double(0), 57344.0);
  EXPECT_EQ(saturated.item_as_double(1), -57344.0);
  EXPECT_EQ(inf.to(DType::float8_e5m2).data_ptr(), inf.data_ptr());
  const Tensor e4 = tensor({448.0}).to(DType::float8_e4m3fn);
  EXPECT_EQ(e4.to(DType::float8_e4m3fn, Overflow::kSaturate).data_ptr(), e4.data_ptr());
  const std::uint8_t e4m3[] = {0x7F, 0x7E, 0x01};  // NaN, 448, the smallest subnormal
  convert(e4m3, DType::float8_e4m3fn, out, DType::float8_e4m3fn, 3, Overflow::kSaturate);
  EXPECT_EQ(std::memcmp(out, e4m3, 3), 0);
}

TEST(Cast, Float64RoundsOnceToFp8) {
  // 464 + 2^-30 lies above the midpoint 464 between 448 and NaN: NaN from the exact double, while rounding to
  // float32 first (464) would tie to 448.
  const Tensor d = tensor({464.0 + std::ldexp(1.0, -30)}, DType::float64);
  EXPECT_TRUE(std::isnan(d.to(DType::float8_e4m3fn).item_as_double(0)));
  EXPECT_EQ(d.to(DType::float8_e4m3fn, Overflow::kSaturate).item_as_double(0), 448.0);
  EXPECT_EQ(d.to(DType::float32).to(DType::float8_e4m3fn).item_as_double(0), 448.0);
  // 1 + 2^-4 + 2^-40: above the midpoint between 1 and 1.125 -> 1.125 (float32 would make it a tie -> 1).
  const Tensor up = tensor({1.0 + 0x1p-4 + 0x1p-40}, DType::float64);
  EXPECT_EQ(up.to(DType::float8_e4m3fn).item_as_double(0), 1.125);
}

TEST(Cast, Float64RoundsOnceToHalfTypes) {
  // Via float32 both would tie to even (1.0); rounded once they round up.
  const Tensor d =
      tensor({1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-8 + 0x1p-40, -(1.0 + 0x1p-11 + 0x1p-40)}, DType::float64);
  const Tensor h = d.to(DType::float16);
  EXPECT_EQ(h.data<float16>()[0].bits, 0x3C01);  // 1 + 2^-10
  EXPECT_EQ(h.data<float16>()[2].bits, 0xBC01);
  EXPECT_EQ(d.to(DType::bfloat16).data<bfloat16>()[1].bits, 0x3F81);  // 1 + 2^-7
  // Exact ties still go to even; overflow and NaN as IEEE.
  const Tensor t = tensor({1.0 + 0x1p-11, 65520.0, 1e300, NAN, 0x1p-25, 0x1p-25 + 0x1p-60}, DType::float64);
  const Tensor th = t.to(DType::float16);
  EXPECT_EQ(th.data<float16>()[0].bits, 0x3C00);
  EXPECT_EQ(th.data<float16>()[1].bits, 0x7C00);
  EXPECT_EQ(th.data<float16>()[2].bits, 0x7C00);
  EXPECT_TRUE(std::isnan(th.item_as_double(3)));
  EXPECT_EQ(th.data<float16>()[4].bits, 0x0000);                      // tie between 0 and 2^-24 -> 0
  EXPECT_EQ(th.data<float16>()[5].bits, 0x0001);                      // just above the tie -> 2^-24
  EXPECT_EQ(t.to(DType::bfloat16).data<bfloat16>()[2].bits, 0x7F80);  // 1e300 -> Inf
}

TEST(Cast, EveryFp8CodeBackToEveryFloatDType) {
  for (Format f : kAllFormats) {
    SCOPED_TRACE(std::string(name(f)));
    Tensor codes = empty({256}, dtype_of(f));
    for (int c = 0; c < 256; ++c) codes.data<std::uint8_t>()[c] = static_cast<std::uint8_t>(c);
    const Tensor f32 = codes.to(DType::float32);
    const Tensor f64 = codes.to(DType::float64);
    const Tensor bf = codes.to(DType::bfloat16);
    const Tensor h = codes.to(DType::float16);
    for (int c = 0; c < 256; ++c) {
      const auto code = static_cast<std::uint8_t>(c);
      EXPECT_EQ(std::bit_cast<std::uint32_t>(f32.data<float>()[c]),
                std::bit_cast<std::uint32_t>(decode_to_float(f, code)))
          << c;
      EXPECT_EQ(std::bit_cast<std::uint64_t>(f64.data<double>()[c]),
                std::bit_cast<std::uint64_t>(decode_to_double(f, code)))
          << c;
      EXPECT_EQ(bf.data<bfloat16>()[c], decode_to_bfloat16(f, code)) << c;
      EXPECT_EQ(h.data<float16>()[c], decode_to_float16(f, code)) << c;
    }
  }
}

TEST(Cast, Fp8ToFp8DecodesExactlyThenEncodesOnce) {
  for (Format from : kAllFormats) {
    Tensor codes = empty({256}, dtype_of(from));
    for (int c = 0; c < 256; ++c) codes.data<std::uint8_t>()[c] = static_cast<std::uint8_t>(c);
    for (Format to : kAllFormats) {
      for (Overflow o : kPolicies) {
        SCOPED_TRACE(trace(dtype_of(from), dtype_of(to), o));
        const Tensor out = codes.to(dtype_of(to), o);
        if (from == to && !(o == Overflow::kSaturate && descriptor(to).has_inf)) {
          EXPECT_TRUE(out.shares_storage_with(codes));
          continue;
        }  // (saturating e5m2 to itself: a copy, its infinities +-57344, as the formula below gives)
        for (int c = 0; c < 256; ++c) {
          const std::uint8_t want = encode(decode_to_double(from, static_cast<std::uint8_t>(c)), EncodeSpec{to, o});
          EXPECT_EQ(out.data<std::uint8_t>()[c], want) << c;
        }
      }
    }
  }
  // Spot checks: e5m2 57344 -> e4m3fn NaN / 448; e4m3fn 448 -> e4m3fnuz NaN (0x80) / 240.
  const Tensor big = tensor({57344.0}, DType::float8_e5m2);
  EXPECT_TRUE(std::isnan(big.to(DType::float8_e4m3fn).item_as_double(0)));
  EXPECT_EQ(big.to(DType::float8_e4m3fn, Overflow::kSaturate).item_as_double(0), 448.0);
  const Tensor m = tensor({448.0}, DType::float8_e4m3fn);
  EXPECT_EQ(m.to(DType::float8_e4m3fnuz).data<std::uint8_t>()[0], 0x80);
  EXPECT_EQ(m.to(DType::float8_e4m3fnuz, Overflow::kSaturate).item_as_double(0), 240.0);
}

// The vectorized float32 -> bfloat16 path against bfloat16::from_float: every low half-word (all rounding cases:
// below, at and above the tie, odd and even) under high half-words around 1, the largest finite values, Inf/NaN
// (quiet and signalling payloads), subnormals and zero, both signs; and every 4099th bit pattern. Threads split
// the long arrays, so the parallel path runs too.
TEST(Cast, Float32ToBfloat16MatchesFromFloatBitForBit) {
  std::vector<std::uint32_t> patterns;
  for (const std::uint32_t high :
       {0x0000u, 0x0001u, 0x3F80u, 0x3F81u, 0x7F7Fu, 0x7F80u, 0x7FC0u, 0x8000u, 0xBF80u, 0xFF7Fu, 0xFF80u, 0xFFC0u}) {
    for (std::uint32_t low = 0; low < 0x10000u; ++low) patterns.push_back(high << 16 | low);
  }
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 4099) patterns.push_back(static_cast<std::uint32_t>(u));
  Tensor f32 = empty({static_cast<std::int64_t>(patterns.size())}, DType::float32);
  std::memcpy(f32.raw(), patterns.data(), patterns.size() * sizeof(std::uint32_t));
  const Tensor bf = f32.to(DType::bfloat16);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    const bfloat16 want = bfloat16::from_float(std::bit_cast<float>(patterns[i]));
    if (bf.data<bfloat16>()[i].bits != want.bits && ++mismatches <= 5) {
      ADD_FAILURE() << std::hex << "0x" << patterns[i] << " -> 0x" << bf.data<bfloat16>()[i].bits << ", want 0x"
                    << want.bits;
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << patterns.size();
}

TEST(Cast, FloatToFloat) {
  const std::vector<double> values = test_values(3000);
  const Tensor f64 = tensor(values, {static_cast<std::int64_t>(values.size())}, DType::float64);
  const Tensor f32 = f64.to(DType::float32);
  const Tensor h = f32.to(DType::float16);
  const Tensor bf = f32.to(DType::bfloat16);
  for (std::int64_t i = 0; i < f32.numel(); ++i) {
    const float x = f32.data<float>()[i];
    if (!std::isnan(values[i])) EXPECT_EQ(x, static_cast<float>(values[i])) << i;
    EXPECT_EQ(h.data<float16>()[i], float16::from_float(x)) << i;
    EXPECT_EQ(bf.data<bfloat16>()[i], bfloat16::from_float(x)) << i;
  }
  // Widening is exact.
  const Tensor back = h.to(DType::float64);
  for (std::int64_t i = 0; i < h.numel(); ++i) {
    const double want = h.data<float16>()[i].to_float();
    if (!std::isnan(want)) EXPECT_EQ(back.data<double>()[i], want) << i;
  }
  const Tensor hb = h.to(DType::bfloat16);
  for (std::int64_t i = 0; i < h.numel(); ++i) {
    EXPECT_EQ(hb.data<bfloat16>()[i], bfloat16::from_float(h.data<float16>()[i].to_float())) << i;
  }
}

TEST(Cast, FloatToInteger) {
  const Tensor x = tensor({1.7, -1.7, 2.5, NAN, INFINITY, -INFINITY, 1e30, 300.0, -0.5}, DType::float64);
  const Tensor i8 = x.to(DType::int8);
  const std::int8_t want8[] = {1, -1, 2, 0, 127, -128, 127, 127, 0};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(i8.data<std::int8_t>()[i], want8[i]) << i;
  const Tensor u8 = x.to(DType::uint8);
  const std::uint8_t wantu8[] = {1, 0, 2, 0, 255, 0, 255, 255, 0};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(u8.data<std::uint8_t>()[i], wantu8[i]) << i;
  const Tensor i64 = x.to(DType::int64);
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  const std::int64_t want64[] = {1, -1, 2, 0, kMax, kMin, kMax, 300, 0};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(i64.data<std::int64_t>()[i], want64[i]) << i;
  // FP8 and half types go through their exact values.
  EXPECT_EQ(tensor({448.0, -2.75}, DType::float8_e4m3fn).to(DType::int16).data<std::int16_t>()[0], 448);
  EXPECT_EQ(tensor({448.0, -2.75}, DType::float8_e4m3fn).to(DType::int16).data<std::int16_t>()[1], -2);
  EXPECT_EQ(tensor({448.0}, DType::float8_e4m3fn).to(DType::int8).data<std::int8_t>()[0], 127);
  EXPECT_EQ(tensor({-3.5}, DType::bfloat16).to(DType::int32).data<std::int32_t>()[0], -3);
}

TEST(Cast, IntegerToFloatRoundsOnce) {
  Tensor i = empty({4}, DType::int64);
  i.data<std::int64_t>()[0] = (std::int64_t{1} << 62) + (std::int64_t{1} << 54) + 1;  // just above a bf16 tie
  i.data<std::int64_t>()[1] = (std::int64_t{1} << 24) + 1;                            // a float32 tie
  i.data<std::int64_t>()[2] = -((std::int64_t{1} << 53) + 1);                         // a float64 tie
  i.data<std::int64_t>()[3] = std::numeric_limits<std::int64_t>::min();
  const Tensor bf = i.to(DType::bfloat16);
  EXPECT_EQ(bf.data<bfloat16>()[0], bfloat16::from_float(std::ldexp(1.0f, 62) + std::ldexp(1.0f, 55)));
  EXPECT_EQ(i.to(DType::float32).data<float>()[1], 16777216.0f);
  EXPECT_EQ(i.to(DType::float64).data<double>()[2], -std::ldexp(1.0, 53));
  EXPECT_EQ(i.to(DType::float64).data<double>()[3], -std::ldexp(1.0, 63));
  EXPECT_EQ(i.to(DType::float16).data<float16>()[1].bits, 0x7C00);  // beyond float16: Inf
  // e8m0fnu rounds by value between powers of two: 3 * 2^61 + 1 is above the midpoint of 2^62 and 2^63.
  i.data<std::int64_t>()[0] = 3 * (std::int64_t{1} << 61) + 1;
  EXPECT_EQ(i.to(DType::float8_e8m0fnu).item_as_double(0), std::ldexp(1.0, 63));
  const Tensor small = tensor({-3.0, 7.0, 100.0}, DType::int32);
  EXPECT_EQ(small.to(DType::float8_e4m3fn).item_as_double(0), -3.0);
  EXPECT_EQ(small.to(DType::float8_e4m3fn).item_as_double(2), 96.0);  // 100 -> 96 (ulp 8, 100 nearer 96)
  EXPECT_EQ(small.to(DType::float16).item_as_double(1), 7.0);
}

TEST(Cast, IntegerToIntegerAndBool) {
  const Tensor i = tensor({300.0, -1.0, 0.0, 65537.0}, DType::int64);
  const Tensor i8 = i.to(DType::int8);
  EXPECT_EQ(i8.data<std::int8_t>()[0], 44);  // 300 mod 256
  EXPECT_EQ(i.to(DType::uint8).data<std::uint8_t>()[1], 255);
  EXPECT_EQ(i.to(DType::int16).data<std::int16_t>()[3], 1);
  const Tensor b = i.to(DType::bool_);
  EXPECT_EQ(b.data<bool>()[0], true);
  EXPECT_EQ(b.data<bool>()[2], false);

  const Tensor f = tensor({0.0, -0.0, 0.5, NAN, -INFINITY});
  const bool want[] = {false, false, true, true, true};
  const Tensor fb = f.to(DType::bool_);
  for (int k = 0; k < 5; ++k) EXPECT_EQ(fb.data<bool>()[k], want[k]) << k;
  const Tensor e4 = tensor({0.0, NAN, 0.001953125}, DType::float8_e4m3fn).to(DType::bool_);
  EXPECT_EQ(e4.data<bool>()[0], false);
  EXPECT_EQ(e4.data<bool>()[1], true);
  EXPECT_EQ(e4.data<bool>()[2], true);

  const Tensor back = fb.to(DType::float32);
  EXPECT_EQ(back.data<float>()[0], 0.0f);
  EXPECT_EQ(back.data<float>()[2], 1.0f);
  EXPECT_EQ(fb.to(DType::float8_e5m2).item_as_double(3), 1.0);
  EXPECT_EQ(fb.to(DType::int64).data<std::int64_t>()[4], 1);
}

TEST(Cast, SameDTypeSharesAndEmptyConverts) {
  const Tensor t = tensor({1.0, 2.0});
  EXPECT_TRUE(t.to(DType::float32).shares_storage_with(t));
  EXPECT_FALSE(t.to(DType::float64).shares_storage_with(t));
  const Tensor e = zeros({0, 3}, DType::bfloat16).to(DType::float8_e4m3fn);
  EXPECT_EQ(e.shape(), (Shape{0, 3}));
  EXPECT_EQ(e.dtype(), DType::float8_e4m3fn);
  const Tensor s = scalar_tensor(3.0, DType::float16).to(DType::float8_e5m2);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item_as_double(0), 3.0);
}

// The float16 nearest to v (|v| < 65504), found independently of Tensor::to: start from the double-rounded
// candidate and pick the nearest of it and its two neighbours (differences of nearby values are exact).
float16 nearest_float16(double v) {
  const float16 c = float16::from_float(static_cast<float>(v));
  float16 best = c;
  double best_err = std::fabs(v - static_cast<double>(c.to_float()));
  for (int step : {-1, 1}) {
    const int mag = (c.bits & 0x7FFF) + step;
    if (mag < 0 || mag > 0x7BFF) continue;
    const float16 cand = float16::from_bits(static_cast<std::uint16_t>((c.bits & 0x8000) | mag));
    const double err = std::fabs(v - static_cast<double>(cand.to_float()));
    if (err < best_err || (err == best_err && (cand.bits & 1) == 0)) {
      best = cand;
      best_err = err;
    }
  }
  return best;
}

TEST(Cast, LargeTensorsMatchReferencesForAnyThreadCount) {
  const int saved = num_threads();
  std::vector<double> values = test_values(300000);
  // Values half a float16 ulp away from a tie by less than float32 can hold: rounding through float32 fails.
  for (int k = 0; k < 1000; ++k)
    values[k] = std::ldexp(1.0 + (2 * k + 1) * 0x1p-11 + ((k & 1) ? 0x1p-40 : -0x1p-40), k % 20 - 10);
  const Tensor f64 = tensor(values, {300, 1000}, DType::float64);
  std::vector<Tensor> halves;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    const Tensor e4 = f64.to(DType::float8_e4m3fn, Overflow::kSaturate);
    for (std::int64_t i = 0; i < f64.numel(); ++i) {
      ASSERT_EQ(e4.data<std::uint8_t>()[i], encode(values[i], EncodeSpec{Format::e4m3fn, Overflow::kSaturate})) << i;
    }
    halves.push_back(f64.to(DType::float16));
  }
  set_num_threads(saved);
  int checked = 0;
  for (std::int64_t i = 0; i < f64.numel(); ++i) {
    ASSERT_EQ(halves[0].data<float16>()[i], halves[1].data<float16>()[i]) << i;
    if (std::fabs(values[i]) < 65504.0) {
      ASSERT_EQ(halves[0].data<float16>()[i], nearest_float16(values[i])) << i << " " << values[i];
      ++checked;
    }
  }
  EXPECT_GT(checked, 200000);
}

}  // namespace
}  // namespace fp8kit
