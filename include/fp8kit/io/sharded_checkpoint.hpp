// Checkpoints split over several safetensors files (`model-00001-of-00003.safetensors`, ...) with a
// `model.safetensors.index.json` mapping each tensor to its shard, as Hugging Face writes them: reader and writer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fp8kit/io/safetensors.hpp"

namespace fp8kit {

inline constexpr std::string_view kSafetensorsIndexName = "model.safetensors.index.json";

// A sharded (or single-file) checkpoint, every shard memory-mapped and validated as SafetensorsFile does.
// The index is checked against the shards: each weight_map entry must name a plain file name (no directory,
// no "..") of a .safetensors shard that exists and holds the tensor, and every tensor of a shard must be mapped
// to that shard. Any mismatch is an Error(kParse) naming the tensor and the files.
class ShardedCheckpoint {
 public:
  // `path` may be an index file (any *.json), a directory (its model.safetensors.index.json, else its
  // model.safetensors), or one .safetensors file (a checkpoint of one shard). Pickle-based files and
  // directories holding only pytorch_model*.bin are refused as SafetensorsFile::open refuses them.
  static ShardedCheckpoint open(const std::filesystem::path& path);

  // The directory the shards are in.
  const std::filesystem::path& directory() const noexcept { return directory_; }
  // The index file; empty for a single-file checkpoint.
  const std::filesystem::path& index_path() const noexcept { return index_path_; }
  // The shards, ordered by file name.
  const std::vector<SafetensorsFile>& shards() const noexcept { return shards_; }
  // Tensor name -> shard file name.
  const std::map<std::string, std::string, std::less<>>& weight_map() const noexcept { return weight_map_; }
  // The index's "metadata" object: string values as they are, other JSON values as their JSON text
  // ("total_size" -> "123"). Empty for a single-file checkpoint.
  const std::map<std::string, std::string>& index_metadata() const noexcept { return index_metadata_; }
  std::size_t size() const noexcept { return weight_map_.size(); }

  // nullptr when there is no such tensor.
  const SafetensorsTensor* find(std::string_view name) const;
  // Throws Error(kInvalidArgument) when there is no such tensor.
  const SafetensorsTensor& at(std::string_view name) const;
  // Every tensor, in name order.
  std::vector<const SafetensorsTensor*> tensors() const;

 private:
  std::filesystem::path directory_;
  std::filesystem::path index_path_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, std::string, std::less<>> weight_map_;
  std::map<std::string, std::string> index_metadata_;
  std::map<std::string, std::size_t, std::less<>> shard_of_;  // tensor name -> index into shards_
};

struct ShardOptions {
  // A shard holds at most this many bytes of tensor data, except a single tensor larger than the limit, which
  // gets a shard of its own (Hugging Face's rule; its default is "5GB").
  std::uint64_t max_shard_bytes = 5'000'000'000;
  // Shards are "<prefix>-00001-of-00003.safetensors", the index "<prefix>.safetensors.index.json", a checkpoint
  // of one shard "<prefix>.safetensors" without an index.
  std::string prefix = "model";
};

class AtomicFile;

// A sharded checkpoint written but not yet visible (stage_sharded_safetensors): every shard and the index in
// temporary files beside their names, synced. commit() renames them into place, the index last, and removes what an
// earlier checkpoint of the same prefix left that this one does not use; destroyed without commit() having been
// called, it removes its temporary files and the directory is as it was. A caller with more files to write (a
// config.json, a model's other files) stages them too and commits them all together, after the last byte is on disk.
class StagedShards {
 public:
  StagedShards(StagedShards&&) noexcept;
  StagedShards& operator=(StagedShards&&) noexcept;
  ~StagedShards();
  // The renames, then the removals. Returns the files written, shards first. A rename that fails (a directory in
  // the way, the disk gone) throws with the files renamed before it in place: check the destinations first.
  std::vector<std::filesystem::path> commit();
  // Where commit() will put the files, shards first, the index last.
  std::vector<std::filesystem::path> destinations() const;

 private:
  friend StagedShards stage_sharded_safetensors(const std::filesystem::path&, std::span<const SafetensorsEntry>,
                                                const std::map<std::string, std::string>&, const ShardOptions&);
  StagedShards() = default;
  std::filesystem::path directory_;
  std::string prefix_, index_name_;
  bool sharded_ = false;
  std::vector<std::string> files_;
  std::vector<std::unique_ptr<AtomicFile>> pending_;
};

// Whether a sharded write of `prefix` in a directory writes or (as an earlier checkpoint's) removes the file named
// `file` there: "<prefix>.safetensors", "<prefix>-00001-of-00003.safetensors", "<prefix>.safetensors.index.json".
bool is_checkpoint_file_name(const std::string& file, const std::string& prefix = "model");

// Whether an entry of a directory (`relative` to it) goes on into the directory that replaces it when a new checkpoint
// of `prefix` is written there whole (AtomicDirectory::commit's `carry`): all but an earlier checkpoint's top-level
// shards, single file and index, which the new checkpoint replaces.
bool kept_beside_new_checkpoint(const std::filesystem::path& relative, const std::string& prefix = "model");

// write_sharded_safetensors up to the renames: everything written and synced, nothing visible until commit().
StagedShards stage_sharded_safetensors(const std::filesystem::path& directory,
                                       std::span<const SafetensorsEntry> entries,
                                       const std::map<std::string, std::string>& metadata = {},
                                       const ShardOptions& options = {});

// Splits `entries` into shards in their order (a new shard starts when the next tensor would pass the limit)
// and writes them into `directory` (which must exist), each shard with `metadata` as its `__metadata__`, then
// the index {"metadata": {"total_size": bytes}, "weight_map": {...}} (none for a single shard). Returns the
// files written, shards first. Every file is written crash-safely (AtomicFile) and all are fsynced before the
// first rename; the index, renamed last, is the commit point. Afterwards, shards and an index left by an earlier
// checkpoint of the same prefix that are not part of this one are removed (as Hugging Face's save_pretrained
// does). A crash between the renames of a rewrite in place can leave new shards beside the old index: where
// replacing a checkpoint must be all-or-nothing, write it into an AtomicDirectory's path() and commit that with
// kept_beside_new_checkpoint (what fp8kit's CLI and export_fp8_checkpoint do).
// Throws as write_safetensors does, and Error(kInvalidArgument) for a prefix that is not a plain file name.
std::vector<std::filesystem::path> write_sharded_safetensors(const std::filesystem::path& directory,
                                                             std::span<const SafetensorsEntry> entries,
                                                             const std::map<std::string, std::string>& metadata = {},
                                                             const ShardOptions& options = {});

}  // namespace fp8kit
