// The sharded checkpoint's index reader on any text: the input is model.safetensors.index.json in a directory of
// two fixed shards (model-00001-of-00002.safetensors: a.weight F8_E4M3 [2,4] and a.weight_scale_inv F32 [1,1];
// model-00002-of-00002.safetensors: b BF16 [3]). An index it accepts maps every tensor of the shards it names to
// the shard that holds it; the checkpoint's layout is detected and its quantized weights read (or refused, one line).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "fp8kit/common/text.hpp"
#include "fp8kit/io/checkpoint_layout.hpp"
#include "fp8kit/io/safetensors.hpp"
#include "fp8kit/io/sharded_checkpoint.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace fp8kit;
using fuzz::check;

void write_shard(const std::filesystem::path& path, const std::vector<SafetensorsEntry>& entries) {
  const std::vector<std::byte> image = serialize_safetensors(entries);
  fuzz::write_file(path, {reinterpret_cast<const std::uint8_t*>(image.data()), image.size()});
}

const std::filesystem::path& checkpoint_directory() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path d = fuzz::scratch() / "sharded";
    std::filesystem::create_directories(d);
    static const std::byte codes[8] = {std::byte{0x38}, std::byte{0xB8}, std::byte{0x40}, std::byte{0x00},
                                       std::byte{0x7E}, std::byte{0x01}, std::byte{0x80}, std::byte{0x30}};
    static const float scale = 0.5f;
    static const std::uint16_t b[3] = {0x3F80, 0xBF80, 0x0000};
    write_shard(d / "model-00001-of-00002.safetensors",
                {{"a.weight", SafetensorsDType::F8_E4M3, {2, 4}, std::as_bytes(std::span(codes)), {}},
                 {"a.weight_scale_inv", SafetensorsDType::F32, {1, 1}, std::as_bytes(std::span(&scale, 1)), {}}});
    write_shard(d / "model-00002-of-00002.safetensors",
                {{"b", SafetensorsDType::BF16, {3}, std::as_bytes(std::span(b)), {}}});
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::filesystem::path& dir = checkpoint_directory();
  fuzz::write_file(dir / std::string(kSafetensorsIndexName), {data, size});
  std::optional<ShardedCheckpoint> checkpoint;
  if (!fuzz::accepted([&] { checkpoint.emplace(ShardedCheckpoint::open(dir)); })) return 0;
  // The shards are the files the index names (a shard it does not name is no part of the checkpoint, as in Hugging
  // Face's loaders), and each of them is mapped whole.
  std::size_t held = 0;
  for (const SafetensorsFile& shard : checkpoint->shards()) held += shard.tensors().size();
  check(checkpoint->size() == held && checkpoint->tensors().size() == held,
        "an index accepted that does not map every tensor of its shards");
  for (const auto& [name, shard] : checkpoint->weight_map()) {
    const SafetensorsTensor* t = checkpoint->find(name);
    check(t != nullptr && t->name == name, "the weight_map names " + printable(name) + ", which cannot be found");
    check(name == "b" ? shard == "model-00002-of-00002.safetensors" : shard == "model-00001-of-00002.safetensors",
          "an index accepted that maps " + printable(name) + " to " + printable(shard));
  }
  fuzz::accepted([&] {
    const LayoutDetection detection = detect_layout(*checkpoint);
    if (!detection.layout) return;
    for (const QuantizedWeight& q : quantized_weights(*checkpoint, *detection.layout)) {
      (void)dequantize_checkpoint_tensor(*detection.layout, checkpoint->at(q.weight), checkpoint->at(q.scale),
                                         DType::float32, {}, checkpoint->shards().front().metadata());
    }
  });
  return 0;
}
