// The training loop: the Trainer's phases (batches, forward, backward, the non-finite guard that skips or aborts
// naming the tensor, AdamW, the delayed-scaling update), a warm-up + cosine learning rate, the hooks, peak memory.
#include "fp8kit/nn/train.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <numeric>

#include "fp8kit/common/error.hpp"
#include "fp8kit/format/codec.hpp"
#include "fp8kit/nn/cnn.hpp"
#include "fp8kit/nn/gpt.hpp"
#include "fp8kit/tensor/memory.hpp"

namespace fp8kit::nn {
namespace {

constexpr std::int64_t kDefaultGptBatch = 16;
constexpr std::size_t kCorpusBytes = std::size_t{1} << 20;
constexpr std::size_t kHeldOutBytes = std::size_t{1} << 16;  // generated held-out text, another seed
constexpr std::uint64_t kHeldOutSeed = 0x48454C444F5554ull;  // "HELDOUT": xored into the run's seed
constexpr std::size_t kHeldOutPercent = 10;                  // of a --data file: its last 10%
constexpr std::int64_t kDefaultCnnBatch = 64;                // images of kCnnImageSize x kCnnImageSize
constexpr std::int64_t kCnnImageSize = 32;

double median(std::vector<double> v) {
  if (v.empty()) return NAN;  // no step ran (a run resumed at its end): no time to report
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// TrainConfig::perturb_seed: each nonzero finite value's magnitude one ulp up or down (its bits plus or minus one;
// down only from the largest finite value, so that nothing becomes Inf), by bit 0 of stochastic_bits(seed, i), i
// counting every element of every parameter in order.
template <typename Bits>
void perturb_values(std::span<Bits> values, std::uint64_t seed, std::uint64_t& index) {
  // float32's or bfloat16's: the sign is the top bit, Inf's magnitude an all-ones exponent.
  constexpr Bits magnitude_mask = static_cast<Bits>(sizeof(Bits) == 4 ? 0x7FFFFFFFu : 0x7FFFu);
  constexpr Bits inf_bits = static_cast<Bits>(sizeof(Bits) == 4 ? 0x7F800000u : 0x7F80u);
  for (Bits& v : values) {
    const Bits magnitude = v & magnitude_mask;
    const bool up = (stochastic_bits(seed, index++) & 1u) != 0;
    if (magnitude == 0 || magnitude >= inf_bits) continue;
    v = (up && magnitude + 1 < inf_bits) ? static_cast<Bits>(v + 1) : static_cast<Bits>(v - 1);
  }
}

}  // namespace

void perturb_by_one_ulp(std::span<Parameter* const> params, std::uint64_t seed) {
  std::uint64_t index = 0;
  for (Parameter* p : params) {
    if (p->value.dtype() == DType::float32) {
      const auto f = p->value.span<float>();
      perturb_values(std::span<std::uint32_t>(reinterpret_cast<std::uint32_t*>(f.data()), f.size()), seed, index);
    } else {
      FP8KIT_CHECK(p->value.dtype() == DType::bfloat16, "perturb_by_one_ulp: parameter '", p->name, "' is ",
                   name(p->value.dtype()), ": float32 or bfloat16 values are moved");
      const auto b = p->value.span<bfloat16>();
      perturb_values(std::span<std::uint16_t>(reinterpret_cast<std::uint16_t*>(b.data()), b.size()), seed, index);
    }
  }
}

double learning_rate(const TrainConfig& c, std::int64_t step) {
  FP8KIT_CHECK(step >= 0 && c.warmup_steps >= 0, "learning_rate: step and warmup_steps must be >= 0, got ", step,
               " and ", c.warmup_steps);
  const double lr = c.adamw.lr;
  if (step < c.warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  const double progress = static_cast<double>(step - c.warmup_steps) /
                          static_cast<double>(std::max<std::int64_t>(1, c.steps - c.warmup_steps));
  const double min_lr = lr / 10.0;
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(3.14159265358979323846 * std::min(1.0, progress)));
}

Batch Dataset::eval_batch(std::int64_t /*index*/) const {
  FP8KIT_CHECK(false, "the dataset '", describe(), "' has no held-out data for the evaluation loss ",
               "(implement Dataset::eval_batch)");
  return {};
}

float evaluate(Model& model, const Dataset& data, const PrecisionRecipe& recipe, std::int64_t batches) {
  FP8KIT_CHECK(batches >= 1, "evaluate: batches must be at least 1, got ", batches);
  StepReport report;
  Context ctx;
  ctx.saved_dtype = recipe.saved_dtype();
  ctx.fp8_activations = recipe.fp8_activations();
  ctx.recipe = &recipe;
  ctx.report = &report;
  double sum = 0.0;
  for (std::int64_t i = 0; i < batches; ++i) {
    report.clear();
    sum += model.forward(ctx, data.eval_batch(i));
    for (Fp8LayerState* s : model.fp8_states()) s->discard_step();
  }
  model.release();
  return static_cast<float>(sum / static_cast<double>(batches));
}

std::int64_t batch_size(const TrainConfig& config) {
  FP8KIT_CHECK(config.batch >= 0, "train: batch must be at least 1 (0 for the model's default), got ", config.batch);
  if (config.batch > 0) return config.batch;
  return config.model == "cnn" ? kDefaultCnnBatch : kDefaultGptBatch;
}

std::unique_ptr<Model> make_model(const TrainConfig& config, const PrecisionRecipe& recipe) {
  if (config.model == "gpt") {
    GptConfig g;
    g.seed = config.seed;
    return std::make_unique<Gpt>(g, recipe);
  }
  if (config.model == "cnn") {
    CnnConfig c;
    c.seed = config.seed;
    return std::make_unique<Cnn>(c, recipe);
  }
  FP8KIT_CHECK(false, "unknown model '", config.model, "' (use gpt, cnn)");
  return nullptr;
}

std::string read_training_text(const std::string& path) {
  std::error_code ec;
  FP8KIT_CHECK(!std::filesystem::is_directory(path, ec), "the training text '", path,
               "' is a directory; give a text file");
  // (a device or a pipe, /dev/zero say, would be read without end, and a resume hashes the text again)
  FP8KIT_CHECK(!std::filesystem::exists(path, ec) || std::filesystem::is_regular_file(path, ec), "the training text '",
               path, "' is not a regular file; give a text file");
  std::ifstream in(path, std::ios::binary);
  FP8KIT_CHECK(static_cast<bool>(in), "cannot read the training text '", path, "' (check the path)");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::unique_ptr<Dataset> make_dataset(const TrainConfig& config) {
  const std::int64_t batch = batch_size(config);
  if (config.model == "gpt") {
    const GptConfig g;
    if (!config.data_path.empty()) {
      std::string text = read_training_text(config.data_path);
      const std::size_t held = text.size() * kHeldOutPercent / 100;
      FP8KIT_CHECK(held > static_cast<std::size_t>(g.seq_len) + 1, "the training text '", config.data_path, "' has ",
                   text.size(), text.size() == 1 ? " byte" : " bytes", "; its last ", kHeldOutPercent,
                   "% is held out for the evaluation loss and must ", "exceed ", g.seq_len + 1,
                   " bytes (give a text of at least ",
                   ((static_cast<std::size_t>(g.seq_len) + 2) * 100 + kHeldOutPercent - 1) / kHeldOutPercent,
                   " bytes)");
      std::string held_out = text.substr(text.size() - held);
      text.resize(text.size() - held);
      return std::make_unique<TextDataset>(std::move(text), std::move(held_out), batch, g.seq_len, config.seed,
                                           config.data_path);
    }
    return std::make_unique<TextDataset>(generate_corpus(config.seed, kCorpusBytes),
                                         generate_corpus(config.seed ^ kHeldOutSeed, kHeldOutBytes), batch, g.seq_len,
                                         config.seed, "generated corpus");
  }
  if (config.model == "cnn") {
    FP8KIT_CHECK(config.data_path.empty(), "the cnn trains on generated images; a data file ('", config.data_path,
                 "') is for the gpt");
    return std::make_unique<ShapesDataset>(batch, kCnnImageSize, CnnConfig{}.classes, config.seed);
  }
  FP8KIT_CHECK(false, "unknown model '", config.model, "' (use gpt, cnn)");
  return nullptr;
}

// ---------------------------------------------------------------- the trainer's phases

namespace {

AdamWOptions optimizer_options(const TrainConfig& config, const PrecisionRecipe& recipe) {
  AdamWOptions o = config.adamw;
  o.moments = recipe.optimizer_state;
  o.master = recipe.master_weights;
  o.rounding_seed = config.seed;
  return o;
}

}  // namespace

Trainer::Trainer(const TrainConfig& config, const PrecisionRecipe& recipe, Profiler* profiler)
    : config_(config),
      recipe_(recipe),
      profiler_(profiler),
      data_(make_dataset(config)),
      model_(make_model(config, recipe)),
      params_(model_->parameters()),
      trained_(params_),
      optimizer_(optimizer_options(config, recipe)) {
  for (Parameter* p : params_) set_master_dtype(*p, master_dtype(recipe.master_weights));
  if (config.perturb_seed != 0) perturb_by_one_ulp(params_, config.perturb_seed);
  report_.log_scales = config.log_scales;
  ctx_.saved_dtype = recipe_.saved_dtype();
  ctx_.fp8_activations = recipe_.fp8_activations();
  ctx_.profiler = profiler;
  ctx_.recipe = &recipe_;
  ctx_.report = &report_;
  release_gradients(params_);  // held only from a step's backward to its update
}

float Trainer::forward(const Batch& batch) {
  report_.clear();
  MemoryCategoryScope category(MemoryCategory::kActivations);
  return model_->forward(ctx_, batch);
}

void Trainer::backward() {
  model_->backward(ctx_);
  ensure_gradients(trained_);
}

std::string Trainer::nonfinite(float loss) const {
  if (report_.first_nonfinite) {
    return "non-finite amax in " + report_.first_nonfinite->layer + " (" +
           std::string(name(report_.first_nonfinite->role)) + ")";
  }
  if (std::string p = first_nonfinite_grad(trained_); !p.empty()) return "non-finite gradient of " + p;
  if (!std::isfinite(loss)) return "non-finite loss";
  return {};
}

void Trainer::optimizer_step(std::int64_t step) {
  optimizer_.options().lr = learning_rate(config_, step);
  ensure_gradients(trained_);  // zeros for a step driven without a backward
  optimizer_.step(trained_, profiler_);
}

void Trainer::update_scales() {
  for (Fp8LayerState* s : model_->fp8_states()) s->update();
}

void Trainer::discard_scales() {
  // The delayed-scaling histories must not take a skipped step's NaN either: drop what was recorded.
  for (Fp8LayerState* s : model_->fp8_states()) s->discard_step();
}

void Trainer::zero_grad() {
  release_gradients(trained_);
}

Batch slice_batch(const Batch& batch, std::int64_t begin, std::int64_t end) {
  auto rows_of = [&](const Tensor& t) {
    FP8KIT_CHECK(t.dim() >= 1 && begin >= 0 && begin <= end && end <= t.size(0), "slice_batch: rows ", begin, " to ",
                 end, " of a ", shape_string(t.shape()), " tensor");
    Shape shape = t.shape();
    shape[0] = end - begin;
    Tensor out = empty(shape, t.dtype());
    const std::int64_t row_bytes = t.size(0) == 0 ? 0 : t.nbytes() / t.size(0);
    if (out.nbytes() > 0) std::memcpy(out.raw(), t.raw() + begin * row_bytes, static_cast<std::size_t>(out.nbytes()));
    return out;
  };
  return Batch{rows_of(batch.inputs), rows_of(batch.targets)};
}

StepLog Trainer::run_step(std::int64_t step, const TrainHooks& hooks, TrainProgress& progress) {
  Batch batch = data_->batch(step);
  if (config_.batch_shard.count > 1) {
    const auto [begin, end] = even_split(batch.inputs.size(0), config_.batch_shard.index, config_.batch_shard.count);
    batch = slice_batch(batch, begin, end);
  }
  const auto t0 = std::chrono::steady_clock::now();
  StepLog log;
  log.step = step;
  {
    ScopedEvent event(profiler_, "step", "step");
    event.arg("step", std::to_string(step));
    if (hooks.begin_step) hooks.begin_step(*this);
    log.loss = forward(batch);
    if (hooks.agree_loss) log.loss = hooks.agree_loss(*this, log.loss);
    backward();
    if (config_.inject_nan_step && *config_.inject_nan_step == step && !trained_.empty() &&
        trained_.front()->grad.numel() > 0) {
      Tensor& g = trained_.front()->grad;
      if (g.dtype() == DType::bfloat16) {
        g.data<bfloat16>()[0] = bfloat16::from_float(std::numeric_limits<float>::quiet_NaN());
      } else {
        g.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
      }
    }
    if (hooks.reduce_gradients) {
      hooks.reduce_gradients(*this);
      ensure_gradients(trained_);  // a hook may release them (or a sharded run's shards be reduced into)
    }
    // The guard: a non-finite amax (seen while quantizing), gradient or loss skips the step or aborts, on every rank
    // alike once agree_nonfinite has made the verdict the run's.
    std::string bad = nonfinite(log.loss);
    if (hooks.agree_nonfinite) bad = hooks.agree_nonfinite(*this, bad);
    if (!bad.empty()) {
      if (config_.on_nonfinite == OnNonfinite::kAbort) {
        throw NonfiniteAbort("step " + std::to_string(step) + ": " + bad + " (--on-nonfinite abort)");
      }
      log.skipped = true;
      ++progress.skipped_steps;
      event.arg("skipped", bad);
      discard_scales();
    } else {
      if (hooks.agree_amax) hooks.agree_amax(*this);
      optimizer_step(step);
      update_scales();
    }
    zero_grad();
  }
  log.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  progress.losses.push_back(log.loss);
  progress.next_step = step + 1;
  if (hooks.after_step) hooks.after_step(*this, progress);
  if (config_.log_scales) log.scales = report_.scales;
  return log;
}

// ---------------------------------------------------------------- the run

void check_train_config(const TrainConfig& config) {
  FP8KIT_CHECK(config.steps >= 1, "train: steps must be at least 1, got ", config.steps);
  FP8KIT_CHECK(config.eval_batches >= 1, "train: eval_batches must be at least 1, got ", config.eval_batches);
  FP8KIT_CHECK(config.final_loss_window >= 1, "train: final_loss_window must be at least 1, got ",
               config.final_loss_window);
  FP8KIT_CHECK(config.warmup_steps >= 0, "train: warmup_steps must be >= 0, got ", config.warmup_steps);
  // A rank's part of each batch: part `index` of `count` (count 1: the whole batch).
  FP8KIT_CHECK(config.batch_shard.count >= 1 && config.batch_shard.index >= 0 &&
                   config.batch_shard.index < config.batch_shard.count,
               "train: batch_shard must be part index 0..count-1 of count >= 1, got ", config.batch_shard.index, " of ",
               config.batch_shard.count);
}

TrainResult train(const TrainConfig& config, const PrecisionRecipe& recipe, Profiler* profiler,
                  const TrainHooks& hooks) {
  check_train_config(config);
  reset_peak_memory();
  const MemoryStats baseline = memory_stats();
  TrainResult result;
  result.recipe = recipe.name();
  result.optimizer_state = std::string(name(recipe.optimizer_state));
  result.master_weights = std::string(name(recipe.master_weights));
  TrainProgress progress;
  {
    Trainer trainer(config, recipe, profiler);
    result.data = trainer.data().describe();
    for (const Parameter* p : trainer.parameters()) result.parameters += p->value.numel();
    if (hooks.resume) {
      hooks.resume(trainer, progress);
      FP8KIT_CHECK(progress.next_step >= 0 && progress.next_step <= config.steps &&
                       static_cast<std::int64_t>(progress.losses.size()) == progress.next_step &&
                       progress.skipped_steps >= 0 && progress.skipped_steps <= progress.next_step,
                   "train: the resumed progress (step ", progress.next_step, ", ", progress.losses.size(), " losses, ",
                   progress.skipped_steps, " skipped) does not fit a run of ", config.steps,
                   " steps (the resume hook must give one loss per step done)");
    }
    if (hooks.prepare) hooks.prepare(trainer);
    result.start_step = progress.next_step;
    std::vector<double> times;
    for (std::int64_t step = progress.next_step; step < config.steps; ++step) {
      const StepLog log = trainer.run_step(step, hooks, progress);
      times.push_back(log.ms);
      if (hooks.on_step) hooks.on_step(log);
    }
    if (hooks.finish) hooks.finish(trainer, progress);
    result.step_ms = median(times);
    const MemoryStats peak = memory_stats();  // of training: the evaluation is not counted
    result.peak_bytes = peak.peak_bytes - baseline.current_bytes;
    for (std::size_t i = 0; i < kMemoryCategories; ++i) {
      result.peak_by_category[i] = peak.peak_by_category[i] - baseline.current_by_category[i];
    }
    result.final_loss = evaluate(trainer.model(), trainer.data(), recipe, config.eval_batches);
  }
  result.losses = std::move(progress.losses);
  result.skipped_steps = progress.skipped_steps;
  const std::int64_t window = std::min<std::int64_t>(config.final_loss_window, config.steps);
  double sum = 0;
  std::int64_t counted = 0;
  for (std::int64_t i = config.steps - window; i < config.steps; ++i) {
    if (std::isfinite(result.losses[static_cast<std::size_t>(i)])) {
      sum += result.losses[static_cast<std::size_t>(i)];
      ++counted;
    }
  }
  result.train_loss = counted ? static_cast<float>(sum / static_cast<double>(counted)) : NAN;
  return result;
}

TrainResult train(const TrainConfig& config, const PrecisionRecipe& recipe, Profiler* profiler,
                  const std::function<void(const StepLog&)>& on_step) {
  TrainHooks hooks;
  hooks.on_step = on_step;
  return train(config, recipe, profiler, hooks);
}

}  // namespace fp8kit::nn
