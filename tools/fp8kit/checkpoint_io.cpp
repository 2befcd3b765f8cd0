// The checkpoint commands' input and output: opening files or shard directories, the overwrite and
// never-touch-the-input rules, and writing a file or a directory (shards, index, config.json) crash-safely.
#include "checkpoint_io.hpp"

#include "fp8kit/common/text.hpp"

#include <fmt/core.h>

#include <nlohmann/json.hpp>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <system_error>

#include "cli_common.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/io/atomic_file.hpp"
#include "fp8kit/io/checkpoint_layout.hpp"

namespace fp8kit::cli {
namespace fs = std::filesystem;

namespace {

// Each staged copy holds its temporary file open (its lock) until the commit: a model directory of more files than
// the soft limit on open files (often 1024) would fail half way. While one lives, the soft limit is the hard one
// (best effort: with the lower limit a failure still names the file); then it is what it was, for the process
// (Python's, when the commands run in it) may use select(), which takes no descriptor past 1024.
class OpenFileLimitRaised {
 public:
  OpenFileLimitRaised() {
    if (getrlimit(RLIMIT_NOFILE, &before_) != 0 || before_.rlim_cur >= before_.rlim_max) return;
    rlimit raised = before_;
    raised.rlim_cur = raised.rlim_max;
    raised_ = setrlimit(RLIMIT_NOFILE, &raised) == 0;
  }
  ~OpenFileLimitRaised() {
    if (raised_) setrlimit(RLIMIT_NOFILE, &before_);
  }
  OpenFileLimitRaised(const OpenFileLimitRaised&) = delete;
  OpenFileLimitRaised& operator=(const OpenFileLimitRaised&) = delete;

 private:
  rlimit before_{};
  bool raised_ = false;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  if (!in) throw PathError("cannot read '" + path.string() + "'", !fs::exists(path, ec));
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// `text` staged for `path`: written and synced, renamed into place by commit().
std::unique_ptr<AtomicFile> stage_text(const fs::path& path, const std::string& text) {
  auto file = std::make_unique<AtomicFile>(path);
  file->write(std::as_bytes(std::span<const char>(text.data(), text.size())));
  file->sync();
  return file;
}

// What becomes of a file of a model directory, at `relative` below it: copied with the weights (everything but the
// checkpoint itself: its top-level .safetensors shards and index, config.json, written anew), skipped (hidden files,
// the checkpoint's own files) or left out and named (a pickle, which fp8kit never reads; a top-level .safetensors
// file or index that is not the checkpoint's: either would be unconverted weights in the output). Subfolders come
// along (sentence-transformers' 1_Pooling/, 2_Dense/ with its own weights, onnx/ ...), symlinks to files as their
// contents.
enum class Companion { kCopy, kSkip, kLeaveOut };

Companion classify_companion(const fs::path& relative, const std::set<std::string>& own) {
  for (const fs::path& part : relative) {
    const std::string p = part.string();
    if (p.empty() || p[0] == '.') return Companion::kSkip;
  }
  const std::string name = relative.filename().string();
  if (!relative.has_parent_path()) {
    if (name == "config.json" || own.contains(name)) return Companion::kSkip;
    if (relative.extension() == ".safetensors" || name.find(".index.json") != std::string::npos) {
      return Companion::kLeaveOut;
    }
  }
  return is_pickle_path(relative) ? Companion::kLeaveOut : Companion::kCopy;
}

// `from` staged as a copy at `to` (AtomicFile: a temporary, synced; commit() renames it), in 8 MiB pieces.
std::unique_ptr<AtomicFile> stage_copy(const fs::path& from, const fs::path& to) {
  std::ifstream in(from, std::ios::binary);
  if (!in) FP8KIT_THROW(ErrorKind::kIo, "cannot read '", from.string(), "': ", std::strerror(errno));
  auto file = std::make_unique<AtomicFile>(to);
  std::vector<char> buffer(std::size_t{8} << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto got = static_cast<std::size_t>(in.gcount());
    if (got > 0) file->write(std::as_bytes(std::span<const char>(buffer.data(), got)));
  }
  if (in.bad()) FP8KIT_THROW(ErrorKind::kIo, "reading '", from.string(), "' failed: ", std::strerror(errno));
  file->sync();
  return file;
}

// A directory that holds nothing, or only the temporary files of an interrupted write (the next write of those
// names removes them).
bool is_empty_output(const fs::path& directory) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(directory, ec)) {
    if (!is_temporary_file_name(e.path().filename().string()) || !e.is_regular_file(ec)) return false;
  }
  return !ec;
}

}  // namespace

void return_large_buffers_to_os() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
}

void print_json_report(const CheckpointReport& r) {
  nlohmann::ordered_json j = {{"command", r.command}, {"input", r.input}, {"output", r.output}};
  j[r.converted_key] = r.converted;
  j["copied"] = r.copied;
  for (const auto& [key, value] : r.counts) j[key] = value;
  j["files_copied"] = r.files.copied;
  j["files_not_copied"] = r.files.left_out;
  j["bytes_in"] = r.bytes_in;
  j["bytes_out"] = r.bytes_out;
  j["seconds"] = r.seconds;
  for (const auto& [key, value] : r.details) j[key] = value;
  fmt::print(output(), "{}\n", json_text(j));
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::uint64_t safetensors_bytes(const std::filesystem::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    const std::uintmax_t size = fs::file_size(path, ec);
    return ec ? 0 : size;
  }
  std::uint64_t total = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
    if (!e.is_regular_file(ec) || e.path().extension() != ".safetensors") continue;
    const std::uintmax_t size = e.file_size(ec);
    if (!ec) total += size;
  }
  return total;
}

std::uint64_t input_bytes(const CheckpointInput& in) {
  std::uint64_t total = 0;
  for (const SafetensorsFile& shard : in.checkpoint.shards()) {
    std::error_code ec;
    const std::uintmax_t size = fs::file_size(shard.path(), ec);
    if (!ec) total += size;
  }
  return total;
}

void Progress::step(const std::string& name, std::uint64_t bytes) {
  ++done_;
  done_bytes_ += current_bytes_;  // the previous tensor is written by now
  current_bytes_ = bytes;
  if (!line_.on()) return;
  const double seconds = seconds_since(start_);
  const double rate = seconds > 0 ? static_cast<double>(done_bytes_) / seconds : 0.0;
  const double percent =
      total_bytes_ > 0 ? 100.0 * static_cast<double>(done_bytes_) / static_cast<double>(total_bytes_) : 0.0;
  std::string eta = "--:--";
  if (rate > 0) {
    const auto left = static_cast<long long>(static_cast<double>(total_bytes_ - done_bytes_) / rate + 0.5);
    eta = fmt::format("{}:{:02}", left / 60, left % 60);
  }
  line_.show(fmt::format("{} [{}/{}] {:.0f}% {:.1f} MB/s ETA {} {:.80}", verb_, done_, total_, percent, rate / 1e6, eta,
                         printable(name)));
}

CheckpointInput open_checkpoint_input(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (!fs::exists(p, ec)) throw PathError("'" + path + "' does not exist", true);
  CheckpointInput in{p, fs::is_directory(p, ec), ShardedCheckpoint::open(p), std::nullopt, {}};
  // A config.json that is not a file (a folder, a link to nothing) would be left out of the output unsaid.
  if (in.is_directory && fs::symlink_status(p / "config.json", ec).type() != fs::file_type::not_found &&
      !fs::is_regular_file(p / "config.json", ec)) {
    throw UsageError("'" + (p / "config.json").string() +
                     "' is not a file (a folder, or a link to nothing); make it the model's config.json or remove it");
  }
  if (in.is_directory && fs::is_regular_file(p / "config.json", ec)) {
    in.config = read_text(p / "config.json");
    // Checked strictly once, before any command parses it (nesting, UTF-8, duplicate keys, the quantization_config's
    // fields): a config.json nested 100000 deep overflowed the stack of the commands' own parse.
    (void)parse_quantization_config(*in.config);
  }
  for (const SafetensorsFile& shard : in.checkpoint.shards()) {
    in.metadata.insert(shard.metadata().begin(), shard.metadata().end());
  }
  return in;
}

void check_output(const CheckpointInput& in, const std::string& out, bool force, const std::string& max_shard_size) {
  if (out.empty()) throw UsageError("OUT is empty: give the output's path");
  if (!max_shard_size.empty()) {
    if (!in.is_directory) throw UsageError("--max-shard-size applies to directory outputs");
    parse_shard_size(max_shard_size);
  }
  std::error_code ec;
  const fs::path o(out);
  if (fs::exists(o, ec)) {
    if (fs::equivalent(o, in.path, ec)) throw UsageError("'" + out + "' is the input; write to another path");
    for (const SafetensorsFile& shard : in.checkpoint.shards()) {
      if (fs::equivalent(o, shard.path(), ec)) throw UsageError("'" + out + "' is part of the input");
    }
  }
  check_output_folder(o, "'" + out + "': ");  // (a directory output is created there)
  if (in.is_directory) {
    // Inside the input, the output would be copied into itself as the model's other files on the next run.
    std::error_code in_ec, out_ec;
    const fs::path input = fs::weakly_canonical(in.path, in_ec), output = fs::weakly_canonical(o, out_ec);
    const auto [stop, rest] = std::mismatch(input.begin(), input.end(), output.begin(), output.end());
    if (!in_ec && !out_ec && stop == input.end() && rest != output.end()) {
      throw UsageError("'" + out + "' is inside the input directory '" + in.path.string() + "'; write it elsewhere");
    }
    if (fs::exists(o, ec) && !fs::is_directory(o, ec)) {
      throw UsageError("'" + out + "' is a file; the input is a directory, so the output is a directory");
    }
    if (!fs::exists(o, ec) && o.extension() == ".safetensors") {
      throw UsageError("'" + out +
                       "' names a .safetensors file, but the input is a directory, so the output is a "
                       "directory (of shards, config.json and the other files): give a directory name");
    }
    if (fs::is_directory(o, ec) && !is_empty_output(o) && !force) {
      throw UsageError("'" + out + "' exists and is not empty; pass --force to write into it");
    }
    // An input file that is, through a symbolic link, a file of OUT the write replaces (config.json, the shards and
    // index) or removes (an earlier checkpoint's shards): refused, --force or not.
    if (fs::is_directory(o, ec)) {
      const fs::path out_dir = fs::canonical(o, ec);
      std::vector<fs::path> inputs{in.path / "config.json"};
      if (!in.checkpoint.index_path().empty()) inputs.push_back(in.checkpoint.index_path());
      for (const SafetensorsFile& shard : in.checkpoint.shards()) inputs.push_back(shard.path());
      for (const fs::path& file : inputs) {
        std::error_code file_ec;
        const fs::path real = fs::canonical(file, file_ec);
        const std::string written = real.filename().string();
        if (!ec && !file_ec && real.parent_path() == out_dir &&
            (written == "config.json" || is_checkpoint_file_name(written))) {
          throw UsageError("'" + file.string() + "' (an input file) is '" + (o / real.filename()).string() +
                           "' in the output directory, which the write would replace; write to another directory");
        }
      }
    }
  } else {
    if (fs::is_directory(o, ec))
      throw UsageError("'" + out + "' is a directory; the input is a file, so is the output");
    // (the name first: --force would not make /dev/null an output)
    if (o.extension() != ".safetensors") throw UsageError("'" + out + "': the output file must end in .safetensors");
    if (fs::exists(o, ec) && !force) throw UsageError("'" + out + "' exists; pass --force to replace it");
  }
}

std::uint64_t parse_shard_size(const std::string& text) {
  const std::uint64_t bytes = parse_byte_size(text, "--max-shard-size");
  if (bytes == 0) throw UsageError("--max-shard-size must be more than 0 bytes, got '" + text + "'");
  return bytes;
}

std::map<std::string, std::string> carried_metadata(const CheckpointInput& in) {
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : in.metadata) {
    if (!key.starts_with("fp8kit.")) out.emplace(key, value);
  }
  out["format"] = "pt";
  return out;
}

CompanionFiles write_checkpoint_output(const CheckpointInput& in, const std::string& out,
                                       std::vector<SafetensorsEntry> entries,
                                       const std::map<std::string, std::string>& metadata,
                                       const std::optional<std::string>& config_json,
                                       const std::string& max_shard_size) {
  const fs::path o(out);
  if (!in.is_directory) {
    if (!max_shard_size.empty()) throw UsageError("--max-shard-size applies to directory outputs");
    write_safetensors(o, entries, metadata);
    return {};
  }
  ShardOptions shards;
  if (!max_shard_size.empty()) shards.max_shard_bytes = parse_shard_size(max_shard_size);
  // The whole output is staged in a new directory beside OUT and swapped in with one rename (AtomicDirectory): a
  // failure or a kill at any moment leaves OUT as it was or complete. OUT's other files go on into the new directory
  // (hard links), except an earlier checkpoint's shards and index, which this one replaces. Where OUT cannot be
  // swapped (a symbolic link, a mount point, a file system without RENAME_EXCHANGE) the files are staged in OUT
  // itself and renamed into place one by one, the weights first, their index last, then config.json and the rest.
  std::vector<fs::path> made;         // folders this command created inside OUT (in place), outermost first
  const auto remove_made = [&made] {  // (the staged files are gone already: AtomicFile, AtomicDirectory)
    std::error_code ec;
    for (auto it = made.rbegin(); it != made.rend(); ++it) fs::remove(*it, ec);
  };
  std::string staged_at;  // the staging directory, while there is one
  try {
    AtomicDirectory directory(o);
    const fs::path w = directory.path();
    if (!directory.in_place()) staged_at = w.string();
    StagedShards weights = stage_sharded_safetensors(w, entries, metadata, shards);
    const OpenFileLimitRaised limit;  // outlives the staged files below
    std::vector<std::unique_ptr<AtomicFile>> others;
    if (config_json) others.push_back(stage_text(w / "config.json", *config_json));
    const CompanionFiles files = stage_companion_files(in, w, o, others, made);
    if (directory.in_place()) {
      // Before the renames, no destination may be a directory (the one way a rename then fails).
      std::vector<fs::path> destinations = weights.destinations();
      for (const auto& f : others) destinations.push_back(f->destination());
      for (const fs::path& d : destinations) {
        std::error_code ec;
        if (fs::is_directory(d, ec)) {
          FP8KIT_THROW(ErrorKind::kIo, "cannot write '", d.string(), "': a directory of that name is in the way");
        }
      }
    }
    weights.commit();
    for (auto& f : others) f->commit();
    directory.commit([](const fs::path& relative) { return kept_beside_new_checkpoint(relative); });
    return files;
  } catch (const Error& e) {
    remove_made();
    // A failed write names the file where the user will look for it, not in the staging directory it removed.
    std::string message = e.what();
    if (staged_at.empty() || message.find(staged_at) == std::string::npos) throw;  // (as it was, whatever its type)
    for (std::size_t at = message.find(staged_at); at != std::string::npos;
         at = message.find(staged_at, at + o.string().size())) {
      message.replace(at, staged_at.size(), o.string());
    }
    throw Error(e.kind(), message, e.file(), e.line());
  } catch (...) {
    remove_made();
    throw;
  }
}

void make_directories(const fs::path& directory, std::vector<fs::path>& made) {
  std::error_code ec;
  std::vector<fs::path> missing;  // innermost first
  for (fs::path p = directory; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    fs::create_directory(*it, ec);
    if (ec) FP8KIT_THROW(ErrorKind::kIo, "cannot create directory '", it->string(), "': ", ec.message());
    made.push_back(*it);
  }
  if (!fs::is_directory(directory, ec)) {
    FP8KIT_THROW(ErrorKind::kIo, "cannot create directory '", directory.string(),
                 "': a file of that name is in the way");
  }
}

CompanionFiles stage_companion_files(const CheckpointInput& in, const fs::path& to, const fs::path& destination,
                                     std::vector<std::unique_ptr<AtomicFile>>& staged, std::vector<fs::path>& made) {
  const fs::path& from = in.path;
  std::set<std::string> own{std::string(kSafetensorsIndexName)};
  for (const SafetensorsFile& shard : in.checkpoint.shards()) own.insert(shard.path().filename().string());
  CompanionFiles files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(from, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const fs::path relative = it->path().lexically_relative(from);
    if (it->is_directory(ec)) {
      if (!relative.empty() && relative.filename().string()[0] == '.') it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(ec)) continue;  // (it follows symlinks)
    const Companion what = classify_companion(relative, own);
    if (what == Companion::kLeaveOut) files.left_out.push_back(relative.generic_string());
    if (what != Companion::kCopy) continue;
    // A symbolic link inside OUT (a folder of it leading back into the input) would have the copy replace the
    // input's own file: refused before anything is made or staged there.
    std::error_code in_ec, out_ec;
    // (The folder's path resolved, not the file's own: a link left at the file's name is replaced, not written
    // through.)
    const fs::path input = fs::weakly_canonical(from, in_ec),
                   dest = fs::weakly_canonical((destination / relative).parent_path(), out_ec) / relative.filename();
    const auto [stop, rest] = std::mismatch(input.begin(), input.end(), dest.begin(), dest.end());
    if (!in_ec && !out_ec && stop == input.end()) {
      throw UsageError("'" + (destination / relative).string() + "' leads into the input directory '" + from.string() +
                       "' (a symbolic link in the output): remove the link or write elsewhere");
    }
    make_directories((to / relative).parent_path(), made);
    staged.push_back(stage_copy(it->path(), to / relative));
    ++files.copied;
  }
  if (ec) FP8KIT_THROW(ErrorKind::kIo, "cannot list '", from.string(), "': ", ec.message());
  std::sort(files.left_out.begin(), files.left_out.end());
  return files;
}

void note_left_out(const CompanionFiles& files) {
  if (files.left_out.empty()) return;
  std::string names;
  for (const std::string& name : files.left_out) names += (names.empty() ? "" : ", ") + printable(name);
  fmt::print(stderr,
             "note: not copied: {} (weights that are not the checkpoint's shards, or pickles, which fp8kit does not "
             "read; copy them to the output yourself if they belong with it)\n",
             names);
}

namespace {

// Calls run(is_finite) with is_finite(i) telling whether element i of `bytes` (of dtype `d`) is finite, on its bits:
// one loop per pair of dtypes, so the loops below compile without a branch on the dtype per element.
template <typename Run>
void with_finite_test(std::span<const std::byte> bytes, DType d, const Run& run) {
  const auto bits = [p = bytes.data()]<typename U>(U, std::size_t i) {
    U v;
    std::memcpy(&v, p + i * sizeof(U), sizeof v);
    return v;
  };
  switch (d) {
    case DType::float64:
      return run(
          [&](std::size_t i) { return (bits(std::uint64_t{}, i) & 0x7FF0000000000000ull) != 0x7FF0000000000000ull; });
    case DType::float32:
      return run([&](std::size_t i) { return (bits(std::uint32_t{}, i) & 0x7F800000u) != 0x7F800000u; });
    case DType::bfloat16:
      return run([&](std::size_t i) { return (bits(std::uint16_t{}, i) & 0x7F80u) != 0x7F80u; });
    case DType::float16:
      return run([&](std::size_t i) { return (bits(std::uint16_t{}, i) & 0x7C00u) != 0x7C00u; });
    default: {
      const FormatDescriptor& f = descriptor(*fp8_format(d));
      std::array<bool, 256> finite{};
      for (int c = 0; c < 256; ++c)
        finite[c] = !f.is_nan(static_cast<std::uint8_t>(c)) && !f.is_inf(static_cast<std::uint8_t>(c));
      return run([&](std::size_t i) { return finite[static_cast<std::uint8_t>(bytes[i])]; });
    }
  }
}

}  // namespace

void OverflowCount::add(const std::string& tensor, std::span<const std::byte> in, DType from,
                        std::span<const std::byte> out, DType to) {
  const std::size_t n = in.size() / element_size(from);
  // First the output alone (one test of its bits per element, which the compiler vectorizes for the wide types): in
  // the usual output every value is finite and the input is not read again.
  bool any = false;
  with_finite_test(out, to, [&](const auto& out_finite) {
    std::size_t nonfinite = 0;
    for (std::size_t i = 0; i < n; ++i) nonfinite += out_finite(i) ? 0 : 1;
    any = nonfinite != 0;
  });
  if (!any) return;
  std::uint64_t count = 0;
  with_finite_test(in, from, [&](const auto& in_finite) {
    with_finite_test(out, to, [&](const auto& out_finite) {
      for (std::size_t i = 0; i < n; ++i) count += (in_finite(i) && !out_finite(i)) ? 1 : 0;
    });
  });
  if (count == 0) return;
  const std::lock_guard lock(mutex_);
  values_ += count;
  if (tensors_++ == 0) first_ = tensor;
}

void OverflowCount::note(DType to, const std::string& advice) const {
  if (values_ == 0) return;
  fmt::print(stderr, "note: {} of '{}'{} became inf or NaN past {}'s range: {}\n", counted(values_, "finite value"),
             one_line(first_), tensors_ > 1 ? " and " + counted(tensors_ - 1, "more tensor") : "", name(to), advice);
}

}  // namespace fp8kit::cli
