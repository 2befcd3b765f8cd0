// Training checkpoints: the tensors and __metadata__ of a run between two steps, written crash-safely, and the
// strict reading back (every field and tensor checked before the model is touched), plus the trainer's hooks.
#include "fp8kit/io/train_checkpoint.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <map>
#include <set>
#include <system_error>

#include "common/fingerprint.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/common/version.hpp"
#include "fp8kit/io/atomic_file.hpp"
#include "fp8kit/io/fp8_export.hpp"
#include "fp8kit/io/safetensors.hpp"
#include "fp8kit/scaling/amax.hpp"
#include "fp8kit/tensor/memory.hpp"
#include "io/strict_json.hpp"

namespace fp8kit {
namespace {

using namespace nn;  // NOLINT: this file saves and restores the training layer's runs

namespace fs = std::filesystem;

// __metadata__ keys, all under one prefix.
constexpr std::string_view kPrefix = "fp8kit.train.";
// Tensor name prefixes besides the parameters' own names.
constexpr std::string_view kExpAvg = "optim.exp_avg.";
constexpr std::string_view kExpAvgSq = "optim.exp_avg_sq.";
constexpr std::string_view kOptimStep = "optim.step.";
constexpr std::string_view kExpAvgScale = "optim.exp_avg_scale_inv.";       // FP8 moments: one per block
constexpr std::string_view kExpAvgSqScale = "optim.exp_avg_sq_scale_inv.";  // (of the codes of sqrt(v))
constexpr std::string_view kCompensation = "optim.compensation.";           // bf16-kahan master weights
constexpr std::string_view kFp8 = "fp8.";
constexpr std::string_view kLosses = "train.losses";

constexpr TensorRole kRoles[] = {TensorRole::kInput, TensorRole::kWeight, TensorRole::kGradOutput};

std::string key(std::string_view field) {
  return std::string(kPrefix) + std::string(field);
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

std::string quoted(const fs::path& path) {
  std::string out = "'";
  out += path.string();
  out += '\'';
  return out;
}

std::string fp8_state_name(const Fp8LayerState& s, TensorRole role) {
  return std::string(kFp8) + s.layer + "." + std::string(name(role));
}

// The shortest decimal that reads back as exactly v ("0.003").
std::string exact(double v) {
  char buf[40];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::string("nan");
}

// The recipe's settings besides its name, as "key=value;..." (what Fp8LayerState and the dispatcher read).
std::string recipe_settings(const PrecisionRecipe& r) {
  return "amax_history_length=" + std::to_string(r.amax_history_length) +
         ";amax_compute=" + (r.amax_compute == AmaxCompute::kMax ? "max" : "most_recent") +
         ";margin=" + std::to_string(r.margin) +
         ";fp8_conv_max_kernel_area=" + std::to_string(r.fp8_conv_max_kernel_area) +
         ";min_fp8_gemm_macs=" + std::to_string(r.min_fp8_gemm_macs) +
         ";optimizer_state=" + std::string(nn::name(r.optimizer_state)) +
         ";master_weights=" + std::string(nn::name(r.master_weights));
}

// AdamW's settings besides the learning rate (which has its own key), as "key=value;...".
std::string adamw_settings(const AdamWOptions& o) {
  return "beta1=" + exact(o.beta1) + ";beta2=" + exact(o.beta2) + ";eps=" + exact(o.eps) +
         ";weight_decay=" + exact(o.weight_decay) + ";decay=" + (o.decay == DecayPolicy::kAll ? "all" : "matrices");
}

template <typename T>
bool parse_number(std::string_view text, T& out) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end && !text.empty();
}

// One "key=value;..." metadata field of a file (recipe_settings, adamw), its items checked as they are read.
class Settings {
 public:
  Settings(fs::path path, std::string field, std::string text)
      : path_(std::move(path)), field_(std::move(field)), text_(std::move(text)) {
    std::size_t begin = 0;
    while (begin <= text_.size()) {
      const std::size_t end = std::min(text_.find(';', begin), text_.size());
      const std::string item = text_.substr(begin, end - begin);
      const std::size_t eq = item.find('=');
      if (eq != std::string::npos) items_[item.substr(0, eq)] = item.substr(eq + 1);
      begin = end + 1;
    }
  }
  template <typename T>
  void number(const char* k, T& out) const {
    const auto it = items_.find(k);
    check(it != items_.end() && parse_number(it->second, out), k);
  }
  bool has(const char* k) const { return items_.count(k) != 0; }
  // The item's value, which must be one of `choices`.
  const std::string& choice(const char* k, std::initializer_list<std::string_view> choices) const {
    const auto it = items_.find(k);
    check(it != items_.end() && std::find(choices.begin(), choices.end(), it->second) != choices.end(), k);
    return it->second;
  }

 private:
  void check(bool ok, const char* k) const {
    FP8KIT_CHECK_KIND(ok, ErrorKind::kParse, quoted(path_), ": __metadata__ '", key(field_), "' has no valid ", k, " (",
                      detail::quoted(text_), ")");
  }
  fs::path path_;
  std::string field_;
  std::string text_;
  std::map<std::string, std::string> items_;
};

// Reads the checked metadata fields of one file.
class MetadataReader {
 public:
  MetadataReader(const fs::path& path, const std::map<std::string, std::string>& metadata)
      : path_(path), metadata_(metadata) {}

  const std::string& text(std::string_view field) const {
    const auto it = metadata_.find(key(field));
    FP8KIT_CHECK_KIND(it != metadata_.end(), ErrorKind::kParse, quoted(path_), ": __metadata__ has no '", key(field),
                      "' (the file is damaged or was not written by fp8kit train --save-checkpoint)");
    return it->second;
  }
  template <typename T>
  T number(std::string_view field) const {
    T v{};
    FP8KIT_CHECK_KIND(parse_number(text(field), v), ErrorKind::kParse, quoted(path_), ": __metadata__ '", key(field),
                      "' is ", detail::quoted(text(field)), ", not a number (the file is damaged)");
    return v;
  }
  PrecisionRecipe recipe() const {
    const std::string& name = text("recipe");
    const auto parsed = PrecisionRecipe::parse(name);
    FP8KIT_CHECK_KIND(parsed.has_value(), ErrorKind::kParse, quoted(path_), ": unknown recipe '", name,
                      "' in __metadata__ (written by a newer fp8kit?)");
    PrecisionRecipe r = *parsed;
    const Settings settings(path_, "recipe_settings", text("recipe_settings"));
    settings.number("amax_history_length", r.amax_history_length);
    settings.number("margin", r.margin);
    settings.number("fp8_conv_max_kernel_area", r.fp8_conv_max_kernel_area);
    settings.number("min_fp8_gemm_macs", r.min_fp8_gemm_macs);
    r.amax_compute =
        settings.choice("amax_compute", {"max", "most_recent"}) == "max" ? AmaxCompute::kMax : AmaxCompute::kMostRecent;
    // Checkpoints written before the optimizer's storage was configurable have neither: they ran float32.
    r.optimizer_state = settings.has("optimizer_state")
                            ? *nn::parse_moment_storage(settings.choice("optimizer_state", {"fp32", "bf16", "fp8"}))
                            : MomentStorage::kFloat32;
    r.master_weights =
        settings.has("master_weights")
            ? *nn::parse_master_weights(settings.choice("master_weights", {"fp32", "bf16-sr", "bf16-kahan"}))
            : MasterWeights::kFloat32;
    return r;
  }
  // The optimizer's settings. Checkpoints written before they were configurable have no "adamw" key: they ran
  // kTrainAdamW's.
  AdamWOptions adamw() const {
    AdamWOptions o = nn::kTrainAdamW;
    o.lr = number<double>("lr");
    if (metadata_.find(key("adamw")) == metadata_.end()) return o;
    const Settings settings(path_, "adamw", text("adamw"));
    settings.number("beta1", o.beta1);
    settings.number("beta2", o.beta2);
    settings.number("eps", o.eps);
    settings.number("weight_decay", o.weight_decay);
    o.decay = settings.choice("decay", {"all", "matrices"}) == "all" ? DecayPolicy::kAll : DecayPolicy::kMatricesOnly;
    return o;
  }

 private:
  const fs::path& path_;
  const std::map<std::string, std::string>& metadata_;
};

SafetensorsFile open_checkpoint(const fs::path& path) {
  std::error_code ec;
  FP8KIT_CHECK(fs::exists(path, ec), quoted(path),
               " does not exist (give a checkpoint written by fp8kit train --save-checkpoint)");
  return SafetensorsFile::open(path);
}

TrainCheckpointInfo info_of(const SafetensorsFile& file) {
  const fs::path& path = file.path();
  const auto& metadata = file.metadata();
  const auto marker = metadata.find(key("format"));
  if (marker == metadata.end() || marker->second != kTrainCheckpointFormat) {
    const bool export_file = metadata.count("fp8kit.export.recipe") != 0;
    FP8KIT_THROW(ErrorKind::kInvalidArgument, quoted(path), " is ",
                 export_file ? "an FP8 inference export" : "not an fp8kit training checkpoint", " (no __metadata__ '",
                 key("format"), "'); resume from a file written by fp8kit train --save-checkpoint");
  }
  const MetadataReader m(path, metadata);
  TrainCheckpointInfo info;
  info.version = m.number<int>("version");
  FP8KIT_CHECK_KIND(info.version == kTrainCheckpointVersion, ErrorKind::kParse, quoted(path), " is a version ",
                    info.version, " training checkpoint; this fp8kit (", kVersion, ") reads version ",
                    kTrainCheckpointVersion, " (resume it with the fp8kit that wrote it)");
  info.next_step = m.number<std::int64_t>("next_step");
  info.steps = m.number<std::int64_t>("steps");
  info.model = m.text("model");
  info.seed = m.number<std::uint64_t>("seed");
  info.adamw = m.adamw();
  info.warmup_steps = m.number<std::int64_t>("warmup_steps");
  info.batch = m.number<std::int64_t>("batch");
  info.data_path = m.text("data");
  info.data_fingerprint = m.text("data_fingerprint");
  info.recipe = m.recipe();
  info.skipped_steps = m.number<std::int64_t>("skipped_steps");
  // Values no run writes (a hand-edited or damaged file): said as damage, not as a setting to resume with.
  FP8KIT_CHECK_KIND(info.batch >= 1 && info.warmup_steps >= 0 && std::isfinite(info.adamw.lr) && info.adamw.lr >= 0,
                    ErrorKind::kParse, quoted(path), ": __metadata__ says batch ", info.batch, ", warmup_steps ",
                    info.warmup_steps, ", lr ", info.adamw.lr, ", which no run has (the file is damaged)");
  const PrecisionRecipe& r = info.recipe;
  const AdamWOptions& o = info.adamw;
  FP8KIT_CHECK_KIND(r.amax_history_length >= 1 && r.amax_history_length <= (1 << 24) && r.margin >= -127 &&
                        r.margin <= 127 && r.fp8_conv_max_kernel_area >= 1 && r.min_fp8_gemm_macs >= 0,
                    ErrorKind::kParse, quoted(path), ": __metadata__ '", key("recipe_settings"),
                    "' says amax_history_length ", r.amax_history_length, ", margin ", r.margin,
                    ", fp8_conv_max_kernel_area ", r.fp8_conv_max_kernel_area, ", min_fp8_gemm_macs ",
                    r.min_fp8_gemm_macs, ", which no run has (the file is damaged)");
  FP8KIT_CHECK_KIND(o.beta1 >= 0.0 && o.beta1 < 1.0 && o.beta2 >= 0.0 && o.beta2 < 1.0 && o.eps > 0.0 &&
                        std::isfinite(o.eps) && o.weight_decay >= 0.0 && std::isfinite(o.weight_decay),
                    ErrorKind::kParse, quoted(path), ": __metadata__ '", key("adamw"), "' says beta1 ", o.beta1,
                    ", beta2 ", o.beta2, ", eps ", o.eps, ", weight_decay ", o.weight_decay,
                    ", which no run has (the file is damaged)");
  if (metadata.count(key("eval_batches")) != 0) {
    info.eval_batches = m.number<std::int64_t>("eval_batches");
    FP8KIT_CHECK_KIND(info.eval_batches >= 1, ErrorKind::kParse, quoted(path), ": __metadata__ '", key("eval_batches"),
                      "' is ", info.eval_batches, ", not at least 1 (the file is damaged)");
  }
  if (metadata.count(key("on_nonfinite")) != 0) {
    const std::string& policy = m.text("on_nonfinite");
    FP8KIT_CHECK_KIND(policy == "skip" || policy == "abort", ErrorKind::kParse, quoted(path), ": __metadata__ '",
                      key("on_nonfinite"), "' is ", detail::quoted(policy),
                      ", not skip or abort (the file is damaged)");
    info.on_nonfinite = policy == "abort" ? OnNonfinite::kAbort : OnNonfinite::kSkip;
  }
  FP8KIT_CHECK_KIND(info.next_step >= 1 && info.next_step <= info.steps && info.skipped_steps >= 0 &&
                        info.skipped_steps <= info.next_step,
                    ErrorKind::kParse, quoted(path), ": __metadata__ says step ", info.next_step, " of ", info.steps,
                    " with ", info.skipped_steps, " skipped, which cannot be (the file is damaged)");
  return info;
}

// A tensor of the file that must be there, of this dtype and shape.
const SafetensorsTensor& expect(const SafetensorsFile& file, const std::string& name, SafetensorsDType dtype,
                                const Shape& shape, std::string_view what) {
  const SafetensorsTensor* t = file.find(name);
  FP8KIT_CHECK(t != nullptr, quoted(file.path()), " has no tensor '", name, "' (", what,
               "): the file is incomplete or from another model");
  FP8KIT_CHECK(t->dtype == dtype && t->shape == shape, quoted(file.path()), ": tensor '", name, "' (", what, ") is ",
               fp8kit::name(t->dtype), " ", shape_string(t->shape), ", the model needs ", fp8kit::name(dtype), " ",
               shape_string(shape));
  return *t;
}

// The settings of a restored delayed-scaling state must be those the recipe gives the layer.
bool same_config(const DelayedScalingConfig& a, const DelayedScalingConfig& b) {
  return a.format == b.format && a.history_length == b.history_length && a.algorithm == b.algorithm &&
         a.margin == b.margin && a.ema_decay == b.ema_decay;
}

// A restored tensor's values must be ones training leaves: finite (a NaN weight or moment reached every later step
// through AdamW, and the run reported NaN losses as its result) and, for a second moment or a scale, not negative.
void check_values(const Tensor& t, const std::string& ck, const std::string& name, bool nonnegative) {
  const Tensor wide = t.dtype() == DType::float32 ? t : t.to(DType::float32);
  const std::span<const float> v = wide.span<float>();
  const auto bad =
      std::find_if(v.begin(), v.end(), [&](float x) { return !std::isfinite(x) || (nonnegative && x < 0.0f); });
  FP8KIT_CHECK_KIND(bad == v.end(), ErrorKind::kParse, ck, ": ", detail::quoted(name), " holds ", *bad, " at element ",
                    bad - v.begin(), ", which training never leaves there (the file is damaged)");
}

}  // namespace

std::string file_fingerprint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FP8KIT_CHECK_KIND(in.good(), ErrorKind::kIo, "cannot read '", path, "': ", std::strerror(errno));
  detail::Fingerprint f;
  std::vector<char> chunk(1 << 20);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    f.add(std::as_bytes(std::span<const char>(chunk.data(), static_cast<std::size_t>(in.gcount()))));
  }
  FP8KIT_CHECK_KIND(in.eof(), ErrorKind::kIo, "cannot read '", path, "': ", std::strerror(errno));
  return f.hex();
}

std::string data_fingerprint(const TrainConfig& config) {
  if (config.data_path.empty()) return {};
  const std::string text = nn::read_training_text(config.data_path);
  detail::Fingerprint f;
  f.add(std::as_bytes(std::span<const char>(text)));
  return f.hex();
}

void save_train_checkpoint(const fs::path& path, const TrainConfig& config, const PrecisionRecipe& recipe, Model& model,
                           const AdamW& optimizer, const TrainProgress& progress, const std::string& data_fingerprint) {
  FP8KIT_CHECK(progress.next_step >= 1 && static_cast<std::size_t>(progress.next_step) == progress.losses.size(),
               "save_train_checkpoint: ", progress.losses.size(), " losses for step ", progress.next_step);
  const std::vector<Parameter*> params = model.parameters();
  const std::map<std::string, AdamW::State>& optim = optimizer.state();
  std::vector<SafetensorsEntry> entries;
  std::vector<Tensor> owned;  // the tensors the entries view (storage outlives moves of the Tensor objects)
  std::vector<std::vector<std::uint8_t>> blobs;
  owned.reserve(optim.size() + 1);
  for (const Parameter* p : params) {
    FP8KIT_CHECK_KIND(!starts_with(p->name, "optim.") && !starts_with(p->name, kFp8) && p->name != kLosses,
                      ErrorKind::kInternal, "parameter name '", p->name, "' collides with a checkpoint tensor name");
    entries.push_back(safetensors_entry(p->name, p->value));
  }
  for (const auto& [name, s] : optim) {
    entries.push_back(safetensors_entry(std::string(kExpAvg) + name, s.m));
    entries.push_back(safetensors_entry(std::string(kExpAvgSq) + name, s.v));
    if (s.m_scale.numel() > 0) {
      entries.push_back(safetensors_entry(std::string(kExpAvgScale) + name, s.m_scale));
      entries.push_back(safetensors_entry(std::string(kExpAvgSqScale) + name, s.v_scale));
    }
    if (s.compensation.numel() > 0)
      entries.push_back(safetensors_entry(std::string(kCompensation) + name, s.compensation));
    Tensor step = empty(Shape{}, DType::int64);
    step.data<std::int64_t>()[0] = s.step;
    owned.push_back(step);
    entries.push_back(safetensors_entry(std::string(kOptimStep) + name, owned.back()));
  }
  for (Fp8LayerState* s : model.fp8_states()) {
    for (TensorRole role : kRoles) {
      blobs.push_back(s->of(role).serialize());
      const std::vector<std::uint8_t>& b = blobs.back();
      entries.push_back({fp8_state_name(*s, role),
                         SafetensorsDType::U8,
                         {static_cast<std::int64_t>(b.size())},
                         std::as_bytes(std::span<const std::uint8_t>(b)),
                         {}});
    }
  }
  Tensor losses = empty({static_cast<std::int64_t>(progress.losses.size())}, DType::float32);
  std::copy(progress.losses.begin(), progress.losses.end(), losses.data<float>());
  entries.push_back(safetensors_entry(std::string(kLosses), losses));

  const std::map<std::string, std::string> metadata = {
      {key("format"), std::string(kTrainCheckpointFormat)},
      {key("version"), std::to_string(kTrainCheckpointVersion)},
      {key("fp8kit_version"), kVersion},
      {key("next_step"), std::to_string(progress.next_step)},
      {key("steps"), std::to_string(config.steps)},
      {key("model"), config.model},
      {key("seed"), std::to_string(config.seed)},
      {key("lr"), exact(config.adamw.lr)},
      {key("adamw"), adamw_settings(config.adamw)},
      {key("warmup_steps"), std::to_string(config.warmup_steps)},
      {key("batch"), std::to_string(batch_size(config))},
      {key("data"), config.data_path},
      {key("data_fingerprint"), data_fingerprint},
      {key("recipe"), recipe.name()},
      {key("recipe_settings"), recipe_settings(recipe)},
      {key("skipped_steps"), std::to_string(progress.skipped_steps)},
      {key("eval_batches"), std::to_string(config.eval_batches)},
      {key("on_nonfinite"), config.on_nonfinite == OnNonfinite::kAbort ? "abort" : "skip"},
  };
  write_safetensors(path, entries, metadata);
}

TrainCheckpointInfo read_train_checkpoint_info(const fs::path& path) {
  return info_of(open_checkpoint(path));
}

void check_resumable(const fs::path& path, const TrainCheckpointInfo& info, const TrainConfig& config,
                     const PrecisionRecipe& recipe) {
  const std::string ck = quoted(path);
  FP8KIT_CHECK(info.model == config.model, ck, " is a checkpoint of the ", info.model, " model, not the ", config.model,
               ": resume it with --model ", info.model, " (or without --model)");
  FP8KIT_CHECK(info.seed == config.seed, ck, " was trained with seed ", info.seed, ", not ", config.seed,
               ": resume it with --seed ", info.seed, " (or without --seed)");
  FP8KIT_CHECK(info.recipe.name() == recipe.name(), ck, " was trained under ", info.recipe.name(), ", not ",
               recipe.name(), ": resume it with --recipe ", info.recipe.name(), " (or without --recipe)");
  if (info.recipe.fp8_conv_max_kernel_area != recipe.fp8_conv_max_kernel_area) {
    FP8KIT_THROW(ErrorKind::kInvalidArgument, ck, " was trained with --fp8-conv-max-kernel-area ",
                 info.recipe.fp8_conv_max_kernel_area, ", not ", recipe.fp8_conv_max_kernel_area,
                 ": resume it with --fp8-conv-max-kernel-area ", info.recipe.fp8_conv_max_kernel_area,
                 " (or without the option)");
  }
  FP8KIT_CHECK(info.recipe.optimizer_state == recipe.optimizer_state, ck, " was trained with --optimizer-state ",
               nn::name(info.recipe.optimizer_state), ", not ", nn::name(recipe.optimizer_state),
               ": resume it with --optimizer-state ", nn::name(info.recipe.optimizer_state),
               " (or without the option)");
  FP8KIT_CHECK(info.recipe.master_weights == recipe.master_weights, ck, " was trained with --master-weights ",
               nn::name(info.recipe.master_weights), ", not ", nn::name(recipe.master_weights),
               ": resume it with --master-weights ", nn::name(info.recipe.master_weights), " (or without the option)");
  FP8KIT_CHECK(recipe_settings(info.recipe) == recipe_settings(recipe), ck, " was trained with recipe settings ",
               recipe_settings(info.recipe), ", not ", recipe_settings(recipe), ": resume it with the same settings");
  FP8KIT_CHECK(info.adamw.lr == config.adamw.lr && info.warmup_steps == config.warmup_steps, ck,
               " was trained with lr ", exact(info.adamw.lr), " and ", info.warmup_steps, " warm-up steps, not lr ",
               exact(config.adamw.lr), " and ", config.warmup_steps,
               ": resume it with the same learning rate and warm-up");
  FP8KIT_CHECK(adamw_settings(info.adamw) == adamw_settings(config.adamw), ck, " was trained with AdamW ",
               adamw_settings(info.adamw), ", not ", adamw_settings(config.adamw),
               ": resume it with the same optimizer settings");
  FP8KIT_CHECK(info.batch == batch_size(config), ck, " was trained with batch ", info.batch, ", not ",
               batch_size(config), ": resume it with --batch ", info.batch, " (or without --batch)");
  if (info.data_path.empty() != config.data_path.empty()) {
    FP8KIT_THROW(ErrorKind::kInvalidArgument, ck, " was trained on ",
                 info.data_path.empty() ? "the generated data" : "'" + info.data_path + "'", ", not ",
                 config.data_path.empty() ? "the generated data" : "'" + config.data_path + "'", ": resume it ",
                 info.data_path.empty() ? "without --data" : "with --data " + info.data_path);
  }
  if (!config.data_path.empty()) {
    FP8KIT_CHECK(data_fingerprint(config) == info.data_fingerprint, ck, " was trained on '", info.data_path,
                 "' (fingerprint ", info.data_fingerprint, "); '", config.data_path,
                 "' has other contents: resume it with the same text");
  }
  FP8KIT_CHECK(config.steps >= info.next_step, ck, " has done ", info.next_step, " steps, more than the ", config.steps,
               " asked for: resume it with --steps ", info.next_step, " or more (or without --steps, for its run's ",
               info.steps, ")");
}

TrainProgress load_train_checkpoint(const fs::path& path, const TrainConfig& config, const PrecisionRecipe& recipe,
                                    Model& model, AdamW& optimizer) {
  const SafetensorsFile file = open_checkpoint(path);
  const TrainCheckpointInfo info = info_of(file);
  check_resumable(path, info, config, recipe);
  const std::string ck = quoted(path);
  std::set<std::string> used;

  // Everything is read and checked first; the model and the optimizer change only at the end.
  const std::vector<Parameter*> params = model.parameters();
  std::vector<Tensor> values;
  std::map<std::string, const Parameter*> by_name;
  for (const Parameter* p : params) {
    values.push_back(
        to_tensor(expect(file, p->name, safetensors_dtype(p->value.dtype()), p->value.shape(), "a parameter")));
    check_values(values.back(), ck, p->name, false);
    by_name[p->name] = p;
    used.insert(p->name);
  }

  std::map<std::string, AdamW::State> optim;
  for (const SafetensorsTensor& t : file.tensors()) {
    if (!starts_with(t.name, kOptimStep)) continue;
    const std::string name = t.name.substr(kOptimStep.size());
    const auto p = by_name.find(name);
    FP8KIT_CHECK(p != by_name.end(), ck, " has optimizer state ", detail::quoted(t.name), " for ", detail::quoted(name),
                 ", which is not a parameter of the ", config.model, " model");
    const Shape& shape = p->second->value.shape();
    AdamW::State s;
    const Tensor step = to_tensor(expect(file, t.name, SafetensorsDType::I64, Shape{}, "an AdamW step count"));
    s.step = step.data<std::int64_t>()[0];
    FP8KIT_CHECK_KIND(s.step >= 1 && s.step <= info.next_step, ErrorKind::kParse, ck, ": ", detail::quoted(t.name),
                      " is ", s.step, ", not a step count of a run at step ", info.next_step, " (the file is damaged)");
    // The moments in the storage the recipe gives them (optim.hpp), with their block scales and the Kahan buffer.
    const SafetensorsDType moments = recipe.optimizer_state == MomentStorage::kFloat32    ? SafetensorsDType::F32
                                     : recipe.optimizer_state == MomentStorage::kBfloat16 ? SafetensorsDType::BF16
                                                                                          : SafetensorsDType::F8_E4M3;
    MemoryCategoryScope category(MemoryCategory::kOptimizerState);
    s.m = to_tensor(expect(file, std::string(kExpAvg) + name, moments, shape, "AdamW's first moment"));
    s.v = to_tensor(expect(file, std::string(kExpAvgSq) + name, moments, shape, "AdamW's second moment"));
    used.insert({t.name, std::string(kExpAvg) + name, std::string(kExpAvgSq) + name});
    check_values(s.m, ck, std::string(kExpAvg) + name, false);
    check_values(s.v, ck, std::string(kExpAvgSq) + name, true);
    if (recipe.optimizer_state == MomentStorage::kFp8) {
      const Shape blocks{ceil_div(p->second->value.numel(), nn::kMomentBlock)};
      s.m_scale = to_tensor(
          expect(file, std::string(kExpAvgScale) + name, SafetensorsDType::F32, blocks, "the first moment's scales"));
      s.v_scale = to_tensor(expect(file, std::string(kExpAvgSqScale) + name, SafetensorsDType::F32, blocks,
                                   "the second moment's scales"));
      used.insert({std::string(kExpAvgScale) + name, std::string(kExpAvgSqScale) + name});
      check_values(s.m_scale, ck, std::string(kExpAvgScale) + name, true);
      check_values(s.v_scale, ck, std::string(kExpAvgSqScale) + name, true);
    }
    if (recipe.master_weights == MasterWeights::kBf16Kahan) {
      s.compensation = to_tensor(expect(file, std::string(kCompensation) + name, SafetensorsDType::BF16, shape,
                                        "the master weights' Kahan compensation"));
      used.insert(std::string(kCompensation) + name);
      check_values(s.compensation, ck, std::string(kCompensation) + name, false);
    }
    optim.emplace(name, std::move(s));
  }

  std::vector<std::pair<DelayedScaling*, DelayedScaling>> scaling;
  for (Fp8LayerState* s : model.fp8_states()) {
    for (TensorRole role : kRoles) {
      const std::string name = fp8_state_name(*s, role);
      const SafetensorsTensor* t = file.find(name);
      FP8KIT_CHECK(t != nullptr, ck, " has no tensor '", name,
                   "' (the FP8 scaling state of a layer): the file is incomplete or from another model");
      FP8KIT_CHECK_KIND(t->dtype == SafetensorsDType::U8 && t->shape.size() == 1, ErrorKind::kParse, ck, ": '", name,
                        "' is ", fp8kit::name(t->dtype), " ", shape_string(t->shape),
                        ", not U8 bytes of a scaling state (the file is damaged)");
      const auto* bytes = reinterpret_cast<const std::uint8_t*>(t->bytes.data());
      std::optional<DelayedScaling> restored;
      try {
        restored = DelayedScaling::deserialize(std::span<const std::uint8_t>(bytes, t->bytes.size()));
      } catch (const Error& e) {
        FP8KIT_THROW(ErrorKind::kParse, ck, ": '", name, "' is corrupted: ", e.what());
      }
      FP8KIT_CHECK(same_config(restored->config(), s->of(role).config()), ck, ": '", name,
                   "' has scaling settings (format, history length, amax algorithm, margin) other than ", recipe.name(),
                   " gives the layer: resume with the recipe settings it was trained with");
      scaling.emplace_back(&s->of(role), std::move(*restored));
      used.insert(name);
    }
  }

  const SafetensorsTensor& loss_tensor =
      expect(file, std::string(kLosses), SafetensorsDType::F32, Shape{info.next_step}, "the losses so far");
  used.insert(std::string(kLosses));
  for (const SafetensorsTensor& t : file.tensors()) {
    FP8KIT_CHECK(used.count(t.name) != 0, ck, " has tensor ", detail::quoted(t.name), ", which is not part of a ",
                 config.model, " checkpoint under ", recipe.name(),
                 " (the file is from another model or fp8kit version)");
  }

  TrainProgress progress;
  progress.next_step = info.next_step;
  progress.skipped_steps = info.skipped_steps;
  progress.losses.resize(static_cast<std::size_t>(info.next_step));
  std::memcpy(progress.losses.data(), loss_tensor.bytes.data(), loss_tensor.bytes.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::memcpy(params[i]->value.raw(), values[i].raw(), static_cast<std::size_t>(values[i].nbytes()));
  }
  optimizer.state() = std::move(optim);
  for (auto& [target, restored] : scaling) *target = std::move(restored);
  return progress;
}

// ---------------------------------------------------------------- the trainer's hooks

TrainCheckpointer::TrainCheckpointer(const TrainConfig& config, const PrecisionRecipe& recipe,
                                     TrainCheckpointOptions options)
    : config_(config), recipe_(recipe), options_(std::move(options)) {
  const TrainCheckpointOptions& o = options_;
  FP8KIT_CHECK(o.checkpoint_every >= 0, "--checkpoint-every must be at least 1 (or 0: only at the end), got ",
               o.checkpoint_every);
  FP8KIT_CHECK(o.checkpoint_every == 0 || !o.save_checkpoint.empty(),
               "--checkpoint-every needs --save-checkpoint FILE (where to write)");
  FP8KIT_CHECK(o.export_fp8.empty() ? !o.export_scheme && !o.export_layout : true,
               "--export-scheme and --export-layout need --export-fp8 PATH (where to write)");
  if (!o.export_fp8.empty()) {
    export_options_ = resolve_fp8_export(recipe, o.export_scheme, o.export_layout, o.export_input_scales);
  }
  // Where the results go, checked now rather than after the run (here, where this process writes them; with
  // around_write, the process that writes is the caller's to check).
  if (!o.around_write && !o.save_checkpoint.empty()) check_writable_destination(o.save_checkpoint);
  if (!o.around_write && !o.export_fp8.empty()) {
    const std::filesystem::path p(o.export_fp8);
    check_writable_destination(p, /*directory=*/p.extension() != ".safetensors");
  }
  if (!o.save_checkpoint.empty()) fingerprint_ = data_fingerprint(config);
  if (!o.resume_from.empty()) {
    check_resumable(o.resume_from, read_train_checkpoint_info(o.resume_from), config, recipe);
  }
}

void TrainCheckpointer::write(Trainer& trainer, bool optimizer_state, const std::function<void()>& what) {
  if (options_.around_write) return options_.around_write(trainer, optimizer_state, what);
  what();
}

void TrainCheckpointer::save(Trainer& trainer, const TrainProgress& progress) {
  write(trainer, true, [&] {
    save_train_checkpoint(options_.save_checkpoint, config_, recipe_, trainer.model(), trainer.optimizer(), progress,
                          fingerprint_);
  });
  saved_at_ = progress.next_step;
}

TrainHooks TrainCheckpointer::hooks(TrainHooks base) {
  if (!options_.resume_from.empty()) {
    base.resume = [this, then = std::move(base.resume)](Trainer& trainer, TrainProgress& progress) {
      progress = load_train_checkpoint(options_.resume_from, config_, recipe_, trainer.model(), trainer.optimizer());
      if (then) then(trainer, progress);
    };
  }
  base.after_step = [this, then = std::move(base.after_step)](Trainer& trainer, const TrainProgress& progress) {
    const std::int64_t done = progress.next_step;
    if (!options_.save_checkpoint.empty() &&
        (done == config_.steps || (options_.checkpoint_every > 0 && done % options_.checkpoint_every == 0))) {
      save(trainer, progress);
    }
    if (then) then(trainer, progress);
  };
  base.finish = [this, then = std::move(base.finish)](Trainer& trainer, const TrainProgress& progress) {
    if (!options_.save_checkpoint.empty() && saved_at_ != progress.next_step) save(trainer, progress);
    if (export_options_) {
      write(trainer, false, [&] {
        export_fp8_checkpoint(options_.export_fp8, trainer.model(), config_, recipe_, progress.next_step,
                              *export_options_);
      });
    }
    if (then) then(trainer, progress);
  };
  return base;
}

TrainResult train_with_checkpoints(const TrainConfig& config, const PrecisionRecipe& recipe,
                                   const TrainCheckpointOptions& options, Profiler* profiler,
                                   const std::function<void(const StepLog&)>& on_step) {
  check_train_config(config);                              // the config's own refusals come first
  TrainCheckpointer checkpoints(config, recipe, options);  // then the options', before any work
  TrainHooks base;
  base.on_step = on_step;
  return train(config, recipe, profiler, checkpoints.hooks(std::move(base)));
}

}  // namespace fp8kit
