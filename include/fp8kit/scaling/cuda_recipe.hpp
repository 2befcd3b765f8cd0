// Delayed scaling on a CUDA device (a build with the CUDA backend): recipe.hpp's DelayedScaling kept where the kernels
// read it, so that a training step quantizes with the scale of earlier steps, records this step's amax and updates
// the scale without the host waiting for the device once. The same results as the CPU's state, bit for bit: the
// same update in Transformer Engine's order (skip when nothing was recorded, fmax over the window or the most
// recent amax, optional EMA, the scale formula's guards, the roll), and the nn recipes' first step (this step's own
// amax until the history holds one). A build without the CUDA backend throws Error(kUnsupported).
#pragma once

#include "fp8kit/scaling/cuda_quantize.hpp"
#include "fp8kit/scaling/recipe.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit::cuda {

class DelayedScalingState;

// Per-tensor quantization of x (float32, bfloat16 or float16 on the state's device) to the state's format with its
// scale, recording x's amax (NaN when x holds a NaN or an Inf) into the current step's slot; until the state is
// calibrated the scale is this step's own (current scaling; the previous scale when x is not finite), as the nn
// recipes do. codes = cast(x * scale) under `overflow`, scale_inv = 1 / scale (a 1 x 1 tensor): what
// quantize_with_scale() gives for that scale. Queued on the current stream; returns without waiting.
QuantizedTensor quantize_delayed(const Tensor& x, DelayedScalingState& state, Overflow overflow = Overflow::kSaturate);

// DelayedScaling::update() on the device: one kernel, no wait.
void update(DelayedScalingState& state);

// One tensor role's delayed-scaling state on a device.
class DelayedScalingState {
 public:
  // Transformer Engine's start on `device`: scale 1, an empty history.
  DelayedScalingState(const DelayedScalingConfig& config, int device);
  // A copy of a host state (one read from a checkpoint) on `device`.
  DelayedScalingState(const DelayedScaling& host, int device);

  const DelayedScalingConfig& config() const { return config_; }
  int device() const { return device_; }
  // Device float32 scalars: the quantization scale the next quantize_delayed uses once calibrated, and 1 / it.
  const Tensor& scale() const { return scale_; }
  const Tensor& scale_inv() const { return scale_inv_; }
  // A copy on the host (waits for the device): to checkpoint the state, or to compare it with the CPU's.
  DelayedScaling to_host() const;

 private:
  friend QuantizedTensor quantize_delayed(const Tensor& x, DelayedScalingState& state, Overflow overflow);
  friend void update(DelayedScalingState& state);
  DelayedScalingConfig config_;
  int device_ = 0;
  Tensor scale_, scale_inv_;
  Tensor history_;  // history_length float32, a ring: slot i is history_[(pos + i) % length]
  Tensor meta_;     // 4 x 32 bits: pos, calibrated, has_smoothed, smoothed (float bits)
};

}  // namespace fp8kit::cuda
