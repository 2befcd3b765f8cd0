// Shared pieces of the CLI commands: how a command registers itself, the usage-error type, small parsers for
// the option values several commands take (format lists), and how codes and exact values are printed.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cli.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/dist/communicator.hpp"
#include "fp8kit/format/codec.hpp"
#include "fp8kit/format/format.hpp"

namespace fp8kit::cli {

// Says what `error` was, in one line "<command>: <message>" on stderr (under mpirun only launcher rank 0 says it),
// and returns the exit status it deserves: 2 for bad usage or bad input (UsageError, Error kInvalidArgument or
// kParse), 1 for any other failure. An error already said (ReportedError) is not said again: its status.
int report_error(const std::string& command, const std::exception_ptr& error);

// world_communicator() for a command run over ranks. Its one refusal (FP8KIT_DIST_CHECK set on some ranks only) is
// every rank's and said by rank 0 alone (report_error); the other ranks, with no communicator to wait on, wait a
// second before their exit ends the job, so that mpirun does not kill rank 0 before its line is out (it did in about
// one run of five on two loaded cores).
std::unique_ptr<Communicator> job_communicator();

// An error report_error has said already: main() exits with `status` and prints nothing more. (A run over ranks
// says its error while the other ranks wait, so that none of them ends the job before rank 0 has said why.)
class ReportedError : public std::exception {
 public:
  explicit ReportedError(int exit_status) : status(exit_status) {}
  const char* what() const noexcept override { return "reported"; }
  int status;
};

// Each command adds its subcommand (options + callback) to the app.
void add_formats_command(CLI::App& app);
void add_cast_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_analyze_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_dequantize_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_info_command(CLI::App& app);

// An integer option's value, strictly: decimal digits, a leading '-' only for a signed T, within T's range. Anything
// else ("", "1.5", "0x10", "12abc", "-1" for an unsigned T, a value past the range, which CLI11's own conversion
// would clamp) is a UsageError naming the option and the range.
template <typename T>
T parse_integer_option(const std::string& option, const std::string& text);

// An integer option parsed by parse_integer_option into `target` (which must outlive the app).
template <typename T>
CLI::Option* add_integer_option(CLI::App* cmd, const std::string& name, T& target, const std::string& description) {
  return cmd
      ->add_option_function<std::string>(
          name, [&target, name](const std::string& text) { target = parse_integer_option<T>(name, text); }, description)
      ->type_name(std::is_signed_v<T> ? "INT" : "UINT");
}

// A report's JSON text (`indent` < 0: one line). Bytes that are not UTF-8 (in a path, or a tensor name from an
// untrusted file) come out as U+FFFD: nlohmann throws on them by default, which failed a command after its output
// was written.
template <typename Json>
std::string json_text(const Json& j, int indent = 2) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

// `text` on one line, as errors and tables print untrusted names and paths: control bytes (a newline, a terminal
// escape) as \xNN; other bytes (UTF-8) as they are.
std::string one_line(std::string_view text);

// A byte count for people: "512 B", "4.0 KiB", "3.2 MiB", "1.5 GiB".
std::string byte_size_text(std::uint64_t bytes);

// "1 step", "400 steps": a count and its noun, for summary lines, notes and messages.
template <typename Count>
requires std::is_integral_v<Count> std::string counted(Count n, std::string_view noun) {
  return std::to_string(n) + " " + std::string(noun) + (n == 1 ? "" : "s");
}

// Where an output file `path` is written through a temporary file and a rename: the path, or what an existing symlink
// there points to (the link stays a link); nothing for an existing file that is not a regular file (a device, a
// pipe, /dev/stdout), which is written in place.
std::optional<std::filesystem::path> atomic_target(const std::string& path);

// The memory this process can allocate now: /proc/meminfo's MemAvailable, and below it what the cgroup (v2) limit
// leaves (memory.max - memory.current, in containers); 0 where unknown.
std::uint64_t available_memory();
// The ranks of this job on this machine (mpirun's OMPI_COMM_WORLD_LOCAL_SIZE), 1 outside mpirun.
int local_ranks();

// An output that does not exist yet goes into a folder that does (a file is written there, a directory output is
// created there, never a tree of folders a typo would grow), and is not a symbolic link to nothing; "out/" names the
// directory out. Otherwise PathError:
// "<prefix>the directory 'D' does not exist; create it first" or "<prefix>'D' is not a directory".
void check_output_folder(const std::filesystem::path& output, const std::string& prefix);

// `text` as the file `path`, crash-safely (a temporary file, fsync, rename: an existing file stays whole until the new
// one is complete; see atomic_target). Throws fp8kit::Error (kIo) naming the path when it cannot.
void write_text_file(const std::string& path, const std::string& text);

// "e4m3fn,e5m2" -> formats; an unknown name is a UsageError naming it and listing the known ones.
std::vector<Format> parse_format_list(std::string_view text);

// The known format names, comma-separated (for help texts and errors).
std::string known_format_names();

// A double printed exactly ("448", "0.001953125", "-0", "inf", "nan") when its exact decimal form takes at
// most `max_chars` characters; otherwise "2^127 (1.70141e+38)" for a power of two, "~1.23457e+38" for
// anything else.
std::string format_exact(double value, std::size_t max_chars = 24);

// The overflow policy of every command that casts to FP8 (cast, convert, analyze; quantize always saturates): the
// same default everywhere, saturating (overflow becomes +-max finite, as CUDA's __NV_SATFINITE, Transformer Engine,
// torchao and PyTorch's eager e4m3fn casts from 2.12 do), and `--no-saturate` for overflow to Inf/NaN (PyTorch's
// .to() up to 2.11, ml_dtypes). `--saturate` says the default explicitly; both together are a UsageError.
struct OverflowFlags {
  bool saturate = false;
  bool no_saturate = false;
  bool given() const { return saturate || no_saturate; }
  Overflow overflow() const;  // checks that the flags do not contradict each other
};
void add_overflow_flags(CLI::App* command, OverflowFlags& flags);

// A byte count for the option `option` (named in the error): digits, then a unit: none or B (bytes), KB, MB, GB
// (10^3, 10^6, 10^9, as Hugging Face's max_shard_size), KiB, MiB, GiB or K, M, G (2^10, 2^20, 2^30). Every size
// option of the CLI reads its value with this; callers check the range.
std::uint64_t parse_byte_size(const std::string& text, const std::string& option);

// True when stderr is a terminal (progress output goes there only then).
bool stderr_is_terminal();

// `--quiet` on a long-running command (quantize, dequantize, convert, train): no progress line even on a terminal.
void add_quiet_flag(CLI::App* command);
bool progress_silenced();
void clear_quiet_flag();  // before a command line is parsed (several may run in one process)

// The process's dispatch settings, put back when it ends (an error included): the ISA cap (set_max_isa), the thread
// count (set_num_threads) and the calling thread's OpenMP default. Every command runs inside one, so a command run
// in a process that goes on (the Python package's command(), a test) leaves them as they were, whatever its --isa
// and --threads set; within a command, a benchmark keeps one per sweep over levels.
class KeepDispatchSettings {
 public:
  KeepDispatchSettings();
  ~KeepDispatchSettings();
  KeepDispatchSettings(const KeepDispatchSettings&) = delete;
  KeepDispatchSettings& operator=(const KeepDispatchSettings&) = delete;

 private:
  std::optional<Isa> cap_;
  std::optional<int> threads_;
  int openmp_default_;
};

// The CLI's one progress reporter: a line on stderr rewritten in place by show() and cleared when the object goes
// away, only when stderr is a terminal and --quiet was not given (nothing otherwise: pipes and logs stay clean).
class ProgressLine {
 public:
  ProgressLine() : on_(stderr_is_terminal() && !progress_silenced()) {}
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  bool on() const { return on_; }
  void show(const std::string& text) const;

 private:
  bool on_;
  mutable bool shown_ = false;
};

}  // namespace fp8kit::cli
