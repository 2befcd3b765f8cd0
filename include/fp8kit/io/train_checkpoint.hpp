// Training checkpoints of `fp8kit train`: one safetensors file with everything a run needs to continue exactly as
// if it had never stopped (FP32 master weights, AdamW moments and step counts, every layer's delayed-scaling state,
// the losses so far) and, in its __metadata__, the run it belongs to; loading checks all of it, one line per error.
// The trainer (fp8kit/nn/train.hpp) knows nothing of files: TrainCheckpointer gives it resume/save/export hooks.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp8kit/io/fp8_export.hpp"
#include "fp8kit/nn/model.hpp"
#include "fp8kit/nn/optim.hpp"
#include "fp8kit/nn/precision.hpp"
#include "fp8kit/nn/train.hpp"

namespace fp8kit {

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
  nn::AdamWOptions adamw;  // lr: the schedule's peak
  std::int64_t warmup_steps = 0;
  std::int64_t batch = 0;        // TrainConfig::batch (0: the model's default)
  std::string data_path;         // empty: the model's generated data
  std::string data_fingerprint;  // of the data file's bytes (16 hex digits); empty for generated data
  nn::PrecisionRecipe recipe;    // kind, mode and every setting (history length, margin, dispatcher rules)
  std::int64_t skipped_steps = 0;
  // How the run evaluates and meets NaN/Inf: what a resumed run takes when they are not given again (neither changes
  // the training state). Checkpoints written before they were recorded read as the defaults.
  std::int64_t eval_batches = nn::TrainConfig{}.eval_batches;
  nn::OnNonfinite on_nonfinite = nn::OnNonfinite::kSkip;
};

// Writes a checkpoint of the run `config` and `recipe` describe after `progress.next_step` steps, crash-safely
// (write_safetensors: a temporary file, fsync, rename). Tensors: every parameter under its own name (F32, or BF16
// under bfloat16 master weights), AdamW's "optim.exp_avg.<name>" and "optim.exp_avg_sq.<name>" (F32, BF16, or
// F8_E4M3 codes of m and sqrt(v) with "optim.exp_avg_scale_inv.<name>" and "optim.exp_avg_sq_scale_inv.<name>", F32
// per block of nn::kMomentBlock), "optim.compensation.<name>" (BF16, bf16-kahan) and "optim.step.<name>" (I64 scalar)
// for every parameter it has stepped (the step counts and the run's seed are the stochastic rounding's whole state),
// "fp8.<layer>.<role>" (U8, DelayedScaling::serialize()) for each FP8 layer state and role, "train.losses" (F32).
// `data_fingerprint` is data_fingerprint(config) (computed once per run by the caller).
void save_train_checkpoint(const std::filesystem::path& path, const nn::TrainConfig& config,
                           const nn::PrecisionRecipe& recipe, nn::Model& model, const nn::AdamW& optimizer,
                           const nn::TrainProgress& progress, const std::string& data_fingerprint);

// Opens a checkpoint and reads its __metadata__, checked: Error(kInvalidArgument) for a file that is not an fp8kit
// training checkpoint (or a missing one), Error(kParse) for another version or a malformed field; each names the
// file and says what to do.
TrainCheckpointInfo read_train_checkpoint_info(const std::filesystem::path& path);

// Checks that a checkpoint belongs to the run that `config` and `recipe` ask for: the model, seed, recipe (name and
// settings), learning rate, warm-up and data (by content, not by path) must match, and config.steps must be at
// least the steps done. A different config.steps is accepted: it changes the learning-rate schedule from the
// resumed step on. The first mismatch throws Error(kInvalidArgument), naming both values and the fix.
void check_resumable(const std::filesystem::path& path, const TrainCheckpointInfo& info, const nn::TrainConfig& config,
                     const nn::PrecisionRecipe& recipe);

// Restores a model and an optimizer freshly built for `config` and `recipe` from a checkpoint (check_resumable
// first) and returns the progress. Every parameter must be there with its shape (and nothing else), every optimizer
// and FP8 state must belong to a parameter or layer of the model, with the shape and settings it has; a missing,
// extra or malformed tensor throws Error(kInvalidArgument or kParse) naming it. Nothing is modified unless all of it
// checks out.
nn::TrainProgress load_train_checkpoint(const std::filesystem::path& path, const nn::TrainConfig& config,
                                        const nn::PrecisionRecipe& recipe, nn::Model& model, nn::AdamW& optimizer);

// A fingerprint of the data a config trains on: 16 hex digits of FNV-1a 64 over the text file's bytes, or empty
// for the generated data. Throws like the dataset when the file cannot be read.
std::string data_fingerprint(const nn::TrainConfig& config);
// The same fingerprint of a file's bytes (a checkpoint each rank of a job resumes from: the same on every rank);
// Error(kIo) naming the file when it cannot be read.
std::string file_fingerprint(const std::string& path);

// Where a run's checkpoints and FP8 export go (`fp8kit train --save-checkpoint/--resume/--export-fp8`). Each path
// is written crash-safely and replaced when it exists (the CLI refuses that without --force).
struct TrainCheckpointOptions {
  std::string save_checkpoint;        // a training checkpoint after the last step (and every checkpoint_every)
  std::int64_t checkpoint_every = 0;  // 0: only after the last step
  std::string resume_from;            // continue the run of this checkpoint from its step to config.steps
  std::string export_fp8;             // the final weights as an FP8 inference checkpoint (.safetensors or a directory)
  std::optional<QuantScheme> export_scheme;       // default: resolve_fp8_export's
  std::optional<CheckpointLayout> export_layout;  // default: default_layout() of the scheme
  bool export_input_scales = false;               // static input_scale tensors from delayed scaling (Fp8ExportOptions)
  // A run over ranks: how the files get written. Called on every process with the trainer, whether `write` reads
  // the optimizer's state (a checkpoint does; the FP8 export reads only the model), and `write`; it must make the
  // model's parameters (and the optimizer's state) whole where it calls `write`, call it on the one process that
  // writes, put back what it changed, and fail on every process when the write failed (fp8kit/dist: gathered on
  // every rank, written by rank 0). Empty: write() here.
  using AroundWrite = std::function<void(nn::Trainer&, bool optimizer_state, const std::function<void()>& write)>;
  AroundWrite around_write;
};

// The checkpoint phase of a run: constructed before anything else (validates the options, reads and checks the
// checkpoint to resume from, and, without around_write, checks that the checkpoint and export destinations can be
// written (check_writable_destination), so that a bad request fails before any work); hooks() plugs it into
// nn::train(): resume right after the model and the optimizer are built, a save after each step's update every
// checkpoint_every steps and after the last, and at the end the last save when no step ran and the FP8 export.
class TrainCheckpointer {
 public:
  TrainCheckpointer(const nn::TrainConfig& config, const nn::PrecisionRecipe& recipe, TrainCheckpointOptions options);
  TrainCheckpointer(const TrainCheckpointer&) = delete;  // the hooks point at this object
  TrainCheckpointer& operator=(const TrainCheckpointer&) = delete;
  // `base` with this checkpointer's resume, after_step and finish: each runs first, then base's own hook of that
  // name when it has one (a distributed run's, say); base's other hooks are kept. The checkpointer must outlive
  // the run.
  nn::TrainHooks hooks(nn::TrainHooks base = {});

 private:
  void write(nn::Trainer& trainer, bool optimizer_state, const std::function<void()>& what);  // options.around_write
  void save(nn::Trainer& trainer, const nn::TrainProgress& progress);
  nn::TrainConfig config_;
  nn::PrecisionRecipe recipe_;
  TrainCheckpointOptions options_;
  std::optional<Fp8ExportOptions> export_options_;
  std::string fingerprint_;
  std::int64_t saved_at_ = -1;  // next_step of the last save
};

// nn::train() with a TrainCheckpointer's hooks: what `fp8kit train` runs.
nn::TrainResult train_with_checkpoints(const nn::TrainConfig& config, const nn::PrecisionRecipe& recipe,
                                       const TrainCheckpointOptions& options, Profiler* profiler = nullptr,
                                       const std::function<void(const nn::StepLog&)>& on_step = {});

}  // namespace fp8kit
