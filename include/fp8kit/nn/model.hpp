// What the trainer needs from a model and its data: a loss from a batch, a backward pass, the parameters and the
// FP8 scaling states (the GPT and the CNN implement it), and a deterministic stream of batches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fp8kit/nn/context.hpp"
#include "fp8kit/nn/precision.hpp"

namespace fp8kit::nn {

struct Batch {
  Tensor inputs;   // tokens (B, T) int64, or images (N, C, H, W) float32
  Tensor targets;  // (B, T) or (N) int64
};

class Model {
 public:
  virtual ~Model() = default;
  // The mean loss of the batch; keeps what backward() needs until backward() runs.
  virtual float forward(const Context& ctx, const Batch& batch) = 0;
  // Gradients of the last forward's loss, accumulated into the parameters; releases the saved state.
  virtual void backward(const Context& ctx) = 0;
  // Drops what the last forward kept for backward (after an evaluation forward, which has no backward). The
  // default keeps it until the next forward replaces it.
  virtual void release() {}
  virtual std::vector<Parameter*> parameters() = 0;
  virtual std::vector<Fp8LayerState*> fp8_states() = 0;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  // The batch of training step `step` (deterministic: the same step gives the same batch).
  virtual Batch batch(std::int64_t step) const = 0;
  // Held-out batch `index`: data training never sees (another part of the text, other images), deterministic.
  // The default throws: a dataset without held-out data cannot give train() its evaluation loss.
  virtual Batch eval_batch(std::int64_t index) const;
  virtual std::string describe() const = 0;
};

}  // namespace fp8kit::nn
