// `fp8kit convert IN OUT --to DTYPE`: every floating tensor of a checkpoint cast to one dtype (no scales; FP8
// targets are a plain cast that saturates unless --no-saturate), tensor by tensor; integer and bool tensors copied.
#include <fmt/core.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint_io.hpp"
#include "cli_common.hpp"
#include "fp8kit/io/checkpoint_layout.hpp"

namespace fp8kit::cli {
namespace {

struct ConvertArgs {
  std::string in, out;
  std::string to;
  OverflowFlags overflow;
  bool force = false;
  bool json = false;
  std::string max_shard_size;
};

void run_convert(const ConvertArgs& args) {
  const auto start = std::chrono::steady_clock::now();
  const auto to = parse_dtype(args.to);
  if (!to || !is_floating(*to) || *to == DType::float8_e8m0fnu) {
    throw UsageError("--to must be a floating dtype (f32, f64, f16, bf16, e4m3fn, e5m2, e4m3fnuz, e5m2fnuz), not '" +
                     args.to + "'");
  }
  if (args.overflow.given() && !is_fp8(*to)) {
    throw UsageError(std::string(args.overflow.saturate ? "--saturate" : "--no-saturate") +
                     " applies to FP8 targets only");
  }
  const Overflow overflow = args.overflow.overflow();
  return_large_buffers_to_os();  // memory: about the largest tensor, however many there are
  const CheckpointInput in = open_checkpoint_input(args.in);
  check_output(in, args.out, args.force, args.max_shard_size);
  if (const LayoutDetection d = detect_layout(in.checkpoint, in.config.value_or("")); d.layout) {
    throw UsageError("'" + args.in + "' is quantized (" + std::string(name(*d.layout)) +
                     "); casting would separate its weights from their scales: use fp8kit dequantize");
  }
  std::vector<SafetensorsEntry> entries;
  std::size_t cast = 0, copied = 0;
  auto progress = std::make_shared<Progress>("convert");
  auto overflowed = std::make_shared<OverflowCount>();
  for (const SafetensorsTensor* t : in.checkpoint.tensors()) {
    const auto from = tensor_dtype(t->dtype);
    if (!from || !is_floating(*from) || *from == DType::float8_e8m0fnu || *from == *to) {
      entries.push_back(safetensors_entry(*t));
      ++copied;
      continue;
    }
    SafetensorsEntry e{t->name, safetensors_dtype(*to), t->shape, {}, {}};
    progress->expect(t->bytes.size());
    e.fill = [t, from = *from, dtype = *to, overflow, progress, overflowed](std::span<std::byte> out) {
      progress->step(t->name, t->bytes.size());
      convert_tensor_into(*t, dtype, overflow, out);
      overflowed->add(t->name, t->bytes, from, out, dtype);
    };
    entries.push_back(std::move(e));
    ++cast;
  }
  // (only a non-saturating FP8 target or a narrower float can overflow)
  const std::string advice = is_fp8(*to)
                                 ? "--saturate keeps the largest finite value; fp8kit quantize scales into range"
                             : *to == DType::float16  ? "convert to bf16, f32 or f64 (wider ranges) to keep them"
                             : *to == DType::float64  ? "the input holds them: a damaged file?"
                             : *to == DType::bfloat16 ? "convert to f32 or f64 to keep them"
                                                      : "convert to f64 to keep them";
  std::optional<std::string> config_out;
  if (in.config) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(*in.config, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw UsageError("'" + args.in + "/config.json' is not a JSON object");
    if (j.contains("torch_dtype") && !is_fp8(*to)) j["torch_dtype"] = std::string(name(*to));
    config_out = j.dump(2) + "\n";
  }
  const CompanionFiles files =
      write_checkpoint_output(in, args.out, std::move(entries), carried_metadata(in), config_out, args.max_shard_size);
  progress.reset();
  if (args.json) {
    CheckpointReport r{"convert",
                       args.in,
                       args.out,
                       "cast",
                       cast,
                       copied,
                       input_bytes(in),
                       safetensors_bytes(args.out),
                       seconds_since(start),
                       {{"to", std::string(name(*to))}},
                       {{"overflowed", overflowed->values()}},
                       files};
    if (is_fp8(*to))
      r.details.emplace_back("overflow", overflow == Overflow::kSaturate ? "saturate" : "non-saturating");
    print_json_report(r);
    note_left_out(files);
    overflowed->note(*to, advice);
    return;
  }
  fmt::print(output(), "{} -> {}: cast {} to {}{}; copied {}{}\n", args.in, args.out, counted(cast, "tensor"),
             name(*to), is_fp8(*to) ? (overflow == Overflow::kSaturate ? " (saturating)" : " (non-saturating)") : "",
             counted(copied, "tensor"), other_files(files));
  note_left_out(files);
  overflowed->note(*to, advice);
}

}  // namespace

void add_convert_command(CLI::App& app) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand("convert", "Cast every floating tensor of a checkpoint to one dtype (no scales)");
  cmd->add_option("IN", args->in, "A .safetensors file or a checkpoint directory")->required();
  cmd->add_option("OUT", args->out, "The output file (.safetensors) or directory")->required();
  cmd->add_option("--to", args->to, "f32, f64, f16, bf16, e4m3fn, e5m2, e4m3fnuz, e5m2fnuz")->required();
  add_overflow_flags(cmd, args->overflow);
  cmd->add_option("--max-shard-size", args->max_shard_size, kMaxShardSizeHelp);
  cmd->add_flag("--force", args->force, "Replace an existing output");
  add_quiet_flag(cmd);
  cmd->add_flag("--json", args->json, kCheckpointJsonHelp);
  cmd->callback([args] { run_convert(*args); });
}

}  // namespace fp8kit::cli
