// fp8kit: the command-line tool. The commands are the fp8kit_cli_commands library (cli.hpp), which the Python
// package runs too; every error becomes one line on stderr and an exit status (0 success, 2 bad usage or bad
// input, 1 any other failure). Never prints a stack trace.
#include <csignal>

#include "cli.hpp"

int main(int argc, char** argv) {
  // A write past the file-size limit (ulimit -f) then fails with EFBIG, which the writers report in one line after
  // removing their temporary file, instead of the default SIGXFSZ killing the process mid-write (as Python does too).
  std::signal(SIGXFSZ, SIG_IGN);
  return fp8kit::cli::run(argc, argv);
}
