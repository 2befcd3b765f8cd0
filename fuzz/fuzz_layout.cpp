// Checkpoint layout detection and the readers behind `fp8kit dequantize` / `inspect` on any checkpoint: the input is
// a config.json text and a safetensors file (fuzz_support.hpp's split: the config, kSeparator, the file; without a
// separator, no config). The layout is detected (from the config's quantization_config, the file's metadata or its
// tensors), every quantized weight it finds is read with its scale and dequantized, and every weight `quantize`
// would take is quantized into each layout — each accepted or refused with one line.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "fp8kit/io/checkpoint_layout.hpp"
#include "fp8kit/io/safetensors.hpp"
#include "fp8kit/io/sharded_checkpoint.hpp"
#include "fuzz_support.hpp"

using namespace fp8kit;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto parts = fuzz::split({data, size});
  const std::string_view config = parts.first;  // (a structured binding cannot be captured by the lambdas below)
  const std::span<const std::uint8_t> file = parts.second;
  const std::filesystem::path path = fuzz::scratch() / "model.safetensors";
  fuzz::write_file(path, file);
  std::optional<ShardedCheckpoint> checkpoint;
  if (!fuzz::accepted([&] { checkpoint.emplace(ShardedCheckpoint::open(path)); })) return 0;
  std::optional<QuantizationConfig> quantization;
  if (!fuzz::accepted([&] { quantization = parse_quantization_config(config); })) return 0;

  fuzz::accepted([&] {
    const LayoutDetection detection = detect_layout(*checkpoint, config);
    fuzz::check(!detection.evidence.empty(), "a layout detected without evidence");
    if (!detection.layout) return;
    for (const QuantizedWeight& q : quantized_weights(*checkpoint, *detection.layout)) {
      fuzz::accepted([&] {
        (void)dequantize_checkpoint_tensor(*detection.layout, checkpoint->at(q.weight), checkpoint->at(q.scale),
                                           DType::bfloat16, quantization.value_or(QuantizationConfig{}),
                                           checkpoint->shards().front().metadata());
      });
    }
  });
  for (const SafetensorsTensor* t : checkpoint->tensors()) {
    if (skip_reason(t->name, t->dtype, t->shape)) continue;
    fuzz::accepted([&] {
      const Tensor tensor = to_tensor(*t);
      for (const CheckpointLayout layout : kAllCheckpointLayouts) {
        const QuantScheme scheme = implied_scheme(layout).value_or(QuantScheme::kFp8Block);
        fuzz::accepted([&] { (void)quantize_checkpoint_tensor(t->name, tensor, scheme, Format::e4m3fn, layout); });
      }
    });
  }
  return 0;
}
