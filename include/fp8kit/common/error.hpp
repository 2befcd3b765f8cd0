// The one error vocabulary of fp8kit: a typed exception carrying file:line and a formatted message.
// Library code checks its preconditions with FP8KIT_CHECK(cond, parts...); the CLI turns errors into one line.
#pragma once

#include <concepts>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace fp8kit {

// What went wrong, so a caller (and the CLI's exit status) can tell bad input from other failures.
enum class ErrorKind {
  kInvalidArgument,  // the caller passed something the function does not accept (bad size, bad name)
  kParse,            // text or a file could not be parsed
  kIo,               // the operating system refused a read or write
  kUnsupported,      // a valid request this build or machine cannot serve
  kInternal,         // an invariant of fp8kit itself was broken: a bug
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, const char* file, int line)
      : std::runtime_error(std::move(message)), kind_(kind), file_(file), line_(line) {}
  ErrorKind kind() const noexcept { return kind_; }
  // Where the check fired (for bug reports; the CLI does not print it).
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  ErrorKind kind_;
  const char* file_;
  int line_;
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
// The condition of a check must already be a bool: FP8KIT_CHECK("text") or FP8KIT_CHECK(ptr) do not compile.
template <typename T>
requires std::same_as<T, bool>
constexpr bool check_condition(T value) {
  return value;
}
}  // namespace detail

}  // namespace fp8kit

#define FP8KIT_THROW(kind, ...) throw ::fp8kit::Error((kind), ::fp8kit::detail::concat(__VA_ARGS__), __FILE__, __LINE__)

// Throws ErrorKind::kInvalidArgument with the message parts concatenated when cond is false.
#define FP8KIT_CHECK(cond, ...)                                         \
  do {                                                                  \
    if (!::fp8kit::detail::check_condition(cond)) {                     \
      FP8KIT_THROW(::fp8kit::ErrorKind::kInvalidArgument, __VA_ARGS__); \
    }                                                                   \
  } while (false)

// Same, with an explicit kind.
#define FP8KIT_CHECK_KIND(cond, kind, ...)          \
  do {                                              \
    if (!::fp8kit::detail::check_condition(cond)) { \
      FP8KIT_THROW((kind), __VA_ARGS__);            \
    }                                               \
  } while (false)
