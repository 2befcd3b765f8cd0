// The command line: one CLI::App with every command, run for the tool (errors said on stderr, an exit status) or
// for a library caller (output to a stream, errors thrown).
#include "cli.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/common/version.hpp"

namespace fp8kit::cli {
namespace {

thread_local std::FILE* g_output = nullptr;

// Points output() at `out` for the life of the object.
class OutputScope {
 public:
  explicit OutputScope(std::FILE* out) : before_(g_output) { g_output = out; }
  ~OutputScope() { g_output = before_; }
  OutputScope(const OutputScope&) = delete;
  OutputScope& operator=(const OutputScope&) = delete;

 private:
  std::FILE* before_;
};

// An option given an empty value ("--compare ''", "--isa ''") is refused rather than read as not given: every named
// option of every command that takes a value, flags aside.
void refuse_empty_values(CLI::App& app) {
  const CLI::Validator non_empty(
      [](std::string& value) {
        return value.empty() ? std::string("an empty value (give one, or leave the option out)") : "";
      },
      "", "non-empty");
  for (CLI::Option* option : app.get_options()) {
    if (option->nonpositional() && option->get_expected_min() > 0) option->check(non_empty);
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) refuse_empty_values(*sub);
}

std::unique_ptr<CLI::App> make_app() {
  auto app = std::make_unique<CLI::App>("fp8kit: exact FP8 formats, conversions, and the tools around them.", "fp8kit");
  app->set_version_flag("--version", std::string(kVersion));
  app->require_subcommand(1);
  add_formats_command(*app);
  add_cast_command(*app);
  add_analyze_command(*app);
  add_bench_command(*app);
  add_train_command(*app);
  add_inspect_command(*app);
  add_dequantize_command(*app);
  add_quantize_command(*app);
  add_convert_command(*app);
  add_info_command(*app);
  refuse_empty_values(*app);
  clear_quiet_flag();
  return app;
}

// The name of the command being run, for error messages ("fp8kit cast: ...").
std::string command_name(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) {
    std::string name = "fp8kit " + sub->get_name();
    for (const CLI::App* subsub : sub->get_subcommands()) name += " " + subsub->get_name();
    return name;
  }
  return "fp8kit";
}

// A parse error as the user should read it: CLI11 reports a missing command before an unknown one; name the token
// the user typed instead.
UsageError parse_failure(const CLI::App& app, const CLI::ParseError& e) {
  // The deepest command selected ("fp8kit bench" for "fp8kit bench bogus") and what it did not take.
  const CLI::App* at = &app;
  while (!at->get_subcommands().empty()) at = at->get_subcommands().front();
  const std::vector<std::string> rest = at->remaining();
  if (!rest.empty() && (at == &app || at->get_require_subcommand_min() > 0)) {
    return UsageError("unknown command or option '" + rest.front() + "' (see --help)");
  }
  // An option the command does not know, before what CLI11 says first ("--to is required" for a mistyped "--too"):
  // the token the user typed.
  const auto is_option = [](const std::string& a) {
    return a.size() > 1 && a[0] == '-' && !std::isdigit(static_cast<unsigned char>(a[1])) && a[1] != '.';
  };
  if (const auto option = std::find_if(rest.begin(), rest.end(), is_option); option != rest.end()) {
    return UsageError("unknown option '" + *option + "' (see --help)");
  }
  // CLI11's words for an option given twice ("--steps: At Most 1 required but received 2").
  std::string what = e.what();
  if (const std::size_t at_most = what.find(": At Most 1 required but received "); at_most != std::string::npos) {
    return UsageError(what.substr(0, at_most) + " is given " + what.substr(at_most + 34) +
                      " times; give it once (see --help)");
  }
  return UsageError(what + " (see --help)");
}

// Parses and runs one command line; a bad FP8KIT_ISA is refused by every command, before it does anything. The
// process's ISA cap and thread count are as before when it returns (KeepDispatchSettings).
void parse_and_run(CLI::App& app, int argc, const char* const* argv) {
  const KeepDispatchSettings keep;
  if (const auto isa = isa_from_environment(); isa && !parse_isa(*isa)) active_isa();
  app.parse(argc, argv);
}

}  // namespace

std::FILE* output() {
  return g_output != nullptr ? g_output : stdout;
}

int run(int argc, const char* const* argv) {
  const std::unique_ptr<CLI::App> app = make_app();
  try {
    parse_and_run(*app, argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app->exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app->exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app->exit(e);
  } catch (const CLI::ParseError& e) {
    return report_error(command_name(*app), std::make_exception_ptr(parse_failure(*app, e)));
  } catch (const std::exception&) {
    return report_error(command_name(*app), std::current_exception());
  }
  // Output that could not be written (a full disk behind `> file`) is a failure, not a silent exit 0.
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    const int e = errno;
    return report_error(command_name(*app),
                        std::make_exception_ptr(Error(ErrorKind::kIo,
                                                      std::string("cannot write the output: ") +
                                                          (e != 0 ? std::strerror(e) : "a write to stdout failed"),
                                                      __FILE__, __LINE__)));
  }
  return 0;
}

void run_into(const std::vector<std::string>& args, std::FILE* out) {
  const OutputScope scope(out);
  std::vector<const char*> argv{"fp8kit"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  const std::unique_ptr<CLI::App> app = make_app();
  try {
    parse_and_run(*app, static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::CallForHelp&) {
    std::fputs(app->help().c_str(), out);
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app->help("", CLI::AppFormatMode::All).c_str(), out);
  } catch (const CLI::CallForVersion&) {
    std::fprintf(out, "%s\n", std::string(kVersion).c_str());
  } catch (const CLI::ParseError& e) {
    throw parse_failure(*app, e);
  }
}

}  // namespace fp8kit::cli
