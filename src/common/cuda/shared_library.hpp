// A shared library of the CUDA toolkit loaded at run time (dlopen) and kept open for the process, its functions bound
// by name: how fp8kit reaches cuBLASLt and NCCL without linking them (linked, every program of a CUDA build would load
// them at start, 0.13 s for cuBLASLt's 500 MB, and refuse to start where they are missing). Host code, CUDA builds.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

namespace fp8kit::cuda_detail {

class SharedLibrary {
 public:
  // The first of `names` that loads; Error(kUnsupported) "CUDA: <what> could not be loaded (<the loader's message>):
  // <how>" when none does. `newer` says what to install when a function is missing (an older version).
  SharedLibrary(std::initializer_list<std::string> names, std::string_view what, std::string_view how,
                std::string newer);
  // fn = the function `name`; Error(kUnsupported) naming it, the library and `newer` when it has none.
  template <typename Fn>
  void bind(const char* name, Fn& fn) const {
    fn = reinterpret_cast<Fn>(symbol(name));
  }
  const std::string& name() const { return name_; }

 private:
  void* symbol(const char* name) const;
  void* handle_ = nullptr;
  std::string name_, newer_;
};

// "13.1.0" from a version number major * 10000 + minor * 100 + patch (cuBLASLt's and NCCL's).
std::string dotted_version(long version);

}  // namespace fp8kit::cuda_detail
