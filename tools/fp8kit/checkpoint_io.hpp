// What the checkpoint commands (inspect, dequantize, quantize, convert) share: opening an input file or directory
// with its config.json, refusing to overwrite without --force or to write over the input, and the crash-safe output.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cli_common.hpp"
#include "fp8kit/io/atomic_file.hpp"
#include "fp8kit/io/safetensors.hpp"
#include "fp8kit/io/sharded_checkpoint.hpp"

namespace fp8kit::cli {

struct CheckpointInput {
  std::filesystem::path path;                   // as given
  bool is_directory = false;                    // a directory of shards (or of one model.safetensors)
  ShardedCheckpoint checkpoint;                 // every shard mapped and validated
  std::optional<std::string> config;            // config.json's text, for a directory that has one
  std::map<std::string, std::string> metadata;  // every shard's __metadata__, merged
};

// Opens IN (a .safetensors file, or a directory with model.safetensors.index.json or model.safetensors). A missing
// path is a UsageError; pickles and malformed files fail with the reader's one-line error (exit 2).
CheckpointInput open_checkpoint_input(const std::string& path);

// Checks OUT before anything is read: not the input itself (even with --force), of the input's kind (a file for a
// file, a directory for a directory), and not existing unless `force` (a directory that exists and is not empty
// counts as existing), and a valid --max-shard-size only for a directory. Each failure is a UsageError.
void check_output(const CheckpointInput& in, const std::string& out, bool force, const std::string& max_shard_size);

// The __metadata__ an output keeps from its input (every shard's, merged): each key but fp8kit's own (`fp8kit.*`,
// the native layout's description, written anew by quantize and stale once dequantized), and "format" "pt".
std::map<std::string, std::string> carried_metadata(const CheckpointInput& in);

// What a directory output carries besides the weights: how many of the input directory's other files were copied,
// and the weight files left behind (relative paths): top-level .safetensors files and indexes that are not the
// checkpoint's own (Mistral's consolidated.safetensors, a PEFT adapter_model.safetensors) and pickles anywhere
// (pytorch_model.bin, a sentence-transformers module's weights as a pickle), which the commands name in a note.
struct CompanionFiles {
  std::size_t copied = 0;
  std::vector<std::string> left_out;
};

// Writes the entries to OUT: one file (write_safetensors), or a directory of shards with an index
// (stage_sharded_safetensors), plus `config_json` as config.json and the input directory's other files
// (stage_companion_files), staged whole beside OUT and swapped in with one rename (AtomicDirectory; in place, the
// index renamed last, where OUT cannot be swapped): a failure or a kill leaves OUT as it was or complete. An
// existing directory (--force) keeps its files that the output does not replace, less an earlier checkpoint's
// shards and index.
// `max_shard_size` ("5GB" when empty) splits a directory's shards; given for a file output, it is a UsageError.
// Returns what was copied and left out (nothing for a file output).
CompanionFiles write_checkpoint_output(const CheckpointInput& in, const std::string& out,
                                       std::vector<SafetensorsEntry> entries,
                                       const std::map<std::string, std::string>& metadata,
                                       const std::optional<std::string>& config_json,
                                       const std::string& max_shard_size);

// Stages (AtomicFile, synced, not yet renamed: the caller commits them) a copy of every file of the model
// directory in.path that is not the checkpoint itself at the same relative path below `to`, subfolders included:
// tokenizer and generation configs, sentence-transformers' modules.json, 1_Pooling/, 2_Dense/ (its weights as they
// are), onnx/, README. Not copied: config.json (written anew), every top-level .safetensors file and index (the
// checkpoint's own shards and index, and other weights beside them, which would be unconverted weights in the
// output: named in `left_out`), pickles (never read; named in `left_out`) and hidden files and folders. Symlinks
// to files are copied as their contents.
// Folders it creates are appended to `made` (outermost first), for the caller to remove if the write fails.
// `destination` is where `to`'s content ends up (OUT, when `to` is its staging directory): a symbolic link there
// that leads back into the input is refused (UsageError) before anything is staged.
CompanionFiles stage_companion_files(const CheckpointInput& in, const std::filesystem::path& to,
                                     const std::filesystem::path& destination,
                                     std::vector<std::unique_ptr<AtomicFile>>& staged,
                                     std::vector<std::filesystem::path>& made);

// Creates `directory` and its missing parents, appending each one created to `made` (outermost first); Error(kIo)
// naming the folder that cannot be made.
void make_directories(const std::filesystem::path& directory, std::vector<std::filesystem::path>& made);

// "; 3 other files copied" for a summary line (empty for none).
inline std::string other_files(const CompanionFiles& files) {
  return files.copied == 0 ? std::string() : "; " + counted(files.copied, "other file") + " copied";
}
// After the summary (or the --json report), on stderr: "note: not copied: <files> (...)", where weight files were
// left behind.
void note_left_out(const CompanionFiles& files);

// "5GB", "500MB", "64KB", "1000" (bytes): decimal units, as Hugging Face's max_shard_size. UsageError otherwise.
std::uint64_t parse_shard_size(const std::string& text);

// Makes the allocator hand buffers of 1 MiB and more back to the OS when freed (glibc raises its mmap threshold
// after the first large free, after which each tensor's buffers fragment the heap and the peak grows with the
// checkpoint: measured 352 MB instead of 128 MB quantizing twelve 32 MB tensors). Elsewhere a no-op.
void return_large_buffers_to_os();

// What quantize, dequantize and convert did: the one-line summary on stdout, or with --json one object (see
// docs/cli.md): command, input, output, converted (tensors quantized, dequantized or cast: `converted_key`),
// copied, bytes_in and bytes_out (of the safetensors files read and written), seconds, then `details`.
struct CheckpointReport {
  std::string command, input, output;
  std::string converted_key;  // "quantized", "dequantized", "cast"
  std::size_t converted = 0, copied = 0;
  std::uint64_t bytes_in = 0, bytes_out = 0;
  double seconds = 0;
  std::vector<std::pair<std::string, std::string>> details;   // command-specific string fields, in order
  std::vector<std::pair<std::string, std::uint64_t>> counts;  // command-specific counts, in order
  CompanionFiles files;                                       // "files_copied" and "files_not_copied"
};
void print_json_report(const CheckpointReport& report);

// Seconds of wall time since `start`.
double seconds_since(std::chrono::steady_clock::time_point start);

// The bytes of a .safetensors file, or of the .safetensors files of a directory.
std::uint64_t safetensors_bytes(const std::filesystem::path& path);
// The bytes of the input's shards (those an index lists, where the input is one).
std::uint64_t input_bytes(const CheckpointInput& in);

// The --json help of quantize, dequantize and convert (docs/cli.md lists every key).
inline constexpr const char* kCheckpointJsonHelp =
    "Print one JSON object instead of the line: command, input, output, the tensors converted (quantized, "
    "dequantized or cast), what was copied or left, bytes_in, bytes_out, seconds, the choices (docs/cli.md)";
// The --help text of --max-shard-size (quantize, dequantize, convert).
inline constexpr const char* kMaxShardSizeHelp =
    "Directory outputs: the most bytes of tensors per shard (default 5GB; KB/MB/GB are 10^3.., KiB/MiB/GiB 2^10..)";

// "quantize [12/480] 31% 412.3 MB/s ETA 0:07 model.layers.3.mlp.up_proj.weight" on the progress line (stderr, a
// terminal only, not under --quiet): one step per converted tensor, the throughput in input bytes per second.
class Progress {
 public:
  explicit Progress(std::string verb) : verb_(std::move(verb)), start_(std::chrono::steady_clock::now()) {}
  // One more tensor of `bytes` input bytes that a step will announce (counted while the entries are built).
  void expect(std::uint64_t bytes) {
    ++total_;
    total_bytes_ += bytes;
  }
  // The work on a tensor of `bytes` input bytes begins (the bytes before it are done).
  void step(const std::string& name, std::uint64_t bytes);

 private:
  std::string verb_;
  std::chrono::steady_clock::time_point start_;
  std::size_t total_ = 0, done_ = 0;
  std::uint64_t total_bytes_ = 0, done_bytes_ = 0, current_bytes_ = 0;
  ProgressLine line_;
};

// The values a conversion made non-finite: finite elements of `in` (n of dtype `from`) whose converted element in
// `out` (of `to`) is an infinity or NaN, which happens only past the target's range (a float16 past 65504, a
// scale_inv times a code past float32's range, an FP8 target without saturation). Counted so that such an output is
// announced, not silent: quantize refuses non-finite weights for the same reason.
class OverflowCount {
 public:
  void add(const std::string& tensor, std::span<const std::byte> in, DType from, std::span<const std::byte> out,
           DType to);
  std::uint64_t values() const { return values_; }
  // "note: N finite values of 'first' (and K more tensors) became inf or NaN past <to>'s range: <advice>" on
  // stderr where any did.
  void note(DType to, const std::string& advice) const;

 private:
  std::mutex mutex_;  // the fills of one output may run on several threads
  std::uint64_t values_ = 0, tensors_ = 0;
  std::string first_;
};

}  // namespace fp8kit::cli
