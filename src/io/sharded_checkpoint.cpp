// Sharded safetensors checkpoints: the index (strict JSON, plain shard file names, every tensor in the shard the
// index names), opening by directory, index or file; the writer (greedy split, all shards synced, index last).
#include "fp8kit/io/sharded_checkpoint.hpp"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <set>

#include "fp8kit/common/error.hpp"
#include "fp8kit/io/atomic_file.hpp"
#include "io/safetensors_writer.hpp"
#include "io/strict_json.hpp"

namespace fp8kit {
namespace {

using detail::json_kind;
using nlohmann::json;

namespace fs = std::filesystem;

#define INDEX_FAIL(...) FP8KIT_THROW(ErrorKind::kParse, index.string(), ": ", __VA_ARGS__)

// A shard must be a file in the index's directory: an untrusted index must not reach other files.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
}

std::string index_duplicate_message(std::span<const std::string> parents, const std::string& key) {
  if (parents.empty()) return "duplicate key " + detail::quoted(key) + " in the index";
  if (parents.front() == "weight_map") return "duplicate tensor name " + detail::quoted(key) + " in the weight_map";
  return "duplicate key " + detail::quoted(key) + " in the index's " + detail::quoted(parents.front());
}

std::string read_index_text(const fs::path& index) {
  std::error_code ec;
  const auto size = fs::file_size(index, ec);
  if (ec) FP8KIT_THROW(ErrorKind::kIo, "cannot read '", index.string(), "': ", ec.message());
  if (size > kSafetensorsMaxHeaderSize) INDEX_FAIL("the index is ", size, " bytes, more than the 100 MB limit");
  std::ifstream in(index, std::ios::binary);
  FP8KIT_CHECK_KIND(static_cast<bool>(in), ErrorKind::kIo, "cannot open '", index.string(), "' for reading");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  FP8KIT_CHECK_KIND(!in.bad(), ErrorKind::kIo, "error reading '", index.string(), "'");
  return text;
}

// "<prefix>-00001-of-00003.safetensors": the shard names this writer (and Hugging Face) gives.
bool is_shard_name(const std::string& file, const std::string& prefix) {
  const std::string suffix = ".safetensors";
  if (file.size() != prefix.size() + 1 + 5 + 4 + 5 + suffix.size() || !file.starts_with(prefix + "-") ||
      !file.ends_with(suffix)) {
    return false;
  }
  const std::string middle = file.substr(prefix.size() + 1, 14);  // "00001-of-00003"
  for (std::size_t i : {0, 1, 2, 3, 4, 9, 10, 11, 12, 13}) {
    if (middle[i] < '0' || middle[i] > '9') return false;
  }
  return middle.substr(5, 4) == "-of-";
}

std::string shard_name(const std::string& prefix, std::size_t i, std::size_t n) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "-%05zu-of-%05zu", i + 1, n);
  return prefix + digits + ".safetensors";
}

}  // namespace

bool is_checkpoint_file_name(const std::string& file, const std::string& prefix) {
  return file == prefix + ".safetensors" || file == prefix + ".safetensors.index.json" || is_shard_name(file, prefix);
}

bool kept_beside_new_checkpoint(const fs::path& relative, const std::string& prefix) {
  return relative.has_parent_path() || !is_checkpoint_file_name(relative.string(), prefix);
}

// ---------------------------------------------------------------- reading

ShardedCheckpoint ShardedCheckpoint::open(const fs::path& path) {
  ShardedCheckpoint c;
  fs::path index;
  fs::path single;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    c.directory_ = path;
    if (fs::exists(path / kSafetensorsIndexName, ec)) {
      index = path / kSafetensorsIndexName;
    } else if (fs::exists(path / "model.safetensors", ec)) {
      single = path / "model.safetensors";
    } else {
      for (const char* pickled : {"pytorch_model.bin.index.json", "pytorch_model.bin"}) {
        if (fs::exists(path / pickled, ec)) refuse_pickle(path / pickled);
      }
      FP8KIT_THROW(ErrorKind::kInvalidArgument, "'", path.string(), "' holds neither ", kSafetensorsIndexName,
                   " nor model.safetensors: give a .safetensors file, or a Hugging Face checkpoint directory");
    }
  } else {
    c.directory_ = path.parent_path().empty() ? fs::path(".") : path.parent_path();
    if (is_pickle_path(path)) refuse_pickle(path);
    (path.extension() == ".json" ? index : single) = path;
  }

  if (!single.empty()) {
    c.shards_.push_back(SafetensorsFile::open(single));
    for (const SafetensorsTensor& t : c.shards_.front().tensors()) {
      c.weight_map_.emplace(t.name, single.filename().string());
      c.shard_of_.emplace(t.name, 0);
    }
    return c;
  }

  c.index_path_ = index;
  const std::string text = read_index_text(index);
  json root;
  try {
    root = detail::parse_strict_json(text, "the index", 64, index_duplicate_message);
  } catch (const Error& e) {
    FP8KIT_THROW(e.kind(), index.string(), ": ", e.what());
  }
  if (!root.is_object()) INDEX_FAIL("the index must be a JSON object, not ", json_kind(root));
  if (const auto it = root.find("metadata"); it != root.end() && !it->is_null()) {
    if (!it->is_object()) INDEX_FAIL("\"metadata\" must be an object, not ", json_kind(*it));
    for (const auto& [key, value] : it->items()) {
      c.index_metadata_.emplace(key, value.is_string() ? value.get<std::string>() : value.dump());
    }
  }
  const auto map = root.find("weight_map");
  if (map == root.end()) INDEX_FAIL("the index has no \"weight_map\"");
  if (!map->is_object()) INDEX_FAIL("\"weight_map\" must be an object, not ", json_kind(*map));
  // Nothing to read: a checkpoint without tensors is one model.safetensors, never an index (save_pretrained).
  if (map->empty()) INDEX_FAIL("\"weight_map\" is empty: the index lists no tensor");
  std::map<std::string, std::vector<std::string>> by_shard;  // shard file -> its tensors
  for (const auto& [tensor, file] : map->items()) {
    if (!file.is_string())
      INDEX_FAIL("weight_map maps ", detail::quoted(tensor), " to ", json_kind(file), ", not a file name");
    const std::string& shard = file.get_ref<const std::string&>();
    if (!is_plain_file_name(shard)) {
      INDEX_FAIL("weight_map maps ", detail::quoted(tensor), " to ", detail::quoted(shard),
                 ", which is not a plain file name in the index's directory");
    }
    if (is_pickle_path(shard)) refuse_pickle(c.directory_ / shard);
    if (!shard.ends_with(".safetensors")) {
      INDEX_FAIL("weight_map maps ", detail::quoted(tensor), " to ", detail::quoted(shard),
                 ", which is not a .safetensors file");
    }
    c.weight_map_.emplace(tensor, shard);
    by_shard[shard].push_back(tensor);
  }
  for (const auto& [shard, names] : by_shard) {
    const fs::path shard_path = c.directory_ / shard;
    if (!fs::exists(shard_path, ec)) {
      INDEX_FAIL("shard ", detail::quoted(shard), " (holding ", detail::quoted(names.front()), ") does not exist");
    }
    c.shards_.push_back(SafetensorsFile::open(shard_path));
    const SafetensorsFile& f = c.shards_.back();
    for (const std::string& name : names) {
      if (f.find(name) == nullptr) {
        INDEX_FAIL("weight_map maps ", detail::quoted(name), " to ", detail::quoted(shard), ", which does not hold it");
      }
      c.shard_of_.emplace(name, c.shards_.size() - 1);
    }
    for (const SafetensorsTensor& t : f.tensors()) {
      const auto it = c.weight_map_.find(t.name);
      if (it == c.weight_map_.end()) {
        INDEX_FAIL("shard ", detail::quoted(shard), " holds ", detail::quoted(t.name),
                   ", which the weight_map does not list");
      }
      if (it->second != shard) {
        INDEX_FAIL("shard ", detail::quoted(shard), " holds ", detail::quoted(t.name),
                   ", which the weight_map maps to ", detail::quoted(it->second));
      }
    }
  }
  return c;
}

const SafetensorsTensor* ShardedCheckpoint::find(std::string_view name) const {
  const auto it = shard_of_.find(name);
  return it == shard_of_.end() ? nullptr : shards_[it->second].find(name);
}

const SafetensorsTensor& ShardedCheckpoint::at(std::string_view name) const {
  const SafetensorsTensor* t = find(name);
  FP8KIT_CHECK(t != nullptr, "no tensor ", detail::quoted(name), " in the checkpoint at ", directory_.string());
  return *t;
}

std::vector<const SafetensorsTensor*> ShardedCheckpoint::tensors() const {
  std::vector<const SafetensorsTensor*> all;
  all.reserve(shard_of_.size());
  for (const auto& [name, shard] : shard_of_) all.push_back(shards_[shard].find(name));
  return all;
}

// ---------------------------------------------------------------- writing

StagedShards::StagedShards(StagedShards&&) noexcept = default;
StagedShards& StagedShards::operator=(StagedShards&&) noexcept = default;
StagedShards::~StagedShards() = default;  // each uncommitted AtomicFile removes its temporary file

StagedShards stage_sharded_safetensors(const fs::path& directory, std::span<const SafetensorsEntry> entries,
                                       const std::map<std::string, std::string>& metadata,
                                       const ShardOptions& options) {
  FP8KIT_CHECK(is_plain_file_name(options.prefix), "shard prefix ", detail::quoted(options.prefix),
               " must be a plain file name");
  FP8KIT_CHECK(options.max_shard_bytes > 0, "max_shard_bytes must be positive");
  std::error_code ec;
  FP8KIT_CHECK_KIND(fs::is_directory(directory, ec), ErrorKind::kIo, "'", directory.string(), "' is not a directory");

  // Greedy split in the given order; shards are contiguous runs of entries. Names and sizes checked first.
  std::set<std::string_view> names;
  std::vector<std::pair<std::size_t, std::size_t>> runs;  // [first, last) entry of each shard
  std::uint64_t total = 0, current = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    FP8KIT_CHECK(names.insert(entries[i].name).second, "duplicate tensor name ", detail::quoted(entries[i].name));
    std::uint64_t bytes = 0;
    try {
      bytes = safetensors_byte_size(entries[i].dtype, entries[i].shape);
    } catch (const Error& e) {
      FP8KIT_THROW(e.kind(), "tensor ", detail::quoted(entries[i].name), ": ", e.what());
    }
    if (runs.empty() || (current > 0 && current + bytes > options.max_shard_bytes)) {
      runs.emplace_back(i, i);
      current = 0;
    }
    runs.back().second = i + 1;
    current += bytes;
    FP8KIT_CHECK(total <= std::numeric_limits<std::uint64_t>::max() - bytes, "the tensors hold more than 2^64 bytes");
    total += bytes;
  }
  if (runs.empty()) runs.emplace_back(0, 0);  // no tensors: one empty file

  StagedShards staged;
  staged.directory_ = directory;
  staged.prefix_ = options.prefix;
  staged.sharded_ = runs.size() > 1;
  staged.index_name_ = options.prefix + ".safetensors.index.json";
  json weight_map = json::object();
  for (std::size_t s = 0; s < runs.size(); ++s) {
    staged.files_.push_back(staged.sharded_ ? shard_name(options.prefix, s, runs.size())
                                            : options.prefix + ".safetensors");
    const auto run = entries.subspan(runs[s].first, runs[s].second - runs[s].first);
    for (const SafetensorsEntry& e : run) weight_map[e.name] = staged.files_.back();
    staged.pending_.push_back(std::make_unique<AtomicFile>(directory / staged.files_.back()));
    detail::write_safetensors_to(*staged.pending_.back(), run, metadata);
  }
  for (auto& f : staged.pending_) f->sync();  // the slow part, before the first rename
  if (staged.sharded_) {
    // Hugging Face's layout: sorted keys, two-space indent, a final newline.
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    const std::string text = index.dump(2) + "\n";
    staged.pending_.push_back(std::make_unique<AtomicFile>(directory / staged.index_name_));
    staged.pending_.back()->write(std::as_bytes(std::span<const char>(text)));
    staged.pending_.back()->sync();
    staged.files_.push_back(staged.index_name_);
  }
  return staged;
}

std::vector<fs::path> StagedShards::destinations() const {
  std::vector<fs::path> paths;
  for (const std::string& f : files_) paths.push_back(directory_ / f);
  return paths;
}

std::vector<fs::path> StagedShards::commit() {
  for (auto& f : pending_) f->commit();  // the index (when there is one) last: the commit point

  // Files of an earlier checkpoint with this prefix that this one does not use.
  const std::set<std::string> written(files_.begin(), files_.end());
  bool removed = false;
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(directory_, ec)) {
    const std::string file = item.path().filename().string();
    const bool stale_shard = is_shard_name(file, prefix_);
    const bool stale_index = !sharded_ && file == index_name_;
    const bool stale_single = sharded_ && file == prefix_ + ".safetensors";  // loaders would read it first
    if ((stale_shard || stale_index || stale_single) && !written.contains(file) && item.is_regular_file(ec)) {
      removed = fs::remove(item.path(), ec) || removed;
    }
  }
  if (removed) sync_directory(directory_);
  return destinations();
}

std::vector<fs::path> write_sharded_safetensors(const fs::path& directory, std::span<const SafetensorsEntry> entries,
                                                const std::map<std::string, std::string>& metadata,
                                                const ShardOptions& options) {
  return stage_sharded_safetensors(directory, entries, metadata, options).commit();
}

}  // namespace fp8kit
