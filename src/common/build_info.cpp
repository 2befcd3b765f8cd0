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
#ifdef FP8KIT_HAVE_CUDA
  constexpr bool cuda = true;  // src/**/cuda/ is built in (FP8KIT_CUDA=AUTO found the toolkit, or ON)
#else
  constexpr bool cuda = false;
#endif
  return {kVersion, FP8KIT_BUILD_TYPE, compiler, cuda, mpi};
}

}  // namespace fp8kit
