// How this copy of the library was built: version, build type, compiler, optional backends.
#include <string>

#include "fp8kit/common/version.hpp"

#ifndef FP8KIT_BUILD_TYPE
#define FP8KIT_BUILD_TYPE "unknown"
#endif

namespace fp8kit {

BuildInfo build_info() {
#if defined(__clang__)
  static const std::string compiler = "Clang " __clang_version__;
#elif defined(__GNUC__)
  static const std::string compiler = "GCC " __VERSION__;
#else
  static const std::string compiler = "unknown compiler";
#endif
  // No CUDA or MPI backend exists yet: the CUDA and communication issues add them behind these flags.
  return {kVersion, FP8KIT_BUILD_TYPE, compiler, false, false};
}

}  // namespace fp8kit
