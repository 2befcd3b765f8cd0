// fp8kit: the command-line tool. Dispatches to one command per file; turns every error into one line on
// stderr and an exit status (0 success, 2 bad usage or bad input, 1 any other failure). Never prints a stack trace.
#include <CLI/CLI.hpp>

#include <exception>
#include <string>

#include "cli_common.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/version.hpp"

namespace {

// The name of the command being run, for error messages ("fp8kit cast: ...").
std::string command_name(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) {
    std::string name = "fp8kit " + sub->get_name();
    for (const CLI::App* subsub : sub->get_subcommands()) name += " " + subsub->get_name();
    return name;
  }
  return "fp8kit";
}

int fail(const std::string& who, const std::string& message) {
  return fp8kit::cli::report_error(who, std::make_exception_ptr(fp8kit::cli::UsageError(message)));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fp8kit: exact FP8 formats, conversions, and the tools around them.", "fp8kit"};
  app.set_version_flag("--version", std::string(fp8kit::kVersion));
  app.require_subcommand(1);
  fp8kit::cli::add_formats_command(app);
  fp8kit::cli::add_cast_command(app);
  fp8kit::cli::add_analyze_command(app);
  fp8kit::cli::add_bench_command(app);
  fp8kit::cli::add_train_command(app);
  fp8kit::cli::add_inspect_command(app);
  fp8kit::cli::add_dequantize_command(app);
  fp8kit::cli::add_quantize_command(app);
  fp8kit::cli::add_convert_command(app);
  fp8kit::cli::add_info_command(app);
  try {
    // A bad FP8KIT_ISA is refused by every command, before it does anything.
    if (const auto isa = fp8kit::isa_from_environment(); isa && !fp8kit::parse_isa(*isa)) fp8kit::active_isa();
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports a missing command before an unknown one; name the token the user typed instead.
    if (app.get_subcommands().empty() && !app.remaining().empty()) {
      return fail("fp8kit", "unknown command or option '" + app.remaining().front() + "' (see --help)");
    }
    return fail(command_name(app), std::string(e.what()) + " (see --help)");
  } catch (const std::exception&) {
    return fp8kit::cli::report_error(command_name(app), std::current_exception());
  }
  return 0;
}
