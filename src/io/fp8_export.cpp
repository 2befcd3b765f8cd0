// The FP8 inference export: which parameters are quantized (the checkpoint commands' rule), into which layout, and
// the metadata that says what they were (float32, saturating) and how the model was trained.
#include "fp8kit/io/fp8_export.hpp"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>

#include "fp8kit/common/error.hpp"
#include "fp8kit/io/atomic_file.hpp"
#include "fp8kit/io/safetensors.hpp"
#include "fp8kit/io/sharded_checkpoint.hpp"

namespace fp8kit {
namespace {

using namespace nn;  // NOLINT: this file writes the training layer's models

namespace fs = std::filesystem;

bool is_linear_weight(const Parameter& p) {
  constexpr std::string_view kWeight = ".weight";
  return p.value.dim() == 2 && p.name.size() > kWeight.size() &&
         p.name.compare(p.name.size() - kWeight.size(), kWeight.size(), kWeight) == 0;
}

// layout_refusal()'s line in the words of `fp8kit train`, whose options are --export-layout and --export-scheme.
[[noreturn]] void refuse(std::string refusal) {
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"--layout ", "--export-layout "},
                                 std::pair<std::string, std::string>{"--scheme ", "--export-scheme "}}) {
    if (const std::size_t at = refusal.find(from); at != std::string::npos) refusal.replace(at, from.size(), to);
  }
  FP8KIT_THROW(ErrorKind::kInvalidArgument, "FP8 export: ", refusal);
}

}  // namespace

Fp8ExportOptions resolve_fp8_export(const PrecisionRecipe& recipe, std::optional<QuantScheme> scheme,
                                    std::optional<CheckpointLayout> layout, bool static_input_scales) {
  Fp8ExportOptions o;
  o.static_input_scales = static_input_scales;
  // The recipe's weight scheme when neither option names one (per-tensor for the recipes without FP8 weights).
  const QuantScheme recipe_scheme =
      recipe.is_fp8() ? scheme_of(granularity_of(recipe, TensorRole::kWeight)).value_or(QuantScheme::kFp8Tensor)
                      : QuantScheme::kFp8Tensor;
  const WeightStorage storage = *resolve_storage(scheme, layout, recipe_scheme);
  o.scheme = storage.scheme;
  o.layout = storage.layout;
  if (auto refusal = layout_refusal(o.layout, o.scheme, o.format)) refuse(*refusal);
  if (static_input_scales) {
    FP8KIT_CHECK(delayed_scaling(recipe), "FP8 export: static input scales come from the amax ",
                 "histories of delayed scaling; ", recipe.name(), " has none (train with --recipe fp8-delayed)");
    if (auto refusal = static_input_scale_refusal(o.layout)) refuse(*refusal + " (--export-layout)");
  }
  return o;
}

Fp8ExportSummary export_fp8_checkpoint(const fs::path& path, Model& model, const TrainConfig& config,
                                       const PrecisionRecipe& recipe, std::int64_t steps_done,
                                       const Fp8ExportOptions& options) {
  if (auto refusal = layout_refusal(options.layout, options.scheme, options.format)) refuse(*refusal);
  const std::string scheme(name(options.scheme)), layout(name(options.layout)), format(name(options.format));
  // What the weights were: float32, or bfloat16 under bf16 master weights (fp8-o2), every parameter alike.
  const std::vector<Parameter*> params = model.parameters();
  FP8KIT_CHECK(!params.empty(), "FP8 export: the ", config.model, " has no parameters");
  const DType master = params.front()->value.dtype();
  for (const Parameter* p : params) {
    FP8KIT_CHECK_KIND(p->value.dtype() == master, ErrorKind::kInternal, "FP8 export: '", p->name, "' is ",
                      name(p->value.dtype()), " where the other parameters are ", name(master));
  }
  const std::string original_dtype(name(master));
  std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"fp8kit.export.recipe", recipe.name()},
      {"fp8kit.export.model", config.model},
      {"fp8kit.export.seed", std::to_string(config.seed)},
      {"fp8kit.export.steps", std::to_string(steps_done)},
      {"fp8kit.export.scheme", scheme},
      {"fp8kit.export.layout", layout},
      {"fp8kit.export.format", format},
      {"fp8kit.export.original_dtype", original_dtype},
      {"fp8kit.export.overflow", "saturate"},
  };
  if (options.static_input_scales) {
    FP8KIT_CHECK(delayed_scaling(recipe), "FP8 export: static input scales need delayed scaling, not ", recipe.name());
    metadata["fp8kit.export.input_scales"] =
        "static: each layer's delayed-scaling input scale_inv (its amax history, algorithm and margin applied)";
  }
  std::map<std::string, const Fp8LayerState*> states;  // by layer name, for the static input scales
  if (options.static_input_scales) {
    for (const Fp8LayerState* st : model.fp8_states()) states[st->layer] = st;
  }
  Fp8ExportSummary summary;
  std::vector<NamedTensor> tensors;
  std::vector<std::string> ignored;  // 2-D weights left FP32, for the quantization_config
  for (const Parameter* p : params) {
    if (skip_reason(p->name, safetensors_dtype(master), p->value.shape())) {
      if (is_linear_weight(*p)) ignored.push_back(p->name);
      summary.kept.push_back(p->name);
      tensors.push_back({p->name, p->value});
      continue;
    }
    QuantizedCheckpointTensor q =
        quantize_checkpoint_tensor(p->name, p->value, options.scheme, options.format, options.layout);
    for (NamedTensor& t : q.tensors) tensors.push_back(std::move(t));
    if (options.static_input_scales) {
      const std::string layer = p->name.substr(0, p->name.size() - std::string_view(".weight").size());
      const auto st = states.find(layer);
      FP8KIT_CHECK(st != states.end(), "FP8 export: '", p->name,
                   "' has no FP8 layer state to take an input scale from");
      const DelayedScaling& input = st->second->input;
      const auto history = input.history();
      // Calibrated: a scale moved off its initial 1, or an amax in the history (with a history of one slot the
      // update clears it, so the scale is the evidence).
      FP8KIT_CHECK(
          input.scale() != 1.0f || std::any_of(history.begin(), history.end(), [](float a) { return a > 0.0f; }),
          "FP8 export: layer '", layer, "' never ran an FP8 GEMM under delayed scaling, so it has no input ",
          "scale to export (train some steps, or lower the small-GEMM threshold)");
      Tensor scale = empty({1}, DType::float32);
      scale.data<float>()[0] = input.scale_inv();
      tensors.push_back({input_scale_name(p->name), std::move(scale)});
    }
    metadata.insert(q.metadata.begin(), q.metadata.end());
    metadata["fp8kit.export.tensor." + p->name] =
        "scheme=" + scheme + ";format=" + format + ";dtype=" + original_dtype + ";overflow=saturate";
    summary.quantized.push_back(p->name);
  }
  FP8KIT_CHECK(!summary.quantized.empty(), "FP8 export: the ", config.model,
               " has no 2-D linear weight to quantize (embeddings, norms, lm_head and convolutions are not quantized)");
  std::vector<SafetensorsEntry> entries;
  for (const NamedTensor& t : tensors) {
    entries.push_back(safetensors_entry(t.name, t.tensor));
    summary.bytes += static_cast<std::uint64_t>(t.tensor.nbytes());
  }

  if (path.extension() == ".safetensors") {
    summary.file = path;
    write_safetensors(path, entries, metadata);
    return summary;
  }
  // A directory, as serving stacks read it: model.safetensors and config.json with the quantization_config, staged
  // and swapped in whole (a failure or a kill leaves the directory as it was or complete, and a failure removes the
  // folders this export made), and a sharded checkpoint an earlier write left there (model-*-of-*.safetensors and
  // its index, which loaders read before model.safetensors) not carried over.
  nlohmann::ordered_json j = {
      {"fp8kit", {{"model", config.model}, {"recipe", recipe.name()}, {"seed", config.seed}, {"steps", steps_done}}},
      {"torch_dtype", original_dtype},
      {"quantization_config",
       nlohmann::ordered_json::parse(quantization_config_json(options.layout, options.scheme, options.format, ignored,
                                                              ScaleRounding::kExact, options.static_input_scales))},
  };
  const std::string text = j.dump(2) + "\n";
  std::error_code ec;
  const fs::path directory_path = path.has_filename() ? path : path.parent_path();
  std::vector<fs::path> missing;  // the folders above it that are not there (not even a link), innermost first
  for (fs::path p = directory_path.parent_path(); !p.empty(); p = p.parent_path()) {
    if (fs::symlink_status(p, ec).type() != fs::file_type::not_found) break;
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  std::vector<fs::path> made;  // the folders this export created, innermost first
  try {
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      const bool created = fs::create_directory(*it, ec);
      FP8KIT_CHECK_KIND(!ec, ErrorKind::kIo, "FP8 export: cannot create directory '", it->string(),
                        "': ", ec.message());
      if (created) made.insert(made.begin(), *it);
    }
    // Staged whole beside the directory and swapped in (AtomicDirectory): the directory's other files stay, an
    // earlier checkpoint's shards and index do not.
    AtomicDirectory directory(directory_path);
    const fs::path w = directory.path();
    ShardOptions one_file;
    one_file.max_shard_bytes = std::numeric_limits<std::uint64_t>::max();
    StagedShards weights = stage_sharded_safetensors(w, entries, metadata, one_file);
    AtomicFile config_file(w / "config.json");
    config_file.write(std::as_bytes(std::span<const char>(text.data(), text.size())));
    config_file.sync();
    for (const fs::path& d : {w / "model.safetensors", w / "config.json"}) {
      FP8KIT_CHECK_KIND(!fs::is_directory(d, ec), ErrorKind::kIo, "FP8 export: cannot write '", d.string(),
                        "': a directory of that name is in the way");
    }
    weights.commit();
    config_file.commit();
    directory.commit([](const fs::path& relative) { return kept_beside_new_checkpoint(relative); });
  } catch (...) {
    for (const fs::path& d : made) fs::remove(d, ec);  // empty once the staged files are gone
    throw;
  }
  summary.file = path / "model.safetensors";
  return summary;
}

}  // namespace fp8kit
