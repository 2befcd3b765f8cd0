// SharedLibrary (shared_library.hpp): dlopen with RTLD_LOCAL, never closed.
#include "common/cuda/shared_library.hpp"

#include <dlfcn.h>

#include <utility>

#include "fp8kit/common/error.hpp"

namespace fp8kit::cuda_detail {

SharedLibrary::SharedLibrary(std::initializer_list<std::string> names, std::string_view what, std::string_view how,
                             std::string newer)
    : newer_(std::move(newer)) {
  std::string why;
  for (const std::string& name : names) {
    handle_ = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ != nullptr) {
      name_ = name;
      return;
    }
    if (why.empty()) why = dlerror();
  }
  FP8KIT_THROW(ErrorKind::kUnsupported, "CUDA: ", what, " could not be loaded (", why, "): ", how);
}

void* SharedLibrary::symbol(const char* name) const {
  void* fn = dlsym(handle_, name);
  FP8KIT_CHECK_KIND(fn != nullptr, ErrorKind::kUnsupported, "CUDA: ", name_, " has no ", name, ": ", newer_);
  return fn;
}

std::string dotted_version(long version) {
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

}  // namespace fp8kit::cuda_detail
