// Sharded safetensors checkpoints: round trips through shards and the index, Hugging Face's split and names,
// stale shards removed on rewrite, and a specific error for every inconsistent or hostile index.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/io/sharded_checkpoint.hpp"
#include "io/test_files.hpp"

namespace fp8kit {
namespace {

using test_files::error_of;
using test_files::list_dir;
using test_files::pattern_bytes;
using test_files::TempDir;
using test_files::write_text;

// Tensors of 40, 40, 40, 8, 200 (one over the limit), 4 and 0 bytes.
struct Model {
  std::vector<std::vector<std::byte>> data;
  std::vector<SafetensorsEntry> entries;
  Model() {
    const std::vector<std::tuple<std::string, SafetensorsDType, Shape>> specs = {
        {"embed.weight", SafetensorsDType::BF16, {4, 5}},
        {"layers.0.weight", SafetensorsDType::F8_E4M3, {5, 8}},
        {"layers.0.weight_scale_inv", SafetensorsDType::F32, {10}},
        {"layers.0.bias", SafetensorsDType::F64, {1}},
        {"layers.1.weight", SafetensorsDType::F8_E4M3, {10, 20}},
        {"norm", SafetensorsDType::F32, {}},
        {"empty", SafetensorsDType::U8, {0}}};
    data.reserve(specs.size());
    for (const auto& [name, dtype, shape] : specs) {
      data.push_back(pattern_bytes(safetensors_byte_size(dtype, shape), static_cast<std::uint32_t>(data.size())));
      entries.push_back({name, dtype, shape, data.back(), {}});
    }
  }
};

void expect_same_tensors(const ShardedCheckpoint& c, const Model& m) {
  ASSERT_EQ(c.size(), m.entries.size());
  for (const SafetensorsEntry& e : m.entries) {
    SCOPED_TRACE(e.name);
    const SafetensorsTensor& t = c.at(e.name);
    EXPECT_EQ(t.dtype, e.dtype);
    EXPECT_EQ(t.shape, e.shape);
    EXPECT_TRUE(std::ranges::equal(t.bytes, e.bytes));
  }
}

TEST(ShardedCheckpoint, RoundTripThroughShardsAndTheIndex) {
  TempDir dir;
  const Model m;
  ShardOptions options;
  options.max_shard_bytes = 100;
  const auto files = write_sharded_safetensors(dir.path(), m.entries, {{"format", "pt"}}, options);
  // Greedy in order: [40, 40] | [40, 8] | [200] | [4, 0]
  const std::vector<std::string> expected = {"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                                             "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors",
                                             "model.safetensors.index.json"};
  ASSERT_EQ(files.size(), expected.size());
  for (std::size_t i = 0; i < files.size(); ++i) EXPECT_EQ(files[i], dir / expected[i]);
  EXPECT_EQ(list_dir(dir.path()), expected);

  for (const auto& path : {dir.path(), dir / "model.safetensors.index.json"}) {
    const ShardedCheckpoint c = ShardedCheckpoint::open(path);
    expect_same_tensors(c, m);
    EXPECT_EQ(c.shards().size(), 4u);
    EXPECT_EQ(c.index_path(), dir / "model.safetensors.index.json");
    EXPECT_EQ(c.index_metadata().at("total_size"), "332");
    EXPECT_EQ(c.weight_map().at("layers.1.weight"), "model-00003-of-00004.safetensors");
    EXPECT_EQ(c.weight_map().at("empty"), "model-00004-of-00004.safetensors");
    EXPECT_EQ(c.shards()[0].metadata().at("format"), "pt");
    const auto all = c.tensors();
    ASSERT_EQ(all.size(), m.entries.size());
    EXPECT_EQ(all.front()->name, "embed.weight");  // name order
    EXPECT_EQ(c.find("missing"), nullptr);
    EXPECT_EQ(error_of([&] { (void)c.at("missing"); }).kind(), ErrorKind::kInvalidArgument);
  }
  // Hugging Face's index layout: sorted keys, two-space indent, final newline.
  const auto raw = test_files::read_file(dir / "model.safetensors.index.json");
  const std::string index(reinterpret_cast<const char*>(raw.data()), raw.size());
  EXPECT_TRUE(
      index.starts_with("{\n  \"metadata\": {\n    \"total_size\": 332\n  },\n  \"weight_map\": {\n"
                        "    \"embed.weight\": \"model-00001-of-00004.safetensors\",\n"))
      << index;
  EXPECT_TRUE(index.ends_with("}\n"));
}

TEST(ShardedCheckpoint, OneShardIsAPlainModelFileWithoutIndex) {
  TempDir dir;
  const Model m;
  const auto files = write_sharded_safetensors(dir.path(), m.entries);
  EXPECT_EQ(files, std::vector<std::filesystem::path>{dir / "model.safetensors"});
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"model.safetensors"});
  for (const auto& path : {dir.path(), dir / "model.safetensors"}) {
    const ShardedCheckpoint c = ShardedCheckpoint::open(path);
    expect_same_tensors(c, m);
    EXPECT_TRUE(c.index_path().empty());
    EXPECT_TRUE(c.index_metadata().empty());
    EXPECT_EQ(c.weight_map().at("norm"), "model.safetensors");
  }
}

TEST(ShardedCheckpoint, RewritesRemoveTheFilesOfTheEarlierCheckpointOnly) {
  TempDir dir;
  const Model m;
  for (const char* other :
       {"config.json", "model-extra.safetensors", "other-00001-of-00002.safetensors", "model-1-of-2.safetensors"}) {
    write_text(dir / other, "keep");
  }
  ShardOptions options;
  options.max_shard_bytes = 100;
  write_sharded_safetensors(dir.path(), m.entries, {}, options);  // 4 shards
  options.max_shard_bytes = 250;
  write_sharded_safetensors(dir.path(), m.entries, {}, options);  // [40, 40, 40, 8] | [200, 4, 0]
  const std::vector<std::string> two_shards = {"config.json",
                                               "model-00001-of-00002.safetensors",
                                               "model-00002-of-00002.safetensors",
                                               "model-1-of-2.safetensors",
                                               "model-extra.safetensors",
                                               "model.safetensors.index.json",
                                               "other-00001-of-00002.safetensors"};
  EXPECT_EQ(list_dir(dir.path()), two_shards);
  expect_same_tensors(ShardedCheckpoint::open(dir.path()), m);
  write_sharded_safetensors(dir.path(), m.entries);  // one shard: the index and the shards go
  EXPECT_EQ(list_dir(dir.path()),
            (std::vector<std::string>{"config.json", "model-1-of-2.safetensors", "model-extra.safetensors",
                                      "model.safetensors", "other-00001-of-00002.safetensors"}));
  expect_same_tensors(ShardedCheckpoint::open(dir.path()), m);
  write_sharded_safetensors(dir.path(), m.entries, {}, options);  // shards again: the single file goes
  EXPECT_EQ(list_dir(dir.path()), two_shards);
  expect_same_tensors(ShardedCheckpoint::open(dir.path()), m);
}

// A staged write is invisible until commit(): the directory lists what it did (an earlier checkpoint's files and
// no temporary file) until then, and the same as write_sharded_safetensors's after; dropped uncommitted, nothing.
TEST(ShardedCheckpoint, StagedWritesShowNothingUntilCommitted) {
  TempDir dir;
  const Model m;
  ShardOptions options;
  options.max_shard_bytes = 100;
  write_sharded_safetensors(dir.path(), m.entries, {}, options);  // 4 shards
  const std::vector<std::string> before = list_dir(dir.path());
  options.max_shard_bytes = 250;
  {
    StagedShards dropped = stage_sharded_safetensors(dir.path(), m.entries, {}, options);
    EXPECT_GT(list_dir(dir.path()).size(), before.size());  // the temporary files, beside the old checkpoint
  }
  EXPECT_EQ(list_dir(dir.path()), before);
  StagedShards staged = stage_sharded_safetensors(dir.path(), m.entries, {}, options);
  StagedShards moved = std::move(staged);
  const std::vector<std::filesystem::path> files = moved.commit();
  EXPECT_EQ(files.size(), 3u);  // two shards and the index
  EXPECT_EQ(list_dir(dir.path()),
            (std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                      "model.safetensors.index.json"}));
  expect_same_tensors(ShardedCheckpoint::open(dir.path()), m);
}

TEST(ShardedCheckpoint, WriterChecksBeforeWriting) {
  TempDir dir;
  const Model m;
  std::vector<SafetensorsEntry> twice = m.entries;
  twice.push_back(m.entries.front());
  ShardOptions options;
  options.max_shard_bytes = 100;
  const Error dup = error_of([&] { write_sharded_safetensors(dir.path(), twice, {}, options); });
  EXPECT_EQ(dup.kind(), ErrorKind::kInvalidArgument);
  EXPECT_STREQ(dup.what(), "duplicate tensor name 'embed.weight'");
  options.prefix = "../model";
  const Error prefix = error_of([&] { write_sharded_safetensors(dir.path(), m.entries, {}, options); });
  EXPECT_STREQ(prefix.what(), "shard prefix '../model' must be a plain file name");
  EXPECT_EQ(error_of([&] { write_sharded_safetensors(dir / "missing", m.entries); }).kind(), ErrorKind::kIo);
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

// Two shards written directly, and an index written by hand.
struct HandMade {
  TempDir dir;
  std::vector<std::byte> data = pattern_bytes(16, 1);
  HandMade() {
    const std::vector<SafetensorsEntry> one = {{"a", SafetensorsDType::F32, {2}, std::span(data).first(8), {}}};
    const std::vector<SafetensorsEntry> two = {{"b", SafetensorsDType::F32, {2}, std::span(data).last(8), {}}};
    write_safetensors(dir / "s1.safetensors", one);
    write_safetensors(dir / "s2.safetensors", two);
  }
  std::string open_with_index(const std::string& json) {
    write_text(dir / "model.safetensors.index.json", json);
    const Error e = error_of([&] { (void)ShardedCheckpoint::open(dir.path()); });
    const std::string prefix = (dir / "model.safetensors.index.json").string() + ": ";
    const std::string message = e.what();
    return message.starts_with(prefix) ? message.substr(prefix.size()) : "[" + message + "]";
  }
};

TEST(ShardedCheckpoint, HandWrittenIndexIsRead) {
  HandMade h;
  write_text(h.dir / "model.safetensors.index.json",
             R"({"metadata": {"total_size": 16, "format": "pt", "nested": {"x": [1]}},
                 "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  const ShardedCheckpoint c = ShardedCheckpoint::open(h.dir.path());
  EXPECT_EQ(c.index_metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"nested", "{\"x\":[1]}"}, {"total_size", "16"}}));
  EXPECT_TRUE(std::ranges::equal(c.at("b").bytes, std::span(h.data).last(8)));
}

TEST(ShardedCheckpoint, EveryInconsistentOrHostileIndexIsRefused) {
  HandMade h;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[]", "the index must be a JSON object, not an array"},
      {"{",
       "the index is not valid JSON: parse error at line 1, column 2: syntax error while parsing object key - "
       "unexpected end of input; expected string literal"},
      {R"({"metadata": {}})", "the index has no \"weight_map\""},
      {R"({"weight_map": []})", "\"weight_map\" must be an object, not an array"},
      {R"({"weight_map": {}})", "\"weight_map\" is empty: the index lists no tensor"},
      {R"({"metadata": 3, "weight_map": {}})", "\"metadata\" must be an object, not a number"},
      {R"({"weight_map": {"a": 1}})", "weight_map maps 'a' to a number, not a file name"},
      {R"({"weight_map": {"a": "s1.safetensors", "a": "s1.safetensors"}})",
       "duplicate tensor name 'a' in the weight_map"},
      {R"({"weight_map": {}, "weight_map": {}})", "duplicate key 'weight_map' in the index"},
      {R"({"weight_map": {"a": "../s1.safetensors"}})",
       "weight_map maps 'a' to '../s1.safetensors', which is not a plain file name in the index's directory"},
      {R"({"weight_map": {"a": "/etc/passwd"}})",
       "weight_map maps 'a' to '/etc/passwd', which is not a plain file name in the index's directory"},
      {R"({"weight_map": {"a": ".."}})",
       "weight_map maps 'a' to '..', which is not a plain file name in the index's directory"},
      {R"({"weight_map": {"a": "s1.txt"}})", "weight_map maps 'a' to 's1.txt', which is not a .safetensors file"},
      {R"({"weight_map": {"a": "gone.safetensors"}})", "shard 'gone.safetensors' (holding 'a') does not exist"},
      {R"({"weight_map": {"a": "s2.safetensors", "b": "s2.safetensors"}})",
       "weight_map maps 'a' to 's2.safetensors', which does not hold it"},
      {R"({"weight_map": {"a": "s1.safetensors"}})", ""},  // s2 is not listed: fine, it is not part of this checkpoint
      {R"({"weight_map": {"b": "s2.safetensors", "c": "s1.safetensors"}})",
       "weight_map maps 'c' to 's1.safetensors', which does not hold it"},
  };
  for (const auto& [json, message] : cases) {
    SCOPED_TRACE(json);
    if (message.empty()) {
      write_text(h.dir / "model.safetensors.index.json", json);
      EXPECT_EQ(ShardedCheckpoint::open(h.dir.path()).size(), 1u);
    } else {
      EXPECT_EQ(h.open_with_index(json), message);
    }
  }
  // A shard holding a tensor the index does not list, or lists under another shard.
  const std::vector<std::byte> four = pattern_bytes(4, 9);
  const std::vector<SafetensorsEntry> extra = {{"a", SafetensorsDType::F32, {2}, std::span(h.data).first(8), {}},
                                               {"x", SafetensorsDType::F32, {1}, four, {}}};
  write_safetensors(h.dir / "s1.safetensors", extra);
  EXPECT_EQ(h.open_with_index(R"({"weight_map": {"a": "s1.safetensors"}})"),
            "shard 's1.safetensors' holds 'x', which the weight_map does not list");
  EXPECT_EQ(h.open_with_index(R"({"weight_map": {"a": "s1.safetensors", "x": "s2.safetensors"}})"),
            "shard 's1.safetensors' holds 'x', which the weight_map maps to 's2.safetensors'");
}

TEST(ShardedCheckpoint, PickleCheckpointsAreRefused) {
  TempDir dir;
  write_text(dir / "pytorch_model.bin", "not loaded");
  const Error e = error_of([&] { (void)ShardedCheckpoint::open(dir.path()); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(std::string(e.what()).starts_with("'" + (dir / "pytorch_model.bin").string() +
                                                "' is a pickle-based PyTorch file: fp8kit does not load pickles"))
      << e.what();
  write_text(dir / "pytorch_model.bin.index.json", R"({"weight_map": {"a": "pytorch_model-00001-of-00002.bin"}})");
  const Error index = error_of([&] { (void)ShardedCheckpoint::open(dir / "pytorch_model.bin.index.json"); });
  EXPECT_TRUE(
      std::string(index.what())
          .starts_with("'" + (dir / "pytorch_model-00001-of-00002.bin").string() + "' is a pickle-based PyTorch file"))
      << index.what();
  const Error file = error_of([&] { (void)ShardedCheckpoint::open(dir / "model.pt"); });
  EXPECT_EQ(file.kind(), ErrorKind::kInvalidArgument);

  TempDir empty;
  const Error nothing = error_of([&] { (void)ShardedCheckpoint::open(empty.path()); });
  EXPECT_EQ(nothing.kind(), ErrorKind::kInvalidArgument);  // bad input: the CLI's exit status 2
  EXPECT_EQ(std::string(nothing.what()), "'" + empty.path().string() +
                                             "' holds neither model.safetensors.index.json nor model.safetensors: give "
                                             "a .safetensors file, or a Hugging Face checkpoint directory");
}

TEST(ShardedCheckpoint, ShardErrorsNameTheShard) {
  HandMade h;
  test_files::write_file(h.dir / "s2.safetensors", test_files::st_image("{}", 3));
  write_text(h.dir / "model.safetensors.index.json",
             R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  const Error e = error_of([&] { (void)ShardedCheckpoint::open(h.dir.path()); });
  EXPECT_EQ(e.kind(), ErrorKind::kParse);
  EXPECT_EQ(std::string(e.what()), (h.dir / "s2.safetensors").string() +
                                       ": the tensors end at 0 but the data section holds 3 bytes (trailing bytes "
                                       "are not allowed)");
}

}  // namespace
}  // namespace fp8kit
