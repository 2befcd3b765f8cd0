// Test helper for check_safetensors_interop.py: reads safetensors files and checkpoints with fp8kit and prints
// them as JSON (bytes in hex), and writes files described by a JSON spec. Errors: one line on stderr, exit 2.
//   safetensors_dump read FILE                        -> {"header_size", "metadata", "tensors": [...]} (file order)
//   safetensors_dump read-checkpoint PATH             -> {"index_metadata", "weight_map", "tensors": [...]}
//   safetensors_dump write OUT SPEC.json              -> SPEC: {"metadata": {...}, "tensors": [{name, dtype, shape,
//                                                        hex}]}
//   safetensors_dump write-sharded DIR SPEC.json MAX  -> prints the written file names as a JSON list
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fp8kit/common/error.hpp"
#include "fp8kit/io/safetensors.hpp"
#include "fp8kit/io/sharded_checkpoint.hpp"

using namespace fp8kit;
using nlohmann::ordered_json;

namespace {

std::string to_hex(std::span<const std::byte> bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (std::byte b : bytes) {
    s += kHex[static_cast<unsigned>(b) >> 4];
    s += kHex[static_cast<unsigned>(b) & 15];
  }
  return s;
}

std::vector<std::byte> from_hex(const std::string& hex) {
  FP8KIT_CHECK(hex.size() % 2 == 0, "odd hex length");
  std::vector<std::byte> out(hex.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<std::byte>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

ordered_json describe(const SafetensorsTensor& t) {
  return {{"name", t.name},
          {"dtype", std::string(name(t.dtype))},
          {"shape", t.shape},
          {"data_offsets", {t.begin, t.end}},
          {"hex", to_hex(t.bytes)}};
}

// The spec's entries; `storage` keeps their bytes alive.
std::vector<SafetensorsEntry> entries_of(const nlohmann::json& spec, std::vector<std::vector<std::byte>>& storage,
                                         std::map<std::string, std::string>& metadata) {
  if (spec.contains("metadata")) metadata = spec["metadata"].get<std::map<std::string, std::string>>();
  std::vector<SafetensorsEntry> entries;
  storage.reserve(spec["tensors"].size());
  for (const auto& t : spec["tensors"]) {
    const auto dtype = parse_safetensors_dtype(t["dtype"].get<std::string>());
    FP8KIT_CHECK(dtype.has_value(), "unknown dtype in the spec");
    storage.push_back(from_hex(t["hex"].get<std::string>()));
    entries.push_back({t["name"].get<std::string>(), *dtype, t["shape"].get<Shape>(), storage.back(), {}});
  }
  return entries;
}

nlohmann::json read_json(const char* path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

int run(const std::vector<std::string>& args) {
  if (args.size() == 2 && args[0] == "read") {
    const SafetensorsFile f = SafetensorsFile::open(args[1]);
    ordered_json out = {
        {"header_size", f.header_size()}, {"metadata", f.metadata()}, {"tensors", ordered_json::array()}};
    for (const SafetensorsTensor& t : f.tensors()) out["tensors"].push_back(describe(t));
    std::cout << out.dump() << "\n";
    return 0;
  }
  if (args.size() == 2 && args[0] == "read-checkpoint") {
    const ShardedCheckpoint c = ShardedCheckpoint::open(args[1]);
    ordered_json out = {
        {"index_metadata", c.index_metadata()}, {"weight_map", c.weight_map()}, {"tensors", ordered_json::array()}};
    for (const SafetensorsTensor* t : c.tensors()) out["tensors"].push_back(describe(*t));
    std::cout << out.dump() << "\n";
    return 0;
  }
  if (args.size() == 3 && args[0] == "write") {
    std::vector<std::vector<std::byte>> storage;
    std::map<std::string, std::string> metadata;
    const auto entries = entries_of(read_json(args[2].c_str()), storage, metadata);
    write_safetensors(args[1], entries, metadata);
    return 0;
  }
  if (args.size() == 4 && args[0] == "write-sharded") {
    std::vector<std::vector<std::byte>> storage;
    std::map<std::string, std::string> metadata;
    const auto entries = entries_of(read_json(args[2].c_str()), storage, metadata);
    ShardOptions options;
    options.max_shard_bytes = std::stoull(args[3]);
    ordered_json out = ordered_json::array();
    for (const auto& p : write_sharded_safetensors(args[1], entries, metadata, options)) {
      out.push_back(p.filename().string());
    }
    std::cout << out.dump() << "\n";
    return 0;
  }
  std::cerr
      << "usage: safetensors_dump read FILE | read-checkpoint PATH | write OUT SPEC | write-sharded DIR SPEC MAX\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
