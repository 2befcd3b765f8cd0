// Delayed scaling: the amax history, its update in Transformer Engine's order, and a versioned binary form.
#include "fp8kit/scaling/recipe.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "common/no_cuda.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/scaling/cuda_recipe.hpp"
#include "fp8kit/scaling/quantize.hpp"

namespace fp8kit {

DelayedScaling::DelayedScaling(const DelayedScalingConfig& config) : config_(config) {
  check_element_format(config.format, "delayed scaling");
  // The bounds Python's DelayedScaling and the serialized state keep: a history of 2^31 amaxes was 8 GiB allocated
  // per tensor role, and a margin past +-127 takes every scale past float's range (all codes 0, or all saturated).
  FP8KIT_CHECK(config.history_length >= 1 && config.history_length <= (1 << 24),
               "delayed scaling: history length must be 1 to 16777216, got ", config.history_length);
  FP8KIT_CHECK(config.margin >= -127 && config.margin <= 127, "delayed scaling: margin must be -127 to 127, got ",
               config.margin);
  FP8KIT_CHECK(!config.ema_decay || (*config.ema_decay >= 0.0f && *config.ema_decay < 1.0f),
               "delayed scaling: EMA decay must be in [0, 1), got ", config.ema_decay.value_or(0.0f));
  history_.assign(static_cast<std::size_t>(config.history_length), 0.0f);
}

void DelayedScaling::discard_step() {
  history_[0] = 0.0f;
}

void DelayedScaling::record(float amax) {
  // NaN must not vanish in a max: it is kept (update() then keeps the previous scale, as TE does).
  if (std::isnan(amax) || std::isnan(history_[0])) {
    history_[0] = std::numeric_limits<float>::quiet_NaN();
  } else {
    history_[0] = std::max(history_[0], std::fabs(amax));
  }
}

void DelayedScaling::update() {
  const float current = history_[0];
  if (current == 0.0f) return;  // the module did not run this step: no roll, no new scale (TE PR #825)
  const std::size_t n = history_.size();
  float amax = current;
  if (config_.algorithm == AmaxCompute::kMax) {
    // fmax ignores NaN, as Transformer Engine's fmaxf reduction does: one bad step does not freeze the scale
    // for a whole window (kMostRecent sees the NaN and keeps the previous scale for that step).
    amax = 0.0f;
    for (float a : history_) amax = std::fmax(amax, a);
  }
  if (config_.ema_decay && std::isfinite(amax)) {
    smoothed_ = smoothed_ ? *config_.ema_decay * *smoothed_ + (1.0f - *config_.ema_decay) * amax : amax;
    amax = *smoothed_;
  }
  scale_ = compute_scale(amax, config_.format, ScaleOptions{config_.margin}, scale_);
  if (std::isfinite(amax) && amax > 0.0f) calibrated_ = true;
  // Roll: slot i <- slot i+1, last slot <- this step's amax, slot 0 cleared for the next step.
  if (n > 1) {
    std::rotate(history_.begin(), history_.begin() + 1, history_.end());  // last slot now holds slot 0
  }
  history_[0] = 0.0f;
}

namespace {

// The values update() and record() can leave in a state: a finite positive scale, a smoothed amax >= 0 (+Inf when
// the average of amaxes near FLT_MAX rounds up), and history amaxes >= 0, Inf or NaN (record keeps both). A state
// given others (by hand, or from damaged bytes) is refused rather than quantizing with them.
void check_state_values(float scale, std::optional<float> smoothed, std::span<const float> history, ErrorKind kind) {
  FP8KIT_CHECK_KIND(std::isfinite(scale) && scale > 0.0f, kind,
                    "delayed scaling: the scale must be finite and positive, got ", scale);
  FP8KIT_CHECK_KIND(!smoothed || *smoothed >= 0.0f, kind, "delayed scaling: the smoothed amax must be >= 0, got ",
                    smoothed.value_or(0.0f));
  for (std::size_t i = 0; i < history.size(); ++i) {
    FP8KIT_CHECK_KIND(!(history[i] < 0.0f), kind, "delayed scaling: history amax ", i, " is negative (", history[i],
                      "); amaxes are magnitudes");
  }
}

}  // namespace

DelayedScaling DelayedScaling::from_parts(const DelayedScalingConfig& config, float scale,
                                          std::optional<float> smoothed, bool calibrated,
                                          std::span<const float> history) {
  DelayedScaling state(config);
  FP8KIT_CHECK(history.size() == state.history_.size(), "delayed scaling: a history of ", history.size(),
               " amaxes for a history length of ", config.history_length);
  check_state_values(scale, smoothed, history, ErrorKind::kInvalidArgument);
  state.scale_ = scale;
  state.smoothed_ = smoothed;
  state.calibrated_ = calibrated;
  std::copy(history.begin(), history.end(), state.history_.begin());
  return state;
}

namespace {

constexpr std::uint32_t kMagic = 0x53443846;  // "F8DS"
constexpr std::uint32_t kVersion = 2;         // 2 added `calibrated`; version 1 is still read

void put_u32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put_f32(std::vector<std::uint8_t>& out, float v) {
  put_u32(out, std::bit_cast<std::uint32_t>(v));
}

class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}
  std::uint32_t u32() {
    FP8KIT_CHECK_KIND(pos_ + 4 <= bytes_.size(), ErrorKind::kParse, "delayed scaling state: truncated at byte ", pos_,
                      " of ", bytes_.size());
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(bytes_[pos_ + static_cast<std::size_t>(i)]) << (8 * i);
    pos_ += 4;
    return v;
  }
  float f32() { return std::bit_cast<float>(u32()); }
  bool done() const { return pos_ == bytes_.size(); }

 private:
  std::span<const std::uint8_t> bytes_;
  std::size_t pos_ = 0;
};

}  // namespace

// Layout (little-endian u32/f32): magic, version, format, history_length, algorithm, margin (as u32 two's
// complement), has_ema, ema_decay, scale, has_smoothed, smoothed, calibrated (version 2 on), history[history_length].
std::vector<std::uint8_t> DelayedScaling::serialize() const {
  std::vector<std::uint8_t> out;
  put_u32(out, kMagic);
  put_u32(out, kVersion);
  put_u32(out, static_cast<std::uint32_t>(config_.format));
  put_u32(out, static_cast<std::uint32_t>(config_.history_length));
  put_u32(out, static_cast<std::uint32_t>(config_.algorithm));
  put_u32(out, static_cast<std::uint32_t>(config_.margin));
  put_u32(out, config_.ema_decay ? 1 : 0);
  put_f32(out, config_.ema_decay.value_or(0.0f));
  put_f32(out, scale_);
  put_u32(out, smoothed_ ? 1 : 0);
  put_f32(out, smoothed_.value_or(0.0f));
  put_u32(out, calibrated_ ? 1 : 0);
  for (float a : history_) put_f32(out, a);
  return out;
}

DelayedScaling DelayedScaling::deserialize(std::span<const std::uint8_t> bytes) {
  Reader in(bytes);
  FP8KIT_CHECK_KIND(in.u32() == kMagic, ErrorKind::kParse, "not a delayed scaling state (bad magic)");
  const std::uint32_t version = in.u32();
  FP8KIT_CHECK_KIND(version == 1 || version == kVersion, ErrorKind::kParse, "delayed scaling state version ", version,
                    " is not supported (this build reads versions 1 and ", kVersion, ")");
  DelayedScalingConfig config;
  const std::uint32_t format = in.u32();
  FP8KIT_CHECK_KIND(format < kAllFormats.size(), ErrorKind::kParse, "delayed scaling state: unknown format ", format);
  config.format = static_cast<Format>(format);
  const std::uint32_t length = in.u32();
  FP8KIT_CHECK_KIND(length >= 1 && length <= (1u << 24), ErrorKind::kParse,
                    "delayed scaling state: bad history length ", length);
  config.history_length = static_cast<int>(length);
  const std::uint32_t algorithm = in.u32();
  FP8KIT_CHECK_KIND(algorithm <= 1, ErrorKind::kParse, "delayed scaling state: unknown amax algorithm ", algorithm);
  config.algorithm = static_cast<AmaxCompute>(algorithm);
  config.margin = static_cast<int>(in.u32());
  const auto flag = [&](const char* what) {
    const std::uint32_t v = in.u32();
    FP8KIT_CHECK_KIND(v <= 1, ErrorKind::kParse, "delayed scaling state: bad ", what, " flag ", v);
    return v == 1;
  };
  const bool has_ema = flag("EMA");
  const float ema = in.f32();
  if (has_ema) config.ema_decay = ema;
  // The constructor's checks of the settings (margin, EMA decay) are the blob's: a malformed state is kParse.
  std::optional<DelayedScaling> constructed;
  try {
    constructed.emplace(config);
  } catch (const Error& e) {
    FP8KIT_THROW(ErrorKind::kParse, "delayed scaling state: ", e.what());
  }
  DelayedScaling& state = *constructed;
  state.scale_ = in.f32();
  const bool has_smoothed = flag("smoothed");
  const float smoothed = in.f32();
  if (has_smoothed) state.smoothed_ = smoothed;
  const bool calibrated = version >= 2 && flag("calibrated");
  for (float& a : state.history_) a = in.f32();
  check_state_values(state.scale_, state.smoothed_, state.history_, ErrorKind::kParse);
  // Version 1 did not say: a state whose scale moved or whose history holds an amax has been updated.
  state.calibrated_ =
      calibrated || (version == 1 && (state.scale_ != 1.0f || std::any_of(state.history_.begin(), state.history_.end(),
                                                                          [](float a) { return a != 0.0f; })));
  FP8KIT_CHECK_KIND(in.done(), ErrorKind::kParse, "delayed scaling state: trailing bytes");
  return std::move(state);
}

}  // namespace fp8kit

#ifndef FP8KIT_HAVE_CUDA
// The CPU-only build's device state (cuda_recipe.hpp): there is no device to keep it on.
namespace fp8kit::cuda {
// The device first, as the CUDA build checks it (in this build it is never there).
DelayedScalingState::DelayedScalingState(const DelayedScalingConfig&, int device) {
  check_available(Device::cuda(device));
  detail::throw_no_cuda_backend("DelayedScalingState");
}
DelayedScalingState::DelayedScalingState(const DelayedScaling&, int device) {
  check_available(Device::cuda(device));
  detail::throw_no_cuda_backend("DelayedScalingState");
}
DelayedScaling DelayedScalingState::to_host() const {
  detail::throw_no_cuda_backend("DelayedScalingState::to_host");
}
QuantizedTensor quantize_delayed(const Tensor&, DelayedScalingState&, Overflow) {
  detail::throw_no_cuda_backend("quantize_delayed");
}
void update(DelayedScalingState&) {
  detail::throw_no_cuda_backend("update");
}
}  // namespace fp8kit::cuda
#endif
