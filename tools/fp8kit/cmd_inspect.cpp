// `fp8kit inspect FILE`: what a safetensors file or checkpoint directory holds: every tensor's dtype, shape and
// bytes, the detected FP8 layout and why, and which weights are quantized with which scales (--json for machines).
#include <fmt/core.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint_io.hpp"
#include "cli_common.hpp"
#include "fp8kit/checkpoint_layout.hpp"
#include "fp8kit/error.hpp"

namespace fp8kit::cli {
namespace {

struct InspectArgs {
  std::string file;
  bool json = false;
};

void run_inspect(const InspectArgs& args) {
  const CheckpointInput in = open_checkpoint_input(args.file);
  const LayoutDetection detection = detect_layout(in.checkpoint, in.config.value_or(""));
  const QuantizationConfig config =
      in.config ? parse_quantization_config(*in.config).value_or(QuantizationConfig{}) : QuantizationConfig{};
  // Roles: weight -> its scales, scale -> its weight.
  std::map<std::string, std::string> role;
  std::vector<QuantizedWeight> weights;
  std::map<std::string, std::string> granularity;
  if (detection.layout) {
    weights = quantized_weights(in.checkpoint, *detection.layout);
    for (const QuantizedWeight& w : weights) {
      try {
        granularity[w.weight] = scale_granularity(*detection.layout, in.checkpoint.at(w.weight),
                                                  in.checkpoint.at(w.scale), config, in.metadata)
                                    .name();
      } catch (const Error& e) {  // shown, not fatal: inspect is how one finds out what is wrong
        granularity[w.weight] = std::string("invalid: ") + e.what();
      }
      role[w.weight] = "weight (" + granularity[w.weight] + ", scale " + w.scale + ")";
      role[w.scale] = "scale of " + w.weight;
      if (w.input_scale) role[*w.input_scale] = "input scale of " + w.weight;
    }
  }
  std::uint64_t total = 0;
  for (const SafetensorsTensor* t : in.checkpoint.tensors()) total += t->bytes.size();
  const std::string layout = detection.layout ? std::string(name(*detection.layout)) : "none";

  if (args.json) {
    nlohmann::ordered_json out;
    out["path"] = args.file;
    out["shards"] = in.checkpoint.shards().size();
    out["layout"] = detection.layout ? nlohmann::ordered_json(layout) : nlohmann::ordered_json(nullptr);
    out["evidence"] = detection.evidence;
    out["total_bytes"] = total;
    out["tensors"] = nlohmann::ordered_json::array();
    for (const SafetensorsTensor* t : in.checkpoint.tensors()) {
      nlohmann::ordered_json e = {{"name", t->name},
                                  {"dtype", std::string(name(t->dtype))},
                                  {"shape", t->shape},
                                  {"bytes", t->bytes.size()},
                                  {"shard", in.checkpoint.weight_map().count(t->name)
                                                ? in.checkpoint.weight_map().at(t->name)
                                                : in.checkpoint.shards().front().path().filename().string()}};
      e["role"] = role.count(t->name) ? nlohmann::ordered_json(role.at(t->name)) : nlohmann::ordered_json(nullptr);
      out["tensors"].push_back(e);
    }
    out["quantized"] = nlohmann::ordered_json::array();
    for (const QuantizedWeight& w : weights) {
      out["quantized"].push_back(
          {{"weight", w.weight},
           {"scale", w.scale},
           {"input_scale", w.input_scale ? nlohmann::ordered_json(*w.input_scale) : nlohmann::ordered_json(nullptr)},
           {"granularity", granularity.at(w.weight)}});
    }
    fmt::print("{}\n", out.dump(2));
    return;
  }
  fmt::print("{}: {} tensors in {} shard{}, {} bytes\n", args.file, in.checkpoint.size(), in.checkpoint.shards().size(),
             in.checkpoint.shards().size() == 1 ? "" : "s", total);
  fmt::print("layout: {} ({})\n", layout, detection.evidence);
  fmt::print("quantized weights: {}\n", weights.size());
  std::size_t width = 4;
  for (const SafetensorsTensor* t : in.checkpoint.tensors()) width = std::max(width, t->name.size());
  width = std::min<std::size_t>(width, 72);
  fmt::print("{:<{}} {:<11} {:<18} {:>12}  {}\n", "name", width, "dtype", "shape", "bytes", "role");
  for (const SafetensorsTensor* t : in.checkpoint.tensors()) {
    fmt::print("{:<{}} {:<11} {:<18} {:>12}  {}\n", t->name, width, name(t->dtype), shape_string(t->shape),
               t->bytes.size(), role.count(t->name) ? role.at(t->name) : "");
  }
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "List a safetensors file's or checkpoint's tensors, its FP8 layout and its quantized weights");
  cmd->add_option("FILE", args->file, "A .safetensors file, or a directory with model.safetensors.index.json")
      ->required();
  cmd->add_flag("--json", args->json, "Print a JSON object instead of the table");
  cmd->callback([args] { run_inspect(*args); });
}

}  // namespace fp8kit::cli
