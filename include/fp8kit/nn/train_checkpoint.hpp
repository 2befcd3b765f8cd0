// Training checkpoints of `fp8kit train`: one safetensors file with everything a run needs to continue exactly as
// if it had never stopped (FP32 master weights, AdamW moments and step counts, every layer's delayed-scaling state,
// the losses so far) and, in its __metadata__, the run it belongs to; loading checks all of it, one line per error.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp8kit/nn/fp8_export.hpp"
#include "fp8kit/nn/model.hpp"
#include "fp8kit/nn/optim.hpp"
#include "fp8kit/nn/precision.hpp"
#include "fp8kit/nn/train.hpp"

namespace fp8kit::nn {

// The __metadata__ marker ("fp8kit.train.format") and the version this build writes and reads.
inline constexpr std::string_view kTrainCheckpointFormat = "fp8kit-train-checkpoint";
inline constexpr int kTrainCheckpointVersion = 1;

// What a training checkpoint's __metadata__ says: the run it belongs to and how far it got.
struct TrainCheckpointInfo {
  int version = kTrainCheckpointVersion;
  std::int64_t next_step = 0;  // the steps done: a resumed run starts at this step
  std::int64_t steps = 0;      // the run's total steps (the length of the learning-rate schedule)
  std::string model;
  std::uint64_t seed = 0;
  double lr = 0.0;
  std::int64_t warmup_steps = 0;
  std::int64_t batch = 0;        // TrainConfig::batch (0: the model's default)
  std::string data_path;         // empty: the model's generated data
  std::string data_fingerprint;  // of the data file's bytes (16 hex digits); empty for generated data
  PrecisionRecipe recipe;        // kind, mode and every setting (history length, margin, dispatcher rules)
  std::int64_t skipped_steps = 0;
};

// The state of a run between two steps that is neither in the model nor in the optimizer.
struct TrainProgress {
  std::int64_t next_step = 0;
  std::vector<float> losses;  // one per step done (next_step of them)
  std::int64_t skipped_steps = 0;
};

// Writes a checkpoint of the run `config` and `recipe` describe after `progress.next_step` steps, crash-safely
// (write_safetensors: a temporary file, fsync, rename). Tensors: every parameter under its own name (F32), AdamW's
// "optim.exp_avg.<name>" and "optim.exp_avg_sq.<name>" (F32) and "optim.step.<name>" (I64 scalar) for every
// parameter it has stepped, "fp8.<layer>.<role>" (U8, DelayedScaling::serialize()) for each FP8 layer state and
// role, "train.losses" (F32). `data_fingerprint` is data_fingerprint(config) (computed once per run by the caller).
void save_train_checkpoint(const std::filesystem::path& path, const TrainConfig& config, const PrecisionRecipe& recipe,
                           Model& model, const AdamW& optimizer, const TrainProgress& progress,
                           const std::string& data_fingerprint);

// Opens a checkpoint and reads its __metadata__, checked: Error(kInvalidArgument) for a file that is not an fp8kit
// training checkpoint (or a missing one), Error(kParse) for another version or a malformed field; each names the
// file and says what to do.
TrainCheckpointInfo read_train_checkpoint_info(const std::filesystem::path& path);

// Checks that a checkpoint belongs to the run that `config` and `recipe` ask for: the model, seed, recipe (name and
// settings), learning rate, warm-up and data (by content, not by path) must match, and config.steps must be at
// least the steps done. A different config.steps is accepted: it changes the learning-rate schedule from the
// resumed step on. The first mismatch throws Error(kInvalidArgument), naming both values and the fix.
void check_resumable(const std::filesystem::path& path, const TrainCheckpointInfo& info, const TrainConfig& config,
                     const PrecisionRecipe& recipe);

// Restores a model and an optimizer freshly built for `config` and `recipe` from a checkpoint (check_resumable
// first) and returns the progress. Every parameter must be there with its shape (and nothing else), every optimizer
// and FP8 state must belong to a parameter or layer of the model, with the shape and settings it has; a missing,
// extra or malformed tensor throws Error(kInvalidArgument or kParse) naming it. Nothing is modified unless all of it
// checks out.
TrainProgress load_train_checkpoint(const std::filesystem::path& path, const TrainConfig& config,
                                    const PrecisionRecipe& recipe, Model& model, AdamW& optimizer);

// A fingerprint of the data a config trains on: 16 hex digits of FNV-1a 64 over the text file's bytes, or empty
// for the generated data. Throws like the dataset when the file cannot be read.
std::string data_fingerprint(const TrainConfig& config);

// What train() does with the checkpoint fields of a TrainConfig, in the order of a run: constructed before anything
// else (validates the fields, reads and checks the checkpoint to resume from, so that a bad request fails before
// any work), resume() right after the model and the optimizer are built, after_step() after each step's update
// (saves every checkpoint_every steps and after the last), finish() at the end (the last save when no step ran, and
// the FP8 export).
class TrainCheckpointer {
 public:
  TrainCheckpointer(const TrainConfig& config, const PrecisionRecipe& recipe);
  bool resuming() const { return !config_.resume_from.empty(); }
  TrainProgress resume(Model& model, AdamW& optimizer);
  void after_step(std::int64_t step, Model& model, const AdamW& optimizer, const std::vector<float>& losses,
                  std::int64_t skipped_steps);
  void finish(Model& model, const AdamW& optimizer, const std::vector<float>& losses, std::int64_t skipped_steps);

 private:
  void save(Model& model, const AdamW& optimizer, const std::vector<float>& losses, std::int64_t skipped_steps);

  TrainConfig config_;
  PrecisionRecipe recipe_;
  std::optional<Fp8ExportOptions> export_options_;
  std::string fingerprint_;
  std::int64_t saved_at_ = -1;  // next_step of the last save
};

}  // namespace fp8kit::nn
