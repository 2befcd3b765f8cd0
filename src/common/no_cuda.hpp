// The CPU-only build's one refusal of a CUDA entry point (cuda::cast_to_fp8, cuda::amax, ...): in a build without the
// CUDA backend they exist, so that programs link alike, and throw this.
#pragma once

#include <string_view>

#include "fp8kit/common/error.hpp"

namespace fp8kit::detail {

[[noreturn]] inline void throw_no_cuda_backend(std::string_view what) {
  FP8KIT_THROW(ErrorKind::kUnsupported, "cuda::", what, ": this build of fp8kit has no CUDA backend (build with the ",
               "CUDA toolkit installed, FP8KIT_CUDA=AUTO or ON)");
}

}  // namespace fp8kit::detail
