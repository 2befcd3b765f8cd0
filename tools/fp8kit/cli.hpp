// The fp8kit command line as a library. The tool's main() and the Python package (`python -m fp8kit` and its
// checkpoint functions) run the same commands through these entries; nothing here needs CLI11.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace fp8kit::cli {

// Bad usage or bad input: the tool prints "fp8kit <command>: <message>" and exits with status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A UsageError about a path the command reads or writes into: it does not exist (`missing`) or cannot be read. The
// tool exits with status 2 all the same; the Python package raises FileNotFoundError / OSError for it, as open() does.
class PathError : public UsageError {
 public:
  PathError(const std::string& message, bool missing) : UsageError(message), missing_(missing) {}
  bool missing() const noexcept { return missing_; }

 private:
  bool missing_;
};

// Runs `fp8kit ARGS...` as the tool does (argv[0] is the program's name): output on stdout, each error said in one
// line on stderr. Returns the exit status: 0 success, 2 bad usage or bad input, 1 any other failure.
int run(int argc, const char* const* argv);

// Runs `fp8kit ARGS...` (`args` without the program's name) for a library caller: what the command prints goes to
// `out` instead of stdout, and an error is thrown instead of said: UsageError for bad usage or bad input (the
// parser's errors included, with the tool's message), the library's Error and other exceptions as they are.
// --help and --version print their text to `out` and return.
void run_into(const std::vector<std::string>& args, std::FILE* out);

// Where the command being run on this thread prints (stdout unless run_into says otherwise).
std::FILE* output();

}  // namespace fp8kit::cli
