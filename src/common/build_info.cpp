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
#ifdef FP8KIT_HAVE_MPI
  constexpr bool mpi = true;  // src/dist/mpi_communicator.cpp is built in (FP8KIT_MPI=AUTO found MPI, or ON)
#else
  constexpr bool mpi = false;
#endif
  // No CUDA backend exists yet: the CUDA issue adds it behind this flag.
  return {kVersion, FP8KIT_BUILD_TYPE, compiler, false, mpi};
}

}  // namespace fp8kit
