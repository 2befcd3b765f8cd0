// The training loop behind `fp8kit train`: one recipe per run (model, data, AdamW with FP32 master weights) as a
// Trainer with explicit phases (forward, backward, gradient reduction, the non-finite guard, amax agreement, optimizer
// step, scale update, checkpoint) that hooks can replace or wrap; the per-step scale log, measured peak memory and
// step times. Checkpoints and the FP8 export are io's (fp8kit/io/train_checkpoint.hpp), plugged in as hooks.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fp8kit/common/even_split.hpp"
#include "fp8kit/nn/model.hpp"
#include "fp8kit/nn/optim.hpp"
#include "fp8kit/nn/precision.hpp"
#include "fp8kit/tensor/memory.hpp"

namespace fp8kit::nn {

enum class OnNonfinite : std::uint8_t { kSkip, kAbort };

// AdamW as `fp8kit train` runs it (GPT-2 / nanoGPT settings): lr is the peak of the schedule (linear warm-up,
// then cosine decay to lr / 10), weight decay 0.1 on matrices only, beta2 0.95.
inline constexpr AdamWOptions kTrainAdamW{
    .lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .decay = DecayPolicy::kMatricesOnly};

struct TrainConfig {
  std::string model = "gpt";  // "gpt" or "cnn"
  std::int64_t steps = 400;
  std::uint64_t seed = 1;
  std::string data_path;   // gpt: train on this text file instead of the generated corpus
  std::int64_t batch = 0;  // sequences (gpt) or images (cnn) per step; 0: the model's default (16, 64)
  // The optimizer's settings; adamw.lr is the schedule's peak (each step runs at learning_rate(config, step)).
  AdamWOptions adamw = kTrainAdamW;
  std::int64_t warmup_steps = 10;  // linear warm-up, then cosine decay to adamw.lr / 10
  OnNonfinite on_nonfinite = OnNonfinite::kSkip;
  bool log_scales = false;
  std::int64_t final_loss_window = 10;  // train_loss is the mean of the last steps' losses
  std::int64_t eval_batches = 16;       // final_loss: the mean loss over this many held-out batches
  // Nonzero: every nonzero initial parameter value is moved one unit in the last place of its dtype, up or down in
  // magnitude by a counter-based draw of this seed (stochastic_bits(perturb_seed, its index among all the
  // parameters' elements)), right after the model is built. How far a run lands from the unperturbed one measures
  // the training's own sensitivity: the floor under any comparison of recipes (`fp8kit train --fp32-spread`).
  std::uint64_t perturb_seed = 0;
  // Fault injection (tests, and `fp8kit train --inject-nan STEP` to see the guard work): at this step a NaN is
  // written into the first trained parameter's gradient after backward (a sharded run: every rank whose shard of
  // it is not empty, into its first element).
  std::optional<std::int64_t> inject_nan_step;
  // Data parallelism: this process trains on shard `index` of `count` of every global batch (its rows
  // even_split(global rows, index, count)); the held-out evaluation uses whole batches on every process.
  struct BatchShard {
    int index = 0, count = 1;
  } batch_shard;
};

// Rows [begin, end) of a batch (inputs and targets along their first dimension), copied.
Batch slice_batch(const Batch& batch, std::int64_t begin, std::int64_t end);

// The learning rate of a step: linear warm-up over config.warmup_steps (step s < warmup runs at lr * (s + 1) /
// warmup), then cosine decay from config.adamw.lr towards a tenth of it, reached at step config.steps (one past the
// last, which runs just above it). A run of fewer steps than its warm-up never reaches the peak.
double learning_rate(const TrainConfig& config, std::int64_t step);

// A run between two steps, beyond the model and the optimizer: what a checkpoint keeps and a resume restores.
struct TrainProgress {
  std::int64_t next_step = 0;
  std::vector<float> losses;  // one per step done (next_step of them)
  std::int64_t skipped_steps = 0;
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
  std::string optimizer_state, master_weights;  // the recipe's (optim.hpp names)
  std::vector<float> losses;                    // one per step (skipped steps included: their loss was computed)
  // The held-out evaluation loss after the last step (the model under the run's recipe, on data training never saw:
  // Dataset::eval_batch): what recipes are compared by. A single run's last training batches vary too much.
  float final_loss = 0.0f;
  float train_loss = 0.0f;      // the mean training loss of the last final_loss_window steps
  std::int64_t peak_bytes = 0;  // memory_stats() peak over the run, from model creation to the end (the process's
                                // counters: a run beside another in one process counts the other's tensors too)
  // What the peak held, by MemoryCategory (index): parameters, gradients, optimizer state, activations (what the
  // training forwards allocated and still held), temporaries; they sum to peak_bytes.
  std::array<std::int64_t, kMemoryCategories> peak_by_category{};
  double step_ms = 0.0;            // median step time; NaN where no step ran (resumed at the end)
  std::int64_t skipped_steps = 0;  // over the whole run, those before a resume included
  std::int64_t parameters = 0;
  std::int64_t start_step = 0;  // the step this process started at (a resumed run: the checkpoint's)
  std::string data;             // the dataset's description
};

// Thrown by train() under OnNonfinite::kAbort: names the layer and tensor (or the parameter gradient).
struct NonfiniteAbort : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Trainer;

// The phases a run may replace or wrap, called by train() with the trainer (empty: the single-process default).
// A distributed run all-reduces gradients and agrees on amaxes; a checkpointing run resumes and saves.
struct TrainHooks {
  // After backward (and the fault injection), before the guard: make the gradients the global ones (e.g. an
  // all-reduce of every parameter's gradient, averaged). Default: nothing (one process).
  std::function<void(Trainer&)> reduce_gradients;
  // Right after forward: this rank's loss (the mean over its rows of the batch) made the run's (e.g. the mean over
  // ranks weighted by their rows). Default: this rank's.
  std::function<float(Trainer&, float)> agree_loss;
  // The guard's verdict made the same on every rank: given this rank's (what is not finite, empty when all is),
  // return the run's (e.g. any rank's non-empty one), so that all ranks skip a step or none does. The amaxes a
  // rank saw while quantizing are its own until agree_amax, hence this separate agreement. Default: this rank's.
  std::function<std::string(Trainer&, const std::string&)> agree_nonfinite;
  // Before update_scales: make every FP8 state's amaxes of this step the global ones (e.g. a MAX all-reduce, as
  // Transformer Engine does). Default: nothing.
  std::function<void(Trainer&)> agree_amax;
  // Right after the trainer is built: restore a run (fills the progress; the model and optimizer are fresh).
  std::function<void(Trainer&, TrainProgress&)> resume;
  // After resume, before the first step: e.g. shard the model over ranks (FSDP: set_trained_parameters and
  // set_weight_source).
  std::function<void(Trainer&)> prepare;
  // Before every step's forward: e.g. gather the parameters layers read directly (FSDP).
  std::function<void(Trainer&)> begin_step;
  // After every step's update, with the progress that includes it (e.g. save a checkpoint every N steps).
  std::function<void(Trainer&, const TrainProgress&)> after_step;
  // After the last step, before the evaluation (e.g. the last checkpoint, the FP8 export).
  std::function<void(Trainer&, const TrainProgress&)> finish;
  // Sees every step's log (progress bars, scale logs).
  std::function<void(const StepLog&)> on_step;
};

// One run's model, data and optimizer, and the phases of a step as functions. train() calls, each step:
//   batch (this shard's rows) -> begin_step -> forward -> agree_loss -> backward -> [inject NaN] -> reduce_gradients ->
//   nonfinite (the guard) -> agree_nonfinite ->
//     finite:  agree_amax -> optimizer_step -> update_scales
//     else:    discard_scales (or throw NonfiniteAbort)
//   -> zero_grad -> after_step (checkpoint)
// run_step() is that sequence with the hooks in their places; a caller may also drive the phases itself.
class Trainer {
 public:
  // Builds the dataset and the model (config.model under `recipe`; its parameters in the recipe's master_weights
  // dtype) and the optimizer (config.adamw with the recipe's optimizer_state and master_weights, rounding seed
  // config.seed).
  Trainer(const TrainConfig& config, const PrecisionRecipe& recipe, Profiler* profiler = nullptr);
  Trainer(const Trainer&) = delete;  // the context points into the trainer
  Trainer& operator=(const Trainer&) = delete;

  const TrainConfig& config() const { return config_; }
  const PrecisionRecipe& recipe() const { return recipe_; }
  Model& model() { return *model_; }
  const Dataset& data() const { return *data_; }
  AdamW& optimizer() { return optimizer_; }
  std::span<Parameter* const> parameters() const { return params_; }
  // What the optimizer steps, the guard checks and zero_grad clears: the model's parameters, or what a sharded run
  // put in their place (each rank's shards, set_trained_parameters; they must outlive the trainer's use of them).
  std::span<Parameter* const> trained_parameters() const { return trained_; }
  void set_trained_parameters(std::vector<Parameter*> params) { trained_ = std::move(params); }
  // Where the GEMM layers' weights come from (Context::weights; null: the model's own). Must outlive its use.
  void set_weight_source(WeightSource* weights) { ctx_.weights = weights; }
  // What the last forward and backward saw (the non-finite amaxes, the scale log when config.log_scales).
  const StepReport& report() const { return report_; }

  // The phases of one step.
  // The loss (the report is cleared first); data().batch(step) is step's batch. Its allocations count as
  // MemoryCategory::kActivations.
  float forward(const Batch& batch);
  void backward();
  // The guard: what is not finite after backward (an amax seen while quantizing, a parameter's gradient, the
  // loss), named; empty when everything is finite.
  std::string nonfinite(float loss) const;
  void optimizer_step(std::int64_t step);  // AdamW at learning_rate(config, step)
  void update_scales();                    // every FP8 state takes this step's amaxes and sets its next scales
  void discard_scales();                   // every FP8 state drops this step's amaxes (a skipped step)
  // Releases the trained parameters' gradients (release_gradients): none is held between steps; backward() gives
  // every trained parameter one again (zeros where nothing was added).
  void zero_grad();

  // One step, the phases above in order with the hooks in their places; `progress` gets the loss (and the skip).
  // StepLog::ms times the phases from forward to the checkpoint (the batch is read before).
  StepLog run_step(std::int64_t step, const TrainHooks& hooks, TrainProgress& progress);

 private:
  TrainConfig config_;
  PrecisionRecipe recipe_;
  Profiler* profiler_;
  std::unique_ptr<Dataset> data_;
  std::unique_ptr<Model> model_;
  std::vector<Parameter*> params_;
  std::vector<Parameter*> trained_;
  AdamW optimizer_;
  StepReport report_;
  Context ctx_;
};

// TrainConfig::perturb_seed's change, on its own: each nonzero finite float32 or bfloat16 value of `params` moved one
// ulp up or down in magnitude (never to Inf) by bit 0 of stochastic_bits(seed, i), i counting every element of every
// parameter in order. Another dtype is Error(kInvalidArgument) naming the parameter.
void perturb_by_one_ulp(std::span<Parameter* const> params, std::uint64_t seed);

// Throws Error(kInvalidArgument), one line, for a config train() cannot run (steps or eval_batches below 1); train()
// checks it first, and so should a caller that does work of its own before (checkpoint hooks read files).
void check_train_config(const TrainConfig& config);

// Trains config.model under `recipe` and reports: a Trainer, hooks.resume (whose progress is checked: as many
// losses as steps done, no more steps done than config.steps), run_step() from the resumed step to config.steps,
// hooks.finish, then the held-out evaluation.
TrainResult train(const TrainConfig& config, const PrecisionRecipe& recipe, Profiler* profiler,
                  const TrainHooks& hooks);
// The same with only a step callback (progress, scale logs).
TrainResult train(const TrainConfig& config, const PrecisionRecipe& recipe, Profiler* profiler = nullptr,
                  const std::function<void(const StepLog&)>& on_step = {});

// The sequences (gpt) or images (cnn) per step a config trains with: config.batch, or the model's default for 0.
std::int64_t batch_size(const TrainConfig& config);

// The mean loss over `batches` held-out batches (Dataset::eval_batch) under `recipe`, forward only: what the
// forwards record into delayed-scaling histories is dropped and the saved state released, so the model, its FP8
// states and the optimizer are exactly as before. train() reports it as TrainResult::final_loss.
float evaluate(Model& model, const Dataset& data, const PrecisionRecipe& recipe, std::int64_t batches);

// The bytes of a --data training text (TrainConfig::data_path): a directory or a file that cannot be read is
// Error(kInvalidArgument), one line. make_dataset reads it; a training checkpoint fingerprints it.
std::string read_training_text(const std::string& path);

// The model and data train() builds for a config (exposed for tests).
std::unique_ptr<Model> make_model(const TrainConfig& config, const PrecisionRecipe& recipe);
std::unique_ptr<Dataset> make_dataset(const TrainConfig& config);

}  // namespace fp8kit::nn
