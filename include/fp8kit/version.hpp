// fp8kit's version.
#pragma once

namespace fp8kit {
inline constexpr int kVersionMajor = 0;
inline constexpr int kVersionMinor = 1;
inline constexpr int kVersionPatch = 0;
inline constexpr const char* kVersion = "0.1.0";
}  // namespace fp8kit
