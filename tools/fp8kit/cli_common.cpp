// Shared CLI helpers: format-list parsing, printing codes and exact values, terminal detection.
// Used by several commands; nothing here knows about any one command.
#include "cli_common.hpp"

#include <fmt/core.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <optional>
#include <thread>
#include <type_traits>

#include "fp8kit/common/error.hpp"
#include "fp8kit/dist/communicator.hpp"
#include "fp8kit/io/atomic_file.hpp"

namespace fp8kit::cli {

KeepDispatchSettings::KeepDispatchSettings()
    : cap_(max_isa_set()), threads_(num_threads_set()), openmp_default_(omp_get_max_threads()) {}

KeepDispatchSettings::~KeepDispatchSettings() {
  set_max_isa(cap_);
  set_num_threads(threads_);
  omp_set_num_threads(openmp_default_);
}

std::string one_line(std::string_view text) {
  std::string line;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7F) {
      line += fmt::format("\\x{:02x}", c);
    } else {
      line += ch;
    }
  }
  return line;
}

std::unique_ptr<Communicator> job_communicator() {
  try {
    return world_communicator();
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kInvalidArgument && launcher_rank() != 0) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    throw;
  }
}

int report_error(const std::string& command, const std::exception_ptr& error) {
  std::string message;
  int status = 1;
  try {
    std::rethrow_exception(error);
  } catch (const ReportedError& e) {
    return e.status;
  } catch (const UsageError& e) {
    message = e.what();
    status = 2;
  } catch (const Error& e) {
    message = e.what();
    status = e.kind() == ErrorKind::kInvalidArgument || e.kind() == ErrorKind::kParse ? 2 : 1;
  } catch (const std::bad_alloc&) {
    message =
        "out of memory: what was asked needs more memory than this machine can give (std::bad_alloc); try "
        "smaller sizes";
  } catch (const std::exception& e) {
    message = e.what();
  }
  // Under mpirun every rank reaches the same verdict on its arguments and settings: rank 0 says it, once. (A rank
  // that fails on its own in the middle of a run says so itself, naming its rank, and ends the job: fp8kit train.)
  const std::string line = one_line(message);
  if (launcher_rank() == 0) {
    std::fprintf(stderr, "%s: %s\n", command.c_str(), line.c_str());
    std::fflush(stderr);
  }
  return status;
}

std::string known_format_names() {
  std::string names;
  for (Format f : kAllFormats) {
    if (!names.empty()) names += ", ";
    names += name(f);
  }
  return names;
}

std::string byte_size_text(std::uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  std::size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(units)) v /= 1024.0, ++u;
  return fmt::format("{:.1f} {}", v, units[u]);
}

std::optional<std::filesystem::path> atomic_target(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return fs::path(path);
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  const fs::path target = fs::canonical(path, ec);
  return ec ? fs::path(path) : target;
}

void write_text_file(const std::string& path, const std::string& text) {
  if (const std::optional<std::filesystem::path> target = atomic_target(path)) {
    AtomicFile file(*target);
    file.write(std::as_bytes(std::span<const char>(text.data(), text.size())));
    file.commit();
    return;
  }
  std::ofstream out(path, std::ios::binary | std::ios::app);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.flush();
  if (!out) FP8KIT_THROW(ErrorKind::kIo, "cannot write '", path, "': ", std::strerror(errno));
}

namespace {

// The first number in a file (a /proc or /sys entry), if it starts with one.
std::optional<unsigned long long> read_number(const char* path, const char* format) {
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return std::nullopt;
  char line[256];
  unsigned long long value = 0;
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f) != nullptr) found = std::sscanf(line, format, &value) == 1;
  std::fclose(f);
  return found ? std::optional(value) : std::nullopt;
}

}  // namespace

std::uint64_t available_memory() {
  std::uint64_t available = read_number("/proc/meminfo", "MemAvailable: %llu kB").value_or(0) * 1024;
  const auto limit = read_number("/sys/fs/cgroup/memory.max", "%llu");  // "max" (no limit) does not parse
  const auto used = read_number("/sys/fs/cgroup/memory.current", "%llu");
  if (limit && used && *limit > *used) available = std::min<std::uint64_t>(available, *limit - *used);
  return available;
}

int local_ranks() {
  const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  return v == nullptr ? 1 : std::max(1, std::atoi(v));
}

void check_output_folder(const std::filesystem::path& output, const std::string& prefix) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(output, ec)) return;
  const fs::path named = output.has_filename() ? output : output.parent_path();
  if (fs::is_symlink(fs::symlink_status(named, ec))) {  // a link to nothing: what is written there is lost with it
    throw PathError(prefix + "'" + named.string() + "' is a symbolic link to '" + fs::read_symlink(named, ec).string() +
                        "', which does not exist; give a path that does",
                    true);
  }
  const fs::path parent = named.parent_path().empty() ? fs::path(".") : named.parent_path();
  if (fs::is_directory(parent, ec)) return;
  const bool missing = !fs::exists(parent, ec);
  throw PathError(prefix + (missing ? "the directory '" : "'") + parent.string() +
                      (missing ? "' does not exist; create it first" : "' is not a directory"),
                  missing);
}

template <typename T>
T parse_integer_option(const std::string& option, const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || stop != end) {
    const std::string shown = text.empty() ? "(nothing)" : "'" + text + "'";
    if (ec == std::errc::result_out_of_range && stop == end) {  // digits, too many of them
      throw UsageError(option + ": " + shown + (text.starts_with('-') ? " is too small" : " is too large") +
                       " for it (it holds " + std::to_string(std::numeric_limits<T>::min()) + " .. " +
                       std::to_string(std::numeric_limits<T>::max()) + ")");
    }
    if (std::is_unsigned_v<T> && text.starts_with('-')) {
      throw UsageError(option + ": " + shown + " is negative; it takes 0 .. " +
                       std::to_string(std::numeric_limits<T>::max()));
    }
    throw UsageError(option + ": " + shown + " is not a whole decimal number (no fraction, exponent or 0x)");
  }
  return value;
}
template int parse_integer_option<int>(const std::string&, const std::string&);
template std::int64_t parse_integer_option<std::int64_t>(const std::string&, const std::string&);
template std::uint64_t parse_integer_option<std::uint64_t>(const std::string&, const std::string&);

std::vector<Format> parse_format_list(std::string_view text) {
  std::vector<Format> formats;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::string_view token = text.substr(start, comma == std::string_view::npos ? text.npos : comma - start);
    const auto format = parse_format(token);
    if (!format) {
      throw UsageError("unknown format '" + std::string(token) + "' (known: " + known_format_names() + ")");
    }
    if (std::find(formats.begin(), formats.end(), *format) != formats.end()) {  // (e4m3fn,float8_e4m3fn too)
      throw UsageError("format " + std::string(name(*format)) + " is listed twice in '" + std::string(text) +
                       "'; give each format once");
    }
    formats.push_back(*format);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return formats;
}

std::string format_exact(double value, std::size_t max_chars) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  if (value == 0) return std::signbit(value) ? "-0" : "0";
  // value = significand * 2^exponent with an odd integer significand: the exact decimal has max(0, -exponent)
  // digits after the point, and printf prints every one of them exactly.
  int binary_exponent = 0;
  const double fraction = std::frexp(std::fabs(value), &binary_exponent);
  const auto significand = static_cast<std::uint64_t>(std::ldexp(fraction, 53));
  const int lowest_bit = binary_exponent - 53 + std::countr_zero(significand);
  const int decimals = lowest_bit < 0 ? -lowest_bit : 0;
  const int length = std::snprintf(nullptr, 0, "%.*f", decimals, value);
  if (length > 0 && static_cast<std::size_t>(length) <= max_chars) {
    std::string text(static_cast<std::size_t>(length) + 1, '\0');
    std::snprintf(text.data(), text.size(), "%.*f", decimals, value);
    text.pop_back();
    return text;
  }
  if (significand == (std::uint64_t{1} << 52)) {  // a power of two
    return fmt::format("{}2^{} ({:.6g})", value < 0 ? "-" : "", binary_exponent - 1, value);
  }
  return fmt::format("~{:.6g}", value);
}

Overflow OverflowFlags::overflow() const {
  if (saturate && no_saturate) throw UsageError("--saturate and --no-saturate contradict each other");
  return no_saturate ? Overflow::kNonSaturating : Overflow::kSaturate;
}

void add_overflow_flags(CLI::App* command, OverflowFlags& flags) {
  command->add_flag("--saturate", flags.saturate,
                    "Overflow to +-max finite (the default, as TE, CUDA satfinite and PyTorch >= 2.12 for e4m3fn)");
  command->add_flag(
      "--no-saturate", flags.no_saturate,
      "Overflow to Inf/NaN instead, as ml_dtypes and PyTorch .to() (e4m3fn up to 2.11, the other formats always)");
}

std::uint64_t parse_byte_size(const std::string& text, const std::string& option) {
  static constexpr struct {
    std::string_view unit;
    std::uint64_t bytes;
  } kUnits[] = {
      {"", 1},          {"B", 1},       {"KB", 1'000},    {"MB", 1'000'000}, {"GB", 1'000'000'000}, {"K", 1 << 10},
      {"KiB", 1 << 10}, {"M", 1 << 20}, {"MiB", 1 << 20}, {"G", 1ull << 30}, {"GiB", 1ull << 30}};
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  const std::string_view unit = std::string_view(text).substr(digits);
  for (const auto& u : kUnits) {
    if (u.unit != unit || digits == 0) continue;
    std::uint64_t value = 0;  // any number of digits: one past uint64 is too large, not malformed
    const auto [end, ec] = std::from_chars(text.data(), text.data() + digits, value);
    if (ec == std::errc::result_out_of_range || value > (std::uint64_t{1} << 62) / u.bytes) {
      throw UsageError(option + ": '" + text + "' is too large (at most 2^62 bytes)");
    }
    return value * u.bytes;
  }
  throw UsageError(option + ": '" + text +
                   "' is not a size (digits and a unit: B, KB, MB, GB = 10^3, 10^6, 10^9; KiB, MiB, GiB or K, M, G "
                   "= 2^10, 2^20, 2^30; e.g. 5GB, 256MiB)");
}

bool stderr_is_terminal() {
  return isatty(STDERR_FILENO) == 1;
}

namespace {
thread_local bool g_quiet = false;  // set while parsing; run() and run_into() clear it first
}  // namespace

void add_quiet_flag(CLI::App* command) {
  command->add_flag("--quiet", g_quiet, "No progress line on stderr (there is one only when stderr is a terminal)");
}

bool progress_silenced() {
  return g_quiet;
}

void clear_quiet_flag() {
  g_quiet = false;
}

ProgressLine::~ProgressLine() {
  if (shown_) std::fprintf(stderr, "\r\033[K");
}

void ProgressLine::show(const std::string& text) const {
  if (!on_) return;
  std::fprintf(stderr, "\r\033[K%s", text.c_str());
  shown_ = true;
}

}  // namespace fp8kit::cli
