// Delayed scaling step by step against hand-computed sequences (max and most_recent, e4m3fn and e5m2), the
// no-roll rule, NaN/Inf/0/tiny amaxes, EMA smoothing, and the serialized state.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/scaling/recipe.hpp"

namespace fp8kit {
namespace {

std::vector<float> hist(const DelayedScaling& s) {
  return {s.history().begin(), s.history().end()};
}

TEST(DelayedScaling, MaxOverWindowByHand) {
  DelayedScaling s(DelayedScalingConfig{Format::e4m3fn, 3, AmaxCompute::kMax});
  EXPECT_EQ(s.scale(), 1.0f);  // TE's initial scale
  EXPECT_EQ(hist(s), (std::vector<float>{0, 0, 0}));
  s.record(2.0f);
  s.update();  // window {2, 0, 0} -> amax 2
  EXPECT_EQ(s.scale(), 224.0f);
  EXPECT_EQ(hist(s), (std::vector<float>{0, 0, 2}));
  s.record(4.0f);
  s.update();  // window {4, 0, 2} -> 4
  EXPECT_EQ(s.scale(), 112.0f);
  EXPECT_EQ(hist(s), (std::vector<float>{0, 2, 4}));
  s.record(1.0f);
  s.update();  // window {1, 2, 4} -> 4
  EXPECT_EQ(s.scale(), 112.0f);
  EXPECT_EQ(hist(s), (std::vector<float>{0, 4, 1}));
  s.record(1.0f);
  s.update();  // window {1, 4, 1} -> 4
  EXPECT_EQ(s.scale(), 112.0f);
  EXPECT_EQ(hist(s), (std::vector<float>{0, 1, 1}));
  s.record(1.0f);
  s.update();  // window {1, 1, 1}: the 4 has left the window
  EXPECT_EQ(s.scale(), 448.0f);
  EXPECT_FLOAT_EQ(s.scale_inv(), 1.0f / 448.0f);
}

TEST(DelayedScaling, MostRecentAndMargin) {
  DelayedScaling s(DelayedScalingConfig{Format::e5m2, 4, AmaxCompute::kMostRecent, 1});
  s.record(8.0f);
  s.update();
  EXPECT_EQ(s.scale(), 57344.0f / 8.0f / 2.0f);
  s.record(2.0f);
  s.record(1.0f);  // several records in a step: their maximum
  s.update();
  EXPECT_EQ(s.scale(), 57344.0f / 2.0f / 2.0f);
}

TEST(DelayedScaling, EdgeCases) {
  for (Format f : {Format::e4m3fn, Format::e5m2}) {
    for (AmaxCompute algo : {AmaxCompute::kMax, AmaxCompute::kMostRecent}) {
      SCOPED_TRACE(std::string(name(f)) + (algo == AmaxCompute::kMax ? " max" : " most_recent"));
      DelayedScaling s(DelayedScalingConfig{f, 4, algo});
      s.record(4.0f);
      s.update();
      const float good = static_cast<float>(max_finite(f)) / 4.0f;
      EXPECT_EQ(s.scale(), good);
      // amax 0 (the module did not run): no roll, no new scale.
      const auto before = hist(s);
      s.update();
      EXPECT_EQ(hist(s), before);
      EXPECT_EQ(s.scale(), good);
      // +Inf: the previous scale stays (kMax: Inf is the window max; kMostRecent: Inf itself).
      s.record(std::numeric_limits<float>::infinity());
      s.update();
      EXPECT_EQ(s.scale(), good);
      // NaN: kMostRecent keeps the previous scale; kMax ignores NaN like fmaxf, the window max (Inf) keeps it too.
      s.record(std::numeric_limits<float>::quiet_NaN());
      s.update();
      EXPECT_EQ(s.scale(), good);
      // Tiny amax: the scale overflows float -> FLT_MAX (once the larger amaxes have left the window).
      DelayedScaling t(DelayedScalingConfig{f, 1, algo});
      t.record(1e-42f);
      t.update();
      EXPECT_EQ(t.scale(), FLT_MAX);
    }
  }
}

TEST(DelayedScaling, ExponentialMovingAverage) {
  DelayedScalingConfig config{Format::e4m3fn, 1, AmaxCompute::kMostRecent};
  config.ema_decay = 0.5f;
  DelayedScaling s(config);
  s.record(4.0f);
  s.update();  // first: 4
  EXPECT_EQ(s.smoothed_amax(), 4.0f);
  EXPECT_EQ(s.scale(), 112.0f);
  s.record(12.0f);
  s.update();  // 0.5 * 4 + 0.5 * 12 = 8
  EXPECT_EQ(s.smoothed_amax(), 8.0f);
  EXPECT_EQ(s.scale(), 56.0f);
  EXPECT_THROW(DelayedScaling(DelayedScalingConfig{Format::e4m3fn, 0}), Error);
  DelayedScalingConfig bad;
  bad.ema_decay = 1.5f;
  EXPECT_THROW(DelayedScaling{bad}, Error);
}

// A state rebuilt from its public parts (what a device copy hands back) is the state, bytes and all.
TEST(DelayedScaling, FromPartsIsTheState) {
  DelayedScalingConfig config{Format::e4m3fn, 4, AmaxCompute::kMax, 1};
  config.ema_decay = 0.5f;
  DelayedScaling s(config);
  for (float a : {3.0f, 7.0f, 1.0f, 2.5f, 9.0f}) {
    s.record(a);
    s.update();
  }
  s.record(4.0f);
  const DelayedScaling r =
      DelayedScaling::from_parts(s.config(), s.scale(), s.smoothed_amax(), s.calibrated(), s.history());
  EXPECT_EQ(r.serialize(), s.serialize());
  const std::vector<float> short_history(3, 0.0f);
  EXPECT_THROW(DelayedScaling::from_parts(config, 1.0f, std::nullopt, false, short_history), Error);
}

TEST(DelayedScaling, SerializeRoundTrip) {
  DelayedScalingConfig config{Format::e5m2, 5, AmaxCompute::kMax, 2};
  config.ema_decay = 0.9f;
  DelayedScaling s(config);
  for (float a : {3.0f, 7.0f, 1.0f}) {
    s.record(a);
    s.update();
  }
  s.record(5.0f);  // mid-step state is kept too
  const auto bytes = s.serialize();
  const DelayedScaling r = DelayedScaling::deserialize(bytes);
  EXPECT_EQ(r.scale(), s.scale());
  EXPECT_EQ(hist(r), hist(s));
  EXPECT_EQ(r.smoothed_amax(), s.smoothed_amax());
  EXPECT_EQ(r.config().format, Format::e5m2);
  EXPECT_EQ(r.config().margin, 2);
  EXPECT_EQ(r.config().ema_decay, 0.9f);
  EXPECT_EQ(r.serialize(), bytes);
  // Continuing from the restored state gives the same scales as continuing the original.
  DelayedScaling a = s, b = r;
  for (float x : {9.0f, 2.0f}) {
    a.record(x);
    a.update();
    b.record(x);
    b.update();
    EXPECT_EQ(a.scale(), b.scale());
  }
  // Corrupted inputs are refused with a parse error.
  auto truncated = bytes;
  truncated.pop_back();
  EXPECT_THROW(DelayedScaling::deserialize(truncated), Error);
  auto bad_magic = bytes;
  bad_magic[0] ^= 0xFF;
  EXPECT_THROW(DelayedScaling::deserialize(bad_magic), Error);
  auto bad_version = bytes;
  bad_version[4] = 99;
  EXPECT_THROW(DelayedScaling::deserialize(bad_version), Error);
  auto trailing = bytes;
  trailing.push_back(0);
  EXPECT_THROW(DelayedScaling::deserialize(trailing), Error);
}

// calibrated(): set by the first update() that computes a scale from a finite, nonzero amax; kept through the
// serialized state (version 2), inferred for a version-1 state from its scale and history.
TEST(DelayedScaling, CalibratedAfterTheFirstRealUpdate) {
  DelayedScaling s(DelayedScalingConfig{Format::e4m3fn, 4});
  EXPECT_FALSE(s.calibrated());
  s.update();  // nothing recorded: no step
  EXPECT_FALSE(s.calibrated());
  s.record(std::numeric_limits<float>::quiet_NaN());
  s.update();  // a NaN amax keeps scale 1
  EXPECT_FALSE(s.calibrated());
  EXPECT_EQ(s.scale(), 1.0f);
  s.record(2.0f);
  s.update();
  EXPECT_TRUE(s.calibrated());
  EXPECT_EQ(s.scale(), 224.0f);
  const DelayedScaling fresh(DelayedScalingConfig{Format::e4m3fn, 4});
  EXPECT_FALSE(DelayedScaling::deserialize(fresh.serialize()).calibrated());
  EXPECT_TRUE(DelayedScaling::deserialize(s.serialize()).calibrated());
  // Version 1 (no flag: the 4 bytes after `smoothed` removed, version 1) is read, the flag inferred.
  const auto v1 = [](std::vector<std::uint8_t> bytes) {
    bytes[4] = 1;
    bytes.erase(bytes.begin() + 44, bytes.begin() + 48);  // magic..smoothed are 11 u32 = 44 bytes
    return bytes;
  };
  EXPECT_TRUE(DelayedScaling::deserialize(v1(s.serialize())).calibrated());
  EXPECT_EQ(DelayedScaling::deserialize(v1(s.serialize())).scale(), 224.0f);
  EXPECT_FALSE(DelayedScaling::deserialize(v1(fresh.serialize())).calibrated());
  auto bad_flag = s.serialize();
  bad_flag[44] = 7;
  EXPECT_THROW(DelayedScaling::deserialize(bad_flag), Error);
}

// A state holds what update() and record() can leave: damaged bytes or hand-made parts with a scale that is not
// finite and positive, a negative amax, or a flag other than 0/1 are refused, not quantized with.
TEST(DelayedScaling, ImpossibleStatesAreRefused) {
  DelayedScaling s(DelayedScalingConfig{Format::e4m3fn, 2});
  s.record(3.0f);
  const std::vector<std::uint8_t> good = s.serialize();
  const auto with_u32 = [&](std::size_t offset, std::uint32_t v) {
    auto b = good;
    for (int i = 0; i < 4; ++i) b[offset + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v >> (8 * i));
    return b;
  };
  const auto refused = [](const std::vector<std::uint8_t>& b, const std::string& needle) {
    try {
      DelayedScaling::deserialize(b);
      ADD_FAILURE() << "accepted; expected " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kParse) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  EXPECT_NO_THROW(DelayedScaling::deserialize(good));
  // Byte offsets: has_ema 24, scale 32, has_smoothed 36, calibrated 44, history 48.
  for (const float bad :
       {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    refused(with_u32(32, std::bit_cast<std::uint32_t>(bad)), "scale must be finite and positive");
  }
  refused(with_u32(24, 7), "bad EMA flag");
  refused(with_u32(36, 2), "bad smoothed flag");
  refused(with_u32(48, std::bit_cast<std::uint32_t>(-2.0f)), "history amax 0 is negative");
  // NaN and Inf amaxes are what record() keeps: read back as they were.
  EXPECT_TRUE(std::isnan(DelayedScaling::deserialize(with_u32(48, 0x7FC00000u)).history()[0]));
  const DelayedScalingConfig config{Format::e4m3fn, 2};
  const std::vector<float> history{0.0f, 1.0f};
  EXPECT_THROW(DelayedScaling(DelayedScalingConfig{Format::e8m0fnu, 2}), Error);  // a scale format, not a value one
  EXPECT_THROW(DelayedScaling(DelayedScalingConfig{Format::e4m3fn, 2, AmaxCompute::kMax, 1000}), Error);  // margin
  EXPECT_THROW(DelayedScaling(DelayedScalingConfig{Format::e4m3fn, (1 << 24) + 1}), Error);  // history length
  EXPECT_THROW(DelayedScaling::from_parts(config, 0.0f, std::nullopt, false, history), Error);
  EXPECT_THROW(DelayedScaling::from_parts(config, 1.0f, -1.0f, false, history), Error);
  EXPECT_NO_THROW(DelayedScaling::from_parts(config, 2.0f, 1.0f, true, history));
}

TEST(CurrentScaling, IsTheScaleFormula) {
  const CurrentScaling c{Format::e4m3fn, ScaleOptions{0, 1e-12f}};
  EXPECT_EQ(c.scale_for(3.5f), 128.0f);
  EXPECT_EQ(c.scale_for(0.0f), static_cast<float>(448.0 / double{1e-12f}));
}

}  // namespace
}  // namespace fp8kit
