// fp8kit's version, and how this copy of the library was built.
#pragma once

#include <string_view>

namespace fp8kit {
inline constexpr int kVersionMajor = 0;
inline constexpr int kVersionMinor = 1;
inline constexpr int kVersionPatch = 0;
inline constexpr const char* kVersion = "0.1.0";

struct BuildInfo {
  std::string_view version;     // kVersion
  std::string_view build_type;  // CMake's build type: "Release", "Debug", ...
  std::string_view compiler;    // "GCC 12.2.0"
  bool cuda = false;            // the CUDA backend is built in
  bool mpi = false;             // the MPI communicator is built in
};
BuildInfo build_info();
}  // namespace fp8kit
