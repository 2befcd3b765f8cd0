// The training loop: batches, forward, backward, the non-finite guard (skip or abort, naming the tensor), AdamW,
// the delayed-scaling update, a warm-up + cosine learning rate, peak memory from the allocation accounting.
#include "fp8kit/nn/train.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <numeric>

#include "fp8kit/common/error.hpp"
#include "fp8kit/nn/cnn.hpp"
#include "fp8kit/nn/gpt.hpp"
#include "fp8kit/nn/train_checkpoint.hpp"
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

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FP8KIT_CHECK(static_cast<bool>(in), "cannot read the training text '", path, "' (check the path)");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

double learning_rate(const TrainConfig& c, std::int64_t step) {
  if (step < c.warmup_steps) return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  const double progress = static_cast<double>(step - c.warmup_steps) /
                          static_cast<double>(std::max<std::int64_t>(1, c.steps - c.warmup_steps));
  const double min_lr = c.lr / 10.0;
  return min_lr + 0.5 * (c.lr - min_lr) * (1.0 + std::cos(3.14159265358979323846 * std::min(1.0, progress)));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

Batch Dataset::eval_batch(std::int64_t /*index*/) const {
  FP8KIT_CHECK(false, "the dataset '", describe(), "' has no held-out data for the evaluation loss ",
               "(implement Dataset::eval_batch)");
  return {};
}

float evaluate(Model& model, const Dataset& data, const PrecisionRecipe& recipe, std::int64_t batches) {
  StepReport report;
  Context ctx;
  ctx.saved_dtype = recipe.saved_dtype();
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

std::unique_ptr<Dataset> make_dataset(const TrainConfig& config) {
  const std::int64_t batch = batch_size(config);
  if (config.model == "gpt") {
    const GptConfig g;
    if (!config.data_path.empty()) {
      std::string text = read_text(config.data_path);
      const std::size_t held = text.size() * kHeldOutPercent / 100;
      FP8KIT_CHECK(held > static_cast<std::size_t>(g.seq_len) + 1, "the training text '", config.data_path, "' has ",
                   text.size(), " bytes; its last ", kHeldOutPercent, "% is held out for the evaluation loss and must ",
                   "exceed ", g.seq_len + 1, " bytes (give a text of at least ",
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

TrainResult train(const TrainConfig& config, const PrecisionRecipe& recipe, Profiler* profiler,
                  const std::function<void(const StepLog&)>& on_step) {
  FP8KIT_CHECK(config.steps >= 1, "train: steps must be at least 1, got ", config.steps);
  FP8KIT_CHECK(config.eval_batches >= 1, "train: eval_batches must be at least 1, got ", config.eval_batches);
  TrainCheckpointer checkpoints(config, recipe);  // checks the checkpoint fields before any work
  const std::unique_ptr<Dataset> data = make_dataset(config);
  reset_peak_memory();
  const std::int64_t baseline = memory_stats().current_bytes;
  TrainResult result;
  result.recipe = recipe.name();
  result.data = data->describe();
  {
    const std::unique_ptr<Model> model = make_model(config, recipe);
    const std::vector<Parameter*> params = model->parameters();
    for (const Parameter* p : params) result.parameters += p->value.numel();
    AdamWOptions opt;
    opt.lr = config.lr;
    opt.weight_decay = 0.1;
    opt.beta2 = 0.95;
    opt.decay = DecayPolicy::kMatricesOnly;
    AdamW adamw(opt);
    StepReport report;
    report.log_scales = config.log_scales;
    Context ctx;
    ctx.saved_dtype = recipe.saved_dtype();
    ctx.profiler = profiler;
    ctx.recipe = &recipe;
    ctx.report = &report;
    std::vector<double> times;
    if (checkpoints.resuming()) {
      TrainProgress resumed = checkpoints.resume(*model, adamw);
      result.start_step = resumed.next_step;
      result.losses = std::move(resumed.losses);
      result.skipped_steps = resumed.skipped_steps;
    }
    for (std::int64_t step = result.start_step; step < config.steps; ++step) {
      const Batch batch = data->batch(step);
      const auto t0 = std::chrono::steady_clock::now();
      report.clear();
      StepLog log;
      log.step = step;
      {
        ScopedEvent event(profiler, "step", "step");
        event.arg("step", std::to_string(step));
        log.loss = model->forward(ctx, batch);
        model->backward(ctx);
        if (config.inject_nan_step && *config.inject_nan_step == step && !params.empty()) {
          params.front()->grad.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
        }
        // The guard: a non-finite amax (seen while quantizing) or gradient skips the step or aborts.
        std::string bad;
        if (report.first_nonfinite) {
          bad = "non-finite amax in " + report.first_nonfinite->layer + " (" +
                std::string(name(report.first_nonfinite->role)) + ")";
        } else if (const std::string p = first_nonfinite_grad(params); !p.empty()) {
          bad = "non-finite gradient of " + p;
        } else if (!std::isfinite(log.loss)) {
          bad = "non-finite loss";
        }
        if (!bad.empty()) {
          if (config.on_nonfinite == OnNonfinite::kAbort) {
            throw NonfiniteAbort("step " + std::to_string(step) + ": " + bad + " (--on-nonfinite abort)");
          }
          log.skipped = true;
          ++result.skipped_steps;
          event.arg("skipped", bad);
          // The delayed-scaling histories must not take this step's NaN either: drop what was recorded.
          for (Fp8LayerState* s : model->fp8_states()) s->discard_step();
        } else {
          adamw.options().lr = learning_rate(config, step);
          adamw.step(params, profiler);
          for (Fp8LayerState* s : model->fp8_states()) s->update();
        }
        AdamW::zero_grad(params);
      }
      log.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      times.push_back(log.ms);
      result.losses.push_back(log.loss);
      checkpoints.after_step(step, *model, adamw, result.losses, result.skipped_steps);
      if (config.log_scales) log.scales = report.scales;
      if (on_step) on_step(log);
    }
    checkpoints.finish(*model, adamw, result.losses, result.skipped_steps);
    result.step_ms = median(times);
    result.peak_bytes = memory_stats().peak_bytes - baseline;  // of training: the evaluation is not counted
    result.final_loss = evaluate(*model, *data, recipe, config.eval_batches);
  }
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

}  // namespace fp8kit::nn
