// `fp8kit dequantize IN OUT`: an FP8 checkpoint (any layout fp8kit detects) back to bf16/f16/f32, on the CPU,
// tensor by tensor (memory: about one tensor); scales dropped, other tensors copied, quantization_config removed.
#include <fmt/core.h>

#include <chrono>

#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "checkpoint_io.hpp"
#include "cli_common.hpp"
#include "fp8kit/io/checkpoint_layout.hpp"

namespace fp8kit::cli {
namespace {

struct DequantizeArgs {
  std::string in, out;
  std::string to = "bf16";
  bool force = false;
  bool json = false;
  std::string max_shard_size;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// KV-cache and activation scales only mean something next to FP8 weights.
bool is_activation_scale(const std::string& name) {
  for (const char* s : {".k_scale", ".v_scale", ".q_scale", ".output_scale", ".input_scale"}) {
    if (ends_with(name, s)) return true;
  }
  return false;
}

void run_dequantize(const DequantizeArgs& args) {
  const auto start = std::chrono::steady_clock::now();
  const auto to = parse_dtype(args.to);
  if (!to || !(*to == DType::bfloat16 || *to == DType::float16 || *to == DType::float32)) {
    throw UsageError("--to must be bf16, f16 or f32, not '" + args.to + "'");
  }
  return_large_buffers_to_os();  // memory: about the largest tensor, however many there are
  const CheckpointInput in = open_checkpoint_input(args.in);
  check_output(in, args.out, args.force, args.max_shard_size);
  const LayoutDetection detection = detect_layout(in.checkpoint, in.config.value_or(""));
  if (!detection.layout) {
    throw UsageError("'" + args.in + "' has no quantized FP8 weights (" + detection.evidence +
                     "); to change dtypes use fp8kit convert");
  }
  const CheckpointLayout layout = *detection.layout;
  const QuantizationConfig config =
      in.config ? parse_quantization_config(*in.config).value_or(QuantizationConfig{}) : QuantizationConfig{};
  const std::vector<QuantizedWeight> weights = quantized_weights(in.checkpoint, layout);
  std::map<std::string, const QuantizedWeight*> by_weight;
  std::set<std::string> dropped;
  for (const QuantizedWeight& w : weights) {
    by_weight[w.weight] = &w;
    dropped.insert(w.scale);
    if (w.input_scale) dropped.insert(*w.input_scale);
  }
  std::vector<SafetensorsEntry> entries;
  std::size_t copied = 0, unscaled_fp8 = 0;
  auto progress = std::make_shared<Progress>("dequantize");
  auto overflow = std::make_shared<OverflowCount>();
  for (const SafetensorsTensor* t : in.checkpoint.tensors()) {
    if (auto it = by_weight.find(t->name); it != by_weight.end()) {
      const SafetensorsTensor& scale = in.checkpoint.at(it->second->scale);
      scale_granularity(layout, *t, scale, config, in.metadata);  // every pair checked before anything is written
      SafetensorsEntry e{t->name, safetensors_dtype(*to), t->shape, {}, {}};
      progress->expect(t->bytes.size());
      e.fill = [t, &scale, layout, config, &in, dtype = *to, progress, overflow](std::span<std::byte> out) {
        progress->step(t->name, t->bytes.size());
        dequantize_checkpoint_tensor_into(layout, *t, scale, dtype, out, config, in.metadata);
        overflow->add(t->name, t->bytes, *tensor_dtype(t->dtype), out, dtype);
      };
      entries.push_back(std::move(e));
      continue;
    }
    if (dropped.count(t->name) || is_activation_scale(t->name)) continue;
    if (tensor_dtype(t->dtype) && is_fp8(*tensor_dtype(t->dtype))) {
      // A scale under another layout's name: two layouts in one checkpoint, which would come out half quantized.
      for (const CheckpointLayout other :
           {CheckpointLayout::kDeepSeek, CheckpointLayout::kNative, CheckpointLayout::kCompressedTensors}) {
        if (const std::string s = scale_name(t->name, other); in.checkpoint.find(s) != nullptr) {
          throw UsageError("'" + t->name + "' has its scale as '" + s + "', but this checkpoint reads as " +
                           std::string(name(layout)) + " (" + detection.evidence + "), whose scale would be '" +
                           scale_name(t->name, layout) +
                           "': one checkpoint is read in one layout: rename its scales to one layout's names");
        }
      }
      ++unscaled_fp8;
    }
    entries.push_back(safetensors_entry(*t));
    ++copied;
  }
  std::map<std::string, std::string> metadata = carried_metadata(in);  // the input's, less fp8kit's own
  std::optional<std::string> config_out;
  if (in.config) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(*in.config, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw UsageError("'" + args.in + "/config.json' is not a JSON object");
    j.erase("quantization_config");
    if (j.contains("torch_dtype")) j["torch_dtype"] = std::string(name(*to));
    config_out = j.dump(2) + "\n";
  }
  const CompanionFiles files =
      write_checkpoint_output(in, args.out, std::move(entries), metadata, config_out, args.max_shard_size);
  progress.reset();
  const std::size_t dropped_scales = in.checkpoint.size() - weights.size() - copied;
  if (args.json) {
    print_json_report({"dequantize",
                       args.in,
                       args.out,
                       "dequantized",
                       weights.size(),
                       copied,
                       input_bytes(in),
                       safetensors_bytes(args.out),
                       seconds_since(start),
                       {{"layout", std::string(name(layout))}, {"to", std::string(name(*to))}},
                       {{"dropped_scales", dropped_scales},
                        {"unscaled_fp8_copied", unscaled_fp8},
                        {"overflowed", overflow->values()}},
                       files});
  } else {
    fmt::print(output(), "{} -> {}: dequantized {} to {}; copied {}, dropped {}{}\n", args.in, args.out,
               counted(weights.size(), std::string(name(layout)) + " weight"), name(*to), counted(copied, "tensor"),
               counted(dropped_scales, "scale"), other_files(files));
  }
  note_left_out(files);
  overflow->note(*to,
                 *to == DType::float16 ? "dequantize --to bf16 or f32 keeps them"
                 : *to == DType::bfloat16
                     ? "dequantize --to f32 keeps those below 3.4e38 (larger ones mean scales past float32's range: "
                       "a damaged file?)"
                     : "their scales are past float32's range (a damaged file?)");
  if (unscaled_fp8 != 0) {
    fmt::print(stderr, "note: {} without a scale {} copied as they {}\n", counted(unscaled_fp8, "FP8 tensor"),
               unscaled_fp8 == 1 ? "was" : "were", unscaled_fp8 == 1 ? "is" : "are");
  }
}

}  // namespace

void add_dequantize_command(CLI::App& app) {
  auto args = std::make_shared<DequantizeArgs>();
  CLI::App* cmd = app.add_subcommand("dequantize",
                                     "FP8 checkpoint (DeepSeek, compressed-tensors, AutoFP8, FBGEMM, MXFP8, native) "
                                     "back to bf16/f16/f32 on the CPU");
  cmd->add_option("IN", args->in, "A .safetensors file or a checkpoint directory")->required();
  cmd->add_option("OUT", args->out, "The output file (.safetensors) or directory")->required();
  cmd->add_option("--to", args->to, "Output dtype: bf16 (default), f16, f32");
  cmd->add_option("--max-shard-size", args->max_shard_size, kMaxShardSizeHelp);
  cmd->add_flag("--force", args->force, "Replace an existing output");
  add_quiet_flag(cmd);
  cmd->add_flag("--json", args->json, kCheckpointJsonHelp);
  cmd->callback([args] { run_dequantize(*args); });
}

}  // namespace fp8kit::cli
