// `fp8kit quantize IN OUT --scheme S --layout L`: a bf16/f16/f32 checkpoint to FP8 weights in a layout vLLM and
// Hugging Face load (DeepSeek, compressed-tensors, AutoFP8, FBGEMM, MXFP8) or fp8kit's native one, tensor by tensor.
#include <fmt/core.h>

#include <chrono>

#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>

#include "checkpoint_io.hpp"
#include "cli_common.hpp"
#include "fp8kit/io/checkpoint_layout.hpp"

namespace fp8kit::cli {
namespace {

struct QuantizeArgs {
  std::string in, out;
  std::string scheme;
  std::string format = "e4m3fn";
  std::string layout;
  std::vector<std::string> ignore;
  bool force = false;
  bool json = false;
  std::string max_shard_size;
  std::string scale_fmt = "float";
};

// Scales of quantized weights whose fill ran before their scale's (the writer lays tensors out by dtype, so either
// may come first); the FP8 codes are never kept, so memory stays at the writer's two buffers.
struct ScaleCache {
  std::map<std::string, Tensor> pending;  // computed with the weight, not yet written
  std::set<std::string> written;
};

void run_quantize(const QuantizeArgs& args) {
  const auto start = std::chrono::steady_clock::now();
  std::optional<QuantScheme> scheme;
  if (!args.scheme.empty() && !(scheme = parse_quant_scheme(args.scheme))) {
    throw UsageError("unknown --scheme '" + args.scheme + "' (use fp8-tensor, fp8-channel, fp8-block, mxfp8)");
  }
  const auto format = parse_format(args.format);
  if (!format || !(*format == Format::e4m3fn || *format == Format::e5m2)) {
    throw UsageError("--format must be e4m3fn or e5m2, not '" + args.format + "'");
  }
  std::optional<CheckpointLayout> named_layout;
  if (!args.layout.empty() && !(named_layout = parse_checkpoint_layout(args.layout))) {
    throw UsageError("unknown --layout '" + args.layout +
                     "' (use deepseek, compressed-tensors, autofp8, fbgemm, mxfp8, native)");
  }
  const std::optional<WeightStorage> storage = resolve_storage(scheme, named_layout);
  if (!storage) {
    if (!named_layout) {
      throw UsageError(
          "--scheme is needed (fp8-tensor, fp8-channel, fp8-block, mxfp8), or a --layout that stores one "
          "scheme (deepseek, autofp8, fbgemm, mxfp8)");
    }
    std::string stored;
    for (QuantScheme s : kAllQuantSchemes) {
      if (!layout_refusal(*named_layout, s, Format::e4m3fn))
        stored += (stored.empty() ? "" : ", ") + std::string(name(s));
    }
    throw UsageError("--scheme is needed: the " + args.layout + " layout stores more than one scheme (give --scheme " +
                     stored + ")");
  }
  scheme = storage->scheme;
  const CheckpointLayout layout = storage->layout;
  if (auto refusal = layout_refusal(layout, *scheme, *format)) throw UsageError(*refusal);
  if (args.scale_fmt != "float" && args.scale_fmt != "ue8m0") {
    throw UsageError("--scale-fmt must be float or ue8m0, not '" + args.scale_fmt + "'");
  }
  const ScaleRounding rounding = args.scale_fmt == "ue8m0" ? ScaleRounding::kPowerOfTwoDown : ScaleRounding::kExact;
  if (rounding == ScaleRounding::kPowerOfTwoDown && *scheme == QuantScheme::kMxfp8) {
    throw UsageError("--scale-fmt ue8m0 is for FP8 scales; mxfp8's scales are E8M0 powers of two already");
  }
  std::vector<std::regex> ignore;
  for (const std::string& r : args.ignore) {
    try {
      ignore.emplace_back(r, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw UsageError("--ignore '" + r + "' is not a regular expression: " + e.what());
    }
  }
  return_large_buffers_to_os();  // memory: about the largest tensor, however many there are
  const CheckpointInput in = open_checkpoint_input(args.in);
  check_output(in, args.out, args.force, args.max_shard_size);
  if (const LayoutDetection d = detect_layout(in.checkpoint, in.config.value_or("")); d.layout) {
    throw UsageError("'" + args.in + "' is already quantized (" + std::string(name(*d.layout)) + ": " + d.evidence +
                     "); dequantize it first");
  }
  auto cache = std::make_shared<ScaleCache>();
  auto progress = std::make_shared<Progress>("quantize");
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata = carried_metadata(in);  // the input's, less fp8kit's own
  std::vector<std::string> ignored;  // 2-D float weights left as they are, for the quantization_config
  std::size_t quantized = 0, matched_ignore = 0;
  std::size_t partial_blocks = 0;  // deepseek weights with partial edge blocks on a side of several blocks
  std::string first_partial;
  for (const SafetensorsTensor* t : in.checkpoint.tensors()) {
    const auto reason = skip_reason(t->name, t->dtype, t->shape, ignore);
    if (reason) {
      if (*reason == kMatchesIgnore) ++matched_ignore;  // a weight the patterns keep from being quantized
      if (t->shape.size() == 2 && tensor_dtype(t->dtype) && is_floating(*tensor_dtype(t->dtype)) &&
          t->name.size() > 7 && t->name.compare(t->name.size() - 7, 7, ".weight") == 0) {
        ignored.push_back(t->name);
      }
      entries.push_back(safetensors_entry(*t));
      continue;
    }
    const DType dtype = *tensor_dtype(t->dtype);
    const std::vector<PlannedTensor> plan =
        planned_checkpoint_tensors(t->name, t->shape, dtype, *scheme, *format, layout);
    for (const auto& [k, v] : layout_metadata(t->name, dtype, *scheme, *format, layout)) metadata[k] = v;
    const std::string scale_key = plan[1].name;
    SafetensorsEntry weight{plan[0].name, safetensors_dtype(plan[0].dtype), plan[0].shape, {}, {}};
    progress->expect(t->bytes.size());
    // The codes straight from the mapped input into the writer's buffer.
    weight.fill = [t, s = *scheme, f = *format, layout, rounding, cache, scale_key,
                   progress](std::span<std::byte> out) {
      progress->step(t->name, t->bytes.size());
      const Tensor scale = quantize_checkpoint_tensor_into(*t, s, f, layout, rounding, out);
      if (!cache->written.count(scale_key)) cache->pending[scale_key] = scale;
    };
    // A scale the writer lays out before its weight comes from an amax pass alone (the weight's fill quantizes
    // again, to the same scale).
    SafetensorsEntry scale{plan[1].name, safetensors_dtype(plan[1].dtype), plan[1].shape, {}, {}};
    scale.fill = [t, s = *scheme, f = *format, layout, rounding, cache, scale_key](std::span<std::byte> out) {
      const auto it = cache->pending.find(scale_key);
      const Tensor st = it != cache->pending.end() ? it->second : quantize_checkpoint_scale(*t, s, f, layout, rounding);
      std::memcpy(out.data(), st.raw(), out.size());
      if (it != cache->pending.end()) cache->pending.erase(it);
      cache->written.insert(scale_key);
    };
    entries.push_back(std::move(weight));
    entries.push_back(std::move(scale));
    ++quantized;
    // A side of more than one block that is not a multiple of 128 (a side of one block, 64 say, reads right anyway)
    const auto partial_side = [](std::int64_t side) { return side > 128 && side % 128 != 0; };
    if (layout == CheckpointLayout::kDeepSeek && (partial_side(t->shape[0]) || partial_side(t->shape[1]))) {
      if (partial_blocks++ == 0) first_partial = fmt::format("{} [{}, {}]", t->name, t->shape[0], t->shape[1]);
    }
  }
  if (quantized == 0 && matched_ignore > 0) {
    throw UsageError("every weight of '" + args.in + "' (" + std::to_string(matched_ignore) +
                     ") matches --ignore, so nothing is left to quantize; narrow the --ignore patterns");
  }
  if (quantized == 0) throw UsageError("'" + args.in + "' has no weight to quantize (2-D float '.weight' tensors)");
  std::optional<std::string> config_out;
  if (in.is_directory) {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    if (in.config) {
      j = nlohmann::ordered_json::parse(*in.config, nullptr, false);
      if (j.is_discarded() || !j.is_object()) throw UsageError("'" + args.in + "/config.json' is not a JSON object");
    }
    j["quantization_config"] =
        nlohmann::ordered_json::parse(quantization_config_json(layout, *scheme, *format, ignored, rounding));
    config_out = j.dump(2) + "\n";
  }
  const CompanionFiles files =
      write_checkpoint_output(in, args.out, std::move(entries), metadata, config_out, args.max_shard_size);
  progress.reset();
  if (args.json) {
    print_json_report({"quantize",
                       args.in,
                       args.out,
                       "quantized",
                       quantized,
                       in.checkpoint.size() - quantized,
                       input_bytes(in),
                       safetensors_bytes(args.out),
                       seconds_since(start),
                       {{"scheme", std::string(name(*scheme))},
                        {"format", std::string(name(*format))},
                        {"layout", std::string(name(layout))},
                        {"scale_fmt", args.scale_fmt}},
                       {{"partial_block_weights", partial_blocks}},
                       files});
    note_left_out(files);
    return;
  }
  // Partial edge blocks are the deepseek layout's (fp8kit and compressed-tensors read them so), but a reader that
  // takes the block size from shape / grid misreads them, silently: said on the line, with the first such weight.
  const std::string partial =
      partial_blocks == 0
          ? ""
          : fmt::format(
                "; {} with partial edge blocks (first: {}), which Hugging Face transformers' FP8 dequantization "
                "(5.25) misreads or refuses",
                partial_blocks, first_partial);
  fmt::print(output(), "{} -> {}: quantized {} ({} {}, {} layout{}{}); {} copied as they are{}\n", args.in, args.out,
             counted(quantized, "weight"), name(*scheme), name(*format), name(layout),
             rounding == ScaleRounding::kPowerOfTwoDown ? ", ue8m0 scales" : "", partial,
             counted(in.checkpoint.size() - quantized, "tensor"), other_files(files));
  note_left_out(files);
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "quantize", "Quantize a checkpoint's linear weights to FP8 in a layout vLLM / Hugging Face load, or native");
  cmd->add_option("IN", args->in, "A .safetensors file or a checkpoint directory (bf16/f16/f32 weights)")->required();
  cmd->add_option("OUT", args->out, "The output file (.safetensors) or directory")->required();
  cmd->add_option("--scheme", args->scheme,
                  "fp8-tensor, fp8-channel, fp8-block (128x128), mxfp8 (1x32, E8M0); default: the one --layout stores");
  cmd->add_option("--format", args->format, "e4m3fn (default) or e5m2 (native layout only)");
  cmd->add_option("--layout", args->layout,
                  "deepseek, compressed-tensors, autofp8, fbgemm, mxfp8, native (default: deepseek for fp8-block, "
                  "mxfp8 for mxfp8, compressed-tensors otherwise)");
  // One regex per occurrence (a vector option would take the words after it too, and show "REGEX ...").
  cmd->add_option_function<std::string>(
         "--ignore", [args](const std::string& regex) { args->ignore.push_back(regex); },
         "Leave tensors whose name matches this regex as they are (one regex per --ignore; repeatable)")
      ->type_name("REGEX")
      ->trigger_on_parse()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--max-shard-size", args->max_shard_size, kMaxShardSizeHelp);
  cmd->add_option("--scale-fmt", args->scale_fmt,
                  "float (default) or ue8m0: power-of-two scales 2^ceil(log2(amax/448)), DeepSeek-V3.1's scale_fmt");
  cmd->add_flag("--force", args->force, "Replace an existing output");
  add_quiet_flag(cmd);
  cmd->add_flag("--json", args->json, kCheckpointJsonHelp);
  cmd->callback([args] { run_quantize(*args); });
}

}  // namespace fp8kit::cli
