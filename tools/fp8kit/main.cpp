// fp8kit: the command-line tool. The commands are the fp8kit_cli_commands library (cli.hpp), which the Python
// package runs too; every error becomes one line on stderr and an exit status (0 success, 2 bad usage or bad
// input, 1 any other failure). Never prints a stack trace.
#include "cli.hpp"

int main(int argc, char** argv) {
  return fp8kit::cli::run(argc, argv);
}
