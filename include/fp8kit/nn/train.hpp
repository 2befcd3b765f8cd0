// The training loop behind `fp8kit train`: one recipe per run (model, data, AdamW with FP32 master weights), the
// non-finite guard, the per-step scale log, measured peak memory and step times; and the recipe comparison.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fp8kit/nn/model.hpp"
#include "fp8kit/nn/optim.hpp"
#include "fp8kit/nn/precision.hpp"

namespace fp8kit {
enum class QuantScheme : std::uint8_t;       // fp8kit/io/checkpoint_layout.hpp
enum class CheckpointLayout : std::uint8_t;  // fp8kit/io/checkpoint_layout.hpp
}  // namespace fp8kit

namespace fp8kit::nn {

enum class OnNonfinite : std::uint8_t { kSkip, kAbort };

struct TrainConfig {
  std::string model = "gpt";  // "gpt" or "cnn"
  std::int64_t steps = 400;
  std::uint64_t seed = 1;
  std::string data_path;   // gpt: train on this text file instead of the generated corpus
  std::int64_t batch = 0;  // sequences (gpt) or images (cnn) per step; 0: the model's default (16, 64)
  double lr = 3e-3;
  std::int64_t warmup_steps = 10;  // linear warm-up, then cosine decay to lr / 10
  OnNonfinite on_nonfinite = OnNonfinite::kSkip;
  bool log_scales = false;
  std::int64_t final_loss_window = 10;  // train_loss is the mean of the last steps' losses
  std::int64_t eval_batches = 16;       // final_loss: the mean loss over this many held-out batches
  // Fault injection (tests, and `fp8kit train --inject-nan STEP` to see the guard work): at this step a NaN is
  // written into the first parameter's gradient after backward.
  std::optional<std::int64_t> inject_nan_step;
  // Checkpoints (docs/nn.md, "Training checkpoints"; fp8kit/nn/train_checkpoint.hpp). Each path is written
  // crash-safely and replaced when it exists (the CLI refuses that without --force).
  std::string save_checkpoint;        // a training checkpoint after the last step (and every checkpoint_every)
  std::int64_t checkpoint_every = 0;  // 0: only after the last step
  std::string resume_from;            // continue the run of this checkpoint from its step to `steps`
  std::string export_fp8;             // the final weights as an FP8 inference checkpoint (.safetensors or a directory)
  std::optional<QuantScheme> export_scheme;       // default: the recipe's (fp8-block, mxfp8; else fp8-tensor)
  std::optional<CheckpointLayout> export_layout;  // default: native
  bool export_input_scales = false;               // static input_scale tensors from delayed scaling (Fp8ExportOptions)
};

struct StepLog {
  std::int64_t step = 0;
  float loss = 0.0f;
  double ms = 0.0;
  bool skipped = false;
  std::vector<ScaleRecord> scales;  // when config.log_scales
};

struct TrainResult {
  std::string recipe;
  std::vector<float> losses;  // one per step (skipped steps included: their loss was computed)
  // The held-out evaluation loss after the last step (the model under the run's recipe, on data training never saw:
  // Dataset::eval_batch): what recipes are compared by. A single run's last training batches vary too much.
  float final_loss = 0.0f;
  float train_loss = 0.0f;         // the mean training loss of the last final_loss_window steps
  std::int64_t peak_bytes = 0;     // memory_stats() peak over the run, from model creation to the end
  double step_ms = 0.0;            // median step time
  std::int64_t skipped_steps = 0;  // over the whole run, those before a resume included
  std::int64_t parameters = 0;
  std::int64_t start_step = 0;  // the step this process started at (a resumed run: the checkpoint's)
  std::string data;             // the dataset's description
};

// Thrown by train() under OnNonfinite::kAbort: names the layer and tensor (or the parameter gradient).
struct NonfiniteAbort : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Trains config.model under `recipe` and reports. `on_step` (optional) sees every step (progress, scale logs).
TrainResult train(const TrainConfig& config, const PrecisionRecipe& recipe, Profiler* profiler = nullptr,
                  const std::function<void(const StepLog&)>& on_step = {});

// The sequences (gpt) or images (cnn) per step a config trains with: config.batch, or the model's default for 0.
std::int64_t batch_size(const TrainConfig& config);

// The mean loss over `batches` held-out batches (Dataset::eval_batch) under `recipe`, forward only: what the
// forwards record into delayed-scaling histories is dropped and the saved state released, so the model, its FP8
// states and the optimizer are exactly as before. train() reports it as TrainResult::final_loss.
float evaluate(Model& model, const Dataset& data, const PrecisionRecipe& recipe, std::int64_t batches);

// The model and data train() builds for a config (exposed for tests).
std::unique_ptr<Model> make_model(const TrainConfig& config, const PrecisionRecipe& recipe);
std::unique_ptr<Dataset> make_dataset(const TrainConfig& config);

}  // namespace fp8kit::nn
