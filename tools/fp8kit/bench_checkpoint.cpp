// `fp8kit bench checkpoint`: the checkpoint commands (quantize, dequantize, convert) on a generated checkpoint
// against `cp` + fsync of a file of the same size, on the same disk, interleaved repetitions, medians. The commands
// run as users run them (this executable, as a child process, its output discarded), so the figures include
// everything a user waits for: mapping, compute, the writes and the final fsync.
#include "bench_checkpoint.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "cli_common.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/io/safetensors.hpp"
#include "fp8kit/tensor/tensor.hpp"
#include "harness.hpp"

extern char** environ;

namespace fp8kit::cli {
namespace {
namespace fs = std::filesystem;

constexpr std::int64_t kRows = 4096;  // every weight is 4096 x cols, like a 4096-wide model's projections

// Ctrl-C, a kill or a closed terminal during the benchmark: its folder holds gigabytes of generated checkpoints,
// which must not stay behind. The handler only records the signal and ends the running child (both async-signal-safe);
// the benchmark stops at its next check, its folder is removed as the stack unwinds, and the signal is raised again
// with the disposition it had before, so that the caller sees the benchmark end by that signal.
std::atomic<int> g_interrupted{0};
std::atomic<pid_t> g_child{0};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<pid_t>::is_always_lock_free);

extern "C" void on_interrupt(int signal) {
  g_interrupted.store(signal);
  if (const pid_t child = g_child.load(); child > 0) ::kill(child, SIGTERM);
}

struct Interrupted {
  int signal;
};

void check_interrupted() {
  if (const int signal = g_interrupted.load(); signal != 0) throw Interrupted{signal};
}

// The handlers for the benchmark's duration; the previous dispositions come back on destruction.
class InterruptHandlers {
 public:
  InterruptHandlers() {
    g_interrupted.store(0);
    struct sigaction action {};
    action.sa_handler = on_interrupt;
    sigemptyset(&action.sa_mask);
    for (std::size_t i = 0; i < std::size(kSignals); ++i) {
      ::sigaction(kSignals[i], nullptr, &previous_[i]);
      // An ignored signal stays ignored (nohup, a background job of a script): it would not have ended the run.
      if (previous_[i].sa_handler != SIG_IGN) ::sigaction(kSignals[i], &action, nullptr);
    }
  }
  ~InterruptHandlers() {
    for (std::size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &previous_[i], nullptr);
  }
  InterruptHandlers(const InterruptHandlers&) = delete;
  InterruptHandlers& operator=(const InterruptHandlers&) = delete;

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction previous_[std::size(kSignals)]{};
};

// Runs argv as a child process with its output discarded; throws naming the command when it fails.
void run_child(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) throw std::runtime_error("bench checkpoint: cannot run " + argv[0] + ": " + std::strerror(spawned));
  g_child.store(pid);
  if (g_interrupted.load() != 0) ::kill(pid, SIGTERM);  // a signal between the check and the spawn
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  g_child.store(0);
  check_interrupted();  // a child ended by the handler did not fail: the benchmark was interrupted
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string line;
    for (const std::string& a : argv) line += (line.empty() ? "" : " ") + a;
    throw std::runtime_error("bench checkpoint: '" + line + "' failed");
  }
}

// `cp FROM TO` and an fsync of TO: what writing a file of that size to this disk takes.
void copy_and_sync(const fs::path& from, const fs::path& to) {
  run_child({"cp", from.string(), to.string()});
  const int fd = ::open(to.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) throw std::runtime_error("bench checkpoint: cannot fsync '" + to.string() + "'");
  ::close(fd);
}

// A checkpoint of `count` weights of kRows x cols in `dtype`, random normal (the same values in every dtype).
void write_checkpoint(const fs::path& path, std::int64_t count, std::int64_t cols, DType dtype) {
  std::vector<SafetensorsEntry> entries;
  for (std::int64_t i = 0; i < count; ++i) {
    SafetensorsEntry e{
        fmt::format("model.layers.{}.mlp.up_proj.weight", i), safetensors_dtype(dtype), {kRows, cols}, {}, {}};
    e.fill = [i, cols, dtype](std::span<std::byte> out) {
      check_interrupted();  // between weights: the file being written is a temporary, removed as this unwinds
      Tensor w = randn({kRows, cols}, static_cast<std::uint64_t>(100 + i), DType::float32);
      for (float& v : w.span<float>()) v *= 0.02f;  // the size of a trained projection's weights
      convert(w.raw(), DType::float32, out.data(), dtype, w.numel());
    };
    entries.push_back(std::move(e));
  }
  write_safetensors(path, entries);
}

double seconds_of(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Removes the benchmark's folder however it ends.
struct ScratchDir {
  fs::path path;
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void run_checkpoint_bench(const CheckpointBenchArgs& args) {
  if (args.reps < 3) throw UsageError("--reps must be at least 3, got " + std::to_string(args.reps));
  const std::uint64_t bytes = parse_byte_size(args.bytes, "--bytes");
  constexpr std::uint64_t kWeightsPerFile = 8;
  constexpr std::uint64_t min_bytes = kWeightsPerFile * kRows * 64 * 2;
  static_assert(min_bytes % (1u << 20) == 0, "the range below is said in MiB");
  if (bytes < min_bytes || bytes > (64ull << 30)) {
    throw UsageError(
        fmt::format("--bytes: {} is outside {}MiB..64GiB (the bf16 checkpoint's size)", args.bytes, min_bytes >> 20));
  }
  std::error_code ec;
  const fs::path parent = args.dir.empty() ? fs::temp_directory_path(ec) : fs::path(args.dir);
  if (!fs::is_directory(parent, ec)) throw UsageError("--dir: '" + parent.string() + "' is not a directory");
  // bf16 input and its copy, the FP8 output, the dequantized bf16, the f32 input, its copy and the bf16 convert.
  const std::uint64_t needed = bytes * 2 + bytes / 2 + bytes + bytes * 4 + bytes;
  const fs::space_info space = fs::space(parent, ec);
  if (!ec && space.available < needed + (std::uint64_t{1} << 30)) {
    throw UsageError(
        fmt::format("--bytes {} needs {} free in '{}' (its files, and 1 GiB to spare) and {} is; use a smaller size or "
                    "--dir on a larger disk",
                    args.bytes, byte_size_text(needed + (std::uint64_t{1} << 30)), parent.string(),
                    byte_size_text(space.available)));
  }
  const std::int64_t cols = std::max<std::int64_t>(64, static_cast<std::int64_t>(bytes / kWeightsPerFile / kRows / 2));
  ScratchDir dir{parent / fmt::format("fp8kit-bench-checkpoint-{}", ::getpid())};
  fs::create_directories(dir.path, ec);
  if (ec) throw UsageError("cannot create '" + dir.path.string() + "': " + ec.message());
  const fs::path bf16 = dir.path / "bf16.safetensors", f32 = dir.path / "f32.safetensors",
                 fp8 = dir.path / "fp8.safetensors", back = dir.path / "dequantized.safetensors",
                 cast = dir.path / "converted.safetensors", copy = dir.path / "copy.safetensors";
  ProgressLine progress;
  progress.show("bench checkpoint: writing the inputs");
  write_checkpoint(bf16, kWeightsPerFile, cols, DType::bfloat16);
  write_checkpoint(f32, kWeightsPerFile, cols, DType::float32);
  const std::string self = fs::read_symlink("/proc/self/exe", ec).string();
  if (ec) throw std::runtime_error("bench checkpoint: cannot find this executable: " + ec.message());

  struct Op {
    std::string name, input;
    std::vector<std::string> argv;
    fs::path output;
    int baseline;  // 0: the copy of the bf16 file, 1: of the f32 file
  };
  const std::vector<Op> ops = {
      {"quantize fp8-block deepseek",
       "bf16",
       {self, "quantize", bf16.string(), fp8.string(), "--scheme", "fp8-block", "--layout", "deepseek", "--quiet"},
       fp8,
       0},
      {"dequantize --to bf16",
       "fp8",
       {self, "dequantize", fp8.string(), back.string(), "--to", "bf16", "--quiet"},
       back,
       0},
      {"convert --to bf16", "f32", {self, "convert", f32.string(), cast.string(), "--to", "bf16", "--quiet"}, cast, 1},
  };
  std::vector<std::vector<double>> times(ops.size());
  std::vector<double> copies[2];
  const fs::path sources[2] = {bf16, f32};
  for (int rep = 0; rep < args.reps; ++rep) {
    progress.show(fmt::format("bench checkpoint: {}/{}", rep + 1, args.reps));
    for (int b = 0; b < 2; ++b) {
      copies[b].push_back(seconds_of([&] { copy_and_sync(sources[b], copy); }));
      fs::remove(copy, ec);
    }
    for (std::size_t i = 0; i < ops.size(); ++i) {
      times[i].push_back(seconds_of([&] { run_child(ops[i].argv); }));
      // dequantize reads quantize's output: keep the FP8 file, remove the rest before the next write
      if (ops[i].output != fp8) fs::remove(ops[i].output, ec);
    }
    fs::remove(fp8, ec);
  }
  progress.show("");

  const std::string cpu = cpu_features().brand;
  const double copy_s[2] = {bench::median(copies[0]), bench::median(copies[1])};
  const std::uint64_t file_bytes[2] = {fs::file_size(bf16), fs::file_size(f32)};
  if (args.json) {
    nlohmann::json out = nlohmann::json::array();
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const double t = bench::median(times[i]);
      out.push_back({{"op", ops[i].name},
                     {"input", ops[i].input},
                     {"seconds", t},
                     {"baseline", "cp+fsync"},
                     {"baseline_bytes", file_bytes[ops[i].baseline]},
                     {"baseline_seconds", copy_s[ops[i].baseline]},
                     {"ratio", copy_s[ops[i].baseline] / t},
                     {"reps", args.reps},
                     {"dir", parent.string()},
                     {"cpu", cpu}});
    }
    fmt::print(output(), "{}\n", json_text(out));
    return;
  }
  fmt::print(
      output(),
      "checkpoint commands vs cp + fsync on the same disk ('{}'), {} repetitions interleaved, medians; CPU: {}\n",
      parent.string(), args.reps, cpu.empty() ? "unknown" : cpu);
  fmt::print(output(),
             "inputs: {} bf16 weights of {} x {} ({:.0f} MiB), the same in f32 ({:.0f} MiB); ratio: cp+fsync time / "
             "command time (the copy of the bf16 file for quantize and dequantize, whose output is that size; of the "
             "f32 file for convert)\n\n",
             kWeightsPerFile, kRows, cols, static_cast<double>(file_bytes[0]) / (1 << 20),
             static_cast<double>(file_bytes[1]) / (1 << 20));
  fmt::print(output(), "{:<30} {:>10} {:>14} {:>8}\n", "op", "seconds", "cp+fsync s", "ratio");
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const double t = bench::median(times[i]);
    fmt::print(output(), "{:<30} {:>10.3f} {:>14.3f} {:>7.2f}x\n", ops[i].name, t, copy_s[ops[i].baseline],
               copy_s[ops[i].baseline] / t);
  }
}

}  // namespace

void run_bench_checkpoint(const CheckpointBenchArgs& args) {
  int signal = 0;
  {
    const InterruptHandlers handlers;
    try {
      run_checkpoint_bench(args);
    } catch (const Interrupted& e) {
      signal = e.signal;  // the scratch folder is gone: ScratchDir unwound
    }
    // A signal after the last check (while the results were printed) ends the process the same way.
    if (signal == 0) signal = g_interrupted.load();
  }
  if (signal != 0) {
    std::raise(signal);  // under the previous disposition: by default the process ends here, by that signal
    throw std::runtime_error("bench checkpoint: interrupted by signal " + std::to_string(signal) +
                             "; its files were removed");
  }
}

}  // namespace fp8kit::cli
