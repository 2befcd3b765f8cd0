// Scaling recipes with state: current scaling (the scale of this tensor from its own amax) and delayed scaling
// (Transformer Engine's amax history: the scale of this step comes from the amaxes of earlier steps).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "fp8kit/format/format.hpp"
#include "fp8kit/scaling/scale.hpp"

namespace fp8kit {

// Current (dynamic) scaling: stateless; the scale comes from the tensor being quantized.
struct CurrentScaling {
  Format format = Format::e4m3fn;
  ScaleOptions options;
  float scale_for(float amax) const { return compute_scale(amax, format, options); }
};

enum class AmaxCompute : std::uint8_t {
  kMax,         // the maximum over the whole history window (Transformer Engine's default)
  kMostRecent,  // the amax of the last step only
};

struct DelayedScalingConfig {
  Format format = Format::e4m3fn;
  int history_length = 1024;  // Transformer Engine's default
  AmaxCompute algorithm = AmaxCompute::kMax;
  int margin = 0;
  // Optional exponential moving average of the window amax, as the article suggests against spikes:
  // smoothed = decay * smoothed + (1 - decay) * window_amax (the first update takes window_amax as it is).
  std::optional<float> ema_decay;
};

// One tensor role's delayed-scaling state (e.g. a layer's weight, activation or gradient).
// Use: quantize with scale(); record this step's amax with record(); then update() (Transformer Engine order).
class DelayedScaling {
 public:
  explicit DelayedScaling(const DelayedScalingConfig& config = {});

  const DelayedScalingConfig& config() const { return config_; }
  float scale() const { return scale_; }
  float scale_inv() const { return dequantization_scale(scale_); }
  // Slot 0 holds the amax being recorded for the current step; the rest are earlier steps.
  std::span<const float> history() const { return history_; }
  std::optional<float> smoothed_amax() const { return smoothed_; }
  // Whether an update() has computed the scale from a finite, nonzero amax. Until then scale() is the initial 1
  // (Transformer Engine's start), which can flush most of a tensor of small values to zero on the first steps (the
  // gradients of a CNN: docs/nn.md); a caller may take the first step's scale from the current amax instead, as the
  // nn recipes do.
  bool calibrated() const { return calibrated_; }

  // Records an amax observed in the current step (the maximum of all calls since the last update).
  void record(float amax);
  // Forgets what was recorded since the last update (a skipped training step must not leave its NaN behind).
  void discard_step();
  // Transformer Engine's amax_and_scale_update:
  //  - if nothing was recorded this step (slot 0 is 0), nothing changes: no roll, the scale stays;
  //  - amax = max over the whole window, NaN entries ignored as fmaxf does (kMax), or slot 0 (kMostRecent),
  //    optionally smoothed;
  //  - scale = compute_scale(amax, format, margin, previous scale): NaN/Inf/0 keep the previous scale;
  //  - the history rolls: slot i takes slot i+1, the last slot takes this step's amax, slot 0 is cleared.
  void update();

  // A state from its parts (what serialize() holds: the scale, the smoothed amax, whether it is calibrated, the
  // history in slot order): a state copied back from a device (cuda::DelayedScalingState). Throws fp8kit::Error
  // (kInvalidArgument) when the history's length is not the config's.
  static DelayedScaling from_parts(const DelayedScalingConfig& config, float scale, std::optional<float> smoothed,
                                   bool calibrated, std::span<const float> history);

  // A versioned little-endian binary form of the whole state (config, scale, history, smoothing), for checkpoints.
  std::vector<std::uint8_t> serialize() const;
  // Throws fp8kit::Error (kParse) on a malformed or unknown-version blob.
  static DelayedScaling deserialize(std::span<const std::uint8_t> bytes);

 private:
  DelayedScalingConfig config_;
  float scale_ = 1.0f;
  bool calibrated_ = false;
  std::vector<float> history_;
  std::optional<float> smoothed_;
};

}  // namespace fp8kit
