// What the libFuzzer harnesses share: the rule every reader keeps on untrusted bytes, a scratch directory for the
// readers that take files, and the corpus format of the harnesses whose input is two texts.
//
// The rule: a reader given any bytes either returns what they hold or throws fp8kit::Error whose message is one
// line of printable ASCII (what it quotes of the input escaped, fp8kit/common/text.hpp). Anything else -- another
// exception, a crash, a sanitizer report, a message with a control byte -- aborts, and libFuzzer saves the input.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "fp8kit/common/error.hpp"

namespace fp8kit::fuzz {

// Aborts with `what` on stderr (libFuzzer reports the abort and writes the input as crash-<sha1>).
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "fp8kit fuzz finding: %s\n", what.c_str());
  std::abort();
}

inline void check(bool ok, const std::string& what) {
  if (!ok) finding(what);
}

// An error message fit to print: not empty, one line, printable ASCII only.
inline void check_message(std::string_view message) {
  check(!message.empty(), "an empty error message");
  for (const char c : message) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u > 0x7E) finding("an error message with byte " + std::to_string(u) + ": " + std::string(message));
  }
}

// Runs `read`; an fp8kit::Error is the reader refusing the input (its message checked), and returns false.
template <class Read>
bool accepted(Read&& read) {
  try {
    std::forward<Read>(read)();
    return true;
  } catch (const Error& e) {
    check_message(e.what());
    return false;
  }
}

// This process's scratch directory (under /dev/shm when there is one: no disk writes per input), created once.
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    std::error_code ec;
    const std::filesystem::path base =
        std::filesystem::is_directory("/dev/shm", ec) ? "/dev/shm" : std::filesystem::temp_directory_path();
    std::filesystem::path d = base / ("fp8kit-fuzz-" + std::to_string(::getpid()));
    std::filesystem::remove_all(d, ec);
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code e;
      std::filesystem::remove_all(scratch(), e);
    });
    return d;
  }();
  return dir;
}

inline void write_file(const std::filesystem::path& path, std::span<const std::uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  check(static_cast<bool>(out), "cannot write the scratch file " + path.string());
}

// The inputs of two parts (a config.json and a safetensors file, say): the bytes before the first kSeparator and the
// bytes after it; without one, no first part and all the bytes second.
inline constexpr std::string_view kSeparator = "\n=fp8kit-fuzz=\n";
inline std::pair<std::string_view, std::span<const std::uint8_t>> split(std::span<const std::uint8_t> input) {
  const std::string_view text(reinterpret_cast<const char*>(input.data()), input.size());
  const std::size_t at = text.find(kSeparator);
  if (at == std::string_view::npos) return {{}, input};
  return {text.substr(0, at), input.subspan(at + kSeparator.size())};
}

}  // namespace fp8kit::fuzz
